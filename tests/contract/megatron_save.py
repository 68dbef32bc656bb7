"""Writes torch_dist checkpoints with Megatron's own code, as slime writes them (run as a script: Megatron's writer
starts worker processes that import __main__). Usage: megatron_save.py PORT DIR..., or
megatron_save.py iteration PORT SAVE ITERATION NUMEL (one training save, below).

Each DIR gets one tensor saved by `megatron.core.dist_checkpointing.save` (one gloo rank) into the directory
Megatron's `get_checkpoint_name` names for iteration 1, then, as slime's tools/convert_hf_to_torch_dist.py does, the
tracker `release` and the save moved to `release/`. The two CUDA calls the writer makes on a GPU rank (a stream
synchronize, the device of a flag tensor) are stood in for by their CPU meaning: nothing to wait for, the CPU.

`iteration` saves as Megatron's `save_checkpoint` does during training (megatron/training/checkpointing.py, torch_dist):
the iteration directory made, `dist_checkpointing.save` of a NUMEL-element tensor into it, then the tracker written
with the iteration, last; an error (a full disk) ends the script with its traceback before the tracker is touched.
"""

import json
import os
import shutil
import sys
from pathlib import Path


def torch_dist_files(iteration: Path) -> None:
    """The files a torch_dist save leaves in an iteration directory, with no weights in them (what the cluster check
    reads: cluster.inputs.checkpoint_missing), for tests that need a checkpoint's shape and not its tensors."""
    iteration.mkdir(parents=True, exist_ok=True)
    (iteration / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    for name in ("common.pt", ".metadata", "__0_0.distcp"):
        (iteration / name).write_bytes(b"\0" * 16)


def _gloo_rank(port: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=0, world_size=1)


def save_iteration(save: str, iteration: int, numel: int) -> None:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.training.checkpointing import get_checkpoint_name, get_checkpoint_tracker_filename

    checkpoint = get_checkpoint_name(save, iteration, False, return_base_dir=True)
    os.makedirs(checkpoint, exist_ok=True)  # ensure_directory_exists(checkpoint_name, check_parent=False)
    dist_checkpointing.save({"weight": ShardedTensor.from_rank_offsets("weight", torch.arange(float(numel)))},
                            checkpoint)
    with open(get_checkpoint_tracker_filename(save), "w") as f:  # iter_finalize_fn
        f.write(str(iteration))


def main() -> None:
    import torch.distributed as dist

    if sys.argv[1] == "iteration":
        _gloo_rank(sys.argv[2])
        save_iteration(sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        dist.destroy_process_group()
        return
    _gloo_rank(sys.argv[1])
    from megatron.training.checkpointing import get_checkpoint_name, get_checkpoint_tracker_filename

    for save in sys.argv[2:]:
        save_iteration(save, 1, 8)
        with open(get_checkpoint_tracker_filename(save), "w") as f:
            f.write("release")
        shutil.move(get_checkpoint_name(save, 1, False, return_base_dir=True),
                     get_checkpoint_name(save, -1, True, return_base_dir=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
