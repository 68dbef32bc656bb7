"""slime's partial rollout (`--partial-rollout`, 624b824) through its real rollout code: an episode cut by slime's
end-of-rollout abort goes back to slime's buffer, and when slime hands the sample back our generate goes on with
the same tau2 episode from where it was cut (tau2_rl_pipeline/slime_plugins/partial_rollout.py), as slime's own single-turn
generate goes on from the tokens it holds. The loopback server's `weight_version` stands for slime's weight update
between rollouts."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import threading
import time

import pytest
from slime_harness import flat, prompt_rows, reset_slime, rollout, slime_args, train_data, update_weights
from test_slime_rollout import ASYNC_ROLLOUT, STOP, Script

from tau2_rl_pipeline.slime_plugins.adapter import live_episodes
from tau2_rl_pipeline.slime_plugins.partial_rollout import LiveEpisodes, sample_key

LONG, SHORT = "create_task_1", "update_task_1"
PARTIAL = ("--partial-rollout", "--mask-offpolicy-in-partial-rollout")


class TwoLengths(Script):
    """The policy calls create_task, then says "Done."; the user of SHORT stops after one "Done.", the user of
    LONG after two: LONG takes three policy turns, and only its reward depends on the tool call of its first."""

    def __call__(self, path: str, input_ids: list[int]) -> list[int]:
        if path != "/v1/chat/completions":
            return super().__call__(path, input_ids)
        text = self.tok.decode(input_ids, skip_special_tokens=False)
        task = next(iter(re.findall(r"this is about (\S+)\.", text)), None)
        if task is None:
            return super().__call__(path, input_ids)
        return self.ids(STOP if text.count("Done.") >= (2 if task == LONG else 1) else "Please go on.")


class CutAt:
    """The loopback server's gate: where slime's end-of-rollout abort finds each episode, whatever the machine's load.
    Under weights v0 each LONG episode is held at its second policy turn (it has sampled its first) until the abort
    cuts it, and SHORT's second turn waits until both LONG episodes are held there: SHORT fills rollout 0's batch
    and LONG is cut after one turn, always. Under v1 the episodes of `held_in_v1` are held at their second turn the
    same way, so the resumed LONG (two turns left, as a new short group has) fills rollout 1's batch."""

    HOLD_S = 120.0  # a held request goes on after this, should no abort come (the test then fails on what it sees)

    def __init__(self, loopback, tokenizer, held_in_v1: tuple[str, ...] = ()) -> None:
        self.loopback, self.tok, self.held_in_v1 = loopback, tokenizer, held_in_v1
        self.long_held = 0
        self._both_long_held: asyncio.Event | None = None  # made on the server's loop, at its first use
        loopback.gate, loopback.weight_version = self, "v0"

    async def __call__(self, path: str, body: dict) -> None:
        if path != "/generate":
            return
        text = self.tok.decode(body["input_ids"], skip_special_tokens=False)
        task = next(iter(re.findall(r"this is about (\S+)\.", text)), None)
        if "<tool_response>" not in text:  # a first turn goes on
            return
        both_long_held = self._both_long_held = self._both_long_held or asyncio.Event()
        version = self.loopback.weight_version
        if version == "v0" and task == LONG:
            self.long_held += 1
            if self.long_held == 2:
                both_long_held.set()
            await asyncio.sleep(self.HOLD_S)  # until the abort cancels it
        elif version == "v0" and task == SHORT:
            await asyncio.wait_for(both_long_held.wait(), self.HOLD_S)
        elif version == "v1" and task in self.held_in_v1:
            await asyncio.sleep(self.HOLD_S)


def _rows(tmp_path, tasks: list[str]):
    """Prompt rows in this order (slime hands them out in file order, no shuffle)."""
    lines = {json.loads(line)["metadata"]["task_id"]: line
             for line in prompt_rows(tmp_path / "all.jsonl", tasks).read_text().splitlines()}
    path = tmp_path / "p.jsonl"
    path.write_text("".join(lines[t] + "\n" for t in tasks))
    return path


def _snapshot(sample) -> dict:
    return {"tokens": list(sample.tokens), "logprobs": list(sample.rollout_log_probs),
            "versions": list(sample.weight_versions), "response_length": sample.response_length}


def _first_prompt_requests(loopback, sample) -> int:
    prompt = sample.tokens[:len(sample.tokens) - sample.response_length]
    return sum(1 for path, body in loopback.requests if path == "/generate" and body["input_ids"] == prompt)


def _cut_long(monkeypatch, loopback, model_dir, tokenizer, tmp_path, resume: bool, held_in_v1: tuple[str, ...] = ()):
    """Rollout 0 (weights v0): SHORT fills the batch, slime aborts LONG after its first turn (CutAt) and puts its
    group back in its buffer. Returns slime's args, the data source, the cut samples and what they held then."""
    from slime.utils.types import Sample

    monkeypatch.setenv("TAU2_MAX_TURNS", "8")
    monkeypatch.setenv("TAU2_PARTIAL_RESUME", str(int(resume)))
    loopback.latency_s = 0.25
    loopback.responder = script = TwoLengths(tokenizer)
    CutAt(loopback, tokenizer, held_in_v1)
    rows = _rows(tmp_path, [LONG, SHORT, "impossible_task_1"])  # rollout 1's new group: another short task
    args = slime_args(model_dir, rows, loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--over-sampling-batch-size", "2", *PARTIAL))
    output, source = rollout(args, 0)
    assert flat(output.samples)[0].metadata["task_id"] == SHORT
    (cut_group,) = source.buffer
    assert [s.metadata["task_id"] for s in cut_group] == [LONG, LONG]
    assert all(s.status == Sample.Status.ABORTED and s.metadata["termination_reason"] == "rollout_stopped"
               for s in cut_group)
    # each had sampled its first turn before the cut, and both were cut at the same place (CutAt)
    assert all(s.weight_versions and set(s.weight_versions) == {"v0"} for s in cut_group)
    assert len({(tuple(s.weight_versions), s.response_length) for s in cut_group}) == 1
    before = {sample_key(s): _snapshot(s) for s in cut_group}
    assert live_episodes(args).keys() == (set(before) if resume else set())
    loopback.weight_version = "v1"  # slime updated the weights between the rollouts
    return args, source, cut_group, before, script


def test_an_episode_cut_by_the_abort_goes_on_where_it_was_cut(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                             small_tokenizer, tmp_path):
    """Rollout 1 (new weights): slime hands LONG back first; it goes on from where it was cut and fills the batch
    (the new group is held at its second turn until the abort: CutAt)."""
    from slime.utils.types import Sample

    args, source, cut_group, before, script = _cut_long(monkeypatch, loopback, tiny_small_dir, small_tokenizer,
                                                        tmp_path, resume=True, held_in_v1=("impossible_task_1",))
    rollout(args, 1, source)
    for sample in cut_group:
        old = before[sample_key(sample)]
        n = old["response_length"]
        assert sample.status == Sample.Status.COMPLETED and sample.remove_sample is False  # was True: untrained
        assert sample.metadata["raw_reward"] == 1.0  # the first turn's create_task, run before the cut, counted
        assert sample.metadata["termination_reason"] == "user_stop" and sample.metadata["turns"] == 3
        assert sample.metadata["resumes"] == 1 and sample.metadata["start_rollout_id"] == 0
        assert small_tokenizer.decode(sample.tokens).count("this is about create_task_1") == 1
        assert sample.tokens[:len(old["tokens"])] == old["tokens"]  # the turns before the cut, unchanged
        assert sample.rollout_log_probs[:n] == old["logprobs"]
        assert sample.weight_versions[:len(old["versions"])] == old["versions"] == ["v0"] * len(old["versions"])
        assert set(sample.weight_versions[len(old["versions"]):]) == {"v1"}
        # --mask-offpolicy-in-partial-rollout: only what the new weights sampled is trained ("Done." turns)
        policy = [t for t, m in zip(sample.tokens[-sample.response_length:], sample.loss_mask) if m]
        assert sample.loss_mask[:n] == [0] * n and 0 < len(policy) < len(script.tool_ids + 2 * script.done_ids)
        assert policy == script.done_ids * (len(policy) // len(script.done_ids))
    assert _first_prompt_requests(loopback, cut_group[0]) == 2  # LONG's first turn: sampled once per sample
    # the token books as slime trains them: one mask and one log-prob per response token
    data = train_data(args, cut_group)
    assert data["loss_masks"] == [s.loss_mask for s in cut_group] and data["raw_reward"] == [1.0, 1.0]
    assert all(len(s.rollout_log_probs) == s.response_length for s in cut_group)
    assert not live_episodes(args).keys() & set(before)  # taken when handed back


def test_with_resume_off_a_cut_episode_starts_again(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                    small_tokenizer, tmp_path):
    """TAU2_PARTIAL_RESUME=0: the same cut episode, handed back, starts from its first turn with the new weights
    (and, six calls long again, loses rollout 1 to the new short group: the starvation bench/README.md P6 shows)."""
    args, source, cut_group, before, _ = _cut_long(monkeypatch, loopback, tiny_small_dir, small_tokenizer,
                                                   tmp_path, resume=False)
    rollout(args, 1, source)
    for sample in cut_group:
        assert sample.metadata["resumes"] == 0
        assert sample.weight_versions and set(sample.weight_versions) == {"v1"}  # nothing of rollout 0 kept
    assert _first_prompt_requests(loopback, cut_group[0]) == 4  # LONG's first turn: sampled again
    assert len(live_episodes(args)) == 0


def test_the_resumed_episode_books_the_same_tokens_as_one_never_cut(slime_env, monkeypatch, loopback,
                                                                   tiny_small_dir, small_tokenizer, tmp_path):
    """Without --mask-offpolicy-in-partial-rollout: a cut and resumed LONG is token for token, log-prob for
    log-prob, mask for mask the episode run in one go."""
    monkeypatch.setenv("TAU2_MAX_TURNS", "8")
    loopback.latency_s = 0.25
    loopback.responder = TwoLengths(small_tokenizer)
    CutAt(loopback, small_tokenizer, held_in_v1=("impossible_task_1",))
    router = loopback.base_url.removeprefix("http://")
    args = slime_args(tiny_small_dir, _rows(tmp_path, [LONG, SHORT, "impossible_task_1"]), router, batch=1, n=2,
                      extra=("--over-sampling-batch-size", "2", "--partial-rollout", "--use-tis"))
    _, source = rollout(args, 0)
    (resumed,) = source.buffer  # LONG's group, cut
    loopback.weight_version = "v1"
    rollout(args, 1, source)
    assert all(s.status.name == "COMPLETED" and s.metadata["resumes"] == 1 for s in resumed)
    whole_args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "long.jsonl", [LONG]), router, batch=1, n=2)
    whole, _ = rollout(whole_args, 0)
    whole = flat(whole.samples)
    for a, b in zip(resumed, whole):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask and a.response_length == b.response_length
        assert a.rollout_log_probs == pytest.approx(b.rollout_log_probs, abs=1e-5)
        assert a.metadata["reward_info"]["reward"] == b.metadata["reward_info"]["reward"] == 1.0


def test_cut_episodes_are_kept_no_longer_than_their_samples(slime_env, loopback, tiny_small_dir, small_tokenizer,
                                                            monkeypatch, tmp_path):
    monkeypatch.setenv("TAU2_MAX_TURNS", "8")
    loopback.latency_s = 0.25
    loopback.responder = TwoLengths(small_tokenizer)
    CutAt(loopback, small_tokenizer)
    args = slime_args(tiny_small_dir, _rows(tmp_path, [LONG, SHORT, "impossible_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--over-sampling-batch-size", "2", *PARTIAL))
    _, source = rollout(args, 0)
    registry = live_episodes(args)
    assert registry.keys() == {sample_key(s) for g in source.buffer for s in g} and len(registry) == 2
    source.buffer.clear()  # the samples are gone (as when slime drops them, or the run ends)
    gc.collect()
    assert len(registry) == 0


def test_the_registry_is_bounded_and_refuses_a_changed_sample():
    from slime.utils.types import Sample

    registry = LiveEpisodes(capacity=2)
    samples = [Sample(index=i, group_index=0, response_length=3) for i in range(3)]
    for s in samples:
        assert registry.keep(s, object(), ("mock", LONG))
    assert len(registry) == 2 and registry.evicted == 1
    assert registry.take(samples[0], ("mock", LONG)) is None  # the oldest went: that episode starts again
    samples[1].response_length = 5
    assert registry.take(samples[1], ("mock", LONG)) is None  # changed since it was cut: not resumed
    assert registry.take(samples[2], ("mock", SHORT)) is None  # another task
    assert len(registry) == 0
    assert not registry.keep(Sample(), object(), ("mock", LONG))  # nothing to know it by


def _when(condition, then, timeout_s: float = 300.0) -> threading.Thread:
    """A thread that runs `then()` as soon as `condition()` holds (the test's stand-in for the trainer's clock);
    `timeout_s` only ends the wait of a run that never gets there, far beyond what a loaded machine takes."""
    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.005)
        then()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def _async_args(tiny_small_dir, loopback, tmp_path, extra=PARTIAL):
    return slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", [LONG]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--rollout-function-path", ASYNC_ROLLOUT, "--sglang-server-concurrency", "1", *extra))


def test_fully_async_rollout_resumes_what_a_weight_update_cut(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                              small_tokenizer, tmp_path):
    """slime's fully asynchronous worker with slime's own weight update: while the first sample's second turn is
    in flight, the update pauses the engine (SGLang's /pause_generation aborts that request), flushes, sends the new
    version and continues. Nothing sets GenerateState.aborted (slime never does there): the episode is known cut by
    the abort the engine returned, goes back to slime's buffer with its group, and goes on where it was cut."""
    from slime.rollout.sglang_rollout import GenerateState

    monkeypatch.setenv("TAU2_MAX_TURNS", "8")
    loopback.latency_s = 0.25
    loopback.responder = script = TwoLengths(small_tokenizer)
    loopback.weight_version = "v0"
    args = _async_args(tiny_small_dir, loopback, tmp_path)
    registry = live_episodes(args)
    update = _when(lambda: loopback.count("/generate") >= 2, lambda: update_weights(loopback, "v1"))
    try:
        samples = flat(rollout(args)[0])
    finally:
        update.join()
    assert GenerateState(args).aborted is False  # never set: the cut came from the engine's answer
    assert [s.metadata["raw_reward"] for s in samples] == [1.0, 1.0]
    assert all(s.metadata["turns"] == 3 for s in samples)
    # slime lets one sample generate at a time here (--sglang-server-concurrency 1): the first was cut in its
    # second turn and goes on; the second, which had not started, runs whole with the new weights
    assert [s.metadata["resumes"] for s in samples] == [1, 0]  # was [0, 0]: the cut episode started again
    first, second = samples
    assert first.weight_versions == ["v0", "v0", "v1", "v1"]  # turn 1, turn 2 aborted, turn 2 again, turn 3
    assert second.weight_versions == ["v1"] * 3
    # --mask-offpolicy-in-partial-rollout: the turn the old weights sampled is not trained
    assert _policy(first) == 2 * script.done_ids
    # the second had finished (new weights) when slime's worker sent the group back for the first; handed out
    # again, slime's generate_and_rm masks a finished sample's whole response, whoever sampled it
    assert second.status.name == "COMPLETED" and _policy(second) == []
    assert _first_prompt_requests(loopback, first) == 2  # once per sample: the cut one was not started again
    assert len(registry) == 0
    paths = [p for p, _ in loopback.requests]
    assert paths.index("/pause_generation") < paths.index("/update_weights_from_distributed") \
        < paths.index("/continue_generation")


def test_an_episode_crossing_a_weight_update_between_turns_trains_only_the_new_weights_turns(
        slime_env, monkeypatch, loopback, tiny_small_dir, small_tokenizer, tmp_path):
    """The fully async worker, without --partial-rollout: the update comes while the first sample waits on its
    user between turns 2 and 3, so no request is cut and the episode simply goes on with the new weights. Under
    --mask-offpolicy-in-partial-rollout (GRPO_MASK_OFFPOLICY=1) its turns 1-2, sampled by v0, are not trained."""
    monkeypatch.setenv("TAU2_MAX_TURNS", "8")
    loopback.latency_s = 0.25
    loopback.responder = script = TwoLengths(small_tokenizer)
    loopback.weight_version = "v0"
    chats = "/v1/chat/completions"
    for masked in (True, False):
        reset_slime()
        loopback.requests.clear()
        loopback.weight_version = "v0"
        args = _async_args(tiny_small_dir, loopback, tmp_path,
                           extra=("--mask-offpolicy-in-partial-rollout",) if masked else ("--use-tis",))
        # the user's second message (after the policy's turn 2) has just arrived; it takes 0.25 s to answer
        update = _when(lambda: loopback.count(chats) >= 2, lambda: update_weights(loopback, "v1"))
        try:
            first, second = flat(rollout(args)[0])
        finally:
            update.join()
        assert first.weight_versions == ["v0", "v0", "v1"] and first.metadata["resumes"] == 0
        assert second.weight_versions == ["v1"] * 3
        assert _policy(second) == script.tool_ids + 2 * script.done_ids
        if masked:
            assert _policy(first) == script.done_ids  # was all three turns: the old weights' turns trained
        else:
            assert _policy(first) == script.tool_ids + 2 * script.done_ids
        data = train_data(args, [first, second])
        assert data["loss_masks"] == [first.loss_mask, second.loss_mask]


def _policy(sample) -> list[int]:
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    return [t for t, m in zip(response, sample.loss_mask) if m]


def test_cut_episodes_are_kept_for_every_sample_slimes_async_worker_has_in_flight(slime_env, loopback, tiny_small_dir,
                                                                               tmp_path):
    """slime's fully async worker keeps up to --sglang-server-concurrency x engines *groups* going: a weight update
    can cut every sample of them (it was a cap of samples: past it, cut episodes were dropped and started again)."""
    args = _async_args(tiny_small_dir, loopback, tmp_path, extra=("--sglang-server-concurrency", "8", *PARTIAL))
    assert live_episodes(args).capacity == 2 * 8 * 2  # was 16
