"""The model server of bench/long_tail.py (issue 13, P6), in a process of its own: the loopback server with a
script that makes each episode last its prompt row's drawn number of policy turns.

    python bench/long_tail_server.py MODEL_DIR --latency 0.5 --seed 0 --tail-rate 0.05 [--score]

prints `PORT n`, then answers each line on stdin (`stats`, or `reset` to start a mode afresh) with one JSON line:
the model calls served, the tail episodes begun and its CPU seconds. The row's turns reach it in the user
simulator's instructions (`row_mark`), which bench/long_tail.py writes into its copies of mock's create_task_1.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))  # the test rigs (tests/support)

ROW_MARK = re.compile(r"\[long-tail row (\d+): (\d+) policy turns\]")
STEPS_ASKED = re.compile(r"Hello, I need (\d+) steps\.")
KEEP_GOING = "Hello, I need you to keep going."
STOP = "###STOP###"
CANNED_LOGPROB = -0.1  # the log-prob of every scripted token unless --score


def row_mark(row: int, turns: int) -> str:
    """What a prompt row's user instructions carry: its index and its drawn policy turns."""
    return f"[long-tail row {row}: {turns} policy turns]"


def is_tail(seed: int, row: int, occurrence: int, rate: float) -> bool:
    """The per-episode tail coin: the `occurrence`-th episode of a row, the same in every mode."""
    return random.Random(f"{seed}:{row}:{occurrence}").random() < rate


class LongTailResponder:
    """`LoopbackServer.responder`: the user asks for the row's turns (or, on a tail toss, for no end), the policy
    calls get_users until one turn is left and then closes, the user then stops."""

    def __init__(self, tokenizer, *, seed: int, tail_rate: float) -> None:
        from tau2_rl_pipeline.benchmark.actions import render_assistant_text

        self.tok, self.seed, self.tail_rate = tokenizer, seed, tail_rate
        self.tool_ids = self.ids(render_assistant_text("", [("get_users", {})]))
        self.done_ids = self.ids("Done.")
        self.reset()

    def reset(self) -> None:
        self.occurrences: dict[int, int] = {}
        self.tails = 0

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text + self.tok.eos_token, add_special_tokens=False)

    def __call__(self, path: str, input_ids: list[int]) -> list[int]:
        text = self.tok.decode(input_ids, skip_special_tokens=False)
        if path == "/v1/chat/completions":
            if text.count("<|im_start|>assistant") > 1:  # after the opening, the user speaks only to stop
                return self.ids(STOP)
            mark = ROW_MARK.search(text)
            if mark is None:
                return self.ids(STOP)
            row, turns = int(mark.group(1)), int(mark.group(2))
            k = self.occurrences[row] = self.occurrences.get(row, -1) + 1
            if is_tail(self.seed, row, k, self.tail_rate):
                self.tails += 1
                return self.ids(KEEP_GOING)
            return self.ids(f"Hello, I need {turns} steps.")
        asked = STEPS_ASKED.search(text)
        if KEEP_GOING in text or (asked and text.count("<tool_response>") < int(asked.group(1)) - 1):
            return self.tool_ids
        return self.done_ids


def canned_server_class():
    """The loopback server without its two per-request CPU costs that an SGLang fleet pays on its own GPUs'
    hosts, not on the rollout machine: the teacher-forced scoring of scripted replies (log-probs here are a
    constant, as bench/harness.py's canned engine answers) and the prefix-cache lookup over recent prompts. With
    them, on 2 cores, this process saturated a core and set the pace of the over-sampled steps (`--score`)."""
    from support.loopback_server import LoopbackServer, truncate_scripted

    from tau2_rl_pipeline.rollout.engines import GenerateResult

    class CannedLoopbackServer(LoopbackServer):
        def _cached_tokens(self, input_ids: list[int]) -> int:
            return 0

        async def _run(self, input_ids, sampling, path="/generate"):
            rule = self.engine.stop_rule(sampling)
            ids, finish = truncate_scripted(self.responder(path, input_ids), rule, sampling.max_new_tokens)
            result = GenerateResult(output_ids=ids, output_logprobs=[CANNED_LOGPROB] * len(ids), finish_reason=finish)
            return result, rule.matched(ids) if finish == "stop" else None

    return CannedLoopbackServer


def serve(model: str, latency: float, seed: int, tail_rate: float, score: bool) -> int:
    """The loopback server with the responder; prints its port, then answers `stats` / `reset` lines on stdin."""
    import torch
    from support.loopback_server import LoopbackServer

    # One thread: on a busy 2-core machine torch's two threads wait on each other (a 1000-token teacher-forced
    # scoring took 0.4-1.2 s instead of 15 ms).
    torch.set_num_threads(1)
    server_class = LoopbackServer if score else canned_server_class()
    server = server_class.from_model_dir(model, seed=0, latency_s=latency)
    server.responder = responder = LongTailResponder(server.tokenizer, seed=seed, tail_rate=tail_rate)
    with server:
        print(f"PORT {server.port}", flush=True)
        for line in sys.stdin:
            if line.strip() == "reset":
                responder.reset()
                server.requests.clear()
                server.request_times.clear()
            print(json.dumps({"generate": server.count("/generate"), "chat": server.count("/v1/chat/completions"),
                              "tail_episodes": responder.tails, "cpu_s": time.process_time()}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="HF model directory (weights + tokenizer)")
    parser.add_argument("--latency", type=float, required=True, help="seconds every model call waits")
    parser.add_argument("--seed", type=int, required=True, help="seed of the tail coins")
    parser.add_argument("--tail-rate", type=float, required=True, help="chance that an episode never closes")
    parser.add_argument("--score", action="store_true", help="score scripted replies with the model (CPU)")
    cfg = parser.parse_args(argv)
    return serve(cfg.model, cfg.latency, cfg.seed, cfg.tail_rate, cfg.score)


if __name__ == "__main__":
    sys.exit(main())
