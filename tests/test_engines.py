"""Engines, the loopback SGLang look-alike, and the tiny models/tokenizer they run on.

Everything here is real: tiny randomly initialized Qwen3 models, a trained BPE tokenizer, the real Qwen3
tokenizer, an aiohttp server on 127.0.0.1, httpx and litellm clients.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import torch
from support.loopback_server import Fault, LoopbackServer, parse_qwen3_tool_calls, truncate_scripted

from tau2_rl_pipeline.local.tiny_model import (
    QWEN3_CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    build_tiny_qwen3,
    domain_corpus,
    train_small_tokenizer,
)
from tau2_rl_pipeline.rollout.engines import (
    EngineError,
    GenerateResult,
    SamplingParams,
    SGLangEngine,
    StopRule,
    TransformersEngine,
    backoff_delay,
    parse_generate_response,
    sampling_logprobs,
    sglang_generate_body,
)

MOCK_TOOL = {"type": "function", "function": {
    "name": "create_task", "description": "Create a new task for a user.",
    "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}, "title": {"type": "string"}},
                   "required": ["user_id", "title"]}}}


def chat_prompt(tokenizer: Any, text: str = "Please create a task called Important Meeting.") -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)


def teacher_forced_logits(model: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Logits predicting each output token, from one forward pass over prompt + output (no KV cache)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(output)]


def no_eos(engine: TransformersEngine) -> TransformersEngine:
    """The same model without implicit EOS stops, so a run's length depends only on the test's settings."""
    return TransformersEngine(engine.model, engine.tokenizer, eos_token_ids=())


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def qwen3_engine(tiny_qwen3_dir: Path) -> TransformersEngine:
    return TransformersEngine.from_pretrained(tiny_qwen3_dir, seed=0)


# ---------------------------------------------------------------------------------------------------------------
# Pure logic


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=0),
                                    dict(max_new_tokens=-1), dict(stop="</s>")])
def test_sampling_params_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_sampling_logprobs_filters_in_sglang_order() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    assert torch.allclose(sampling_logprobs(logits, 1.0, -1, 1.0).exp(), probs, atol=1e-6)
    top3 = sampling_logprobs(logits, 1.0, 3, 1.0).exp()
    assert torch.allclose(top3, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=1e-6)
    # top_p=0.7: mass before token 2 is 0.8 > 0.7, so only the first two survive
    nucleus = sampling_logprobs(logits, 1.0, -1, 0.7).exp()
    assert torch.allclose(nucleus, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    hot = sampling_logprobs(logits, 2.0, -1, 1.0)
    assert torch.allclose(hot, torch.log_softmax(logits / 2.0, dim=-1), atol=1e-6)


def test_parse_generate_response_reads_ids_logprobs_and_finish() -> None:
    body = {"text": "ab", "meta_info": {"finish_reason": {"type": "stop", "matched": 7},
                                        "output_token_logprobs": [[-0.5, 3, None], [-1.25, 7, "x"]]}}
    expected = GenerateResult(output_ids=[3, 7], output_logprobs=[-0.5, -1.25], finish_reason="stop")
    assert parse_generate_response(body) == expected
    assert parse_generate_response([body]) == expected  # SGLang's list form for batch input
    aborted = {"meta_info": {"finish_reason": {"type": "abort", "message": "weights updating"}}}
    assert parse_generate_response(aborted) == GenerateResult([], [], "abort")


@pytest.mark.parametrize("body, reason", [
    ({"text": "x"}, "meta_info"),
    ({"meta_info": {"finish_reason": {"type": "length"}}}, "return_logprob"),
    ({"meta_info": {"finish_reason": None, "output_token_logprobs": []}}, "finish_reason"),
    ({"meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[None, 3, None]]}}, "entry"),
    ({"meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-1.0, "3", None]]}}, "entry"),
    ([{}, {}], "list of 2"),
])
def test_parse_generate_response_names_what_is_malformed(body: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_generate_response(body)


def test_backoff_delay_doubles_with_jitter_and_caps() -> None:
    rng = random.Random(0)
    for retry, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = [backoff_delay(retry, 0.5, 8.0, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered, so a burst of failures does not retry in lockstep


def test_stop_rule_matches_ids_and_decoded_strings() -> None:
    def decode(ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)

    rule = StopRule(frozenset({9}), ("cd",), decode)
    assert rule.matched([0, 1]) is None
    assert rule.matched([0, 1, 2, 3]) == "cd"
    assert rule.matched([0, 9]) == 9
    with pytest.raises(ValueError, match="decode"):
        StopRule(frozenset(), ("x",), None)


def test_truncate_scripted_cuts_at_stop_or_limit() -> None:
    rule = StopRule(frozenset({5}))
    assert truncate_scripted([1, 2, 5, 3], rule, 10) == ([1, 2, 5], "stop")
    assert truncate_scripted([1, 2, 5, 3], rule, 2) == ([1, 2], "length")
    assert truncate_scripted([1, 2], rule, 10) == ([1, 2], "stop")


def test_parse_qwen3_tool_calls() -> None:
    good = 'Let me do that.\n<tool_call>\n{"name": "create_task", "arguments": {"user_id": "u1"}}\n</tool_call>'
    content, calls = parse_qwen3_tool_calls(good)
    assert [c["function"]["name"] for c in calls] == ["create_task"] and content == "Let me do that."
    assert json.loads(calls[0]["function"]["arguments"]) == {"user_id": "u1"}
    bad = good + "\n<tool_call>\nnot json\n</tool_call>"
    assert parse_qwen3_tool_calls(bad) == (bad, [])  # output that does not parse stays text


# ---------------------------------------------------------------------------------------------------------------
# TransformersEngine


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_logprobs_match_a_teacher_forced_forward_pass(tiny_engine: TransformersEngine, small_tokenizer: Any,
                                                      temperature: float) -> None:
    prompt = chat_prompt(small_tokenizer)
    result = asyncio.run(tiny_engine.generate(prompt, SamplingParams(temperature=temperature, max_new_tokens=12,
                                                                     seed=1)))
    assert len(result.output_ids) == len(result.output_logprobs) > 0
    rows = teacher_forced_logits(tiny_engine.model, prompt, result.output_ids)
    expected = torch.log_softmax(rows / temperature, dim=-1).gather(1, torch.tensor(result.output_ids)[:, None])
    assert torch.allclose(torch.tensor(result.output_logprobs), expected.squeeze(1), atol=1e-4)


def test_logprobs_match_with_the_real_qwen3_vocabulary(qwen3_engine: TransformersEngine,
                                                       qwen3_tokenizer: Any) -> None:
    prompt = chat_prompt(qwen3_tokenizer)
    result = asyncio.run(qwen3_engine.generate(prompt, SamplingParams(max_new_tokens=6, seed=2)))
    assert qwen3_engine.vocab_size == len(qwen3_tokenizer) == 151669
    rows = teacher_forced_logits(qwen3_engine.model, prompt, result.output_ids)
    expected = torch.log_softmax(rows, dim=-1).gather(1, torch.tensor(result.output_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(result.output_logprobs), expected, atol=1e-4)


def test_top_k_samples_from_the_top_k_with_renormalized_logprobs(tiny_engine: TransformersEngine,
                                                                  small_tokenizer: Any) -> None:
    prompt = chat_prompt(small_tokenizer)
    result = asyncio.run(no_eos(tiny_engine).generate(prompt, SamplingParams(top_k=5, max_new_tokens=10, seed=3)))
    rows = teacher_forced_logits(tiny_engine.model, prompt, result.output_ids)
    for row, token, logprob in zip(rows, result.output_ids, result.output_logprobs, strict=True):
        top = torch.topk(row, 5)
        assert token in top.indices.tolist()
        renormalized = torch.log_softmax(top.values, dim=-1)[top.indices.tolist().index(token)]
        assert math.isclose(logprob, float(renormalized), abs_tol=1e-4)
        assert logprob > float(torch.log_softmax(row, dim=-1)[token])  # renormalizing raised it


def test_temperature_zero_is_greedy_with_unscaled_logprobs(tiny_engine: TransformersEngine,
                                                           small_tokenizer: Any) -> None:
    prompt = chat_prompt(small_tokenizer)
    result = asyncio.run(no_eos(tiny_engine).generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=6)))
    rows = teacher_forced_logits(tiny_engine.model, prompt, result.output_ids)
    assert result.output_ids == rows.argmax(dim=-1).tolist()
    expected = torch.log_softmax(rows, dim=-1).max(dim=-1).values
    assert torch.allclose(torch.tensor(result.output_logprobs), expected, atol=1e-4)


def test_stop_token_ends_generation_and_is_included(tiny_engine: TransformersEngine, small_tokenizer: Any) -> None:
    engine, prompt = no_eos(tiny_engine), chat_prompt(small_tokenizer)
    reference = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, seed=4))).output_ids
    cut = next(i for i in range(2, 12) if reference[i] not in reference[:i])
    stopped = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, seed=4,
                                                                 stop_token_ids=(reference[cut],))))
    assert stopped.output_ids == reference[:cut + 1]
    assert stopped.finish_reason == "stop"
    # The model's own EOS ids stop it too (as SGLang does): here we declare that token to be the EOS.
    as_eos = TransformersEngine(engine.model, engine.tokenizer, eos_token_ids=(reference[cut],))
    assert asyncio.run(as_eos.generate(prompt, SamplingParams(max_new_tokens=12, seed=4))) == stopped


def test_eos_ids_default_to_the_model_config(tiny_engine: TransformersEngine, small_tokenizer: Any) -> None:
    assert tiny_engine.eos_token_ids == (small_tokenizer.convert_tokens_to_ids("<|im_end|>"),)


def test_stop_string_ends_generation_and_is_included(tiny_engine: TransformersEngine,
                                                     small_tokenizer: Any) -> None:
    engine, prompt = no_eos(tiny_engine), chat_prompt(small_tokenizer)
    reference = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, seed=5))).output_ids
    stop = small_tokenizer.decode(reference[4:6])
    first = next(n for n in range(1, 13) if stop in small_tokenizer.decode(reference[:n]))
    result = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=12, seed=5, stop=(stop,))))
    assert result.output_ids == reference[:first]
    assert result.finish_reason == "stop"
    assert stop in small_tokenizer.decode(result.output_ids)
    assert stop not in small_tokenizer.decode(result.output_ids[:-1])


def test_max_new_tokens_ends_with_length(tiny_engine: TransformersEngine, small_tokenizer: Any) -> None:
    engine, prompt = no_eos(tiny_engine), chat_prompt(small_tokenizer)
    result = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=5, seed=6)))
    assert (len(result.output_ids), result.finish_reason) == (5, "length")
    empty = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=0)))
    assert empty == GenerateResult([], [], "length")


def test_request_seed_reproduces_and_engine_seed_sets_the_stream(tiny_engine: TransformersEngine,
                                                                 small_tokenizer: Any) -> None:
    prompt = chat_prompt(small_tokenizer)

    def seeded(seed: int) -> GenerateResult:
        return asyncio.run(tiny_engine.generate(prompt, SamplingParams(max_new_tokens=8, seed=seed)))

    assert seeded(7) == seeded(7)
    assert seeded(7).output_ids != seeded(8).output_ids
    # Without a per-request seed, the engine's seed fixes the whole stream of requests.
    runs = []
    for engine_seed in (11, 11, 12):
        engine = TransformersEngine(tiny_engine.model, tiny_engine.tokenizer, seed=engine_seed)
        runs.append([asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=8))).output_ids
                     for _ in range(2)])
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1] and runs[0] != runs[2]


def test_concurrent_requests_are_serialized_safely(tiny_engine: TransformersEngine, small_tokenizer: Any) -> None:
    prompt = chat_prompt(small_tokenizer)
    params = [SamplingParams(max_new_tokens=6, seed=s) for s in range(4)]

    async def together() -> list[GenerateResult]:
        return list(await asyncio.gather(*(tiny_engine.generate(prompt, p) for p in params)))

    assert asyncio.run(together()) == [asyncio.run(tiny_engine.generate(prompt, p)) for p in params]


def test_bad_prompts_are_refused_with_one_line_errors(tiny_engine: TransformersEngine) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        asyncio.run(tiny_engine.generate([], SamplingParams()))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        asyncio.run(tiny_engine.generate([tiny_engine.vocab_size], SamplingParams()))


def test_from_pretrained_dtype_casts_the_model(tiny_small_dir: Path) -> None:
    engine = TransformersEngine.from_pretrained(tiny_small_dir, dtype="bfloat16")
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown torch dtype"):
        TransformersEngine.from_pretrained(tiny_small_dir, dtype="float7")


# ---------------------------------------------------------------------------------------------------------------
# SGLangEngine against the loopback server


def fast_engine(base_url: str, **kwargs: Any) -> SGLangEngine:
    defaults: dict[str, Any] = dict(timeout_s=5.0, max_retries=3, backoff_base_s=0.001, backoff_max_s=0.01)
    return SGLangEngine(base_url, **{**defaults, **kwargs})


def generate_once(engine: SGLangEngine, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
    async def go() -> GenerateResult:
        try:
            return await engine.generate(input_ids, sampling)
        finally:
            await engine.aclose()

    return asyncio.run(go())


def test_request_body_follows_slime_and_sglang(loopback: LoopbackServer) -> None:
    generate_once(fast_engine(loopback.base_url), [5, 6, 7], SamplingParams(max_new_tokens=3, top_k=20, top_p=0.9,
                                                                           stop=("\n\n",), stop_token_ids=(2,)))
    generate_once(fast_engine(loopback.base_url), [5], SamplingParams(max_new_tokens=1, seed=9))
    (path, body), (_, seeded) = loopback.requests
    assert path == "/generate"
    assert body == {"input_ids": [5, 6, 7], "return_logprob": True, "sampling_params": {
        "temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_new_tokens": 3, "stop": ["\n\n"],
        "stop_token_ids": [2], "skip_special_tokens": False, "no_stop_trim": True,
        "spaces_between_special_tokens": False}}
    assert seeded["sampling_params"]["sampling_seed"] == 9


def test_sglang_engine_returns_what_the_model_sampled(loopback: LoopbackServer, tiny_engine: TransformersEngine,
                                                      small_tokenizer: Any) -> None:
    prompt, sampling = chat_prompt(small_tokenizer), SamplingParams(max_new_tokens=8, seed=21)
    over_http = generate_once(fast_engine(loopback.base_url), prompt, sampling)
    in_process = asyncio.run(tiny_engine.generate(prompt, sampling))
    assert dataclasses.replace(over_http, meta={}) == in_process  # ids and log-probs, bit for bit
    assert over_http.meta == {"prompt_tokens": len(prompt), "cached_tokens": 0, "weight_version": "default"}
    assert loopback.count("/generate") == 1


@pytest.mark.parametrize("fault", [Fault.ERROR_500, Fault.MALFORMED, Fault.DROP])
def test_transient_failures_are_retried(loopback: LoopbackServer, fault: Fault) -> None:
    loopback.faults.fail_next(2, fault)
    result = generate_once(fast_engine(loopback.base_url), [5, 6], SamplingParams(max_new_tokens=2, seed=1))
    assert len(result.output_ids) == len(result.output_logprobs) > 0
    assert loopback.count("/generate") == 3  # two failures, then the answer


def test_a_server_that_never_answers_raises_after_the_retries(tiny_engine: TransformersEngine) -> None:
    with LoopbackServer(tiny_engine, hang_s=30.0) as server:
        server.faults.fail_randomly(1.0, kinds=(Fault.HANG,))
        with pytest.raises(EngineError, match=r"failed after 3 attempts.*TimeoutError: no complete answer within 0.2 s") as err:
            generate_once(fast_engine(server.base_url, timeout_s=0.2, max_retries=2), [5], SamplingParams())
        assert err.value.attempts == 3 and server.base_url in str(err.value)
        assert server.count("/generate") == 3


def test_a_refused_request_is_not_retried(loopback: LoopbackServer, tiny_engine: TransformersEngine) -> None:
    with pytest.raises(EngineError, match="HTTP 400.*outside the vocabulary") as err:
        generate_once(fast_engine(loopback.base_url), [tiny_engine.vocab_size + 5], SamplingParams())
    assert err.value.attempts == 1 and loopback.count("/generate") == 1


def test_connection_refused_raises_after_the_retries() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(EngineError, match="ClientConnectorError: Cannot connect") as err:
        generate_once(fast_engine(url, max_retries=2), [5], SamplingParams())
    assert err.value.attempts == 3 and err.value.url == url + "/generate"


@pytest.mark.parametrize("max_in_flight", [1, 3])
def test_requests_in_flight_are_bounded(tiny_engine: TransformersEngine, max_in_flight: int) -> None:
    with LoopbackServer(tiny_engine, latency_s=0.1) as server:
        engine = fast_engine(server.base_url, max_in_flight=max_in_flight)

        async def burst() -> None:
            try:
                await asyncio.gather(*(engine.generate([5, 6], SamplingParams(max_new_tokens=1)) for _ in range(6)))
            finally:
                await engine.aclose()

        asyncio.run(burst())
        assert server.count("/generate") == 6
        assert server.max_concurrent == max_in_flight


def test_a_caller_supplied_session_is_used_and_left_open(loopback: LoopbackServer) -> None:
    sent: list[str] = []

    async def go() -> None:
        async def record(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
            sent.append(str(params.url))

        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(record)
        session = aiohttp.ClientSession(trace_configs=[trace])
        engine = SGLangEngine.from_router("127.0.0.1", loopback.port, session=session)
        await engine.generate([5], SamplingParams(max_new_tokens=1))
        await engine.aclose()
        assert not session.closed
        await session.close()

    asyncio.run(go())
    assert sent == [f"{loopback.base_url}/generate"]


def test_an_engine_closes_the_session_it_made(loopback: LoopbackServer) -> None:
    async def go() -> aiohttp.ClientSession:
        engine = fast_engine(loopback.base_url)
        await engine.generate([5], SamplingParams(max_new_tokens=1))
        session = engine._session
        await engine.aclose()
        return session

    assert asyncio.run(go()).closed


def test_engine_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="http"):
        SGLangEngine("127.0.0.1:30000")
    with pytest.raises(ValueError, match="max_in_flight"):
        SGLangEngine("http://127.0.0.1:1", max_in_flight=0)
    assert SGLangEngine.from_router("::1", 30000).url == "http://[::1]:30000/generate"


# ---------------------------------------------------------------------------------------------------------------
# Loopback server endpoints


def test_scripted_tokens_are_returned_with_real_logprobs(loopback: LoopbackServer, tiny_engine: TransformersEngine,
                                                         small_tokenizer: Any) -> None:
    prompt = chat_prompt(small_tokenizer)
    im_end = small_tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = small_tokenizer.encode("Sure, done.", add_special_tokens=False) + [im_end]
    loopback.script(answer + [7, 8, 9])  # tokens after <|im_end|> are never reached: sampling would have stopped
    body = httpx.post(loopback.base_url + "/generate", json={
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 20, "skip_special_tokens": False},
        "return_logprob": True}).json()
    meta = body["meta_info"]
    assert body["output_ids"] == answer and body["text"] == "Sure, done.<|im_end|>"
    assert meta["finish_reason"] == {"type": "stop", "matched": im_end}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (len(prompt), len(answer), 0)
    rows = teacher_forced_logits(tiny_engine.model, prompt, answer)
    expected = torch.log_softmax(rows, dim=-1).gather(1, torch.tensor(answer)[:, None]).squeeze(1)
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer
    assert torch.allclose(torch.tensor([entry[0] for entry in meta["output_token_logprobs"]]), expected, atol=1e-4)


def test_info_endpoints_and_logprobs_only_on_request(loopback: LoopbackServer) -> None:
    assert httpx.get(loopback.base_url + "/health").status_code == 200
    assert [m["id"] for m in httpx.get(loopback.base_url + "/v1/models").json()["data"]] == ["tiny"]
    assert httpx.get(loopback.base_url + "/get_model_info").json()["is_generation"] is True
    length = httpx.post(loopback.base_url + "/generate", json={"input_ids": [5], "sampling_params": {
        "max_new_tokens": 2, "stop_token_ids": []}}).json()
    assert "output_token_logprobs" not in length["meta_info"]  # only sent when return_logprob is asked for


def test_litellm_reaches_the_chat_endpoint(tiny_engine: TransformersEngine) -> None:
    import litellm

    with LoopbackServer(tiny_engine, default_max_tokens=4) as server:
        response = litellm.completion(
            model="openai/tiny", api_base=server.base_url + "/v1", api_key="EMPTY", seed=3,
            messages=[{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "Hi!"}],
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert isinstance(response.choices[0].message.content, str)
        assert response.usage.completion_tokens <= 4  # the server's default_max_tokens applied
        (path, body), = server.requests
        assert path == "/v1/chat/completions" and body["model"] == "tiny"


def test_qwen3_tool_calls_come_back_as_openai_tool_calls(loopback: LoopbackServer, small_tokenizer: Any) -> None:
    from openai import OpenAI  # the client litellm's "openai/" provider wraps

    call = '<tool_call>\n{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Meeting"}}\n</tool_call>'
    loopback.script(small_tokenizer.encode(call + "<|im_end|>", add_special_tokens=False))
    with OpenAI(base_url=loopback.base_url + "/v1", api_key="EMPTY") as client:
        response = client.chat.completions.create(model="tiny", tools=[MOCK_TOOL],  # type: ignore[list-item]
                                                  messages=[{"role": "user", "content": "Create it."}])
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None
    function = choice.message.tool_calls[0].function  # type: ignore[union-attr]
    assert function.name == "create_task"
    assert json.loads(function.arguments) == {"user_id": "user_1", "title": "Meeting"}
    assert loopback.requests[0][1]["tools"] == [MOCK_TOOL]


def test_litellm_with_tools_reaches_the_chat_endpoint(loopback: LoopbackServer) -> None:
    import litellm

    response = litellm.completion(model="openai/tiny", api_base=loopback.base_url + "/v1", api_key="EMPTY",
                                  max_tokens=2, messages=[{"role": "user", "content": "Create it."}],
                                  tools=[MOCK_TOOL])
    assert loopback.requests[0][1]["tools"] == [MOCK_TOOL]
    assert response.usage.completion_tokens <= 2


# ---------------------------------------------------------------------------------------------------------------
# Tiny tokenizer and model


def test_small_tokenizer_has_qwen3_markers_as_single_tokens(small_tokenizer: Any) -> None:
    for marker in SPECIAL_TOKENS + TOOL_TOKENS:
        assert len(small_tokenizer.encode(marker, add_special_tokens=False)) == 1, marker
    assert (small_tokenizer.eos_token, small_tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    ids = small_tokenizer.encode("<tool_call>\nx\n</tool_call><|im_end|>", add_special_tokens=False)
    # As in Qwen3, tool markers survive skip_special_tokens (a parser reads them) while <|im_end|> does not.
    assert small_tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\nx\n</tool_call>"


def test_vocab_size_sets_the_tokenizer_size(tmp_path: Path) -> None:
    corpus = domain_corpus(["mock"])
    sizes = [len(train_small_tokenizer(corpus, tmp_path / str(n), vocab_size=n)) for n in (300, 400)]
    assert sizes == [300, 400]
    with pytest.raises(ValueError, match="vocab_size"):
        train_small_tokenizer(corpus, tmp_path / "tiny", vocab_size=100)


def test_small_tokenizer_template_is_qwen3s_and_renders_tools(small_tokenizer: Any, qwen3_tokenizer: Any) -> None:
    assert small_tokenizer.chat_template == QWEN3_CHAT_TEMPLATE == qwen3_tokenizer.chat_template
    messages = [{"role": "user", "content": "Create it."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "create_task", "arguments": {"user_id": "u1"}}}]},
                {"role": "tool", "content": '{"task_id": "t1"}'}]
    rendered = [tok.apply_chat_template(messages, tools=[MOCK_TOOL], tokenize=False, add_generation_prompt=True)
                for tok in (small_tokenizer, qwen3_tokenizer)]
    assert rendered[0] == rendered[1]
    assert "<tools>\n" + json.dumps(MOCK_TOOL) + "\n</tools>" in rendered[0]
    assert '<tool_call>\n{"name": "create_task", "arguments": {"user_id": "u1"}}\n</tool_call>' in rendered[0]
    ids = small_tokenizer.encode(rendered[0], add_special_tokens=False)
    assert small_tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    assert small_tokenizer.decode(ids) == rendered[0]


def test_model_dir_round_trips_through_from_pretrained(tiny_small_dir: Path, small_tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_small_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_small_dir))
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(tokenizer) == len(small_tokenizer)
    assert tokenizer.chat_template == QWEN3_CHAT_TEMPLATE
    text = "<|im_start|>user\nhello<|im_end|>\n"
    assert tokenizer.encode(text) == small_tokenizer.encode(text)
    assert model.generation_config.eos_token_id == small_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_build_tiny_qwen3_settings_seed_and_cache(tmp_path: Path, small_tokenizer: Any) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    sizes = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=48,
                 max_position_embeddings=1024)
    first = build_tiny_qwen3(tmp_path / "a", small_tokenizer, seed=1, **sizes)
    config = AutoConfig.from_pretrained(str(first))
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.max_position_embeddings) == (32, 1, 2, 1, 48, 1024)
    weights = load_file(str(first / "model.safetensors"))
    twin = load_file(str(build_tiny_qwen3(tmp_path / "b", small_tokenizer, seed=1, **sizes) / "model.safetensors"))
    assert weights.keys() == twin.keys() and all(torch.equal(weights[k], twin[k]) for k in weights)

    written = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_qwen3(tmp_path / "a", small_tokenizer, seed=1, **sizes) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == written  # same spec: reused, not rebuilt
    build_tiny_qwen3(tmp_path / "a", small_tokenizer, seed=2, **sizes)  # new spec: rebuilt in place
    reseeded = load_file(str(first / "model.safetensors"))
    assert not torch.equal(reseeded["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])

    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="refusing"):
        build_tiny_qwen3(tmp_path / "foreign", small_tokenizer)
    with pytest.raises(ValueError, match="divide"):
        build_tiny_qwen3(tmp_path / "c", small_tokenizer, hidden_size=30, num_heads=4)


def test_domain_corpus_holds_policy_tools_scenarios_and_db() -> None:
    from tau2.registry import registry

    env = registry.get_env_constructor("mock")()
    corpus = domain_corpus(["mock"])
    assert corpus[0] == env.get_policy()
    assert json.dumps(env.get_tools()[0].openai_schema) in corpus
    assert any("Important Meeting" in text for text in corpus)  # a user scenario
    assert any('"name": "create_task", "arguments"' in text for text in corpus)  # a gold tool call
    assert corpus[-1] == env.tools.db.model_dump_json()


def test_router_addresses_are_bracketed_once_as_slime_stores_them() -> None:
    assert SGLangEngine.from_router("[::1]", 30000).url == "http://[::1]:30000/generate"  # slime's _wrap_ipv6 form
    assert SGLangEngine.from_router("fe80::2", 1).url == "http://[fe80::2]:1/generate"
    assert SGLangEngine.from_router("10.0.0.5", 1).url == "http://10.0.0.5:1/generate"


def test_top_p_replay_is_asked_for_and_read_as_lists_or_base64() -> None:
    import array
    import base64

    body = json.loads(sglang_generate_body([1, 2], SamplingParams(top_p=0.9, return_top_p=True)))
    assert body["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True}
    assert "custom_params" not in json.loads(sglang_generate_body([1], SamplingParams()))["sampling_params"]
    meta = {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None]],
            "top_p_token_ids": [7, 3, 8], "top_p_token_offsets": [0, 2, 3], "cached_tokens": 1, "id": "x"}
    result = parse_generate_response({"text": "", "meta_info": meta})
    assert (result.top_p.ids, result.top_p.offsets) == ([7, 3, 8], [0, 2, 3])
    assert result.meta == {"cached_tokens": 1}  # only what slime reads
    packed = {k: base64.b64encode(array.array("i", meta[k]).tobytes()).decode() for k in
              ("top_p_token_ids", "top_p_token_offsets")}
    assert parse_generate_response({"meta_info": {**meta, **packed}}).top_p == result.top_p
    with pytest.raises(ValueError, match="describe 1 tokens"):
        parse_generate_response({"meta_info": {**meta, "top_p_token_offsets": [0, 3], "top_p_token_ids": [1, 2, 3]}})
    with pytest.raises(ValueError, match="not both"):
        parse_generate_response({"meta_info": {**meta, "top_p_token_offsets": None}})


def test_loopback_top_p_nucleus_holds_each_sampled_token(loopback: LoopbackServer, small_tokenizer: Any) -> None:
    prompt = small_tokenizer.encode("hello there", add_special_tokens=False)
    sampling = SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=6, seed=3, return_top_p=True)

    async def go() -> GenerateResult:
        engine = SGLangEngine(loopback.base_url)
        try:
            return await engine.generate(prompt, sampling)
        finally:
            await engine.aclose()

    result = asyncio.run(go())
    spans = result.top_p
    assert len(spans) == len(result.output_ids)
    for i, token in enumerate(result.output_ids):
        kept = spans.ids[spans.offsets[i]:spans.offsets[i + 1]]
        assert token in kept and 0 < len(kept) < loopback.engine.vocab_size  # the nucleus, not the vocabulary


def test_loopback_abort_request_ends_generations_in_flight(loopback: LoopbackServer) -> None:
    """The request is answered when the abort comes, long before its latency would have let it (a bound far
    beyond what any machine's load adds, compared with the latency the abort cuts short)."""
    loopback.latency_s = 120.0

    async def go() -> tuple[GenerateResult, float]:
        engine = SGLangEngine(loopback.base_url)
        try:
            started = time.monotonic()
            pending = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
            while not loopback.max_generating:
                await asyncio.sleep(0.01)
            async with aiohttp.ClientSession() as http:
                await http.post(loopback.base_url + "/abort_request", json={"abort_all": True})
                async with http.get(loopback.base_url + "/v1/loads") as r:
                    assert (await r.json())["loads"][0]["num_running_reqs"] == 0
                async with http.get(loopback.base_url + "/workers") as r:
                    assert (await r.json())["workers"][0]["url"] == loopback.base_url
            return await pending, time.monotonic() - started
        finally:
            await engine.aclose()

    result, took = asyncio.run(go())
    assert result.finish_reason == "abort" and result.output_ids == [] and took < loopback.latency_s


def test_loopback_pause_aborts_what_is_in_flight_and_holds_what_comes_until_it_goes_on(loopback: LoopbackServer):
    """SGLang's weight-update endpoints as slime calls them: /pause_generation (mode abort) answers once every
    /generate in flight has returned with finish reason abort; a /generate sent while paused waits (the chat
    endpoint does not); /flush_cache is refused while a /generate runs; the new weight version comes with the
    update; /continue_generation lets the waiting request through, answered by the new version."""
    loopback.latency_s = 0.5
    loopback.weight_version = "1"

    async def go():
        engine = SGLangEngine(loopback.base_url)
        url = loopback.base_url
        try:
            cut = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
            while not loopback.max_generating:
                await asyncio.sleep(0.01)
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/flush_cache") as r:
                    assert r.status == 400  # a request is running
                async with http.post(url + "/pause_generation", json={}) as r:
                    assert r.status == 200
                assert (await cut).finish_reason == "abort" and (await cut).abort_error is None
                held = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2)))
                async with http.post(url + "/v1/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}) as r:
                    assert r.status == 200  # the user simulator's endpoint is never paused
                await asyncio.sleep(0.7)
                assert not held.done()
                async with http.get(url + "/flush_cache") as r:
                    assert r.status == 200
                async with http.post(url + "/update_weights_from_distributed", json={
                        "names": [], "dtypes": [], "shapes": [], "group_name": "g", "weight_version": "2"}) as r:
                    assert (await r.json())["success"] is True
                async with http.post(url + "/update_weights_from_distributed", json={"names": ["w"]}) as r:
                    assert r.status == 400  # no tensor can travel to this server
                async with http.post(url + "/pause_generation", json={"mode": "in_place"}) as r:
                    assert r.status == 400
                async with http.post(url + "/continue_generation", json={}) as r:
                    assert r.status == 200
                result = await held
            return cut.result(), result
        finally:
            await engine.aclose()

    cut, result = asyncio.run(go())
    assert cut.meta["weight_version"] == "1" and result.finish_reason in ("stop", "length")
    assert result.meta["weight_version"] == "2"


def test_cancelled_generations_stop_at_once_and_queued_ones_never_start(tiny_small_dir: Path) -> None:
    """Ctrl-C on a busy evaluation cancels every episode: the generation running stops at its next token and those
    waiting on the model's lock never start, so asyncio.run (which waits for its worker threads) returns at once
    instead of after every request in flight has run to its end. Without that, 6 x 1500 tokens here would be
    sampled; counted in forward passes, not timed, so a loaded machine does not change the verdict."""
    from transformers import AutoModelForCausalLM

    engine = TransformersEngine(AutoModelForCausalLM.from_pretrained(str(tiny_small_dir)), device="cpu", seed=0,
                                eos_token_ids=())  # never stops early: each request is long
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=1500)
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))

    async def busy_then_cancelled() -> list:
        tasks = [asyncio.create_task(engine.generate([1, 2, 3], sampling)) for _ in range(6)]
        while len(forwards) < 3:  # a generation is under way
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(busy_then_cancelled())  # returns once the worker threads have (asyncio.run waits)
    hook.remove()
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert len(forwards) < sampling.max_new_tokens  # not even one request ran to its end, let alone six
    whole = asyncio.run(engine.generate([1, 2, 3], dataclasses.replace(sampling, max_new_tokens=20)))
    assert len(whole.output_ids) == 20 and whole.finish_reason == "length"  # uncancelled requests are untouched
