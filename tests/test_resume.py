"""An episode stopped by its caller (slime's end-of-rollout abort) and resumed goes on where it was cut: the same
tau2 conversation, the same token book, as if it had never stopped (the rollout side of partial rollout; slime's
side is tests/contract/test_partial_rollout.py)."""

import asyncio

from test_rollout import CFG, ChosenTextEngine, _check_books, _telecom_script

from tau2_rl_pipeline.benchmark.oracle import gold_actions
from tau2_rl_pipeline.benchmark.prompting import render
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser
from tau2_rl_pipeline.rollout.engines import GenerateResult, SamplingParams
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, COMPLETED, ROLLOUT_STOPPED, Driver, EpisodeSpec, run_episode


def _telecom_task():
    return next(t for t in load_tasks("telecom", "test")
                if {a.requestor for a in gold_actions(t)} == {"assistant", "user"})


class CutEngine:
    """ChosenTextEngine whose request number `cut_at` is aborted after `keep` tokens (as SGLang answers an
    /abort_request mid-decode: finish reason abort, the tokens so far); the next request continues that turn."""

    def __init__(self, inner: ChosenTextEngine, cut_at: int, keep: int):
        self.inner, self.cut_at, self.keep = inner, cut_at, keep
        self.calls, self.rest, self.inputs = 0, None, []

    async def generate(self, input_ids, sampling):
        self.calls += 1
        self.inputs.append(list(input_ids))
        if self.rest is not None:  # the continuation of the cut turn
            ids, logprobs = self.rest
            self.rest = None
            return GenerateResult(ids, logprobs, "stop")
        result = await self.inner.generate(input_ids, sampling)
        if self.calls != self.cut_at:
            return result
        k = self.keep
        self.rest = (result.output_ids[k:], result.output_logprobs[k:])
        return GenerateResult(result.output_ids[:k], result.output_logprobs[:k], "abort")


def _episode(task, engine, tokenizer, stop, resume=None):
    sampling = SamplingParams(temperature=1.0)
    spec = EpisodeSpec.from_config("telecom", task, None if resume else ScriptedUser(task), CFG)
    return asyncio.run(run_episode(spec, Driver.from_config(engine, tokenizer, sampling, CFG), stop_requested=stop,
                                   resume=resume))


def test_a_stopped_episode_resumed_is_the_whole_episode_token_for_token(qwen3_tokenizer):
    task = _telecom_task()
    whole = _episode(task, ChosenTextEngine(qwen3_tokenizer, _telecom_script(task)), qwen3_tokenizer, None)
    engine = ChosenTextEngine(qwen3_tokenizer, _telecom_script(task))
    stopped_at = {"turns": 2}
    cut = _episode(task, engine, qwen3_tokenizer, lambda: len(engine.sampled) >= stopped_at["turns"])
    assert cut.status == ABORTED and cut.termination_reason == ROLLOUT_STOPPED and cut.turns == 2
    assert cut.reward_info is None and cut.live is not None
    done = _episode(task, engine, qwen3_tokenizer, lambda: False, resume=cut.live)
    assert done.status == COMPLETED and done.termination_reason == "user_stop" and done.resumes == 1
    # the user's device actions asked for before the cut changed the environment the evaluation reads
    assert done.reward == whole.reward == 1.0 and done.turns == whole.turns == len(engine.sampled)
    assert done.live is None
    _check_books(done, engine.sampled)
    ours = done.prompt_ids + done.response_ids
    assert ours == whole.prompt_ids + whole.response_ids and done.rollout_logprobs == whole.rollout_logprobs
    assert done.loss_mask == whole.loss_mask
    assert ours[:len(cut.prompt_ids) + cut.response_length] == cut.prompt_ids + cut.response_ids
    rendered = render(qwen3_tokenizer, done.chat, done.tools, add_generation_prompt=False)
    expected = qwen3_tokenizer.encode(rendered, add_special_tokens=False)
    assert ours == expected[: len(ours)]
    assert [m.role for m in done.messages] == [m.role for m in whole.messages]


def test_a_turn_cut_mid_way_is_continued_not_sampled_again(qwen3_tokenizer):
    task = _telecom_task()
    whole = _episode(task, ChosenTextEngine(qwen3_tokenizer, _telecom_script(task)), qwen3_tokenizer, None)
    engine = CutEngine(ChosenTextEngine(qwen3_tokenizer, _telecom_script(task)), cut_at=2, keep=3)
    cut = _episode(task, engine, qwen3_tokenizer, None)
    assert cut.status == ABORTED and cut.termination_reason == "engine_abort" and cut.turns == 2
    assert cut.live is not None and len(cut.live.open_turn) == 3
    done = _episode(task, engine, qwen3_tokenizer, None, resume=cut.live)
    assert engine.inputs[2] == cut.prompt_ids + cut.response_ids  # the continuation sees the cut turn's tokens
    assert done.status == COMPLETED and done.reward == 1.0
    assert done.turns == whole.turns and len(done.turn_meta) == whole.turns + 1  # one turn, two requests
    assert done.prompt_ids + done.response_ids == whole.prompt_ids + whole.response_ids
    assert done.rollout_logprobs[:cut.response_length] == cut.rollout_logprobs
    assert done.loss_mask == whole.loss_mask  # the two halves of the cut turn are one policy turn, then its end


def test_mask_earlier_takes_every_token_before_the_cut_out_of_the_loss(qwen3_tokenizer):
    task = _telecom_task()
    engine = ChosenTextEngine(qwen3_tokenizer, _telecom_script(task))
    cut = _episode(task, engine, qwen3_tokenizer, lambda: len(engine.sampled) >= 2)
    cut.live.mask_earlier()
    done = _episode(task, engine, qwen3_tokenizer, lambda: False, resume=cut.live)
    assert done.loss_mask[:cut.response_length] == [0] * cut.response_length
    assert sum(done.loss_mask) == sum(len(ids) for ids in engine.sampled[2:])  # only the turns after the cut
    assert done.rollout_logprobs[:cut.response_length] == cut.rollout_logprobs  # kept for --use-tis


def test_an_abort_the_engine_reports_with_an_error_is_a_failure_not_a_cut(qwen3_tokenizer):
    """SGLang's abort carries a status_code when it gave the request up (an error), none when it was told to stop
    (/abort_request, /pause_generation): only the latter is a cut to resume."""
    from tau2_rl_pipeline.rollout.engines import parse_generate_response

    stopped = {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "Abort before prefill"},
                                         "output_token_logprobs": [], "weight_version": "3"}}
    failed = {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "input too long",
                                                          "status_code": 400, "err_type": "BadRequestError"},
                                        "output_token_logprobs": []}}
    assert parse_generate_response(stopped).abort_error is None
    assert parse_generate_response(failed).abort_error == "HTTP 400: input too long"

    class FailingEngine(CutEngine):
        async def generate(self, input_ids, sampling):
            result = await super().generate(input_ids, sampling)
            if result.finish_reason != "abort":
                return result
            return GenerateResult(result.output_ids, result.output_logprobs, "abort", abort_error="HTTP 400: no")

    task = _telecom_task()
    engine = FailingEngine(ChosenTextEngine(qwen3_tokenizer, _telecom_script(task)), cut_at=2, keep=3)
    traj = _episode(task, engine, qwen3_tokenizer, None)
    assert traj.status == ABORTED and traj.termination_reason == "engine_error" and traj.live is None
    assert traj.error == "the engine aborted the request: HTTP 400: no"


def test_each_request_books_its_span_of_the_response(qwen3_tokenizer):
    """turn_spans[i] is request i's sampled ids in response_ids (a cut turn's two halves are two requests): what
    the old-weight mask reads."""
    task = _telecom_task()
    engine = CutEngine(ChosenTextEngine(qwen3_tokenizer, _telecom_script(task)), cut_at=2, keep=3)
    cut = _episode(task, engine, qwen3_tokenizer, None)
    done = _episode(task, engine, qwen3_tokenizer, None, resume=cut.live)
    assert len(done.turn_spans) == len(done.turn_meta) == engine.calls
    assert done.turn_spans[1][1] - done.turn_spans[1][0] == 3 and done.turn_spans[2][0] == done.turn_spans[1][1]
    sampled = [i for start, end in done.turn_spans for i in range(start, end)]
    assert sampled == [i for i, m in enumerate(done.loss_mask) if m]  # exactly the policy's tokens
