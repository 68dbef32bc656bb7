"""slime's own rollout over real airline and retail tasks, on whichever tau2 is installed (tests/test_tau2_v1.py runs
this file on tau2 1.0.1 too): each sample's reward is tau2's own evaluation of the episode it came from, scored
again on tau2's native environments (the rollout scores on fast_env's), the judged retail reward of 1.0.1 included
(the loopback judge answers). The policy replays the gold actions (airline without its write: a failure), tau2's LLM
user speaks through the loopback server. A task index written with the other tau2 stops the run (the asynchronous
one too) with one line before any episode."""

from __future__ import annotations

import json
import re

import pytest
from slime_harness import flat, prompt_rows, reset_slime, rollout, slime_args, train_data
from test_slime_rollout import ASYNC_ROLLOUT

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions, last_write_index
from tau2_rl_pipeline.benchmark.tasks import get_task
from tau2_rl_pipeline.benchmark.tau2_version import STOP, V1, VERSION, BenchmarkMismatch, needs_judge
from tau2_rl_pipeline.slime_plugins import adapter as slime_adapter

TASKS = {("airline", "19"): "drop the write", ("retail", "36"): "gold"}  # one write each; retail 36 judged on 1.0.1


class GoldScript:
    """The user names its task, then stops once the agent has spoken; the policy calls the task's gold actions one
    per turn (leaving out the last write where TASKS says so), then says the task's closing message."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.tasks = {key: get_task(*key) for key in TASKS}

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text + self.tok.eos_token, add_special_tokens=False)

    @staticmethod
    def reason(task) -> str:
        """The first line of the task's reason for calling, as it appears in the user simulator's prompt."""
        return task.user_scenario.instructions.reason_for_call.strip().splitlines()[0]

    def actions(self, domain: str, task) -> list:
        drop = last_write_index(domain, task) if TASKS[(domain, task.id)] == "drop the write" else None
        return [a for i, a in enumerate(gold_actions(task)) if i != drop]

    def __call__(self, path: str, input_ids: list[int]) -> list[int]:
        text = self.tok.decode(input_ids, skip_special_tokens=False)
        if path == "/v1/chat/completions":  # tau2's user simulator
            if text.count("<|im_start|>assistant") > 1:
                return self.ids(STOP)
            key = next(k for k, t in self.tasks.items() if self.reason(t) in text)
            return self.ids(f"Hello, this is about {key[0]}/{key[1]}.")
        domain, task_id = re.search(r"this is about (\w+)/(\S+?)\.", text).groups()
        task = self.tasks[(domain, task_id)]
        actions, done = self.actions(domain, task), text.count("<tool_response>")
        if done < len(actions):
            return self.ids(render_assistant_text("", [(actions[done].name, actions[done].arguments)]))
        return self.ids(final_message(task))


def test_each_samples_reward_is_tau2s_own_evaluation_of_its_episode(slime_env, monkeypatch, loopback,
                                                                    tiny_small_dir, small_tokenizer, tmp_path,
                                                                    request):
    from tau2.data_model.simulation import SimulationRun
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.utils.utils import get_now

    judge = request.getfixturevalue("loopback_judge") if V1 else None
    judged_before = len(judge.requests) if judge else 0
    loopback.responder = GoldScript(small_tokenizer)
    episodes = []

    async def recorded(*args, **kwargs):  # the adapter's own episode loop, its trajectory kept for rescoring
        traj = await run_episode(*args, **kwargs)
        episodes.append(traj)
        return traj
    run_episode = slime_adapter.run_episode
    monkeypatch.setattr(slime_adapter, "run_episode", recorded)
    rows = tmp_path / "p.jsonl"
    rows.write_text("".join(prompt_rows(tmp_path / f"{d}.jsonl", [t], d, "test").read_text() for d, t in TASKS))
    args = slime_args(tiny_small_dir, rows, loopback.base_url.removeprefix("http://"), batch=2, n=1,
                      extra=("--rollout-max-response-len", "1024"))
    samples = flat(rollout(args)[0].samples)

    assert sorted((s.metadata["domain"], s.metadata["task_id"]) for s in samples) == sorted(TASKS)
    by_task = {(t.domain, t.task_id): t for t in episodes}
    for s in samples:
        key = (s.metadata["domain"], s.metadata["task_id"])
        traj, task = by_task[key], get_task(*key)
        assert s.metadata["termination_reason"] == "user_stop" and s.metadata["error"] is None
        now = get_now()
        native = evaluate_simulation(
            SimulationRun(id="rescore", task_id=task.id, start_time=now, end_time=now, duration=0.0,
                          termination_reason=traj.termination_reason, messages=traj.messages),
            task, EvaluationType.ALL, solo_mode=False, domain=key[0])
        assert s.metadata["raw_reward"] == native.reward == (1.0 if TASKS[key] == "gold" else 0.0), key
        assert s.metadata["reward_info"]["reward_breakdown"] == {
            getattr(k, "value", k): v for k, v in (native.reward_breakdown or {}).items()}
    assert train_data(args, samples)["raw_reward"] == [s.metadata["raw_reward"] for s in samples]
    if V1:  # retail 36's NL assertions went to the judge, during the rollout and again when rescored
        assert needs_judge(get_task("retail", "36"))
        assert "NL_ASSERTION" in by_task[("retail", "36")].reward_info.reward_breakdown
        assert len(judge.requests) - judged_before >= 2


@pytest.mark.parametrize("rollout_function", [None, ASYNC_ROLLOUT], ids=["sync", "fully_async"])
def test_a_task_index_of_the_other_tau2_stops_the_run_in_one_line(slime_env, loopback, tiny_small_dir, tmp_path,
                                                                   rollout_function):
    other = "26.3" if V1 else "1.0.1"
    rows = prompt_rows(tmp_path / "p.jsonl", ["create_task_1"])
    row = json.loads(rows.read_text())
    row["metadata"]["benchmark"]["tau2_version"] = other  # as `python -m tau2_rl_pipeline.benchmark.tasks` wrote it there
    rows.write_text(json.dumps(row) + "\n")
    extra = ("--rollout-function-path", rollout_function, "--sglang-server-concurrency", "1",
             "--use-tis") if rollout_function else ()
    args = slime_args(tiny_small_dir, rows, loopback.base_url.removeprefix("http://"), batch=1, n=2, extra=extra)
    with pytest.raises(BenchmarkMismatch) as refused:
        rollout(args)
    reset_slime()  # the async worker stops while the server is still up
    assert loopback.count("/generate") == 0  # stopped at the row, before any episode (no clock: any load holds)
    message = str(refused.value)
    assert "\n" not in message and message == (
        f"the task index row 'tau2 mock task create_task_1' was produced with tau2 {other}, this run uses tau2 "
        f"{VERSION}: results of two tau2 versions are not comparable; write the task index again with this tau2 "
        "(python -m tau2_rl_pipeline.benchmark.tasks)")
    assert loopback.count("/generate") == 0  # no episode started
