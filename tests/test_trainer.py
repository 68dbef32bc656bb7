"""Local trainer: slime's loss definitions on hand-made tensors, and real SFT / GRPO steps on a tiny Qwen3.

Demonstrations are oracle replays of tau2's mock tasks; GRPO trains on real multi-turn rollouts of the tiny model
(TransformersEngine + scripted user), so the rollout's books and the trainer's scoring are checked against each
other, not against a fake.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.oracle import replay_episode
from tau2_rl_pipeline.benchmark.prompting import render
from tau2_rl_pipeline.benchmark.tasks import get_task, load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser, opening_request
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.losses import gather_logprobs, grpo_loss, low_var_kl, merge_metrics, sft_loss
from tau2_rl_pipeline.local.examples import TrainExample, examples_from_trajectory, sft_example_from_chat
from tau2_rl_pipeline.local.trainer import LocalTrainer, TrainConfig, token_logprobs
from tau2_rl_pipeline.rollout.engines import SamplingParams, TransformersEngine
from tau2_rl_pipeline.rollout.episode_loop import Driver, EpisodeSpec, run_episode

PPO = {"eps_clip": 0.2, "eps_clip_high": 0.28}


SHORT_SYSTEM = "You are a customer service agent for a task manager. Use the tools to help the user."


def demo_chat(task, *, full_prompt: bool = True) -> tuple[list[dict], list[dict] | None]:
    """An oracle demonstration: system prompt, greeting, the user's opening request, gold tool calls with their
    results, the final message (the replay has no user side, so the opening request is put in). Without
    `full_prompt` the system prompt is one line and no tools block is rendered: 5x fewer tokens to train on."""
    episode = replay_episode("mock", task)
    view = episode.agent_view()
    system = episode.system_prompt if full_prompt else SHORT_SYSTEM
    chat = [{"role": "system", "content": system}, view[0], {"role": "user", "content": opening_request(task)},
            *view[1:]]
    return chat, episode.tools if full_prompt else None


@pytest.fixture(scope="module")
def mock_demos(small_tokenizer) -> list[TrainExample]:
    """The 9 mock tasks' demonstrations (short prompt), in task order (0 and 1 are the same conversation)."""
    return [sft_example_from_chat(small_tokenizer, *demo_chat(t, full_prompt=False))
            for t in load_tasks("mock", "base")]


def trainer_for(model_dir: Path, tmp_path: Path, **overrides) -> LocalTrainer:
    cfg = TrainConfig(log_jsonl=tmp_path / "metrics.jsonl", **{"lr": 1e-3, **overrides})
    return LocalTrainer(model_dir, cfg)


def flat_params(trainer: LocalTrainer) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten().cpu() for p in trainer.model.parameters()])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------------------------
# Pure loss math


def test_sft_loss_ignores_targets_at_mask_0_positions():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=gen)
    targets = torch.randint(0, 11, (2, 6), generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 0, 0, 1, 1]])

    def loss(t: torch.Tensor) -> float:
        return float(sft_loss(gather_logprobs(logits, t)[0], mask)[0])

    base = loss(targets)
    for b, i in [(0, 0), (0, 4), (1, 2)]:  # mask-0 positions: any target there leaves the loss unchanged
        changed = targets.clone()
        changed[b, i] = (changed[b, i] + 3) % 11
        assert loss(changed) == base
    changed = targets.clone()
    changed[0, 2] = (changed[0, 2] + 3) % 11  # a mask-1 target does count
    assert loss(changed) != base
    logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert base == pytest.approx(float(-(logp * mask).sum() / mask.sum()), rel=1e-6)


def test_model_level_loss_ignores_a_mask_0_target_and_counts_a_mask_1_one(tiny_small_dir, tmp_path):
    trainer = trainer_for(tiny_small_dir, tmp_path)
    ids = list(range(10, 30))

    def nll(last: int, last_mask: int) -> float:
        # The last token is nobody's context, so changing it changes only what it is as a target.
        return trainer.evaluate([TrainExample(ids[:-1] + [last], [0, 1, 1, 0, 1] + [1] * 14 + [last_mask])])

    assert nll(ids[-1], 0) == nll(ids[-1] + 7, 0)
    assert nll(ids[-1], 1) != nll(ids[-1] + 7, 1)


def test_ppo_clip_loss_equals_the_hand_computed_value_and_clipfrac():
    old = torch.zeros(1, 5)
    ratios = torch.tensor([[1.0, 1.5, 0.5, 1.1, 0.7]])
    adv = torch.tensor([[0.0, 1.0, -1.0, 2.0, 1.0]])  # token 0 is the prompt (mask 0)
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    loss, m = grpo_loss(ratios.log(), old, adv, mask, **PPO)
    # per token max(-A r, -A clip(r, 0.8, 1.28)):
    expected = [max(-1 * 1.5, -1 * 1.28), max(1 * 0.5, 1 * 0.8), max(-2 * 1.1, -2 * 1.1), max(-0.7, -0.8)]
    assert float(loss) == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert m["pg_loss"] == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert m["clipfrac"] == pytest.approx(2 / 4)  # tokens 1 (above 1.28, A>0) and 2 (below 0.8, A<0)
    assert m["ratio_min"] == pytest.approx(0.5) and m["ratio_max"] == pytest.approx(1.5)
    assert m["ppo_kl"] == pytest.approx(-sum(math.log(r) for r in [1.5, 0.5, 1.1, 0.7]) / 4, rel=1e-6)


def test_grpo_reduces_per_sample_by_default_and_per_token_when_asked():
    """Two samples of 1 and 3 tokens: slime's default weighs each sample's token mean equally; token_mean (slime's
    --calculate-per-token-loss) weighs every token equally. slime's own reducers on the same tensors:
    tests/contract/test_slime_awsft.py."""
    logprobs = torch.tensor([[0.0, 0.1, 0.0, 0.0], [0.0, -0.2, 0.05, 0.3]])
    adv, mask = torch.tensor([[1.0], [-0.5]]), torch.tensor([[0, 1, 0, 0], [0, 1, 1, 1]])
    pg = -adv * logprobs.exp()  # no token clipped: every ratio within [0.8, 1.28]
    per_sample = (pg[0, 1] + pg[1, 1:].mean()) / 2
    per_token = (pg[0, 1] + pg[1, 1:].sum()) / 4
    assert float(grpo_loss(logprobs, torch.zeros(2, 4), adv, mask, **PPO)[0]) == pytest.approx(float(per_sample))
    assert float(grpo_loss(logprobs, torch.zeros(2, 4), adv, mask, reduction="token_mean", **PPO)[0]) == \
        pytest.approx(float(per_token))
    assert abs(float(per_sample) - float(per_token)) > 0.1
    with pytest.raises(ValueError, match="reduction must be one of sample_mean, token_mean"):
        grpo_loss(logprobs, torch.zeros(2, 4), adv, mask, reduction="mean", **PPO)


@pytest.mark.parametrize(("ratio", "advantage", "clipped"), [
    (1.5, 1.0, True),    # above 1 + eps_high with A > 0: no incentive to push further
    (0.5, -1.0, True),   # below 1 - eps with A < 0: no incentive to push further down
    (0.5, 1.0, False),   # below the band with A > 0: PPO still pulls it back up
    (1.5, -1.0, False),  # above the band with A < 0: PPO still pulls it back down
    (1.1, 1.0, False),   # inside the band
])
def test_clipped_tokens_get_no_gradient(ratio, advantage, clipped):
    logprobs = torch.tensor([[0.0, math.log(ratio)]], requires_grad=True)
    loss, m = grpo_loss(logprobs, torch.zeros(1, 2), torch.tensor([[advantage]]), torch.tensor([[0, 1]]), **PPO)
    loss.backward()
    assert bool(logprobs.grad[0, 1] == 0) is clipped
    assert m["clipfrac"] == (1.0 if clipped else 0.0)
    if not clipped:  # gradient of -A * r w.r.t. log r is -A * r
        assert float(logprobs.grad[0, 1]) == pytest.approx(-advantage * ratio, rel=1e-6)


def test_low_var_kl_is_k3_clamped_and_zero_on_the_reference():
    logp = torch.tensor([math.log(0.5), math.log(0.25), -1.0, 0.0])
    ref = torch.tensor([math.log(0.25), math.log(0.5), -1.0, -30.0])
    kl = low_var_kl(logp, ref)
    assert float(kl[0]) == pytest.approx(0.5 - 1 - math.log(0.5), rel=1e-6)  # exp(r) - 1 - r, r = ref - logp
    assert float(kl[1]) == pytest.approx(2.0 - 1 - math.log(2.0), rel=1e-6)
    assert float(kl[2]) == 0.0
    assert float(low_var_kl(ref, logp)[3]) == 10.0  # exp(30) - 31 clamps to slime's 10
    loss, m = grpo_loss(logp[None], logp[None], torch.zeros(1, 1), torch.ones(1, 4), ref_logprobs=logp[None],
                        kl_coef=1.0, **PPO)
    assert m["kl"] == 0.0 and float(loss) == 0.0


def test_entropy_bonus_raises_entropy_and_kl_penalty_pulls_toward_the_reference():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 7, generator=gen, requires_grad=True)
    targets = torch.randint(0, 7, (1, 4), generator=gen)
    mask = torch.tensor([[0, 1, 1, 1]])

    def step(entropy_coef=0.0, kl_coef=0.0, ref=None):
        logp, entropy = gather_logprobs(logits, targets, with_entropy=True)
        loss, m = grpo_loss(logp, logp.detach(), torch.zeros(1, 1), mask, entropy=entropy,
                            entropy_coef=entropy_coef, ref_logprobs=ref, kl_coef=kl_coef, **PPO)
        (grad,) = torch.autograd.grad(loss, logits)
        return grad, m

    grad, m = step(entropy_coef=0.1)
    assert float(grad.abs().sum()) > 0
    with torch.no_grad():
        _, after = gather_logprobs(logits - 1.0 * grad, targets, with_entropy=True)
    assert float((after * mask).sum() / 3) > m["entropy"]  # gradient descent on the loss raised entropy
    grad, _ = step()
    assert float(grad.abs().sum()) == 0.0  # zero advantages and no bonus: nothing to learn
    with torch.no_grad():
        ref = gather_logprobs(logits, targets)[0] + 0.5  # the reference likes the sampled tokens more
    grad, m = step(kl_coef=1.0, ref=ref)
    assert m["kl"] > 0
    logp_grad = torch.autograd.grad(low_var_kl(gather_logprobs(logits, targets)[0], ref).sum(), logits)[0]
    assert torch.allclose(grad * 3, logp_grad * mask.unsqueeze(-1), atol=1e-6)


def test_metrics_merge_sums_means_and_keeps_extremes():
    merged = merge_metrics(merge_metrics({}, {"pg_loss": 0.25, "ratio_min": 0.9, "ratio_max": 1.1}),
                           {"pg_loss": 0.5, "ratio_min": 0.8, "ratio_max": 1.05})
    assert merged == {"pg_loss": 0.75, "ratio_min": 0.8, "ratio_max": 1.1}


# ---------------------------------------------------------------------------------------------------------------
# Examples


def test_sft_example_mask_is_exactly_the_assistant_turns_with_their_end_token(qwen3_tokenizer):
    tok = qwen3_tokenizer
    checked = 0
    for task in load_tasks("mock", "base"):
        chat, tools = demo_chat(task)
        example = sft_example_from_chat(tok, chat, tools)
        runs, current = [], []
        for t, m in zip(example.input_ids + [None], example.loss_mask + [0]):
            if m:
                current.append(t)
            elif current:
                runs.append(tok.decode(current))
                current = []
        expected = [render_assistant_text(msg["content"], [(c["function"]["name"], c["function"]["arguments"])
                                                          for c in msg.get("tool_calls", [])]) + "<|im_end|>"
                    for msg in chat if msg["role"] == "assistant"]
        assert runs == expected
        full = render(tok, chat, tools, add_generation_prompt=False)
        kept = full[:full.rfind("<|im_end|>") + len("<|im_end|>")]
        assert tok.decode(example.input_ids) == kept
        assert example.input_ids == tok.encode(kept, add_special_tokens=False)  # same ids as one whole encode
        checked += len(runs)
    assert checked > 20


def test_sft_example_rejects_a_chat_without_assistant_turns(small_tokenizer):
    with pytest.raises(ValueError, match="no trainable assistant turn"):
        sft_example_from_chat(small_tokenizer, [{"role": "user", "content": "hi"}])


def test_step_loss_mask_zero_keeps_a_turn_as_context_only(small_tokenizer):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there", "step_loss_mask": 0},
            {"role": "user", "content": "book it"}, {"role": "assistant", "content": "Booked."}]
    masked = sft_example_from_chat(small_tokenizer, chat)
    plain = sft_example_from_chat(small_tokenizer, [{k: v for k, v in m.items() if k != "step_loss_mask"}
                                                    for m in chat])
    assert masked.input_ids == plain.input_ids
    targets = small_tokenizer.decode([t for t, m in zip(masked.input_ids, masked.loss_mask) if m])
    assert targets == "Booked.<|im_end|>"
    assert plain.num_targets > masked.num_targets
    with pytest.raises(ValueError, match="no trainable assistant turn"):
        sft_example_from_chat(small_tokenizer, chat[:2])


def test_example_from_trajectory_aligns_the_response_books_after_the_prompt():
    ex = examples_from_trajectory([5, 6, 7], [8, 9, 10], [1, 0, 1], [-0.5, 0.0, -1.5], 0.75)
    assert ex.input_ids == [5, 6, 7, 8, 9, 10] and ex.loss_mask == [0, 0, 0, 1, 0, 1]
    assert ex.old_logprobs == [0.0, 0.0, 0.0, -0.5, 0.0, -1.5] and ex.advantage == 0.75 and ex.num_targets == 2
    with pytest.raises(ValueError, match="loss_mask has 2 entries for 3 response ids"):
        examples_from_trajectory([5], [8, 9, 10], [1, 0], None, 0.0)
    with pytest.raises(ValueError, match="loss_mask\\[0\\] must be 0"):
        TrainExample([1, 2], [1, 1])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("lr", 0.0, "lr must be > 0"), ("eps_clip", 1.0, "eps_clip must be in"), ("dtype", "float16", "dtype must"),
    ("micro_batch_size", 0, "micro_batch_size must be >= 1"), ("betas", (0.9, 1.0), "betas must"),
    ("loss_reduction", "sum", "loss_reduction must be one of sample_mean, token_mean"),
])
def test_bad_train_config_is_a_one_line_error(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        TrainConfig(log_jsonl=tmp_path / "m.jsonl", **{field: value})
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# SFT


def test_sft_lowers_the_masked_loss_on_held_out_demonstrations(tiny_small_dir, mock_demos, tmp_path):
    train, held_out = mock_demos[:6], mock_demos[6:]
    trainer = trainer_for(tiny_small_dir, tmp_path, lr=3e-3, micro_batch_size=2, epochs=4)
    before = trainer.evaluate(held_out)
    records = trainer.sft(train, eval_examples=held_out)
    after = trainer.evaluate(held_out)
    assert after < before - 1.5, (before, after)
    assert len(records) == 4 * 3 and [r["step"] for r in records] == list(range(1, 13))
    assert records[-1]["eval_loss"] == pytest.approx(after, rel=1e-6)
    assert "eval_loss" not in records[0] and "eval_loss" in records[2]  # once per epoch, at its last step
    logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert logged == json.loads(json.dumps(records))
    assert {"stage", "step", "epoch", "loss", "lr", "grad_norm", "tokens", "sequences"} <= logged[0].keys()
    assert sum(r["tokens"] for r in logged[:3]) == sum(e.num_targets for e in train)  # one epoch, every target
    assert [r["sequences"] for r in logged[:3]] == [2, 2, 2]


def test_without_a_terminal_each_training_step_logs_a_line(tiny_small_dir, mock_demos, tmp_path, capsys):
    """A rich bar shows nothing until it ends when output is not a terminal (a log file, CI): a line per step."""
    trainer = trainer_for(tiny_small_dir, tmp_path, lr=1e-3, micro_batch_size=3, epochs=2)
    capsys.readouterr()
    trainer.sft(mock_demos)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sft ")]
    assert [line.split()[1] for line in lines] == [f"{i}/6" for i in range(1, 7)]
    assert all("loss" in line for line in lines)
    # elapsed time and, until the last step, the estimate at this run's pace
    assert all(re.search(r"\(\d[\dhms]*, about \d[\dhms]* left\)$", line) for line in lines[:-1]), lines
    assert re.search(r"\(\d[\dhms]*\)$", lines[-1]), lines[-1]


def test_the_time_left_is_the_runs_pace_times_the_steps_left() -> None:
    from tau2_rl_pipeline.local.train_log import clock, run_time, time_left

    assert [clock(s) for s in (0, 12.4, 59.6, 250, 3599, 3720, 90000)] == [
        "0s", "12s", "1m00s", "4m10s", "59m59s", "1h02m", "25h00m"]
    assert time_left(100.0, 4, 6) == "about 2m30s left"  # 25 s a step, 6 steps to go
    assert time_left(100.0, 0, 6) == "" and time_left(100.0, 4, 0) == ""  # no pace yet; nothing left
    assert run_time(100.0, 4, 6) == "1m40s, about 2m30s left" and run_time(5.0, 1, 0) == "5s"


def test_the_starting_loss_is_kept_for_a_resume_and_not_computed_again(tiny_small_dir, mock_demos, tmp_path,
                                                                       capsys):
    """The demo's SFT stage measures the loss before training; a resumed run reads it back (it is the starting
    weights' loss) instead of a second pass over the examples, and other examples get their own."""
    keep = tmp_path / "sft.resume"
    first = trainer_for(tiny_small_dir, tmp_path / "a", micro_batch_size=2)
    before = first.loss_before(mock_demos[:4], keep)
    assert before == first.evaluate(mock_demos[:4]) and (keep / "loss_before.json").is_file()
    first.sft(mock_demos[:4])  # trained: its own loss now differs from the starting one
    assert first.evaluate(mock_demos[:4]) < before
    capsys.readouterr()
    again = trainer_for(tiny_small_dir, tmp_path / "b", micro_batch_size=2)
    assert again.loss_before(mock_demos[:4], keep) == before
    err = capsys.readouterr().err
    assert "kept from the stopped run, not computed again" in err and "loss over 4 examples (no update)" not in err
    other = trainer_for(tiny_small_dir, tmp_path / "c", micro_batch_size=2)
    assert other.loss_before(mock_demos[:3], keep) == other.evaluate(mock_demos[:3])
    assert "loss over 3 examples (no update)" in capsys.readouterr().err


def test_sft_stopped_by_ctrl_c_resumes_at_its_last_saved_step_and_ends_where_an_unstopped_run_ends(
        tiny_small_dir, mock_demos, tmp_path, capsys):
    """Ctrl-C (KeyboardInterrupt in the main thread, as Python's SIGINT handler raises it) right after SFT has
    saved its first step: the event, not a moment, so a loaded machine cannot let the run finish first; a new
    trainer built the same way continues from the saved step, says so, and ends with bit-identical weights."""
    import _thread

    demos, settings = mock_demos[2:6], {"micro_batch_size": 2, "epochs": 6}  # 12 steps
    whole = trainer_for(tiny_small_dir, tmp_path / "whole", **settings)
    whole.sft(demos)
    state = tmp_path / "resume" / "sft_state.pt"
    stopped = trainer_for(tiny_small_dir, tmp_path / "stopped", **settings)
    save = stopped._save_sft_state

    def save_then_ctrl_c(*args, **kwargs) -> None:
        save(*args, **kwargs)
        _thread.interrupt_main()  # raised at the main thread's next bytecode, inside the training loop

    stopped._save_sft_state = save_then_ctrl_c
    with pytest.raises(KeyboardInterrupt):
        stopped.sft(demos, resume_dir=state.parent, save_every_s=0)
    saved = torch.load(state, weights_only=False)["step"]
    assert saved == 1  # the first save, and the run stopped there
    capsys.readouterr()
    resumed = trainer_for(tiny_small_dir, tmp_path / "resumed", **settings)
    records = resumed.sft(demos, resume_dir=state.parent, save_every_s=0)
    assert f"sft: resuming at step {saved} of 12" in capsys.readouterr().err
    assert [r["step"] for r in records] == list(range(saved + 1, 13))
    assert torch.equal(flat_params(resumed), flat_params(whole))
    other = trainer_for(tiny_small_dir, tmp_path / "other", **settings)  # other examples: the state is not theirs
    assert len(other.sft(mock_demos[:4], resume_dir=state.parent, save_every_s=1e9)) == 12


def test_micro_batches_with_accumulation_give_the_same_gradient_as_one_batch(tiny_small_dir, mock_demos,
                                                                              tmp_path):
    demos = mock_demos[:4]  # different lengths: the one-batch run pads them
    whole = trainer_for(tiny_small_dir, tmp_path / "a", micro_batch_size=4, max_grad_norm=1e6)
    split = trainer_for(tiny_small_dir, tmp_path / "b", grad_accum_steps=4, max_grad_norm=1e6)
    (a,), (b,) = whole.sft(demos), split.sft(demos)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["tokens"] == b["tokens"]
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for p, q in zip(whole.model.parameters(), split.model.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-7)
    assert len(trainer_for(tiny_small_dir, tmp_path / "c", grad_accum_steps=2).sft(demos)) == 2


def test_training_is_deterministic_for_a_seed_and_the_seed_matters(tiny_small_dir, mock_demos, tmp_path):
    def run(seed: int, name: str) -> torch.Tensor:
        trainer = trainer_for(tiny_small_dir, tmp_path / name, seed=seed)
        trainer.sft(mock_demos[2:6])  # four different conversations
        return flat_params(trainer)

    first = run(0, "a")
    assert torch.equal(first, run(0, "b"))
    assert not torch.equal(first, run(1, "c"))  # another example order


def test_non_finite_gradient_stops_before_the_weights_change(tiny_small_dir, mock_demos, tmp_path):
    trainer = trainer_for(tiny_small_dir, tmp_path)
    with torch.no_grad():
        trainer.model.model.norm.weight.fill_(float("nan"))
    before = flat_params(trainer)
    with pytest.raises(FloatingPointError, match="step 1: gradient norm is nan"):
        trainer.sft(mock_demos[:1])
    assert torch.equal(flat_params(trainer).nan_to_num(), before.nan_to_num()) and trainer.step == 0
    with pytest.raises(ValueError, match="no example has a mask-1 token"):
        trainer.sft([TrainExample([1, 2, 3], [0, 0, 0])])


# ---------------------------------------------------------------------------------------------------------------
# GRPO on real rollouts


def rollout(engine, tokenizer, seed: int, temperature: float = 1.0):
    task = get_task("mock", "create_task_1")
    cfg = replace(Tau2Config.from_env({}), max_turns=2)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=16, seed=seed,
                              stop_token_ids=(tokenizer.eos_token_id,))
    return asyncio.run(run_episode(EpisodeSpec.from_config("mock", task, ScriptedUser(task), cfg),
                                   Driver.from_config(engine, tokenizer, sampling, cfg)))


@pytest.fixture(scope="module")
def rollouts(tiny_engine, small_tokenizer):
    return [rollout(tiny_engine, small_tokenizer, seed) for seed in (1, 2)]


def as_example(traj, advantage: float) -> TrainExample:
    return examples_from_trajectory(traj.prompt_ids, traj.response_ids, traj.loss_mask, traj.rollout_logprobs,
                                    advantage)


def test_grpo_step_raises_positive_and_lowers_negative_sampled_tokens(tiny_small_dir, rollouts, tmp_path):
    good, bad = as_example(rollouts[0], 1.0), as_example(rollouts[1], -1.0)
    assert good.num_targets > 0 and bad.num_targets > 0
    trainer = trainer_for(tiny_small_dir, tmp_path, micro_batch_size=2)
    nll_good, nll_bad = trainer.evaluate([good]), trainer.evaluate([bad])
    record = trainer.grpo_step([good, bad])
    # The rollout's log-probs are the engine's; on the same weights the trainer scores them identically.
    assert record["ratio_min"] == pytest.approx(1.0, abs=1e-4) and record["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert record["clipfrac"] == 0.0 and abs(record["ppo_kl"]) < 1e-5
    assert trainer.evaluate([good]) < nll_good  # mean log-prob of A's sampled tokens went up
    assert trainer.evaluate([bad]) > nll_bad  # and B's went down
    logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(logged) == 1 and logged[0]["stage"] == "grpo"
    assert {"pg_loss", "clipfrac", "entropy", "ppo_kl", "ratio_mean", "ratio_min", "ratio_max", "grad_norm",
            "lr", "tokens", "advantage_mean"} <= logged[0].keys()


@pytest.mark.parametrize("reduction", ["sample_mean", "token_mean"])
def test_a_wholly_masked_example_counts_as_slime_counts_it(tiny_small_dir, rollouts, tmp_path, reduction):
    """One sample and one token of the step's means, whatever the micro-batching (issue 32: the trainer dropped it;
    slime's loss_function with it is tests/contract/test_slime_awsft.py)."""
    good, bad = as_example(rollouts[0], 1.0), as_example(rollouts[1], -0.5)
    masked = replace(bad, loss_mask=[0] * len(bad.loss_mask), advantage=0.5)
    records = {}
    for micro in (1, 3):
        trainer = trainer_for(tiny_small_dir, tmp_path / str(micro), micro_batch_size=micro, loss_reduction=reduction)
        records[micro] = trainer.grpo_step([good, masked, bad])
    assert records[1]["pg_loss"] == pytest.approx(records[3]["pg_loss"], abs=1e-5)
    alone = trainer_for(tiny_small_dir, tmp_path / "alone", loss_reduction=reduction).grpo_step([good, bad])
    # on-policy, ratio 1: pg = -A per token; the masked example adds nothing but its count to the denominators
    n_good, n_bad = good.num_targets, bad.num_targets
    if reduction == "sample_mean":
        expected = (-1.0 + 0.5) / 3
    else:
        expected = (-n_good + 0.5 * n_bad) / (n_good + n_bad + 1)
    assert records[3]["pg_loss"] == pytest.approx(expected, abs=1e-4)
    assert records[3]["tokens"] == alone["tokens"] == n_good + n_bad
    assert abs(alone["pg_loss"] - records[3]["pg_loss"]) > 1e-3  # what leaving it out gave


def test_repeated_steps_on_one_batch_hit_the_clip_bound(tiny_small_dir, mock_demos, tmp_path):
    trainer = trainer_for(tiny_small_dir, tmp_path, lr=1e-2)
    good = scored(tiny_small_dir, mock_demos[:1], (1.0,))  # old log-probs stay those of the starting weights
    records = [trainer.grpo_step(good) for _ in range(6)]
    assert records[0]["clipfrac"] == 0.0 and records[-1]["clipfrac"] > 0
    assert records[-1]["ratio_max"] > 1.28  # pushed past 1 + eps_clip_high, where its gradient stops


def test_rollout_temperature_scores_tokens_under_the_distribution_they_came_from(tiny_small_dir, tiny_engine,
                                                                               small_tokenizer, tmp_path):
    example = as_example(rollout(tiny_engine, small_tokenizer, seed=5, temperature=0.7), 0.0)
    matched = trainer_for(tiny_small_dir, tmp_path / "a", rollout_temperature=0.7).grpo_step([example])
    assert abs(matched["ppo_kl"]) < 1e-5 and matched["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    unmatched = trainer_for(tiny_small_dir, tmp_path / "b").grpo_step([example])
    assert abs(unmatched["ratio_max"] - 1.0) > 0.01


def test_kl_to_the_frozen_reference_starts_at_zero_and_grows(tiny_small_dir, mock_demos, tmp_path):
    trainer = trainer_for(tiny_small_dir, tmp_path, kl_coef=0.1)
    examples = [replace(mock_demos[0], advantage=1.0), replace(mock_demos[3], advantage=-1.0)]  # on-policy
    first, second = trainer.grpo_step(examples), trainer.grpo_step(examples)
    assert first["kl"] == 0.0 and second["kl"] > 0
    assert not any(p.requires_grad for p in trainer.reference.parameters())
    assert "kl" not in trainer_for(tiny_small_dir, tmp_path / "b").grpo_step(examples)


def scored(model_dir: Path, examples: list[TrainExample], advantages: tuple[float, ...],
           shifts: tuple[float, ...] = (0.0,)) -> list[TrainExample]:
    """`examples` as GRPO examples: the model's own log-probs (plus a shift cycling through `shifts` over the
    positions) as old log-probs, so ratio = exp(-shift) before any update."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    out = []
    for ex, advantage in zip(examples, advantages):
        with torch.no_grad():
            logprobs = token_logprobs(model, torch.tensor([ex.input_ids]), torch.ones(1, len(ex.input_ids)))[0][0]
        old = [float(lp) + shifts[i % len(shifts)] if m else 0.0
               for i, (lp, m) in enumerate(zip(logprobs, ex.loss_mask))]
        out.append(replace(ex, advantage=advantage, old_logprobs=old))
    return out


@pytest.fixture(scope="module")
def off_policy_examples(tiny_small_dir, mock_demos) -> list[TrainExample]:
    """Two short demonstrations (advantages +1, -1) with ratios inside the clip band, between each bound and
    where another setting would put it (0.86: between 0.8 and 0.9; 1.35: between 1.28 and 1.5), and beyond."""
    return scored(tiny_small_dir, [mock_demos[0], mock_demos[3]], (1.0, -1.0), shifts=(0.15, -0.3, 0.0, 0.5, -0.5))


def two_grpo_steps(model_dir: Path, log_dir: Path, examples: list[TrainExample], **overrides) -> torch.Tensor:
    trainer = trainer_for(model_dir, log_dir, **overrides)
    for _ in range(2):  # the KL term has zero gradient until the policy has moved once
        trainer.grpo_step(examples)
    return flat_params(trainer)


@pytest.fixture(scope="module")
def grpo_baseline(tiny_small_dir, off_policy_examples, tmp_path_factory) -> torch.Tensor:
    return two_grpo_steps(tiny_small_dir, tmp_path_factory.mktemp("baseline"), off_policy_examples)


@pytest.mark.parametrize("override", [
    {"lr": 2e-3}, {"weight_decay": 0.0}, {"betas": (0.8, 0.98)}, {"max_grad_norm": 1e-3}, {"eps_clip": 0.1},
    {"eps_clip_high": 0.5}, {"kl_coef": 0.5}, {"entropy_coef": 0.05}, {"rollout_temperature": 0.8},
    {"dtype": "bfloat16"}, {"loss_reduction": "token_mean"},
])
def test_every_grpo_setting_changes_the_update(tiny_small_dir, off_policy_examples, grpo_baseline, tmp_path,
                                               override):
    assert not torch.equal(grpo_baseline, two_grpo_steps(tiny_small_dir, tmp_path, off_policy_examples, **override))


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints, logging, devices


def test_save_writes_a_model_directory_the_engine_loads_and_samples_from(tiny_small_dir, mock_demos, tmp_path):
    trainer = LocalTrainer(tiny_small_dir, TrainConfig(log_jsonl=tmp_path / "m.jsonl", lr=1e-3))
    trainer.sft(mock_demos[:2])
    out = trainer.save(tmp_path / "ckpt" / "step_1")
    assert sorted(p.name for p in out.parent.iterdir()) == ["step_1"]  # no staging directory left behind
    engine = TransformersEngine.from_pretrained(out, seed=0)
    assert torch.equal(flat_params(trainer), torch.cat([p.flatten() for p in engine.model.parameters()]))
    prompt = engine.tokenizer.encode(render(engine.tokenizer, [{"role": "user", "content": "hi"}], None,
                                            add_generation_prompt=True), add_special_tokens=False)
    result = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=5, seed=0)))
    assert len(result.output_ids) == len(result.output_logprobs) >= 1
    with pytest.raises(FileExistsError, match="not empty"):
        trainer.save(out)


class FakeWandb(types.ModuleType):
    """Stands in for wandb, which is not installed here; follows its documented API: `wandb.init(project=,
    config=, mode=)` returns a run with `.log(data, step=)` and `.finish()`."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.init_kwargs: dict = {}
        self.logged: list[tuple[dict, int]] = []
        self.finished = False

    def init(self, **kwargs):
        self.init_kwargs = kwargs
        return self

    def log(self, data, step):
        self.logged.append((data, step))

    def finish(self):
        self.finished = True


def test_wandb_without_the_package_is_a_one_line_error(tiny_small_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail even where it is installed
    with pytest.raises(RuntimeError, match="wandb_project is set but wandb is not installed") as info:
        trainer_for(tiny_small_dir, tmp_path, wandb_project="tau2")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("key", "mode"), [(None, "offline"), ("secret-key", None)])
def test_wandb_logs_every_step_and_runs_offline_without_a_key(tiny_small_dir, mock_demos, tmp_path, monkeypatch,
                                                              key, mode):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    if key is None:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    else:
        monkeypatch.setenv("WANDB_API_KEY", key)
    trainer = trainer_for(tiny_small_dir, tmp_path, wandb_project="tau2", grad_accum_steps=2)
    trainer.sft(mock_demos[:4])
    trainer.close()
    assert fake.init_kwargs["project"] == "tau2" and fake.init_kwargs["mode"] == mode
    assert "secret-key" not in json.dumps(fake.init_kwargs["config"])
    assert [step for _, step in fake.logged] == [1, 2] and "loss" in fake.logged[0][0] and fake.finished


def test_cuda_requested_without_a_gpu_is_a_clear_error(tiny_small_dir, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="torch.cuda.is_available\\(\\) is False"):
        trainer_for(tiny_small_dir, tmp_path, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_training_runs_on_the_gpu(tiny_small_dir, mock_demos, rollouts, tmp_path):
    trainer = trainer_for(tiny_small_dir, tmp_path, device="cuda", dtype="bfloat16", lr=3e-3, epochs=3)
    assert next(trainer.model.parameters()).device.type == "cuda"
    before = trainer.evaluate(mock_demos[6:])
    trainer.sft(mock_demos[:6])
    assert trainer.evaluate(mock_demos[6:]) < before - 1.0
    record = trainer.grpo_step([as_example(rollouts[0], 1.0), as_example(rollouts[1], -1.0)])
    assert math.isfinite(record["loss"]) and record["ratio_max"] < 2.0
    out = trainer.save(tmp_path / "gpu_ckpt")
    assert TransformersEngine.from_pretrained(out).model.dtype == torch.float32
