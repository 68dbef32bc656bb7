"""Token-in/token-out rollout: token fidelity, masks, log-probs, truncation, retries and aborts."""

import asyncio
import threading
import time
from dataclasses import replace

import pytest
import torch
from support.loopback_server import Fault

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions
from tau2_rl_pipeline.benchmark.prompting import render
from tau2_rl_pipeline.benchmark.tasks import get_task, load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser, UserConfigError, make_user_factory
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.engines import GenerateResult, SamplingParams, SGLangEngine, TransformersEngine
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, COMPLETED, TRUNCATED, Driver, EpisodeSpec, run_episode

CFG = Tau2Config.from_env({})


class ChosenTextEngine:
    """Emits the canonical tokens of chosen assistant texts, one per call (the engine contract, nothing more)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.sampled: list[list[int]] = []

    async def generate(self, input_ids, sampling):
        text = self.texts.pop(0) + self.tokenizer.eos_token
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_new_tokens]
        self.sampled.append(ids)
        finish = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return GenerateResult(ids, [-0.25 - 0.01 * i for i in range(len(ids))], finish)


def _run(domain, task, engine, tokenizer, cfg=CFG, user=None, **sampling):
    user = user or ScriptedUser(task)
    return asyncio.run(run_episode(EpisodeSpec.from_config(domain, task, user, cfg),
                                   Driver.from_config(engine, tokenizer, SamplingParams(**sampling), cfg)))


def _check_books(traj, sampled):
    assert len(traj.loss_mask) == len(traj.rollout_logprobs) == traj.response_length
    policy = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m]
    assert policy == [t for ids in sampled for t in ids]
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, traj.loss_mask) if not m)


def _telecom_script(task):
    lookup = next(a for a in gold_actions(task) if a.requestor == "assistant")
    asks = [f"Please {' '.join(a.name.split('_')[1:])} on your phone." for a in gold_actions(task)
            if a.requestor == "user"]
    return [render_assistant_text("Let me look you up.", [(lookup.name, lookup.arguments)]), *asks,
            "Thanks, that should fix it."]


def test_canonical_multi_turn_episode_equals_the_chat_template_token_for_token(qwen3_tokenizer):
    task = next(t for t in load_tasks("telecom", "test")
                if {a.requestor for a in gold_actions(t)} == {"assistant", "user"})
    engine = ChosenTextEngine(qwen3_tokenizer, _telecom_script(task))
    traj = _run("telecom", task, engine, qwen3_tokenizer, temperature=1.0)
    assert traj.status == COMPLETED and traj.termination_reason == "user_stop"
    assert traj.reward == 1.0 and traj.turns == len(engine.sampled) >= 4
    roles = [m["role"] for m in traj.chat]
    assert roles.count("tool") >= 1 and roles.count("user") >= 3
    _check_books(traj, engine.sampled)
    rendered = render(qwen3_tokenizer, traj.chat, traj.tools, add_generation_prompt=False)
    expected = qwen3_tokenizer.encode(rendered, add_special_tokens=False)
    ours = traj.prompt_ids + traj.response_ids
    # sampling stops at <|im_end|>; the template then adds "\n" and the user's closing turn, which the policy
    # never conditions on, so the token stream ends there
    assert ours == expected[: len(ours)]
    assert qwen3_tokenizer.decode(expected[len(ours):]) == "\n<|im_start|>user\n###STOP###<|im_end|>\n"


def test_parse_errors_and_tool_errors_are_observations_in_the_token_stream(qwen3_tokenizer):
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    texts = ['<tool_call>{"name": "create_task", "arguments": </tool_call>',
             render_assistant_text("", [(action.name, action.arguments)]), final_message(task)]
    engine = ChosenTextEngine(qwen3_tokenizer, texts)
    traj = _run("mock", task, engine, qwen3_tokenizer)
    assert traj.parse_errors == 1 and traj.reward == 1.0 and traj.status == COMPLETED
    _check_books(traj, engine.sampled)
    tool_turns = [m["content"] for m in traj.chat if m["role"] == "tool"]
    assert tool_turns[0].startswith("Error in tool call #1")
    decoded = qwen3_tokenizer.decode(traj.response_ids)
    assert "<tool_response>\nError in tool call #1" in decoded


def test_random_model_keeps_sampled_ids_that_retokenizing_would_change(tiny_qwen3_dir, qwen3_tokenizer):
    engine = TransformersEngine.from_pretrained(tiny_qwen3_dir, seed=0)
    task = get_task("mock", "create_task_1")
    traj = _run("mock", task, engine, qwen3_tokenizer, max_new_tokens=24, seed=1)
    assert traj.status == TRUNCATED and traj.termination_reason == "max_new_tokens"
    sampled = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m]
    assert len(sampled) == 24 and traj.response_ids == sampled
    retokenized = qwen3_tokenizer.encode(qwen3_tokenizer.decode(sampled), add_special_tokens=False)
    assert retokenized != sampled  # re-tokenizing the text would train on ids the model never produced
    assert traj.reward == 0.0 and traj.reward_info is not None


def test_transformers_engine_logprobs_match_a_teacher_forced_pass(tiny_small_dir, small_tokenizer):
    engine = TransformersEngine.from_pretrained(tiny_small_dir, seed=0)
    task = get_task("mock", "create_task_1")
    cfg = replace(CFG, max_turns=3)
    stop = (small_tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    traj = _run("mock", task, engine, small_tokenizer, cfg, max_new_tokens=12, stop_token_ids=stop, seed=3)
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    start = len(traj.prompt_ids)
    checked = 0
    for i, (tok, m, lp) in enumerate(zip(traj.response_ids, traj.loss_mask, traj.rollout_logprobs)):
        if m:
            assert abs(logp[start + i - 1, tok].item() - lp) < 1e-4
            checked += 1
    assert checked == sum(traj.loss_mask) > 0


def _loopback_run(loopback, small_tokenizer, task, cfg=CFG, engine=None, **sampling):
    engine = engine or SGLangEngine(loopback.base_url, max_retries=3, backoff_base_s=0.01, backoff_max_s=0.02,
                                    timeout_s=5.0)
    sampling.setdefault("stop_token_ids", (small_tokenizer.eos_token_id,))
    return _run("mock", task, engine, small_tokenizer, cfg, **sampling)


def _canonical(tokenizer, text):
    return tokenizer.encode(text + tokenizer.eos_token, add_special_tokens=False)


def test_loopback_episode_completes_and_scores(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    loopback.script(_canonical(small_tokenizer, render_assistant_text("", [(action.name, action.arguments)])),
                    _canonical(small_tokenizer, final_message(task)))
    traj = _loopback_run(loopback, small_tokenizer, task)
    assert traj.status == COMPLETED and traj.reward == 1.0 and traj.turns == 2
    body = loopback.requests[0][1]
    assert body["return_logprob"] is True and body["input_ids"] == traj.prompt_ids
    assert all(lp <= 0.0 for lp in traj.rollout_logprobs) and any(lp < 0.0 for lp in traj.rollout_logprobs)


def test_loopback_turn_cut_by_max_new_tokens_is_truncated(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    loopback.script(_canonical(small_tokenizer, "a rather long reply " * 10))
    traj = _loopback_run(loopback, small_tokenizer, task, max_new_tokens=5)
    assert traj.status == TRUNCATED and traj.termination_reason == "max_new_tokens"
    assert traj.response_length == 5 and traj.reward == 0.0


def test_context_budget_truncates(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    probe = _loopback_run(loopback, small_tokenizer, task, max_new_tokens=1)
    cfg = replace(CFG, max_context_len=len(probe.prompt_ids) + 3)
    # a reply longer than the 3 tokens left (a sampled one could end in EOS within them, and the episode with it)
    loopback.script(_canonical(small_tokenizer, "a rather long reply " * 10))
    traj = _loopback_run(loopback, small_tokenizer, task, cfg, max_new_tokens=50)
    assert traj.status == TRUNCATED and traj.termination_reason == "max_context_len"
    assert len(traj.prompt_ids) + traj.response_length <= cfg.max_context_len


def test_max_turns_truncates(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    loopback.script(*[_canonical(small_tokenizer, "<tool_call>{bad</tool_call>")] * 3)
    traj = _loopback_run(loopback, small_tokenizer, task, replace(CFG, max_turns=2))
    assert traj.status == TRUNCATED and traj.termination_reason == "max_turns" and traj.turns == 2


def test_server_failing_twice_is_retried_and_the_episode_completes(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    loopback.faults.fail_next(2, Fault.ERROR_500)
    loopback.script(_canonical(small_tokenizer, render_assistant_text("", [(action.name, action.arguments)])),
                    _canonical(small_tokenizer, final_message(task)))
    traj = _loopback_run(loopback, small_tokenizer, task)
    assert traj.status == COMPLETED and traj.reward == 1.0
    assert loopback.count("/generate") == 4  # two failures, then one answer per turn


def test_server_that_never_answers_aborts_the_episode_unscored(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    loopback.faults.fail_next(100, Fault.ERROR_500)
    traj = _loopback_run(loopback, small_tokenizer, task)
    assert traj.status == ABORTED and traj.termination_reason == "engine_error"
    assert traj.reward_info is None and "500" in traj.error and "4 attempts" in traj.error


def test_closed_port_aborts_with_the_error_recorded(small_tokenizer):
    task = get_task("mock", "create_task_1")
    engine = SGLangEngine("http://127.0.0.1:9", max_retries=1, backoff_base_s=0.01, timeout_s=1.0)
    traj = _run("mock", task, engine, small_tokenizer, stop_token_ids=(small_tokenizer.eos_token_id,))
    assert traj.status == ABORTED and traj.reward_info is None and "127.0.0.1:9" in traj.error


@pytest.mark.parametrize("n", [8])
def test_many_episodes_in_flight_on_one_loop(loopback, small_tokenizer, n):
    tasks = load_tasks("mock", "base")[:n]
    engine = SGLangEngine(loopback.base_url, max_in_flight=4)

    async def main():
        return await asyncio.gather(*[
            run_episode(EpisodeSpec.from_config("mock", t, ScriptedUser(t), CFG), Driver.from_config(
                engine, small_tokenizer,
                SamplingParams(max_new_tokens=6, stop_token_ids=(small_tokenizer.eos_token_id,)), CFG))
            for t in tasks])

    trajs = asyncio.run(main())
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    assert all(t.status in (COMPLETED, TRUNCATED) for t in trajs)
    assert loopback.max_concurrent <= 4


def test_each_turn_samples_with_its_own_seed(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    loopback.script(*[_canonical(small_tokenizer, "<tool_call>{bad</tool_call>")] * 3)
    _loopback_run(loopback, small_tokenizer, task, replace(CFG, max_turns=3), seed=7)
    seeds = [body["sampling_params"].get("sampling_seed") for path, body in loopback.requests if path == "/generate"]
    assert len(seeds) == 3 and len(set(seeds)) == 3 and None not in seeds


@pytest.mark.parametrize("fast", [True, False])
def test_fast_env_setting_picks_the_environments_and_keeps_the_reward(qwen3_tokenizer, monkeypatch, fast):
    import tau2_rl_pipeline.benchmark.episode as env_module

    built = []
    real = env_module.build_environment
    monkeypatch.setattr(env_module, "build_environment", lambda d, f=False, **kw: built.append(f) or real(d, f, **kw))
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    engine = ChosenTextEngine(qwen3_tokenizer, [render_assistant_text("", [(action.name, action.arguments)]),
                                                final_message(task)])
    traj = _run("mock", task, engine, qwen3_tokenizer, Tau2Config.from_env({"TAU2_FAST_ENV": str(fast)}))
    assert built == [fast] and traj.reward == 1.0


class ThreadNotingUser(ScriptedUser):
    """The scripted user, noting the thread each of its replies is made on."""

    def __init__(self, task):
        super().__init__(task)
        self.threads: list[str] = []

    def generate_next_message(self, message, state):
        self.threads.append(threading.current_thread().name)
        return super().generate_next_message(message, state)


@pytest.mark.parametrize("workers,fast_env,on_threads", [(0, True, False), (2, True, True), (-1, True, False),
                                                       (-1, False, True)])
def test_episode_workers_zero_runs_episode_work_on_the_event_loop(qwen3_tokenizer, workers, fast_env, on_threads):
    """0 on the loop, N on threads; auto (-1, the default) on the loop for the scripted user with fast_env, on
    threads with tau2's native environments."""
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    engine = ChosenTextEngine(qwen3_tokenizer, [render_assistant_text("", [(action.name, action.arguments)]),
                                                final_message(task)])
    user = ThreadNotingUser(task)
    cfg = Tau2Config.from_env({"TAU2_EPISODE_WORKERS": str(workers), "TAU2_FAST_ENV": str(fast_env).lower()})
    traj = _run("mock", task, engine, qwen3_tokenizer, cfg, user=user)
    assert traj.status == COMPLETED and traj.reward == 1.0 and len(user.threads) >= 2
    if on_threads:
        assert all(name.startswith("tau2-episode") for name in user.threads)
    else:
        assert set(user.threads) == {threading.main_thread().name}  # asyncio.run's loop runs on this thread


def test_auto_episode_workers_give_threads_only_where_a_user_turn_blocks(monkeypatch):
    from tau2.user.user_simulator import UserSimulator

    from tau2_rl_pipeline.rollout import episode_loop as rollout
    from tau2_rl_pipeline.rollout.episode_loop import AUTO_WORKERS, episode_threads, user_blocks

    monkeypatch.setattr(rollout, "has_fast_path", lambda domain: domain != "banking_knowledge")  # as on 1.0.1

    auto = Tau2Config.from_env({})
    assert auto.episode_workers == -1
    litellm_user = UserSimulator(instructions="x", llm="gpt-4.1", llm_args={})
    assert user_blocks(litellm_user) and not user_blocks(ScriptedUser(get_task("mock", "create_task_1")))
    assert not user_blocks(None)
    mock = ("mock",)
    assert episode_threads(auto.episode_workers, auto.fast_env, True, mock) == AUTO_WORKERS
    assert episode_threads(auto.episode_workers, auto.fast_env, False, mock) == 0
    assert episode_threads(auto.episode_workers, auto.fast_env, False,
                           ("mock", "banking_knowledge")) == AUTO_WORKERS  # no fast path there
    assert episode_threads(auto.episode_workers, False, False, mock) == AUTO_WORKERS
    assert episode_threads(3, auto.fast_env, False, mock) == 3
    assert episode_threads(0, auto.fast_env, True, mock) == 0  # as set (litellm refuses it)
    # the LLM user factory says which: litellm blocks, the async client does not
    assert make_user_factory("llm", Tau2Config.from_env({}, user_api_base="http://x:1/v1")).blocks
    assert not make_user_factory("llm", Tau2Config.from_env({}, user_api_base="http://x:1/v1",
                                                            user_model="openai/tiny")).blocks


def test_the_llm_user_refuses_episode_work_on_the_event_loop():
    with pytest.raises(UserConfigError, match="TAU2_EPISODE_WORKERS=0"):
        make_user_factory("llm", Tau2Config.from_env({"TAU2_EPISODE_WORKERS": "0"}, user_api_base="http://x:1/v1"))


@pytest.mark.parametrize("paced", [True, False])
def test_checkpoint_lets_the_loop_poll_timers_between_slices_of_episode_work(paced):
    """50 episodes with a burst of inline work each: at checkpoints, a due timer runs after about one slice."""
    from tau2_rl_pipeline.rollout import episode_loop as rollout

    chunk_s = rollout.SLICE_S / 2

    async def burst() -> int:
        done = 0

        async def episode() -> None:
            nonlocal done
            for _ in range(4):
                if paced:
                    await rollout.checkpoint()
                end = time.perf_counter() + chunk_s
                while time.perf_counter() < end:  # a stretch of blocking episode work
                    pass
                done += 1

        fired = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.001, lambda: fired.set_result(done))
        await asyncio.gather(*(episode() for _ in range(50)))
        return fired.result()

    chunks_before_the_timer = asyncio.run(burst())
    if paced:
        assert chunks_before_the_timer <= 8  # about a slice of work (two chunks), then the timer
    else:
        assert chunks_before_the_timer >= 50  # every episode's first stretch held the loop first


def test_a_top_p_episode_books_a_nucleus_per_policy_token_and_none_per_observation(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    first = _canonical(small_tokenizer, render_assistant_text("", [(action.name, action.arguments)]))
    loopback.responder = lambda path, ids: first if loopback.count("/generate") == 1 else None  # then: sampled
    traj = _loopback_run(loopback, small_tokenizer, task, top_p=0.8, return_top_p=True, max_new_tokens=len(first) + 4)
    assert traj.turns == 2 and len(traj.top_p) == traj.response_length
    spans = [traj.top_p.ids[a:b] for a, b in zip(traj.top_p.offsets, traj.top_p.offsets[1:])]
    sampled = [i for i, m in enumerate(traj.loss_mask) if m and i >= len(first)]
    assert all(kept == [] for kept, m in zip(spans, traj.loss_mask) if not m)  # observations: no nucleus
    assert all(spans[i] for i in range(len(first)))  # the scripted turn: its nucleus at each position
    assert all(traj.response_ids[i] in spans[i] for i in sampled)  # sampled tokens: drawn from their nucleus
    assert [m["weight_version"] for m in traj.turn_meta] == ["default", "default"]
    assert traj.turn_meta[1]["cached_tokens"] >= len(traj.prompt_ids)  # the second turn reuses the first prompt
    assert _loopback_run(loopback, small_tokenizer, task).top_p is None  # not asked for: not kept


def test_stop_requested_ends_the_episode_before_its_next_turn(loopback, small_tokenizer):
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    loopback.script(_canonical(small_tokenizer, render_assistant_text("", [(action.name, action.arguments)])))
    engine = SGLangEngine(loopback.base_url)
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) > 1  # the rollout is stopped after the first turn

    sampling = SamplingParams(max_new_tokens=64, stop_token_ids=(small_tokenizer.eos_token_id,))
    traj = asyncio.run(run_episode(EpisodeSpec.from_config("mock", task, ScriptedUser(task), CFG),
                                   Driver.from_config(engine, small_tokenizer, sampling, CFG), stop_requested=stop))
    assert traj.status == ABORTED and traj.termination_reason == "rollout_stopped" and traj.turns == 1
    assert traj.reward_info is None and loopback.count("/generate") == 1
