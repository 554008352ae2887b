"""The prediction by replay of a static batch's schedule (#33): the decode a batch ran, round by round, priced with the
costs probed in the run, instead of Leviathan's closed form for an average row.

A static batch decodes in lockstep until its slowest row ends: round k runs over the rows still running, its draft
model drafts G_k = the most any of them drafted (the rest are padded), and its target verifies G_k + 1 tokens per row;
a round in which no row drafts is one plain target step. In units of the target's 1-token step T at the batch's
probed size, round k costs G_k c + v(G_k) (v(0) = 1), and the baseline's batch N_max - 1 steps, N_max its longest
row's new tokens. The predicted decode speedup is then

    (sum of the point's decode tokens / sum of its rounds' costs) / (sum of the baseline's decode tokens / its steps)

over the batches both ran (decode tokens: each row's new tokens after the prefill's). Rows that have finished leave
the batch in the engine; the probes run at the batch's size only, so every round is priced at that size: the tails of
both sides alike. At batch 1 with a constant gamma this is Leviathan's E(alpha) / (gamma c + v) with the alpha solved
from the same rounds (tests/eval/test_replay.py); above it, the gap to Leviathan's is the cost of the batch waiting for
its slowest row. What the replay leaves out: the prefills (the decode speedup is its measure), the host's work between
steps, and the shrinking batch's cheaper steps.
"""
from __future__ import annotations

from eval.stats import ratio
from eval.totals import units


def round_cost(active: list[dict], c: float, v_of) -> float | None:
    """One round over the rows still running (their round records), in target steps: the widest draft prices both
    the draft's forwards and the verification. None where v is unknown at that width."""
    drafted = max(r["drafted"] for r in active)
    if drafted == 0:
        return 1.0
    v = v_of(drafted)
    return None if v is None else drafted * c + v


def speculative_steps(rows: list[list[dict]], c: float, v_of) -> float | None:
    """A static batch's decode in target steps: its rows' rounds (row i's rounds, in order) replayed in lockstep."""
    total = 0.0
    for k in range(max((len(r) for r in rows), default=0)):
        cost = round_cost([r[k] for r in rows if len(r) > k], c, v_of)
        if cost is None:
            return None
        total += cost
    return total


def baseline_steps(new_tokens: list[int]) -> int:
    """The baseline's static batch: one step per token after the prefill's, until its longest row ends."""
    return max((n - 1 for n in new_tokens), default=0)


def decode_tokens(batch: list[dict]) -> int:
    return sum(max(s["new_tokens"] - 1, 0) for s in batch)


def replay_speedup(samples: list[dict], baseline: list[dict], c: float | None, v_of) -> float | None:
    """The predicted decode speedup of a static point from its own batches' rounds and the baseline's rows (paired by
    batch: repeat and batch index), c and v_of(G) (v of a G-draft chain) at the batch's size. None without c, a
    paired batch, or v at a width a round verified."""
    if c is None:
        return None
    mine, theirs = units(samples), units(baseline)
    paired = sorted(set(mine) & set(theirs))
    spec_tokens = spec_steps = base_tokens = base_steps = 0.0
    for unit in paired:
        steps = speculative_steps([s.get("rounds") or [] for s in mine[unit]], c, v_of)
        if steps is None:
            return None
        spec_tokens += decode_tokens(mine[unit])
        spec_steps += steps
        base_tokens += decode_tokens(theirs[unit])
        base_steps += baseline_steps([s["new_tokens"] for s in theirs[unit]])
    return ratio(ratio(spec_tokens, spec_steps), ratio(base_tokens, base_steps))
