"""Issue 9, P3: the rollout's per-turn token cost as the conversation grows (1k, 8k, 32k tokens of history).

    .venv/bin/python bench/token_delta.py            # markdown table
    .venv/bin/python bench/token_delta.py --profile  # + bench/profiles/token_delta.txt (pyinstrument)

The history is an airline customer-service conversation with the Qwen3 chat template: tau2's agent system prompt
(mock policy, so that 1k tokens is reachable) and tool schemas, then rounds of a user message, an assistant tool
call (get_reservation_details) and its result (a real reservation from tau2's airline database), grown until the
rendered conversation holds the target number of tokens. One turn is then timed at each size:

- token-delta step: what `run_episode` does per turn: append the sampled ids and log-probs (`TokenBuffer.add_policy`),
  render and tokenize only the observation with `ObservationTemplate.delta_ids`, append it (`add_observation`).
- naive step: what a rollout without token deltas does: re-render the whole conversation with the chat template
  and re-tokenize all of it (`render` + `encode`).
- request build, for information: `TokenBuffer.all_ids()` and the `/generate` body with its JSON encoding. Every
  turn sends the whole prompt (SGLang's contract), so this part is linear in the history by nature.

Times are medians of --repeats timings per step and size, taken in blocks over passes across the sizes (so load
changes touch all sizes alike); GC off, as timeit.
Exits 1 if the token-delta ids differ from the whole conversation's; else 0.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import PROFILES, load_tokenizer  # noqa: E402

from tau2_rl_pipeline.benchmark.actions import render_assistant_text  # noqa: E402
from tau2_rl_pipeline.benchmark.prompting import agent_system_prompt, assistant_chat_message, render, tool_schemas  # noqa: E402
from tau2_rl_pipeline.rollout.engines import sglang_generate_body  # noqa: E402
from tau2_rl_pipeline.rollout.tokens import ObservationTemplate, TokenBuffer  # noqa: E402

SIZES = (1024, 8192, 32768)
LOGPROB = -0.5


class Conversation:
    """The agent's view of a growing airline conversation as chat messages, with the same tool call each round."""

    def __init__(self, tokenizer):
        from tau2.registry import registry

        self.tokenizer = tokenizer
        mock = registry.get_env_constructor("mock")()
        self.tools = tool_schemas(mock.get_tools())
        self.chat = [{"role": "system", "content": agent_system_prompt(mock.get_policy())},
                     {"role": "assistant", "content": "Hi! How can I help you today?"}]
        airline = registry.get_env_constructor("airline")()
        self.reservations = list(airline.tools.db.reservations.values())
        self.round = 0

    def next_round(self, timed: bool = False) -> tuple[dict, tuple[str, list], list[dict]]:
        """The next round: the user's question, the assistant's tool call (content, calls), the tool's result.
        The timed round is the same at every size (the first reservation); the history's start at the second."""
        self.round += not timed
        res = self.reservations[0 if timed else self.round % len(self.reservations)]
        user = {"role": "user", "content": f"Can you check reservation {res.reservation_id} for me, please?"}
        call = ("Let me look that up.", [("get_reservation_details", {"reservation_id": res.reservation_id})])
        return user, call, [{"role": "tool", "content": res.model_dump_json()}]

    def grow_to(self, n_tokens: int) -> None:
        while self.tokens() < n_tokens:
            user, call, observation = self.next_round()
            self.chat += [user, assistant_chat_message(*call), *observation]

    def tokens(self) -> int:
        return len(self.ids())

    def ids(self) -> list[int]:
        return self.tokenizer.encode(render(self.tokenizer, self.chat, self.tools, add_generation_prompt=True),
                                     add_special_tokens=False)


def steps(tokenizer, size: int, sampling) -> tuple[dict, dict]:
    """One turn at a history of `size` tokens: facts about it, and the three timed steps (each times itself,
    after its own setup)."""
    conv = Conversation(tokenizer)
    conv.grow_to(size)
    template = ObservationTemplate(tokenizer)
    user, call, observation = conv.next_round(timed=True)
    # the sampled turn: canonical ids of the tool call, ending with <|im_end|> as sampling stops there
    sampled = tokenizer.encode(render_assistant_text(*call) + tokenizer.eos_token, add_special_tokens=False)
    logprobs = [LOGPROB] * len(sampled)
    chat_before = conv.chat + [user]
    full_chat = chat_before + [assistant_chat_message(*call), *observation]
    # the policy's prompt: the history, the user's turn, the generation prompt
    prompt = tokenizer.encode(render(tokenizer, chat_before, conv.tools, add_generation_prompt=True),
                              add_special_tokens=False)

    def delta_step() -> float:
        buf = TokenBuffer(prompt)
        t0 = time.perf_counter()
        buf.add_policy(sampled, logprobs)
        closing = [] if sampled[-1:] == [template.end_of_turn_id] else [template.end_of_turn_id]
        buf.add_observation(closing + template.delta_ids(observation))
        return time.perf_counter() - t0

    def naive_step() -> float:
        t0 = time.perf_counter()
        tokenizer.encode(render(tokenizer, full_chat, conv.tools, add_generation_prompt=True),
                         add_special_tokens=False)
        return time.perf_counter() - t0

    def request_build() -> float:
        buf = TokenBuffer(prompt)
        buf.add_policy(sampled, logprobs)
        buf.add_observation(template.delta_ids(observation))
        t0 = time.perf_counter()
        sglang_generate_body(buf.all_ids(), sampling)
        return time.perf_counter() - t0

    # the two ways must give the same ids, or the comparison means nothing
    buf = TokenBuffer(prompt)
    buf.add_policy(sampled, logprobs)
    buf.add_observation(template.delta_ids(observation))
    naive = tokenizer.encode(render(tokenizer, full_chat, conv.tools, add_generation_prompt=True),
                             add_special_tokens=False)
    if buf.all_ids() != naive:
        sys.exit(f"token-delta ids differ from the whole conversation's ids at {size} tokens")
    info = {"history": len(prompt), "delta_tokens": len(naive) - len(prompt) - len(sampled)}
    return info, {"delta_s": delta_step, "naive_s": naive_step, "request_s": request_build}


def measure(sized: list[tuple[dict, dict]], repeats: int, passes: int = 5) -> list[dict]:
    """Medians of `repeats` timings of every step at every size. They are taken in `passes` passes over the sizes,
    each timing a block of consecutive calls of one step (the first untimed: the step before, at another size,
    leaves caches cold), so that a change in the machine's load touches all sizes alike. The cyclic GC is off
    meanwhile, as timeit does: a collection's cost depends on the whole process, not on the step."""
    samples = [{key: [] for key in fns} for _, fns in sized]
    block = max(1, repeats // passes)
    gc.collect()
    gc.disable()
    try:
        for _ in range(passes):
            for (_, fns), out in zip(sized, samples):
                for key, fn in fns.items():
                    fn()
                    out[key].extend(fn() for _ in range(block))
    finally:
        gc.enable()
    return [{**info, **{key: statistics.median(v) for key, v in out.items()}}
            for (info, _), out in zip(sized, samples)]


def table(rows: list[dict]) -> str:
    base = rows[0]["delta_s"]
    header = ("| history (tokens) | token-delta step | vs 1k | naive re-render + re-tokenize | naive / delta "
              "| request build (info) |")
    out = [header, "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['history']} | {r['delta_s'] * 1e3:.3f} ms | {r['delta_s'] / base:.2f}x "
                   f"| {r['naive_s'] * 1e3:.2f} ms | {r['naive_s'] / r['delta_s']:.0f}x "
                   f"| {r['request_s'] * 1e3:.2f} ms |")
    out.append(f"\ntoken delta of the timed turn: {rows[0]['delta_tokens']} tokens (a tool result in the template's "
               "tool-response turn, then the next generation prompt), the same at every size; medians of repeats")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from tau2_rl_pipeline.rollout.engines import SamplingParams

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(SIZES),
                        help="history sizes in tokens, comma-separated")
    parser.add_argument("--repeats", type=int, default=100, help="timings per step and size; medians are reported")
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of the measurements")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer()
    sized = [steps(tokenizer, size, SamplingParams(max_new_tokens=1024)) for size in args.sizes]
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    rows = measure(sized, args.repeats)
    if profiler is not None:
        profiler.stop()
        PROFILES.mkdir(exist_ok=True)
        (PROFILES / "token_delta.txt").write_text(profiler.output_text(unicode=False, color=False))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
