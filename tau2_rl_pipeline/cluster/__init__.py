"""The cluster tools the stage scripts run around slime's job on several nodes (slime never loads them).

The check before the job (every node joined, its network interfaces, the checkpoints and data it must see), the
watch beside it (a node Ray marks dead, a silent head), and the pure readers both use (interfaces, inputs)."""
