"""The golden dry runs: what each stage script prints with DRY_RUN=1, for every stage x layout x preset, pinned.

A case is a stage script with its settings; its golden file (tests/golden/<case>.txt) holds the exit status, stdout
(the `+ ` commands and the pipeline's stage headers) and stderr (notes, warnings, the sizing sheet, the cluster
plan), with only what differs between machines and runs replaced: this checkout's root by <ROOT>, the case's
temporary directory by <TMP>, the shared-storage check's fresh token by <TOKEN>. A change to any script's decisions
shows as a diff here (tests/test_golden.py); an intended one is regenerated (`python -m support.golden --write`, from tests/) and named in its commit.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
SLIME = "/opt/test-slime"
MEGATRON = "/opt/test-megatron"
MASTER = "10.0.0.1"

STAGES: dict[str, tuple[str, dict[str, str]]] = {
    "sft": ("train_sft.sh", {}),
    "rft_gen": ("generate_rft.sh", {}),
    "rft": ("train_rft.sh", {}),
    "grpo": ("train_grpo.sh", {}),
    "grpo_async": ("train_grpo.sh", {"GRPO_ASYNC": "1"}),
    "awsft": ("train_grpo.sh", {"GRPO_ALGORITHM": "awsft"}),
    "pipeline": ("pipeline.sh", {}),
}
NETWORK = {"MASTER_ADDR": MASTER, "SLIME_HOST_IP": MASTER, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
           "TAU2_USER_API_BASE": f"http://{MASTER}:30100/v1"}
# layout -> (its settings, the hostfile's nodes or 0 for none)
LAYOUTS: dict[str, tuple[dict[str, str], int]] = {
    "1node": ({}, 0),
    "hostfile2x4": (NETWORK, 2),
    "hostfile4x2": ({**NETWORK, "TAU2_GPU_LAYOUT": "4"}, 4),
    "ray": ({"RAY_ADDRESS": "http://10.1.0.1:8265", "NUM_NODES": "2", "GPUS_PER_NODE": "8",
             "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "TAU2_USER_API_BASE": "http://10.1.0.1:30100/v1"},
            0),
}
PRESETS: dict[str, dict[str, str]] = {"4b": {}, "8b": {"MODEL": "qwen3-8b"}}
# A few more settings that each decide something the grid above does not reach.
EXTRA: dict[str, tuple[str, dict[str, str]]] = {
    "grpo__1node__recipe8b": ("train_grpo.sh", {"RECIPE": "qwen3-8b-tau2"}),
    "grpo__1node__4b__secrets": ("train_grpo.sh", {"WANDB_API_KEY": "sk-golden-SECRET", "HF_TOKEN": "hf_golden_tok",
                                                   "TAU2_FILTER_ZERO_STD": "1"}),
    "grpo_async__1node__4b__unmasked_no_tis": ("train_grpo.sh", {"GRPO_ASYNC": "1", "GRPO_MASK_OFFPOLICY": "0",
                                                                 "GRPO_USE_TIS": "0"}),
    "grpo__1node__4b__unmasked_no_tis_no_partial": ("train_grpo.sh", {
        "GRPO_MASK_OFFPOLICY": "0", "GRPO_USE_TIS": "0", "GRPO_PARTIAL_ROLLOUT": "0"}),
    "sft__1node__4b__layout2": ("train_sft.sh", {"TAU2_GPU_LAYOUT": "2"}),
    "grpo_async__hostfile2x4__30b": ("train_grpo.sh", {**NETWORK, "GRPO_ASYNC": "1", "MODEL": "qwen3-30b-a3b",
                                                       "_HOSTS": "2"}),
}


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    env: dict[str, str] = field(default_factory=dict)
    hosts: int = 0  # nodes of the hostfile written for it (the head MASTER and workers 10.0.0.2...)


def cases() -> list[Case]:
    out = []
    for stage, (script, stage_env) in STAGES.items():
        for layout, (layout_env, hosts) in LAYOUTS.items():
            for preset, preset_env in PRESETS.items():
                out.append(Case(f"{stage}__{layout}__{preset}", script, {**stage_env, **layout_env, **preset_env},
                                hosts))
    for name, (script, env) in EXTRA.items():
        env = dict(env)
        hosts = int(env.pop("_HOSTS", "0"))
        out.append(Case(name, script, env, hosts))
    return out


def run_case(case: Case) -> str:
    """The case's dry run, normalised, as its golden file holds it."""
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        env = {"PATH": os.environ["PATH"], "HOME": tmp, "LANG": "C.UTF-8", "TAU2_OUT_DIR": f"{tmp}/out",
               "SLIME_DIR": SLIME, "MEGATRON_DIR": MEGATRON, "DRY_RUN": "1", **case.env}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if case.hosts:
            hostfile = Path(tmp) / "hostfile"
            hostfile.write_text("".join(f"10.0.0.{i} slots=8\n" for i in range(1, case.hosts + 1)))
            env["HOSTFILE"] = str(hostfile)
        proc = subprocess.run(["bash", str(ROOT / "scripts" / case.script)], env=env, capture_output=True, text=True,
                              timeout=120, cwd=tmp, check=False)
        text = f"rc: {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
        return normalise(text, tmp)


def normalise(text: str, tmp: str) -> str:
    """Only what varies between machines and runs: the temporary directory, this checkout's root, the shared-storage
    check's fresh token."""
    text = re.sub(r"(\.tau2-shared-check=)[0-9]+-[0-9]+-[0-9]+", r"\1<TOKEN>", text)
    return text.replace(str(Path(tmp).resolve()), "<TMP>").replace(tmp, "<TMP>").replace(str(ROOT), "<ROOT>")


def run_all(selected: list[Case] | None = None) -> dict[str, str]:
    """Every case's normalised dry run, several at once (each is a few short bash and python processes)."""
    todo = selected if selected is not None else cases()
    with ThreadPoolExecutor(max_workers=max(4, (os.cpu_count() or 2) * 2)) as pool:
        return dict(zip((c.name for c in todo), pool.map(run_case, todo)))


def differences(got: dict[str, str]) -> list[str]:
    """A unified diff per case whose dry run differs from its golden file (or has none), and per golden file no case
    makes."""
    out = []
    for name, text in got.items():
        path = GOLDEN / f"{name}.txt"
        want = path.read_text() if path.exists() else ""
        if text != want:
            out.append("".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                                    f"tests/golden/{name}.txt", f"{name} (this checkout)")))
    out += [f"tests/golden/{p.name}: no case makes it" for p in sorted(GOLDEN.glob("*.txt")) if p.stem not in got]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.golden", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite tests/golden/ from this checkout's dry runs")
    a = parser.parse_args(argv)
    got = run_all()
    if a.write:
        GOLDEN.mkdir(exist_ok=True)
        for stale in GOLDEN.glob("*.txt"):
            stale.unlink()
        for name, text in got.items():
            (GOLDEN / f"{name}.txt").write_text(text)
        print(f"wrote {len(got)} golden files into {GOLDEN}")
        return 0
    diffs = differences(got)
    print("\n".join(diffs) or f"{len(got)} golden dry runs equal")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
