"""slime's own rollout code (624b824) drives the plug-ins: `generate_rollout` (and the fully asynchronous rollout)
calls tau2_rl_pipeline.slime_plugins.adapter.generate against the loopback server (SGLang's HTTP contract, a real tiny
model) with tau2's LLM user on its OpenAI-compatible chat endpoint (the user client TAU2_USER_CLIENT picks: the
asynchronous one for a served model, as at scale), and slime's RolloutManager turns what comes back into train
data. Every fault found by running slime for real has a test here that failed on the earlier adapter."""

from __future__ import annotations

import gc
import json
import re

import pytest
from slime_harness import FILTER, LOG, flat, prompt_rows, reset_slime, rollout, slime_args, train_data
from support.loopback_server import Fault, LoopbackServer

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.rollout import gc_policy
from tau2_rl_pipeline.slime_plugins.adapter import in_flight_cap

STOP = "###STOP###"
ASYNC_ROLLOUT = "tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async"


class Script:
    """Deterministic policy and user: the policy calls the task's gold tool, then confirms; the user states
    which task it is, then stops once the agent has confirmed. `tool_ids` and `done_ids` are the policy's two
    turns (ids with their end-of-turn)."""

    def __init__(self, tokenizer, *, tool_call: bool = True, user_stops: bool = True, long_tasks=()):
        self.tok = tokenizer
        self.tool_call, self.user_stops, self.long_tasks = tool_call, user_stops, set(long_tasks)
        self.scenarios = {t.id: str(t.user_scenario.instructions) for t in load_tasks("mock", "base")}
        self.tool_ids = self.ids(render_assistant_text("", [("create_task", {"user_id": "user_1",
                                                                             "title": "Important Meeting"})]))
        self.done_ids = self.ids("Done.")

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text + self.tok.eos_token, add_special_tokens=False)

    def __call__(self, path: str, input_ids: list[int]) -> list[int]:
        text = self.tok.decode(input_ids, skip_special_tokens=False)
        if path == "/v1/chat/completions":
            if text.count("<|im_start|>assistant") <= 1:  # the user's first message (the agent greeted)
                task = next((tid for tid, s in self.scenarios.items() if s in text), "unknown")
                return self.ids(f"Hello, this is about {task}.")
            task = next((m for m in re.findall(r"this is about (\S+)\.", text)), "")
            stops = self.user_stops and task.rstrip(".") not in self.long_tasks and "Done" in text
            return self.ids(STOP if stops else "Please go on.")
        return self.tool_ids if self.tool_call and "<tool_response>" not in text else self.done_ids


def _policy_ids(sample) -> list[int]:
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    return [t for t, m in zip(response, sample.loss_mask) if m]


def test_successful_episodes_train_exactly_the_policys_sampled_turns(slime_env, loopback, tiny_small_dir,
                                                                     small_tokenizer, tmp_path):
    from slime.observability.rollout_metrics import compute_metrics_from_samples
    from slime.utils.types import Sample

    loopback.responder = script = Script(small_tokenizer)
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2)
    gc_before = (gc.get_freeze_count(), gc.get_threshold())
    output, _ = rollout(args)
    samples = flat(output.samples)
    assert [s.status for s in samples] == [Sample.Status.COMPLETED] * 2
    for s in samples:
        assert s.metadata["raw_reward"] == 1.0 and s.metadata["termination_reason"] == "user_stop"
        turns = s.metadata["turns"]
        assert _policy_ids(s) == script.tool_ids + script.done_ids  # exactly the two sampled turns
        assert s.weight_versions == ["default"] * turns
        assert s.prefix_cache_info.cached_tokens > 0  # every turn after the first shares its prefix
    data = train_data(args, samples)
    assert [sum(m) for m in data["loss_masks"]] == [len(_policy_ids(s)) for s in samples]
    assert data["raw_reward"] == [1.0, 1.0]
    json.dumps([s.metadata for s in samples])  # slime logs and ships metadata
    # slime's actor is slime's process: the GC policy is opt-in there (TAU2_SLIME_GC_POLICY), its collector untouched
    assert (gc.get_freeze_count(), gc.get_threshold()) == gc_before
    chats = [body for path, body in loopback.requests if path == "/v1/chat/completions"]
    assert chats[0]["model"] == "tiny"  # tau2's LLM user, the provider prefix stripped as litellm's openai/ route does
    assert any(m["role"] == "system" for m in chats[0]["messages"])  # tau2's user-simulator prompt
    first = next(body for path, body in loopback.requests if path == "/generate")
    assert first["input_ids"] == samples[0].tokens[:len(first["input_ids"])]
    assert small_tokenizer.eos_token_id in first["sampling_params"]["stop_token_ids"]
    metrics = compute_metrics_from_samples(args, samples)
    assert 0.0 < metrics["prefix_cache_hit_rate"] < 1.0  # was 0: meta_info never reached the Sample


def test_truncated_turns_and_failing_servers(slime_env, monkeypatch, loopback, tiny_small_dir, tmp_path):
    from slime.utils.types import Sample

    rows = prompt_rows(tmp_path / "p.jsonl", ["create_task_1"])
    router = loopback.base_url.removeprefix("http://")
    args = slime_args(tiny_small_dir, rows, router, batch=1, n=2, extra=("--rollout-max-response-len", "2"))
    samples = flat(rollout(args)[0].samples)  # a random model never ends a turn within 2 tokens
    assert {s.status for s in samples} == {Sample.Status.TRUNCATED}
    assert train_data(args, samples)["truncated"] == [1, 1]

    reset_slime()
    monkeypatch.setenv("TAU2_ENGINE_MAX_RETRIES", "0")
    with LoopbackServer(loopback.engine) as failing:
        failing.faults.fail_randomly(1.0, kinds=(Fault.ERROR_500,))
        args = slime_args(tiny_small_dir, rows, failing.base_url.removeprefix("http://"), batch=1, n=2)
        samples = flat(rollout(args)[0].samples)
    assert {s.status for s in samples} == {Sample.Status.ABORTED}
    assert all(s.remove_sample and "HTTP 500" in s.metadata["error"] for s in samples)
    assert all(sum(m) == 0 for m in train_data(args, samples)["loss_masks"])


def test_top_p_below_one_fills_slimes_top_p_replay(slime_env, loopback, tiny_small_dir, tmp_path):
    """--rollout-top-p < 1 makes slime ask for each token's nucleus and assert on it before training."""
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2, extra=("--rollout-top-p", "0.9"))
    samples = flat(rollout(args)[0].samples)
    data = train_data(args, samples)  # slime's own length and offset checks
    assert len(data["rollout_top_p_token_ids"]) == 2
    for s in samples:
        response = s.tokens[len(s.tokens) - s.response_length:]
        offsets = list(s.rollout_top_p_token_offsets)
        for i, (token, trained) in enumerate(zip(response, s.loss_mask)):
            kept = list(s.rollout_top_p_token_ids[offsets[i]:offsets[i + 1]])
            assert (token in kept) if trained else kept == []  # sampled among its nucleus; observations: none


def test_an_ipv6_router_address_as_slime_stores_it(slime_env, monkeypatch, loopback, tiny_small_dir, small_tokenizer,
                                                   tmp_path):
    from slime.utils.http_utils import _wrap_ipv6

    monkeypatch.setenv("TAU2_SLIME_GC_POLICY", "1")  # opted in: the actor's first episode settles its heap

    with LoopbackServer(loopback.engine, host="::1") as server6:
        server6.responder = loopback.responder = Script(small_tokenizer)
        router = f"{_wrap_ipv6('::1')}:{server6.port}"  # "[::1]:port", bracketed by slime itself
        args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]), router, batch=1)
        samples = flat(rollout(args)[0].samples)
    assert [s.metadata["episode_status"] for s in samples] == ["completed", "completed"]  # not aborted
    assert server6.count("/generate") >= 4
    assert gc.get_freeze_count() > 0 and gc.get_threshold()[2] == gc_policy.FULL_PASS_EVERY


@pytest.mark.parametrize("keep_when_insufficient", [False, True])
def test_filter_drops_are_counted_by_slime_with_their_reason(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                            small_tokenizer, tmp_path, keep_when_insufficient):
    """update_task_1 always fails under this script (no signal), create_task_1 succeeds on some samples only."""
    monkeypatch.setenv("TAU2_FILTER_KEEP_WHEN_INSUFFICIENT", str(int(keep_when_insufficient)))
    monkeypatch.setenv("TAU2_FILTER_ZERO_STD", "1")
    script = Script(small_tokenizer)
    calls = {"n": 0}

    def alternate(path, input_ids):
        text = small_tokenizer.decode(input_ids, skip_special_tokens=False)
        if path == "/generate" and "<tool_response>" not in text:
            calls["n"] += 1
            if "update_task_1" in text or calls["n"] % 2:  # fail: never call the tool
                return script.ids("Done.")
        return script(path, input_ids)

    loopback.responder = alternate
    rows = tmp_path / "p.jsonl"
    lines = prompt_rows(tmp_path / "all.jsonl", ["update_task_1", "create_task_1"]).read_text().splitlines()
    rows.write_text("\n".join(sorted(lines, key=lambda r: "create" in r)) + "\n")  # the group without signal first
    args = slime_args(tiny_small_dir, rows, loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--dynamic-sampling-filter-path", FILTER))
    output, _ = rollout(args)
    (group,) = output.samples
    if keep_when_insufficient:  # dropping it would leave the batch short: kept, no second round
        assert group[0].metadata["task_id"] == "update_task_1" and output.metrics == {}
    else:
        assert group[0].metadata["task_id"] == "create_task_1"
        assert output.metrics == {"rollout/dynamic_filter/drop_zero_std": 1}  # was {}: a bare bool has no reason


def test_a_group_whose_samples_all_aborted_never_takes_a_batch_slot(slime_env, monkeypatch, loopback,
                                                                    tiny_small_dir, small_tokenizer, tmp_path):
    """Over-sampling 2 for a batch of 1, the zero-spread filter off (the default), the filter installed as
    scripts/train_grpo.sh installs it: the first group's episodes fail at once (its two first model calls, HTTP 500,
    no retry) and it finishes first. slime drops it with the reason all_aborted, counts it, and the healthy group
    fills the batch (before, the all-aborted group took the slot and the healthy one was thrown away)."""
    monkeypatch.setenv("TAU2_ENGINE_MAX_RETRIES", "0")
    loopback.responder = Script(small_tokenizer)
    loopback.faults.fail_next(2, Fault.ERROR_500)
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1", "update_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--over-sampling-batch-size", "2", "--sglang-server-concurrency", "1",
                             "--dynamic-sampling-filter-path", FILTER))
    output, _ = rollout(args)
    (group,) = output.samples
    assert [s.status.name for s in group] == ["COMPLETED", "COMPLETED"]
    assert output.metrics == {"rollout/dynamic_filter/drop_all_aborted": 1}


def test_an_aborted_sample_trains_nothing_and_is_logged_apart(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                              small_tokenizer, tmp_path):
    """One sample of the group aborts (its first model call fails), the other succeeds: the aborted one's books
    hold an all-0 mask on the Sample, slime's logged raw reward is the scored sample's (1.0, was 0.5), and slime's
    rollout log counts the abort apart (the project's --custom-rollout-log-function-path)."""
    from slime.observability import logging_utils
    from slime.observability.rollout_metrics import log_rollout_data

    monkeypatch.setenv("TAU2_ENGINE_MAX_RETRIES", "0")
    loopback.responder = Script(small_tokenizer)
    loopback.faults.fail_next(1, Fault.ERROR_500)
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--sglang-server-concurrency", "1", "--dynamic-sampling-filter-path", FILTER,
                             "--custom-rollout-log-function-path", LOG))
    output, _ = rollout(args)
    aborted, scored = flat(output.samples)
    assert (aborted.status.name, scored.status.name) == ("ABORTED", "COMPLETED")
    assert aborted.loss_mask and set(aborted.loss_mask) == {0}  # on the Sample itself, before slime builds data
    logged = []
    monkeypatch.setattr(logging_utils, "log", lambda args, log_dict, step_key: logged.append(log_dict))
    log_rollout_data(0, args, [aborted, scored], output.metrics, 1.0)  # slime's RolloutManager does this
    assert logged[0]["rollout/aborted_samples"] == 1 and logged[0]["rollout/aborted_fraction"] == 0.5
    data = train_data(args, [aborted, scored])
    assert data["raw_reward"] == [1.0, 1.0]  # what slime averages into rollout/raw_reward (was [0.0, 1.0])
    assert data["loss_masks"][0] == aborted.loss_mask and sum(data["loss_masks"][1]) > 0
    assert aborted.metadata["episode_status"] == "aborted" and aborted.reward == 0.0


def test_requests_in_flight_are_capped_as_slime_caps_them(slime_env, loopback, tiny_small_dir, tmp_path):
    """slime bounds generate calls at --sglang-server-concurrency per rollout engine (4 GPUs, TP1: 4 engines)."""
    loopback.latency_s = 0.3
    tasks = ["create_task_1", "update_task_1", "impossible_task_1", "create_task_1_nl_eval"]
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", tasks),
                      loopback.base_url.removeprefix("http://"), batch=4, n=4,
                      extra=("--sglang-server-concurrency", "2", "--rollout-num-gpus", "4",
                             "--rollout-max-response-len", "2"))
    assert in_flight_cap(args) == 8
    rollout(args)
    assert 2 < loopback.max_generating <= 8  # was at most 2: a quarter of what slime allows


def test_no_new_turns_after_slimes_end_of_rollout_abort(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                        small_tokenizer, tmp_path):
    """Over-sampling: the first group to finish fills the batch, slime aborts the rest; they must stop there."""
    monkeypatch.setenv("TAU2_MAX_TURNS", "8")
    loopback.latency_s = 0.15
    loopback.responder = Script(small_tokenizer, tool_call=False, long_tasks={"update_task_1", "impossible_task_1"})
    rows = prompt_rows(tmp_path / "p.jsonl", ["create_task_1", "update_task_1", "impossible_task_1"])
    args = slime_args(tiny_small_dir, rows, loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--over-sampling-batch-size", "3"))
    output, _ = rollout(args)
    assert flat(output.samples)[0].metadata["task_id"] == "create_task_1"
    aborted_at = next(t for (path, _), t in zip(loopback.requests, loopback.request_times) if path == "/abort_request")
    late = [p for (p, _), t in zip(loopback.requests, loopback.request_times) if p == "/generate" and t > aborted_at]
    assert late == []  # was several: episodes between turns kept sending requests to the end


def test_an_abort_storm_stops_the_run_with_the_first_error(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                           tmp_path):
    from tau2_rl_pipeline.rollout.abort_storm import AbortStorm

    monkeypatch.setenv("TAU2_ENGINE_MAX_RETRIES", "0")
    monkeypatch.setenv("TAU2_ABORT_STORM_PATIENCE", "1")
    rows = prompt_rows(tmp_path / "p.jsonl", ["create_task_1"])
    with LoopbackServer(loopback.engine) as policy:  # the router answers, its workers refuse every request
        policy.faults.fail_randomly(1.0, kinds=(Fault.ERROR_500,))
        args = slime_args(tiny_small_dir, rows, policy.base_url.removeprefix("http://"), batch=1, n=2)
        output, source = rollout(args, 0)  # one storm rollout is tolerated (patience 1) ...
        assert all(s.remove_sample for s in flat(output.samples))
        with pytest.raises(AbortStorm) as stopped:
            rollout(args, 1, source)  # ... the second in a row stops the run
    message = str(stopped.value)
    assert "\n" not in message and "2 windows in a row of 2 finished episodes (one rollout's worth each)" in message
    assert message.count("attempts") == 1, message  # was twice: "failed after 1 attempts; ... (after 1 attempts)"
    assert policy.base_url in message and "HTTP 500" in message


def test_fully_async_rollout_calls_our_generate_and_trains_on_it(slime_env, loopback, tiny_small_dir,
                                                                 small_tokenizer, tmp_path):
    from slime.utils.types import Sample

    loopback.responder = Script(small_tokenizer)
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--rollout-function-path", ASYNC_ROLLOUT, "--sglang-server-concurrency", "1",
                             "--partial-rollout", "--mask-offpolicy-in-partial-rollout", "--use-tis"))
    groups, _ = rollout(args)
    samples = flat(groups)
    assert [s.status for s in samples] == [Sample.Status.COMPLETED] * 2
    assert all(s.weight_versions and set(s.weight_versions) == {"default"} for s in samples)
    data = train_data(args, samples)
    assert data["rollout_log_probs"] == [s.rollout_log_probs for s in samples]  # what --use-tis reads


def test_an_abort_storm_stops_the_fully_async_rollout_too(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                          tmp_path):
    """slime's async worker drops a group whose generate raised; the project's rollout function stops instead of
    waiting for groups that never come."""
    from tau2_rl_pipeline.rollout.abort_storm import AbortStorm

    monkeypatch.setenv("TAU2_ENGINE_MAX_RETRIES", "0")
    monkeypatch.setenv("TAU2_ABORT_STORM_PATIENCE", "0")
    with LoopbackServer(loopback.engine) as policy:
        policy.faults.fail_randomly(1.0, kinds=(Fault.ERROR_500,))
        args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                          policy.base_url.removeprefix("http://"), batch=1, n=2,
                          extra=("--rollout-function-path", ASYNC_ROLLOUT, "--sglang-server-concurrency", "1",
                                 "--use-tis"))
        with pytest.raises(AbortStorm, match="HTTP 500"):  # raised, not waited for: a wait is pytest's timeout
            rollout(args)
        reset_slime()  # the worker stops while the server is still up


ROLLOUT_LOG = "tau2_rl_pipeline.slime_plugins.rollout_log.log_rollout_data"


@pytest.mark.parametrize("extra_metrics", [True, False], ids=["sync-rollout", "bare-list-rollout"])
def test_behaviour_monitors_are_logged_by_slimes_own_rollout_logging(extra_metrics, slime_env, monkeypatch, loopback,
                                                                     tiny_small_dir, small_tokenizer, tmp_path):
    """slime's real log_rollout_data (what RolloutManager.generate calls after each rollout) with our log function
    (--custom-rollout-log-function-path, as scripts/train_grpo.sh passes it): the monitors land in the row slime
    logs with compute_metrics_from_samples' rollout/* keys; with no extra-metrics dict (slime's fully async rollout
    returns a bare list) they go out at the same rollout/step on their own."""
    from slime.observability import logging_utils
    from slime.observability.rollout_metrics import log_rollout_data

    loopback.responder = Script(small_tokenizer)  # gold create_task, then "Done."; the user stops
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--custom-rollout-log-function-path", ROLLOUT_LOG))
    output, _ = rollout(args)
    samples = flat(output.samples)
    assert [s.metadata["monitors"]["tool_calls"] for s in samples] == [1, 1]
    rows: list[dict] = []
    monkeypatch.setattr(logging_utils, "log", lambda args, metrics, step_key: rows.append(dict(metrics)))
    log_rollout_data(0, args, samples, output.metrics if extra_metrics else None, 1.0)
    logged = {k: v for row in rows for k, v in row.items()}
    assert len(rows) == (1 if extra_metrics else 2) and all(row["rollout/step"] == 0 for row in rows)
    assert logged["rollout/monitor/episodes"] == 2.0
    assert logged["rollout/monitor/tool_calls_mean"] == 1.0 and logged["rollout/monitor/over_actions_mean"] == 0.0
    assert logged["rollout/monitor/user_ended_share"] == 1.0 and logged["rollout/monitor/transfer_share"] == 0.0
    assert logged["rollout/monitor/successes_without_action_check_share"] == 1.0  # create_task_1: DB + COMMUNICATE
    assert logged["rollout/user_monitor/episodes"] == 2.0 and logged["rollout/user_monitor/user_turns_mean"] >= 1.0
    # the double's user says "this is about create_task_1": an identifier its scenario does not hold, flagged
    assert logged["rollout/user_monitor/user_wrong_facts_share"] == 1.0 == logged["rollout/user_monitor/user_flagged_share"]
    assert logged["rollout/user_monitor/user_empty_share"] == 0.0 == logged["rollout/user_monitor/user_echo_share"]
    assert "rollout/prefix_cache_hit_rate" in logged  # slime's compute_metrics_from_samples, beside ours
    if extra_metrics:
        assert "rollout/prefix_cache_hit_rate" in rows[0] and "rollout/monitor/episodes" in rows[0]  # one row
