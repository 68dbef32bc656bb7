"""In place of slime's train.py / train_async.py on the namespaced hosts (test_hosts_cluster.py): what the stage
script's `ray job submit -- python $SLIME_DIR/train.py ARGV` runs on the head, as far as a machine without GPUs goes.

The `ray` the script calls there is the real one except for `job submit`, which runs this module with the submit's
own arguments (written by test_hosts_cluster.py), as Ray's job API would run the entrypoint on the head with its runtime env. For
the script's own argv, and then for each argv in $HOSTS_JOB_MORE (other stages' argvs from their dry runs, an argv
planted without --num-gpus-per-node), with slime's own code at the pinned commit:

- `parse_args` (parse_argv.parse_slime: the whole of slime's parsing and validation, the GPU answered as an H100);
- `create_placement_groups` on the live cluster, and where each bundle landed;
- with rollout engines: slime's `RolloutManager` actor (its router, one `SGLangEngine` actor per engine in its
  bundle, `_allocate_rollout_engine_addr_and_ports_normal`, `_compute_server_args`, the launch of the SGLang double
  at the address slime gave: tests/contract/sglang_double/sglang/srt/entrypoints/http_server.py), then
  $HOSTS_JOB_ROLLOUTS rollouts through slime's rollout function and the project's custom generate, with the user
  simulator of TAU2_USER_API_BASE; for the script's own argv from the rollout slime's train.py starts at (a resume:
  the checkpointed one + 1), each followed by a checkpoint at slime's save cadence (no weights) and a line in
  $HOSTS_JOB_PROGRESS (HOSTS_JOB_ROLLOUTS=all: up to --num-rollout, as train.py's loop; with
  `--use-fault-tolerance`, before each rollout after the first the manager restarts the engines its health monitor
  killed, as slime's actor asks it to before each weight update: `recover_updatable_engines`);
- training only (SFT): slime's `RayTrainGroup` places one train actor (slime's TrainRayActor, its address choice) in
  each actor bundle, and each says where it runs and the MASTER_ADDR it was given.

Writes one JSON report per argv to $HOSTS_JOB_OUT (a list). The script's own argv fails as slime's train.py does:
an exception in a rollout or a save (a full disk, an abort storm when the user simulator is gone) ends the job with
its traceback and exit 1, after its report is written, so the stage script sees a failed job. Only the planted argvs
(HOSTS_JOB_MORE) are reported with their error and let the next one run: one of them cannot start its engines.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import parse_argv  # noqa: E402 (these three: slime, Megatron-LM and the SGLang double on sys.path by contract_tier)
from contract_tier import SGLANG_DOUBLE  # noqa: E402
from megatron_save import torch_dist_files  # noqa: E402
from parse_argv import parse_slime  # noqa: E402

WAIT_S = 600


def answer_gpus_as_cuda() -> None:
    """Ray's worker setup hook for this job: slime asks its accelerator for the visible index of an engine's base GPU
    (`_compute_server_args`: `accelerator.resolve_visible_device_id`); with no CUDA runtime here, the CUDA backend's
    own mapping (its CUDA_VISIBLE_DEVICES rule) answers, as on the GPU nodes (the bundles' GPUs are Ray resources)."""
    from slime.utils import accelerator
    from slime.utils.accelerator.cuda import CUDAAccelerator

    accelerator.resolve_visible_device_id = CUDAAccelerator().resolve_visible_device_id


def submitted(argv: list[str]) -> tuple[dict, list[str]]:
    """(runtime env, the entrypoint's argv after the script) of `ray job submit [options] -- python SCRIPT ARGV`."""
    cut = argv.index("--")
    env = next(json.loads(a.split("=", 1)[1]) for a in argv[:cut] if a.startswith("--runtime-env-json="))
    return env, argv[cut + 3:]


def bundle_nodes(pg_entry) -> list[str]:
    """The node address of each bundle, in slime's order (its reordered bundle indices)."""
    import ray
    from ray.util.placement_group import placement_group_table

    pg, order, _gpu_ids = pg_entry
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    where = placement_group_table(pg)["bundles_to_node_id"]
    return [ips[where[i]] for i in order]


def train_actors(args, pgs) -> list[dict]:
    """slime's RayTrainGroup over the actor bundles, with a TrainRayActor that only reports where it is."""
    import ray
    from slime.ray.placement_group import allocate_train_group
    from slime.ray.train_actor import TrainRayActor
    from slime.utils.misc import get_current_node_ip

    class Probe(TrainRayActor):
        def where(self) -> dict:
            return {"rank": self._rank, "node": get_current_node_ip(), "master_addr": os.environ["MASTER_ADDR"],
                    "master_port": os.environ["MASTER_PORT"]}

        def sleep(self, tags): ...
        def wake_up(self, tags): ...
        def train(self, rollout_id, rollout_data_ref, external_data=None): ...
        def save_model(self, rollout_id, force_sync=False): ...
        def update_weights(self): ...
        def _get_parallel_config(self): ...

    group = allocate_train_group(args, args.actor_num_nodes, args.actor_num_gpus_per_node, pgs["actor"],
                                 actor_cls=Probe)
    # RayTrainGroup.create() up to its actors' init (which starts torch.distributed on the GPUs): the actors in their
    # bundles, rank 0 choosing the master address the others get
    group._allocate_gpus_for_actor(group._pg, group._num_gpus_per_actor)
    try:
        return ray.get([a.where.remote() for a in group._actor_handlers], timeout=WAIT_S)
    finally:
        for actor in group._actor_handlers:
            ray.kill(actor)


def start_rollout(args) -> int:
    """Where slime's train.py starts: `--start-rollout-id` when the script passes it (a fresh start), else the rollout
    its actors loaded + 1 (slime/backends/megatron_utils/actor.py), the iteration Megatron's `read_metadata` reads from
    the tracker in `--load`."""
    from megatron.training.checkpointing import (
        get_checkpoint_tracker_filename,
        read_metadata,
    )

    if args.start_rollout_id is not None:
        return args.start_rollout_id
    iteration, _release = read_metadata(get_checkpoint_tracker_filename(args.load))
    return iteration + 1


def save_checkpoint(args, rollout_id: int) -> bool:
    """After a trained rollout, at slime's save cadence (`should_run_periodic_action`): the files a torch_dist save
    leaves in Megatron's iteration directory, then the tracker naming it, last, as Megatron writes it (a run killed
    before the tracker resumes from the previous one). No weights: nothing is trained here."""
    from megatron.training.checkpointing import (
        get_checkpoint_name,
        get_checkpoint_tracker_filename,
    )
    from slime.utils.misc import should_run_periodic_action

    if not should_run_periodic_action(rollout_id, args.save_interval, None, args.num_rollout):
        return False
    torch_dist_files(Path(get_checkpoint_name(args.save, rollout_id, False, return_base_dir=True)))
    Path(get_checkpoint_tracker_filename(args.save)).write_text(str(rollout_id))
    return True


def progress(event: str, **fields) -> None:
    """One line per event in $HOSTS_JOB_PROGRESS, for the fault tests to act at a moment of the job."""
    if where := os.environ.get("HOSTS_JOB_PROGRESS"):
        with open(where, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def hold(rollout_id: int, first: int) -> None:
    """From a run's third rollout on, wait while the file $HOSTS_JOB_HOLD exists: a fault test's run stays mid-run (as
    a real one, hundreds of rollouts long, would) until its fault has hit and been acted on, instead of ending first."""
    where = os.environ.get("HOSTS_JOB_HOLD")
    deadline = time.monotonic() + WAIT_S
    while where and rollout_id >= first + 2 and os.path.exists(where) and time.monotonic() < deadline:
        time.sleep(0.5)


def engines_and_rollouts(args, pgs, records: Path, rollouts: int | None, train: bool = False) -> dict:
    import ray
    from slime.ray.rollout import RolloutManager
    from slime.ray.utils import add_default_ray_env_vars

    out: dict = {"engines": [], "rollouts": [], "error": None}
    manager = RolloutManager.options(num_cpus=1, num_gpus=0,
                                     runtime_env={"env_vars": add_default_ray_env_vars()}).remote(args, pgs["rollout"])
    try:
        engines = ray.get(manager.get_updatable_engines_and_lock.remote(), timeout=WAIT_S)[0]
        for rank, engine in enumerate(engines):
            url = ray.get(engine.get_url.remote(), timeout=60)
            node, _ = ray.get(engine._get_current_node_ip_and_free_port.remote(), timeout=60)
            out["engines"].append({"rank": rank, "url": url, "actor_node": node})
        # what slime's train actors tell the manager once Megatron is up (megatron_utils/actor.py): its split of the
        # rollout into data-parallel shards follows it
        ray.get(manager.set_train_parallel_config.remote({
            "dp_size": args.data_parallel_size, "cp_size": args.context_parallel_size, "vpp_size": 1,
            "microbatch_group_size_per_vp_stage": 1}), timeout=60)
        first = start_rollout(args) if train else 0
        out["start_rollout_id"] = first
        last = args.num_rollout if rollouts is None else first + rollouts
        for rollout_id in range(first, last):
            if train:
                hold(rollout_id, first)
            if args.use_fault_tolerance and rollout_id > first:  # slime's actor.update_weights, before the weights go
                ray.get(manager.recover_updatable_engines.remote(), timeout=WAIT_S)
                engines = ray.get(manager.get_updatable_engines_and_lock.remote(), timeout=WAIT_S)[0]
                progress("engines", rollout=rollout_id,
                         urls=ray.get([e.get_url.remote() for e in engines], timeout=60))
            progress("rollout", rollout=rollout_id)
            boxes = ray.get(manager.generate.remote(rollout_id), timeout=WAIT_S)  # one per data-parallel rank
            shards = [ray.get(box.inner, timeout=60) for box in boxes]
            out["rollouts"].append({"id": rollout_id, "samples": len(shards[0]["total_lengths"]),
                                    "response_tokens": [int(n) for s in shards for n in s["response_lengths"]]})
            if train:
                progress("trained", rollout=rollout_id)  # where train.py trains on it (nothing to train here)
                if save_checkpoint(args, rollout_id):
                    progress("saved", rollout=rollout_id)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        if train:  # slime's train.py has no handler: the job ends with the traceback
            progress("failed", error=out["error"])
            raise
    finally:
        ray.kill(manager)
    out["records"] = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    # the engines die with their owner, the doubles with their engine: the next argv's engines take the same ports
    deadline = time.monotonic() + 120
    for rec in out["records"]:
        while rec["error"] is None and time.monotonic() < deadline and _answers(rec["host"], rec["port"]):
            time.sleep(0.5)
    return out


def _answers(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex((host, port)) == 0


def run_one(name: str, argv: list[str], records: Path, rollouts: int | None, train: bool = False) -> dict:
    from ray.util.placement_group import remove_placement_group
    from slime.ray.placement_group import create_placement_groups

    report: dict = {"name": name, "argv": argv, "error": None}
    shutil.rmtree(records, ignore_errors=True)
    records.mkdir(parents=True)
    try:
        args, unknown = parse_slime(argv)
        assert not unknown, f"flags slime does not know: {unknown}"
        report["num_gpus_per_node"] = args.num_gpus_per_node
        pgs = create_placement_groups(args)
        try:
            report["actor_bundles"] = bundle_nodes(pgs["actor"])[:args.actor_num_nodes * args.actor_num_gpus_per_node]
            if args.debug_train_only:
                report["train_actors"] = train_actors(args, pgs)
            else:
                report["rollout_bundles"] = bundle_nodes(pgs["rollout"])[:args.rollout_num_gpus]
                report["gpus_per_engine"] = args.rollout_num_gpus_per_engine
                report.update(engines_and_rollouts(args, pgs, records, rollouts, train))
        finally:
            remove_placement_group(pgs["actor"][0])
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-3000:]
        if train:
            raise JobFailed(report) from exc
    return report


class JobFailed(Exception):
    """The script's own argv failed: main writes the reports, then the job ends as train.py's would."""

    def __init__(self, report: dict) -> None:
        super().__init__(report["error"])
        self.report = report


def main() -> None:
    runtime_env, argv = submitted(sys.argv[1:])
    env_vars = dict(runtime_env["env_vars"])
    os.environ.update(env_vars)  # as Ray's job API gives the entrypoint its runtime env
    records = Path(os.environ["HOSTS_JOB_RECORDS"])
    # the SGLang double stands in for the SGLang package of the image on every node
    env_vars["PYTHONPATH"] = os.pathsep.join((env_vars["PYTHONPATH"], str(SGLANG_DOUBLE), str(HERE)))
    env_vars["SGLANG_DOUBLE_RECORDS"] = str(records)
    jobs = [(os.environ.get("HOSTS_JOB_NAME", "job"), argv)]
    if os.environ.get("HOSTS_JOB_MORE"):
        jobs += [(j["name"], j["argv"]) for j in json.loads(Path(os.environ["HOSTS_JOB_MORE"]).read_text())]
    import argparse

    import ray

    argparse.ArgumentParser.parse_known_args = parse_argv._recording_parse_known_args  # as parse_argv.main does
    ray.init(address="auto", _node_ip_address=os.environ["MASTER_ADDR"], log_to_driver=False,
             runtime_env={"env_vars": env_vars, "worker_process_setup_hook": "hosts_job.answer_gpus_as_cuda"})
    progress("job", pid=os.getpid())
    # the script's own argv trains as slime's train.py would: from where it resumes, saving at its cadence, and
    # failing with its exception (the planted argvs after it then do not run, as nothing runs after train.py dies)
    count = os.environ.get("HOSTS_JOB_ROLLOUTS", "1")
    rollouts = None if count == "all" else int(count)
    reports: list[dict] = []
    try:
        for i, (name, job_argv) in enumerate(jobs):
            reports.append(run_one(name, job_argv, records, rollouts, train=i == 0))
    except JobFailed as failed:
        reports.append(failed.report)
        raise failed.__cause__ from None
    finally:
        Path(os.environ["HOSTS_JOB_OUT"]).write_text(json.dumps(reports, indent=1))
    ray.shutdown()


if __name__ == "__main__":
    main()
