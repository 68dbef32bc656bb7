"""Running slime's own rollout code (slime 624b824) against this project's plug-ins and the loopback server.

`slime_args(...)` is slime's real argument parser over a train.py command line; `rollout(...)` is one call of
slime's real rollout function with its real data source; `train_data(...)` is slime's RolloutManager turning the
samples into train data (its real method, called on an instance made without Ray). Each test starts from fresh
slime and adapter state (slime keeps process-wide singletons: GenerateState, its HTTP client).
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import contract_tier  # noqa: F401  (slime, Megatron-LM and the SGLang double on sys.path)

GENERATE = "tau2_rl_pipeline.slime_plugins.adapter.generate"
POST_PROCESS = "tau2_rl_pipeline.slime_plugins.adapter.reward_post_process"
FILTER = "tau2_rl_pipeline.slime_plugins.batch.filter_groups"
LOG = "tau2_rl_pipeline.slime_plugins.rollout_log.log_rollout_data"


@functools.cache
def _parse(argv: tuple[str, ...]):
    from slime.utils.arguments import parse_args

    saved = sys.argv
    sys.argv = list(argv)
    try:
        return parse_args()
    finally:
        sys.argv = saved


def slime_args(model_dir: Path, prompt_data: Path, router: str, *, batch: int = 2, n: int = 2,
               extra: tuple[str, ...] = ()) -> Any:
    """slime's parsed arguments for a GRPO rollout against `router` (host:port, host as slime stores it)."""
    host, port = router.rsplit(":", 1)
    argv = ("train.py", "--debug-rollout-only", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
            "--colocate", "--rollout-num-gpus-per-engine", "1",
            "--hf-checkpoint", str(model_dir), "--prompt-data", str(prompt_data),
            "--input-key", "input", "--metadata-key", "metadata",
            "--rollout-batch-size", str(batch), "--n-samples-per-prompt", str(n), "--global-batch-size",
            str(batch * n), "--num-rollout", "1", "--rollout-temperature", "1.0", "--rollout-max-response-len", "48",
            "--advantage-estimator", "grpo", "--sglang-router-ip", host, "--sglang-router-port", port,
            "--custom-generate-function-path", GENERATE, "--custom-reward-post-process-path", POST_PROCESS,
            *extra)
    return copy.deepcopy(_parse(argv))


def prompt_rows(path: Path, task_ids: list[str], domain: str = "mock", split: str = "base") -> Path:
    from tau2_rl_pipeline.benchmark.tasks import task_rows

    rows = [r for r in task_rows(domain, split) if r["metadata"]["task_id"] in task_ids]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reset_slime() -> None:
    """Fresh process-wide state of slime and of the adapter; slime's fully-async worker is stopped and waited for."""
    from slime.rollout import fully_async_rollout, sample_hooks, sglang_rollout
    from slime.utils import http_utils

    from tau2_rl_pipeline.slime_plugins import adapter as slime_adapter

    worker = fully_async_rollout._global_worker
    fully_async_rollout._stop_global_worker()
    if worker is not None and worker.worker_thread is not None:
        worker.worker_thread.join(60)
    sglang_rollout.GenerateState.clear_instances()
    http_utils._http_client = None
    sample_hooks.set_current_rollout_id(None)  # a new RolloutManager process: no rollout generated yet
    for cached in (slime_adapter._config, slime_adapter._user_factory, slime_adapter._engine,
                   slime_adapter._storm_guard, slime_adapter._live_episodes, slime_adapter._settle_gc,
                   slime_adapter._admission_gate, slime_adapter._log_once):
        cached.cache_clear()
    slime_adapter._trackers.clear()


def rollout(args, rollout_id: int = 0, data_source=None):
    """slime's generate_rollout (or the function --rollout-function-path names) over its real data source."""
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils.http_utils import init_http_client
    from slime.utils.misc import load_function

    init_http_client(args)  # RolloutManager.__init__ does this before any rollout
    data_source = data_source or RolloutDataSourceWithBuffer(args)
    fn = load_function(args.rollout_function_path)
    return fn(args, rollout_id, data_source), data_source


def own_rollout(args, rollout_id, data_source, evaluation: bool = False):
    """A user's own `--rollout-function-path` (slime_harness.own_rollout: a path the off-policy guard does not know),
    here slime's synchronous generate_rollout under another name."""
    from slime.rollout.sglang_rollout import generate_rollout

    return generate_rollout(args, rollout_id, data_source, evaluation=evaluation)


def update_weights(server, version: str) -> None:
    """What slime's weight update (UpdateWeightFromDistributed.update_weights,
    slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py) does to a rollout engine:
    pause generation, flush the cache, send the weights with their version, continue; each through slime's own
    SGLangEngine method (slime/backends/sglang_utils/sglang_engine.py, its HTTP calls to the server). The tensors
    themselves cannot travel to the loopback server: the update sends none, only the new weight version."""
    from slime.backends.sglang_utils.sglang_engine import SGLangEngine

    engine = SGLangEngine.__new__(SGLangEngine)  # its HTTP client methods only: no server launched, no Ray actor
    engine.node_rank, engine.server_host, engine.server_port = 0, server.host, server.port
    engine.pause_generation()
    engine.flush_cache()
    engine.update_weights_from_distributed([], [], [], "tau2-contract", weight_version=version)
    engine.continue_generation()


def train_async_steps(args, steps: int, server, *, train_s: float = 0.0, source=None):
    """slime's train_async.py schedule around the rollout function, without training: its update_weights() before
    the first rollout (version 1, slime's numbering); then for each step r: rollout r's data, rollout r + 1
    requested (it runs while step r trains), the training step (`train_s`, and whatever the caller does with the
    yielded data), rollout r + 1 awaited, the weight update to version r + 2. Yields (r, rollout r's output)."""
    from concurrent.futures import ThreadPoolExecutor

    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    source = source or RolloutDataSourceWithBuffer(args)
    update_weights(server, "1")
    with ThreadPoolExecutor(1) as pool:
        upcoming = pool.submit(rollout, args, 0, source)
        for step in range(steps):
            output = upcoming.result()[0]
            upcoming = pool.submit(rollout, args, step + 1, source) if step + 1 < steps else None
            yield step, output
            time.sleep(train_s)
            if upcoming is not None:
                upcoming.result()  # train_async.py awaits the next rollout before the update
            update_weights(server, str(step + 2))


def flat(groups) -> list:
    """The samples of a rollout's groups (or of a RolloutFnTrainOutput), in order."""
    groups = getattr(groups, "samples", groups)
    out = []
    for g in groups:
        out.extend(g if isinstance(g, list) else [g])
    return out


def train_data(args, samples: list, rollout_id: int | None = None) -> dict:
    """slime's RolloutManager._convert_samples_to_train_data (reward post-process and every check it makes); with
    `rollout_id`, as RolloutManager.generate(rollout_id) calls it: after slime's set_current_rollout_id, its first
    step (slime/ray/rollout.py)."""
    from slime.ray.rollout import RolloutManager
    from slime.rollout.sample_hooks import set_current_rollout_id
    from slime.utils.misc import load_function

    if rollout_id is not None:
        set_current_rollout_id(rollout_id)

    cls = RolloutManager.__ray_metadata__.modified_class
    manager = cls.__new__(cls)
    manager.args = args
    manager.custom_reward_post_process_func = (load_function(args.custom_reward_post_process_path)
                                               if args.custom_reward_post_process_path else None)
    manager.custom_convert_samples_to_train_data_func = None
    return manager._convert_samples_to_train_data(samples)
