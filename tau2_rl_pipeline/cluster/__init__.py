"""The cluster tools the stage scripts run around slime's job on several nodes (slime never loads them).

The check before the job (every node joined, its network interfaces, the checkpoints and data it must see), the
watch beside it (a node Ray marks dead, a silent head), the one line for a job that failed by itself (job_failure: a
full disk, the user simulator gone), the restarts after a node fault, and the pure readers the check and the watch use
(interfaces, inputs)."""
