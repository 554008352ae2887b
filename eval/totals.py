"""Batches and their totals: throughput, block efficiency, and the pairing of a point's batches with the
baseline's that every ratio rests on."""
from __future__ import annotations

from collections import defaultdict

from eval.records import EARLIER_PROCESS
from eval.stats import ratio


def unit_of(sample: dict) -> tuple:
    """A point's batch: (repeat, batch_index)."""
    return sample.get("repeat", 0), sample["batch_index"]


def units(samples: list[dict]) -> dict[tuple, list[dict]]:
    by_unit: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        by_unit[unit_of(s)].append(s)
    return by_unit


def decode_elapsed(s: dict) -> float | None:
    if s.get("prefill_s") is None:
        return None
    # a row that ended at its first token has no decode, though the batch's draft prefill is on its record
    return max(s["latency_s"] - s["prefill_s"] - (s.get("draft_prefill_s") or 0.0), 0.0)


def unit_totals(batch: list[dict]) -> dict:
    """One batch: tokens and wall (its slowest row), and the same after both prefills (None where unmeasured)."""
    decode = [decode_elapsed(s) for s in batch]
    return {"tokens": sum(s["new_tokens"] for s in batch), "wall": max(s["latency_s"] for s in batch),
            "decode_tokens": sum(max(s["new_tokens"] - 1, 0) for s in batch),
            "decode_wall": None if any(d is None for d in decode) else max(decode)}


def throughput(samples: list[dict]) -> float | None:
    """sum(N) / sum(batch wall times), a batch's wall being its slowest row's latency."""
    totals = [unit_totals(b) for b in units(samples).values()]
    return ratio(sum(t["tokens"] for t in totals), sum(t["wall"] for t in totals))


def block_efficiency(samples: list[dict]) -> float | None:
    if not samples or any(s.get("target_forwards") is None for s in samples):
        return None  # the peers do not count their forwards
    return ratio(sum(s["new_tokens"] for s in samples), sum(s["target_forwards"] for s in samples))


def clusters_of(samples: list[dict]) -> dict[int, int]:
    """batch_index -> the cluster a ratio's bootstrap resamples it with: its own, but batches that hold turns of one
    conversation (dataset.turns) are one cluster (connected through their conversations), since a conversation's
    turns are not independent: a later turn quotes the earlier answers."""
    parent: dict = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for s in samples:
        batch = ("batch", s["batch_index"])
        root(batch)
        if s.get("conversation") is not None:
            parent[root(batch)] = root(("conversation", s["conversation"]))
    names: dict = {}  # numbered by their first batch: without conversations, cluster i is the i-th batch
    return {b: names.setdefault(root(("batch", b)), len(names)) for b in sorted({s["batch_index"] for s in samples})}


def paired_clusters(samples: list[dict], baseline: list[dict], decode: bool = False) -> list[tuple]:
    """Per prompt batch that both sides finished, summed over the repeats both finished, in batch order:
    (point tokens, point wall, baseline tokens, baseline wall). The unit a ratio's bootstrap resamples: a prompt
    batch carries all its repeats, and the batches of one conversation's turns go together (clusters_of). Empty
    when decode=True and either side has no prefill time."""
    mine, theirs = units(samples), units(baseline)
    cluster = clusters_of(samples)
    clusters: dict[int, list[float]] = {}
    for key in sorted(set(mine) & set(theirs)):
        a, b = unit_totals(mine[key]), unit_totals(theirs[key])
        if decode:
            if a["decode_wall"] is None or b["decode_wall"] is None:
                return []
            values = (a["decode_tokens"], a["decode_wall"], b["decode_tokens"], b["decode_wall"])
        else:
            values = (a["tokens"], a["wall"], b["tokens"], b["wall"])
        total = clusters.setdefault(cluster[key[1]], [0, 0.0, 0, 0.0])
        for i, value in enumerate(values):
            total[i] += value
    return [tuple(clusters[index]) for index in sorted(clusters)]


def processes_of(batch: list[dict]) -> set:
    """The processes that measured a batch (records written before processes were recorded: their Ray worker, else
    EARLIER_PROCESS)."""
    return {s.get("process") or s.get("worker") or EARLIER_PROCESS for s in batch}  # an older Ray folder: its worker


def cross_process_pairs(samples: list[dict], baseline: list[dict]) -> int:
    """Paired batches whose point and baseline were measured by different processes (a resumed run, a restarted
    worker): not back to back, so the machine may have changed in between."""
    mine, theirs = units(samples), units(baseline)
    return sum(1 for key in set(mine) & set(theirs) if processes_of(mine[key]) != processes_of(theirs[key]))
