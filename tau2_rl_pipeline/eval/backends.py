"""Where the evaluated policy runs, checked before anything is written.

A local directory or a published checkpoint (resolved through huggingface-hub), an SGLang server that must answer,
the stop tokens.

Each check fails with a `SetupError` whose one-line message says what to fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

# What the SGLang backend needs from a checkpoint: the tokenizer, its chat template, and the EOS settings.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "config.json", "generation_config.json"]
HEALTH_TIMEOUT_S = 5.0


class SetupError(RuntimeError):
    """The run cannot start as configured; the message is one line saying what to fix."""


def resolve_checkpoint(name: str, *, tokenizer_only: bool, flag: str) -> Path:
    """A local model directory, or a hub repo id ("Org/Name") resolved to its snapshot in the HF cache.

    snapshot_download honours HF_HUB_OFFLINE / HF_HOME / HF_HUB_CACHE: offline, a cached snapshot is used
    and a missing one is an error; tokenizer_only fetches just TOKENIZER_FILES (the SGLang server holds the
    weights).
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise SetupError(f"{flag} {name}: is a file; pass a model directory or a hub repo id like Org/Name")
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise SetupError(f"{flag} {name}: no such directory, and not a hub repo id like Org/Name")
    if path.parent.is_dir():  # outputs/nope: a local path whose folder exists, not an organisation on the hub
        raise SetupError(f"{flag} {name}: no such directory (in {path.parent}/: "
                         f"{', '.join(sorted(p.name for p in path.parent.iterdir() if p.is_dir())[:6]) or 'nothing'})")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, allow_patterns=TOKENIZER_FILES if tokenizer_only else None))
    except LocalEntryNotFoundError:
        raise SetupError(f"{flag} {name}: not in the local Hugging Face cache and the hub cannot be reached "
                         "(or HF_HUB_OFFLINE=1); download it first (hf download " + name + ") or pass a "
                         "local directory") from None
    except HfHubHTTPError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SetupError(f"{flag} {name}: the hub refused it ({first}); check the name, or set HF_TOKEN "
                         "for a gated model") from None


def check_model_dir(path: Path, flag: str) -> None:
    if not (path / "config.json").is_file():
        raise SetupError(f"{flag} {path}: no config.json there; pass a Hugging Face model directory")


def check_sglang(urls: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """GET <url>/health of each server (a router's URL, or several servers' comma-separated): SGLang servers and
    routers answer 200 once they can serve."""
    for url in urls.split(","):
        url = url.strip()
        if not url.startswith(("http://", "https://")):
            raise SetupError(f"--sglang-url {url!r} must start with http:// or https://")
        health = url.rstrip("/") + "/health"
        try:
            response = httpx.get(health, timeout=timeout_s)
        except httpx.HTTPError as e:
            raise SetupError(f"cannot reach the SGLang server at {url} ({type(e).__name__}); start it "
                             "(python -m sglang.launch_server ...) or pass the right --sglang-url") from None
        if response.status_code != 200:
            raise SetupError(f"the SGLang server at {url} is not ready (GET /health: HTTP {response.status_code}); "
                             "wait for it to finish loading or check its log")


def load_tokenizer(path: Path, flag: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise SetupError(f"{flag} {path}: cannot load a tokenizer there ({str(e).splitlines()[0]})") from None
    if not tokenizer.chat_template:
        raise SetupError(f"{flag} {path}: the tokenizer has no chat template; the policy prompt needs one")
    return tokenizer


def stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's EOS (Qwen3 instruct: <|im_end|>) and <|endoftext|> when the vocabulary has it."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    endoftext = tokenizer.get_vocab().get("<|endoftext|>")
    if endoftext is not None and endoftext not in ids:
        ids.append(endoftext)
    if not ids:
        raise SetupError("the tokenizer has no EOS token and no <|endoftext|>: generation could not stop")
    return tuple(ids)


def load_local_engine(model_dir: Path, tokenizer: Any, device: str, flag: str) -> Any:
    """The in-process engine over the checkpoint's weights (its own dtype), sampling with `tokenizer`'s stops."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from tau2_rl_pipeline.rollout.engines import TransformersEngine

    hf_logging.disable_progress_bar()  # the run's own progress bar is the one to read
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto")
    except (OSError, ValueError) as e:
        raise SetupError(f"{flag} {model_dir}: cannot load the model ({str(e).splitlines()[0]})") from None
    return TransformersEngine(model, tokenizer, device=device)


def resolve_device(device: str) -> str:
    """'auto' = cuda when torch sees a GPU, else cpu; an explicit cuda without one is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SetupError(f"--device {device}: torch sees no CUDA GPU here; use --device cpu (or auto)")
    return device
