"""The stage scripts' door to the presets and the sizing sheet.

The stage scripts' door to the presets and the sizing sheet (scripts/common.sh calls it; stdlib only, so a dry
run needs no GPU stack).

  python -m tau2_rl_pipeline.scale.cli defaults --model M [--recipe R] --world W
      KEY=value lines: the stage defaults of the preset (and recipe) for W training GPUs (presets.defaults), then
      `# ` lines: where the recipe departs from what it reproduces (the scripts print them)
  python -m tau2_rl_pipeline.scale.cli check --stage grpo --model-file F --name M --nodes N --gpus-per-node G ...
      prints the sizing sheet to stderr; a layout that cannot fit is one `error:` line and exit status 1
      (with --force 1, a warning and status 0). Host memory per node is checked against --host-mem-gb
      (HOST_MEM_GB, GiB); without it, against --meminfo's MemTotal (a real run passes /proc/meminfo: the head's
      memory, taken for every node's) as a warning only.
  python -m tau2_rl_pipeline.scale.cli settings --prog train_grpo.sh
      reads the environment's TAU2_* variables as Tau2Config (every Ray worker) will: a warning naming the closest
      known variable for each unknown one, and one `error:` line naming a bad value's variable (exit status 1)
Each prints one line and exits 1 on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

from tau2_rl_pipeline.config import ConfigError, Tau2Config, unknown_variable_warnings
from tau2_rl_pipeline.scale.presets import defaults, recipe_notes
from tau2_rl_pipeline.scale.sizing import (
    GIB,
    RAY_MEMORY_THRESHOLD,
    Layout,
    Model,
    Work,
    gib,
    model_args_from_file,
    render,
    size,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise SystemExit(f"{self.prog}: error: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tau2_rl_pipeline.scale.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("defaults")
    d.add_argument("--model", default="")
    d.add_argument("--recipe", default="")
    d.add_argument("--world", type=int, required=True)
    sub.add_parser("settings").add_argument("--prog", default="settings")
    c = sub.add_parser("check")
    c.add_argument("--prog", default="sizing")
    c.add_argument("--name", required=True)
    c.add_argument("--model-file", type=Path, required=True)
    c.add_argument("--stage", choices=["sft", "grpo", "policy-server"], required=True)
    for flag in ("--nodes", "--gpus-per-node", "--tp", "--pp", "--cp", "--ep", "--max-tokens-per-gpu", "--engine-gpus"):
        c.add_argument(flag, type=int, default=1)
    c.add_argument("--node-gpus", type=int, default=0)  # GPUs each node gives Ray (GPUS_PER_NODE); 0: --gpus-per-node
    for flag in ("--rollout-gpus", "--rollout-batch", "--samples"):  # 0: no rollout (SFT)
        c.add_argument(flag, type=int, default=0)
    # The episode's turn cap: TAU2_MAX_TURNS when the script has it, else Tau2Config's default.
    c.add_argument("--max-turns", type=int, default=next(f.default for f in fields(Tau2Config) if f.name == "max_turns"))
    c.add_argument("--mem-fraction", type=float, default=0.7)
    c.add_argument("--host-mem-gb", type=float, default=0.0)  # 0: HOST_MEM_GB unset
    c.add_argument("--meminfo", type=Path, default=None)
    for flag in ("--cpu-adam", "--colocated", "--force"):
        c.add_argument(flag, type=int, choices=[0, 1], default=0)
    return parser


def check(a: argparse.Namespace) -> int:
    try:
        model = Model.from_megatron_args(model_args_from_file(a.model_file.read_text()))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{a.prog}: error: cannot read the model's dimensions from {a.model_file}: {exc}") from None
    train = a.stage != "policy-server"
    lay = Layout(nodes=a.nodes, gpus_per_node=a.gpus_per_node, tp=a.tp, pp=a.pp, cp=a.cp, ep=a.ep,
                 cpu_adam=bool(a.cpu_adam), max_tokens_per_gpu=a.max_tokens_per_gpu, rollout_gpus=a.rollout_gpus,
                 engine_gpus=a.engine_gpus, mem_fraction=a.mem_fraction, colocated=bool(a.colocated), train=train,
                 loss="sft" if a.stage == "sft" else "grpo", host_mem=int(a.host_mem_gb * GIB),
                 node_gpus=a.node_gpus)
    work = Work(rollout_batch=a.rollout_batch, samples=a.samples, max_turns=a.max_turns)
    sheet = size(model, lay, work)
    for line in render(a.name, lay, work, sheet):
        print(f"{a.prog}: {line}", file=sys.stderr)
    total = mem_total(a.meminfo) if not lay.host_mem and a.meminfo else 0
    if total and sheet.host_per_node > RAY_MEMORY_THRESHOLD * total:
        print(f"{a.prog}: warning: host memory: a node needs {gib(sheet.host_per_node)} GiB, over "
              f"{RAY_MEMORY_THRESHOLD:.0%} of this machine's {gib(total)} GiB (Ray kills an actor past it); set "
              "HOST_MEM_GB to the nodes' memory to refuse such a layout", file=sys.stderr)
    if sheet.refusal is None:
        return 0
    if a.force:
        for refusal in sheet.refusals:
            print(f"{a.prog}: warning: {refusal.line} (SIZING_FORCE=1: going on; {refusal.by}: {refusal.why})",
                  file=sys.stderr)
        return 0
    print(f"{a.prog}: error: {sheet.refusal.line} (SIZING_FORCE=1 to try anyway)", file=sys.stderr)
    return 1


def mem_total(meminfo: Path) -> int:
    """MemTotal of a /proc/meminfo file in bytes; 0 when it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def settings(prog: str, environ: Mapping[str, str]) -> int:
    """The stage script's TAU2_* variables, named as the user set them: each unknown one warned about (it would
    reach Ray's environment and be ignored there), then the rest read as Tau2Config reads them."""
    unknown = set()
    for line in unknown_variable_warnings(environ):
        unknown.add(line.split()[1])
        print(f"{prog}: {line}", file=sys.stderr)
    try:
        Tau2Config.from_env({k: v for k, v in environ.items() if k not in unknown})
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.command == "defaults":
        try:
            values = defaults(a.model, a.recipe, a.world)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        print("\n".join([*(f"{k}={v}" for k, v in values.items()), *(f"# {n}" for n in recipe_notes(a.recipe))]))
        return 0
    if a.command == "settings":
        return settings(a.prog, os.environ)
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
