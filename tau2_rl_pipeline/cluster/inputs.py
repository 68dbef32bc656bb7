"""What a node has at the paths a slime stage reads, and whether it is complete.

The cluster check's content half (check.py runs the readers on every node and prints the verdicts).

Three kinds of input, each read on a node into plain facts (the only I/O here: `read_data`, `read_hf_model`,
`read_checkpoint`) and judged by pure functions that return what is missing, in words, or None:

- the data file (prompts, SFT samples): its size and sha256, which must equal the head's;
- the Hugging Face model (`--hf-checkpoint`: SGLang loads it, slime reads its config and tokenizer): config.json and
  weight files (*.safetensors or *.bin); where an index (`*.index.json`) is present, every shard its weight_map names;
- the Megatron checkpoint a run loads (`--load`: the initial one, or the run's own save on a resume; GRPO's
  `--ref-load`): as Megatron reads one
  (megatron/training/checkpointing.py at the commit slime pins): `latest_checkpointed_iteration.txt` holding an
  iteration or `release` (slime's tools/convert_hf_to_torch_dist.py writes `release` and moves its save there),
  naming the directory `iter_NNNNNNN` or `release`; in it what megatron/core/dist_checkpointing writes: `common.pt`
  and `metadata.json` (written last, once the save is complete), and for the torch_dist backend torch's `.metadata`
  and its `*.distcp` shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's get_checkpoint_tracker_filename
CONFIG = "metadata.json"  # megatron/core/dist_checkpointing/core.py CONFIG_FNAME
COMMON = "common.pt"  # megatron/core/dist_checkpointing/strategies/common.py COMMON_STATE_FNAME
TORCH_METADATA = ".metadata"  # megatron/core/dist_checkpointing/strategies/torch.py _metadata_fn
WEIGHTS = (".safetensors", ".bin")
TEXT_LIMIT = 16 << 20  # an index or a tracker is small; a larger file is not read


@dataclass(frozen=True)
class FileFacts:
    """A data file on one node: None where it is not a file there."""

    size: int | None
    sha256: str | None = None


@dataclass(frozen=True)
class DirFacts:
    """A directory on one node: its files (name: size), its subdirectories, and the text of the small files a verdict
    reads. `files` None: not a directory there."""

    files: dict[str, int] | None
    dirs: frozenset[str] = frozenset()
    texts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointFacts:
    """A Megatron checkpoint directory and the iteration directory its tracker names (None: it names none)."""

    top: DirFacts
    iteration: DirFacts | None = None

    @property
    def files(self) -> dict[str, int] | None:
        return self.top.files


# ---- reading (on each node) --------------------------------------------------------------------------------------
def read_data(path: str) -> FileFacts:
    if not os.path.isfile(path):
        return FileFacts(None)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return FileFacts(os.path.getsize(path), digest.hexdigest())


def read_dir(path: str, wanted) -> DirFacts:
    """The directory's entries; the text of each file `wanted(name)` is true for (and small enough)."""
    if not os.path.isdir(path):
        return DirFacts(None)
    files, dirs, texts = {}, set(), {}
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir():
                dirs.add(entry.name)
            elif entry.is_file():
                files[entry.name] = entry.stat().st_size
                if wanted(entry.name) and files[entry.name] <= TEXT_LIMIT:
                    with open(entry.path, encoding="utf-8", errors="replace") as f:
                        texts[entry.name] = f.read()
    return DirFacts(files, frozenset(dirs), texts)


def read_hf_model(path: str) -> DirFacts:
    return read_dir(path, lambda name: name.endswith(".index.json"))


def read_checkpoint(path: str) -> CheckpointFacts:
    top = read_dir(path, lambda name: name == TRACKER)
    name = tracked_dir(top.texts.get(TRACKER, ""))
    if name is None or name not in top.dirs:
        return CheckpointFacts(top)
    return CheckpointFacts(top, read_dir(os.path.join(path, name), lambda n: n == CONFIG))


# ---- verdicts (pure) ---------------------------------------------------------------------------------------------
def tracked_dir(text: str) -> str | None:
    """The directory Megatron's read_metadata + get_checkpoint_name make of a tracker's text: `release`, or
    iter_NNNNNNN for a non-negative iteration; None for anything else."""
    text = text.strip()
    if text == "release":
        return "release"
    try:
        iteration = int(text)
    except ValueError:
        return None
    return f"iter_{iteration:07d}" if iteration >= 0 else None


def hf_model_missing(facts: DirFacts) -> str | None:
    files = facts.files or {}
    if "config.json" not in files:
        return "has no config.json"
    for index, text in sorted(facts.texts.items()):
        try:
            shards = set(json.loads(text)["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"has an {index} that is not an index (JSON with a weight_map)"
        absent = sorted(s for s in shards if not files.get(s))
        if absent:
            more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
            return f"lacks {absent[0]}{more}, named in its {index}"
    if not any(name.endswith(WEIGHTS) and size > 0 for name, size in files.items()):
        return "has no weight files (*.safetensors or *.bin)"
    return None


def checkpoint_missing(facts: CheckpointFacts) -> str | None:
    if TRACKER not in (facts.top.files or {}):
        return f"has no {TRACKER} (not a Megatron checkpoint: scripts/convert_hf_to_megatron.sh writes one)"
    text = facts.top.texts.get(TRACKER, "")
    name = tracked_dir(text)
    if name is None:
        return f"has a {TRACKER} holding {text.strip()[:40]!r}, not an iteration or 'release'"
    if facts.iteration is None or facts.iteration.files is None:
        return f"has no {name}, which its {TRACKER} names"
    files = facts.iteration.files
    if CONFIG not in files:
        return f"has no {name}/{CONFIG} (a save that did not finish)"
    try:
        backend = json.loads(facts.iteration.texts.get(CONFIG, ""))["sharded_backend"]
    except (ValueError, KeyError, TypeError):
        return f"has a {name}/{CONFIG} without a sharded_backend"
    needed = [COMMON] + ([TORCH_METADATA] if backend == "torch_dist" else [])
    absent = [n for n in needed if n not in files]
    if absent:
        return f"has no {name}/{absent[0]}"
    if backend == "torch_dist" and not any(n.endswith(".distcp") for n in files):
        return f"has no {name}/*.distcp shards"
    return None


def data_differs(facts: FileFacts, head: FileFacts) -> str | None:
    if facts == head or head.size is None:
        return None
    if facts.size != head.size:
        return f"is {facts.size} bytes, the head's {head.size}"
    return f"has sha256 {facts.sha256[:12]}..., the head's {head.sha256[:12]}..."
