"""Runs the real argument parsers of the programs the stage scripts launch over the argv a dry run printed.

Run by tests/contract/test_stage_argv.py in one subprocess for every command (slime and Megatron import once):
`python parse_argv.py JOBS.json OUT.json`, JOBS a list of {"program", "argv", "env"}; OUT gets, per job,
{"unknown": [...], "error": "..." or null, "args": {dest: value}}. Programs:

- `slime` (train.py, train_async.py): slime's own `slime.utils.arguments.parse_args()`, the whole of it: the pre-parse,
  SGLang's parser (slime's --sglang- wrapper over the SGLang double's ServerArgs), Megatron's parser with slime's
  arguments, then slime's, Megatron's and SGLang's validation. Megatron parses with ignore_unknown_args=True, so
  unknown flags are found by parsing the argv once more with every parser slime built during the call merged into
  one (what is left over is known to none of them; an abbreviated flag counts as unknown). Two things only a GPU
  machine has are answered here: the model's HF config.json (a dry run has no downloaded model, so
  megatron_parse_args' HF check is skipped) and the GPU architecture Megatron's validation asks torch.cuda for
  (the H100's, sm 90, the hardware the scripts target: `h100`).
- `convert_hf_to_torch_dist`: slime's tools/convert_hf_to_torch_dist.py `get_args()` (Megatron's parser with
  ignore_unknown_args=False: an unknown flag is a parser error) and Megatron's validation.
- `convert_torch_dist_to_hf`: slime's tools/convert_torch_dist_to_hf.py run as __main__ up to its parse_args().
- `sglang.launch_server`: SGLang's server parser (the double's ServerArgs.add_cli_args, SGLang's real arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: contract_tier reads third_party.py there
# contract_tier puts slime, Megatron and the SGLang double on sys.path
from contract_tier import MISSING, SLIME_DIR  # noqa: E402

_BUILT: list[argparse.ArgumentParser] = []
_real_parse_known_args = argparse.ArgumentParser.parse_known_args


def _recording_parse_known_args(self, args=None, namespace=None):
    _BUILT.append(self)
    return _real_parse_known_args(self, args, namespace)


class StopAfterParse(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def leftovers(parsers: list[argparse.ArgumentParser], argv: list[str]) -> list[str]:
    """What none of `parsers` accepts: argv parsed once by a parser holding all their arguments."""
    merged = argparse.ArgumentParser(add_help=False, allow_abbrev=False, conflict_handler="resolve", parents=parsers)
    for action in merged._actions:
        action.required = False  # a required argument is checked by the real parse; here only the leftovers count
    return merged.parse_known_args(argv)[1]


def jsonable(namespace: argparse.Namespace) -> dict:
    def value(v: object) -> object:
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            return repr(v)
        return v

    return {k: value(v) for k, v in vars(namespace).items()}


@contextlib.contextmanager
def h100() -> Iterator[None]:
    """The GPU Megatron's validation asks about, answered as an H100 (sm 90): get_device_arch_version, and
    torch.cuda.get_device_capability for MoE's grouped GEMM (--moe-grouped-gemm)."""
    import megatron.training.arguments as megatron_arguments
    import torch

    real = torch.cuda.get_device_capability
    megatron_arguments.get_device_arch_version = lambda: 9
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


def parse_slime(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    import slime.backends.megatron_utils.arguments as slime_megatron
    from slime.utils.arguments import parse_args

    real_megatron_parse_args = slime_megatron.megatron_parse_args
    slime_megatron.megatron_parse_args = lambda extra_args_provider, skip_hf_validate=False: real_megatron_parse_args(
        extra_args_provider, skip_hf_validate=True)
    _BUILT.clear()
    sys.argv = ["train.py", *argv]
    try:
        with h100():
            args = parse_args()
    finally:
        slime_megatron.megatron_parse_args = real_megatron_parse_args
    return args, leftovers(list(_BUILT), argv)


def parse_convert_hf_to_torch_dist(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    sys.path.insert(0, str(SLIME_DIR / "tools"))
    import convert_hf_to_torch_dist

    sys.argv = ["convert_hf_to_torch_dist.py", *argv]
    with h100():
        return convert_hf_to_torch_dist.get_args(), []  # its parser rejects unknown flags itself (a parser error)


def parse_convert_torch_dist_to_hf(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    real_parse_args = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise StopAfterParse(real_parse_args(self, args, namespace))

    sys.argv = ["convert_torch_dist_to_hf.py", *argv]
    argparse.ArgumentParser.parse_args = stop
    try:
        runpy.run_path(str(SLIME_DIR / "tools" / "convert_torch_dist_to_hf.py"), run_name="__main__")
    except StopAfterParse as parsed:
        return parsed.namespace, []
    finally:
        argparse.ArgumentParser.parse_args = real_parse_args
    raise RuntimeError("convert_torch_dist_to_hf.py never parsed its arguments")


def parse_sglang_server(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv), []


PROGRAMS = {"slime": parse_slime, "convert_hf_to_torch_dist": parse_convert_hf_to_torch_dist,
            "convert_torch_dist_to_hf": parse_convert_torch_dist_to_hf, "sglang.launch_server": parse_sglang_server}


def run_job(job: dict) -> dict:
    saved_env = dict(os.environ)
    os.environ.update(job.get("env", {}))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            args, unknown = PROGRAMS[job["program"]](job["argv"])
        return {"unknown": unknown, "error": None, "args": jsonable(args)}
    except SystemExit:  # argparse's error: the message is on stderr
        return {"unknown": [], "error": stderr.getvalue().strip().splitlines()[-1], "args": {}}
    except Exception as exc:  # noqa: BLE001 - a validation error is the answer for this job, the next job still runs
        return {"unknown": [], "error": f"{type(exc).__name__}: {exc}", "args": {}}
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


def main() -> None:
    if MISSING is not None:
        sys.exit(MISSING)
    jobs = json.loads(Path(sys.argv[1]).read_text())
    argparse.ArgumentParser.parse_known_args = _recording_parse_known_args
    Path(sys.argv[2]).write_text(json.dumps([run_job(job) for job in jobs]))


if __name__ == "__main__":
    main()
