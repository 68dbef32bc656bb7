"""Policy engines: token ids in, sampled token ids + their log-probs out.

Two implementations of one small async interface (`Engine.generate`):
- `SGLangEngine`: client of SGLang's native `/generate` (what slime's rollout talks to at scale), with retries,
  exponential backoff and a bound on requests in flight.
- `TransformersEngine`: in-process sampling with a transformers causal LM (local backend, tests, offline demo),
  returning the log-probs of the distribution it actually sampled from, so the rollout stays exactly on-policy.

Rollout code keeps the ids and log-probs these return as its one set of books: nothing is re-tokenized.
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from tau2_rl_pipeline.http_post import RequestFailed, RetryingPost, backoff_delay, split_urls  # noqa: F401 (re-exported)
from tau2_rl_pipeline.rollout.tokens import TopPSpans

if TYPE_CHECKING:  # torch is an optional dependency (extra "local"): SGLangEngine users need not install it
    import torch

FINISH_REASONS = ("stop", "length", "abort")
GREEDY_BELOW = 1e-6  # temperatures under this mean greedy decoding (SGLang's own threshold)


@dataclass(frozen=True)
class SamplingParams:
    """What to sample; mirrors SGLang's sampling_params (top_k -1 = whole vocabulary, temperature 0 = greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 1024
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    # Ask for the ids each sampled token's top-p nucleus kept (slime's top-p replay: custom_params
    # {"return_top_p_token_ids": true}, which slime sends whenever --rollout-top-p < 1).
    return_top_p: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if isinstance(self.stop, str) or isinstance(self.stop_token_ids, int):
            raise ValueError("stop and stop_token_ids must be tuples, not a bare string or int")


@dataclass(frozen=True)
class GenerateResult:
    """Sampled ids (a stop token stays included), the log-prob of each, and why sampling ended; what the server
    said of the request (`meta`: prompt_tokens, cached_tokens, weight_version) and, when asked for, the top-p
    nucleus of each sampled token.

    An `abort` comes two ways: the server was told to stop (SGLang's `/abort_request`, or `/pause_generation` when
    the trainer updates the weights; no error status), or it gave the request up with an error (SGLang's abort
    carries a `status_code` then): `abort_error` holds that error's message, None for a stop."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    meta: dict[str, Any] = field(default_factory=dict)
    top_p: TopPSpans | None = None
    abort_error: str | None = None


class EngineError(RuntimeError):
    """An infrastructure failure that retries did not fix (or a request the server refused)."""

    def __init__(self, message: str, *, url: str, attempts: int) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts


class Engine(Protocol):
    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult: ...


def check_input_ids(input_ids: list[int], vocab_size: int | None = None) -> None:
    """One-line ValueError for a prompt no engine can serve (empty, not ints, outside the vocabulary)."""
    if not isinstance(input_ids, list) or not input_ids:
        raise ValueError("input_ids must be a non-empty list of token ids")
    # Checked on every turn's whole prompt on the event loop: the C-level type scan covers the usual all-int case
    # (3-5x faster than the per-element test, bench/README.md P2); only other lists take the per-element test.
    if not set(map(type, input_ids)) <= {int} and not all(
            isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        raise ValueError("input_ids must hold ints only")
    if vocab_size is not None:
        bad = [t for t in input_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")


# ---------------------------------------------------------------------------------------------------------------
# SGLang over HTTP


def sglang_generate_payload(input_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
    """The `/generate` body slime's own rollout sends: ids in, log-probs on, special tokens and stops kept."""
    check_input_ids(input_ids)
    params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_new_tokens": sampling.max_new_tokens,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
        # The response text must match the ids exactly: keep special tokens and the stop string.
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed  # SGLang's SamplingParams field name
    if sampling.return_top_p:
        params["custom_params"] = {"return_top_p_token_ids": True}
    return {"input_ids": list(input_ids), "sampling_params": params, "return_logprob": True}


def sglang_generate_body(input_ids: list[int], sampling: SamplingParams) -> bytes:
    """The request body as sent: compact JSON of the payload (every prompt id, on every turn)."""
    return json.dumps(sglang_generate_payload(input_ids, sampling), separators=(",", ":")).encode()


def parse_generate_response(body: Any) -> GenerateResult:
    """Read ids, log-probs and finish reason from a `/generate` response; ValueError names what is malformed."""
    if isinstance(body, list):  # SGLang answers a batch with a list; we always send one prompt
        if len(body) != 1:
            raise ValueError(f"expected one result, got a list of {len(body)}")
        body = body[0]
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise ValueError("response has no meta_info object")
    meta = body["meta_info"]
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in FINISH_REASONS:
        raise ValueError(f"meta_info.finish_reason.type is {kind!r}, expected one of {FINISH_REASONS}")
    entries = meta.get("output_token_logprobs")
    if entries is None and kind == "abort":  # an aborted request may carry no tokens at all
        entries = []
    if not isinstance(entries, list):
        raise ValueError("meta_info.output_token_logprobs is missing (was return_logprob sent?)")
    ids: list[int] = []
    logprobs: list[float] = []
    for entry in entries:
        ok = (isinstance(entry, (list, tuple)) and len(entry) >= 2 and isinstance(entry[0], (int, float))
              and isinstance(entry[1], int) and not isinstance(entry[1], bool))
        if not ok:
            raise ValueError(f"bad output_token_logprobs entry {entry!r}, expected [logprob, token_id, text]")
        logprobs.append(float(entry[0]))
        ids.append(entry[1])
    top_p = _top_p_spans(meta, len(ids))
    kept = {k: meta[k] for k in META_KEPT if k in meta}
    abort_error = None
    if kind == "abort" and finish.get("status_code") is not None:
        abort_error = f"HTTP {finish['status_code']}: {finish.get('message') or 'aborted'}"
    return GenerateResult(output_ids=ids, output_logprobs=logprobs, finish_reason=kind, meta=kept, top_p=top_p,
                          abort_error=abort_error)


META_KEPT = ("prompt_tokens", "cached_tokens", "weight_version")  # what slime reads of meta_info, top-p aside
# slime's names for the top-p replay in meta_info (slime/utils/types.py, _TOP_P_TOKEN_*_META_KEYS)
TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _int32_array(value: Any, key: str) -> list[int]:
    """An int32 array as SGLang puts it in meta_info: a list of ints, or base64 of the raw int32 buffer."""
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value.encode("ascii"), validate=True)
        except ValueError as exc:
            raise ValueError(f"meta_info.{key} is not base64: {exc}") from None
        if len(raw) % 4:
            raise ValueError(f"meta_info.{key} holds {len(raw)} bytes, not a whole number of int32 values")
        values = array.array("i")
        values.frombytes(raw)
        return values.tolist()
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    raise ValueError(f"meta_info.{key} must be a list of ints or base64 int32, got {type(value).__name__}")


def _top_p_spans(meta: dict[str, Any], n_tokens: int) -> TopPSpans | None:
    ids_key = next((k for k in TOP_P_ID_KEYS if meta.get(k) is not None), None)
    offsets_key = next((k for k in TOP_P_OFFSET_KEYS if meta.get(k) is not None), None)
    if ids_key is None and offsets_key is None:
        return None
    if ids_key is None or offsets_key is None:
        raise ValueError("meta_info has top-p token ids or offsets but not both")
    spans = TopPSpans(_int32_array(meta[ids_key], ids_key), _int32_array(meta[offsets_key], offsets_key))
    if len(spans) != n_tokens:
        raise ValueError(f"top-p offsets describe {len(spans)} tokens, the response has {n_tokens}")
    return spans


class SGLangEngine:
    """Client of an SGLang server or router's native `/generate`, or of several servers (a list, or their URLs
    comma-separated: each request goes to the one with the fewest in flight, `http_post.RetryingPost`).

    Transient failures (connection errors, timeouts, 5xx, malformed bodies) are retried with exponential backoff;
    a refused request (4xx) is not, since sending it again cannot help. At most `max_in_flight` requests are open
    at once so a large rollout batch does not swamp the router's queue or exhaust local sockets. The HTTP client
    is aiohttp: httpx's pool scans every pooled connection on each request event, which with hundreds in flight
    made the client, not the engine, the bottleneck (bench/README.md, P2). The HTTP discipline is
    `http_post.RetryingPost`'s, shared with the user simulator's client; `aclose()` on the loop that used it.
    """

    def __init__(self, base_url: str | Sequence[str], *, timeout_s: float = 120.0, max_retries: int = 4,
                 backoff_base_s: float = 0.5, backoff_max_s: float = 8.0, max_in_flight: int = 256,
                 session: aiohttp.ClientSession | None = None) -> None:
        urls = [url.rstrip("/") + "/generate" for url in split_urls(base_url)]
        self._http = RetryingPost(urls, name="SGLang /generate", timeout_s=timeout_s, max_retries=max_retries,
                                  backoff_base_s=backoff_base_s, backoff_max_s=backoff_max_s,
                                  max_in_flight=max_in_flight, session=session)
        self.url = self._http.url
        self.timeout_s, self.max_retries, self.max_in_flight = timeout_s, max_retries, max_in_flight

    @classmethod
    def from_router(cls, ip: str, port: int, **kwargs: Any) -> SGLangEngine:
        """Engine for slime's `--sglang-router-ip/--sglang-router-port` pair. slime stores an IPv6 router address
        already bracketed (slime/utils/http_utils.py `_wrap_ipv6`); a bare one is bracketed here, never twice."""
        host = ip.strip().removeprefix("[").removesuffix("]")
        if ":" in host:
            host = f"[{host}]"
        return cls(f"http://{host}:{port}", **kwargs)

    @property
    def _session(self) -> aiohttp.ClientSession | None:
        return self._http.session

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        body = sglang_generate_body(input_ids, sampling)
        # The body holds the ids now. Kept, the list would be walked by every full GC pass for as long as the
        # request waits on the engine: one list of the whole conversation's ids per episode in flight (P5).
        del input_ids
        try:
            return await self._http.post(body, lambda content: parse_generate_response(json.loads(content)))
        except RequestFailed as e:
            if e.status is not None:
                raise EngineError(f"SGLang at {self.url} refused the request (HTTP {e.status}): {e.detail}",
                                  url=self.url, attempts=e.attempts) from None
            raise EngineError(f"SGLang /generate at {self.url} failed after {e.attempts} attempts; last error: "
                              f"{e.detail}; is the server up (scripts/start_policy_server.sh) and --sglang-url "
                              "right?", url=self.url, attempts=e.attempts) from None

    async def aclose(self) -> None:
        """Close the HTTP session if this engine created it (a session passed in belongs to the caller)."""
        await self._http.aclose()


# ---------------------------------------------------------------------------------------------------------------
# In-process transformers engine


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Log-probs of the distribution actually sampled from (SGLang's order): logits / temperature, keep the top_k,
    then the smallest head of the sorted distribution holding top_p of the mass; renormalized, the rest -inf."""
    import torch

    scores = logits.float() / temperature
    if 0 < top_k < scores.numel():
        kept = torch.topk(scores, top_k)
        scores = torch.full_like(scores, float("-inf")).scatter(0, kept.indices, kept.values)
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        ordered = ordered.masked_fill(mass_before > top_p, float("-inf"))  # the top token is always kept
        scores = torch.full_like(scores, float("-inf")).scatter(0, order, ordered)
    return torch.log_softmax(scores, dim=-1)


@dataclass(frozen=True)
class StopRule:
    """When sampling stops early: the last id is a stop/eos id, or the decoded tail contains a stop string."""

    token_ids: frozenset[int]
    strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def __post_init__(self) -> None:
        if self.strings and self.decode is None:
            raise ValueError("stop strings need a decode function (a tokenizer)")

    def matched(self, output_ids: list[int]) -> int | str | None:
        """The stop id or stop string that ends `output_ids` (checked after each new token), else None."""
        if output_ids and output_ids[-1] in self.token_ids:
            return output_ids[-1]
        if self.strings and output_ids:
            # A stop string of n UTF-8 bytes spans at most n tokens; one more covers a split first byte.
            window = max(len(s.encode("utf-8")) for s in self.strings) + 1
            tail = self.decode(output_ids[-window:])
            for s in self.strings:
                if s in tail:
                    return s
        return None


def _eos_ids(model: Any) -> tuple[int, ...]:
    """The model's EOS ids (generation config first, as transformers and SGLang read them)."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    return ()


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r} (e.g. float32, bfloat16)")
    return value


class TransformersEngine:
    """In-process engine over a transformers causal LM, sampling token by token with a KV cache.

    Log-probs are those of the distribution the token was drawn from (after temperature, top-k and top-p), so
    importance ratios computed by the trainer start at exactly 1 on-policy. (SGLang by default reports log-probs
    after temperature but before top-k/top-p; the two agree when top_k=-1 and top_p=1.) Temperature 0 is greedy
    and reports the log-prob of the argmax under the unscaled model distribution. Like SGLang, generation also
    stops on the model's EOS ids. Model access is serialized by a lock (one request at a time) and runs on a
    worker thread so the event loop keeps serving HTTP and environment work.
    """

    def __init__(self, model: Any, tokenizer: Any = None, *, device: str = "cpu",
                 dtype: torch.dtype | str | None = None, seed: int | None = None,
                 eos_token_ids: tuple[int, ...] | None = None) -> None:
        import torch

        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=_as_dtype(dtype)).eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = tuple(eos_token_ids) if eos_token_ids is not None else _eos_ids(model)
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str = "cpu", dtype: torch.dtype | str | None = None,
                        seed: int | None = None) -> TransformersEngine:
        """Load a HF model directory (weights + tokenizer); dtype None keeps the checkpoint's dtype."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not (Path(path) / "config.json").is_file():  # else transformers would take it for a hub repo id
            raise FileNotFoundError(f"{path}: no config.json there; expected a Hugging Face model directory "
                                    "(weights + tokenizer)")

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_as_dtype(dtype) or "auto")
        return cls(model, AutoTokenizer.from_pretrained(str(path)), device=device, seed=seed)

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        # A cancelled request (Ctrl-C, a stopped run) is abandoned at its next token, and one still queued on the
        # lock never starts: otherwise every request in flight would run to its end first, one after another.
        abandoned = threading.Event()
        try:
            return await asyncio.to_thread(self._generate_blocking, list(input_ids), sampling, abandoned)
        except asyncio.CancelledError:
            abandoned.set()
            raise

    def stop_rule(self, sampling: SamplingParams) -> StopRule:
        """The stop conditions of one request: its stop ids, the model's EOS ids, and its stop strings."""
        decode = None
        if self.tokenizer is not None:
            def decode(ids: list[int]) -> str:
                return self.tokenizer.decode(ids, skip_special_tokens=False)
        return StopRule(frozenset(sampling.stop_token_ids) | frozenset(self.eos_token_ids), sampling.stop, decode)

    def _generate_blocking(self, input_ids: list[int], sampling: SamplingParams,
                           abandoned: threading.Event | None = None) -> GenerateResult:
        import torch

        check_input_ids(input_ids, self.vocab_size)
        rule = self.stop_rule(sampling)
        output_ids: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        with self._lock, torch.inference_mode():
            generator = self._generator
            if sampling.seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
            step_input = torch.tensor([input_ids], device=self.device)
            cache = None
            while len(output_ids) < sampling.max_new_tokens:
                if abandoned is not None and abandoned.is_set():
                    finish = "abort"  # nobody awaits this result any more
                    break
                out = self.model(input_ids=step_input, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token, logprob = self._sample(out.logits[0, -1], sampling, generator)
                output_ids.append(token)
                logprobs.append(logprob)
                if rule.matched(output_ids) is not None:
                    finish = "stop"
                    break
                step_input = torch.tensor([[token]], device=self.device)
        return GenerateResult(output_ids=output_ids, output_logprobs=logprobs, finish_reason=finish)

    @staticmethod
    def _sample(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
        import torch

        if sampling.temperature < GREEDY_BELOW:
            token = int(torch.argmax(logits))
            return token, float(torch.log_softmax(logits.float(), dim=-1)[token])
        logprobs = sampling_logprobs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
        return token, float(logprobs[token])

    def score(self, input_ids: list[int], output_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Teacher-forced log-probs of `output_ids` after `input_ids` under log_softmax(logits / temperature)
        (temperature 0 = unscaled), without top-k/top-p filtering. Blocking: call it from a thread in async code."""
        import torch

        check_input_ids(input_ids, self.vocab_size)
        if not output_ids:
            return []
        check_input_ids(output_ids, self.vocab_size)
        scale = temperature if temperature >= GREEDY_BELOW else 1.0
        with self._lock, torch.inference_mode():
            full = torch.tensor([input_ids + output_ids[:-1]], device=self.device)
            logits = self.model(input_ids=full).logits[0, len(input_ids) - 1:].float()
            logprobs = torch.log_softmax(logits / scale, dim=-1)
            picked = logprobs.gather(1, torch.tensor(output_ids, device=self.device).unsqueeze(1))
        return [float(x) for x in picked.squeeze(1)]

    def top_p_spans(self, input_ids: list[int], output_ids: list[int], sampling: SamplingParams) -> TopPSpans:
        """The ids each of `output_ids` was sampled among under `sampling` (its top-k/top-p nucleus), teacher-forced:
        what SGLang returns for slime's top-p replay. Blocking: call it from a thread in async code."""
        import torch

        check_input_ids(input_ids, self.vocab_size)
        ids, offsets = [], [0]
        if output_ids:
            with self._lock, torch.inference_mode():
                full = torch.tensor([input_ids + output_ids[:-1]], device=self.device)
                logits = self.model(input_ids=full).logits[0, len(input_ids) - 1:].float()
            for row in logits:
                if sampling.temperature < GREEDY_BELOW:
                    kept = [int(torch.argmax(row))]
                else:
                    scores = sampling_logprobs(row, sampling.temperature, sampling.top_k, sampling.top_p)
                    kept = torch.nonzero(torch.isfinite(scores)).flatten().tolist()
                ids.extend(kept)
                offsets.append(len(ids))
        return TopPSpans(ids, offsets)
