"""Batches and their totals: throughput, block efficiency, and the pairing of a point's records with the
baseline's that every ratio rests on: one function for fixed batches and load points, its pairing a parameter (a
served point is a batch whose rows arrive: eval/served_figures.py REQUESTS)."""
from __future__ import annotations

import statistics

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

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


@dataclass(frozen=True)
class Ratio:
    """A ratio of the point's totals to the baseline's over the units both finished (eval/stats.py ratio_of_totals)."""
    name: str  # its metric (its interval: name + "_ci95")
    measure: Callable[[list[dict]], tuple | None]  # a unit's records -> (amount, time); None: the unit has none
    every_pair: bool = False  # a unit without it: no ratio at all (its records do not time it); else that pair is left out


@dataclass(frozen=True)
class Pairing:
    """How a point's records pair with its baseline's: by unit (a fixed batch: (repeat, batch_index); a load
    point's request: (repeat, request, sample_id)), each unit resampled with its cluster (a prompt batch or a
    request with all its repeats, a conversation's turns together), and the ratios over them, the throughput
    ratio first; the outputs pair row by row (a batch's row: (repeat, sample_id); a request)."""
    rows: Callable[[list[dict]], list[tuple]]  # records -> [(row key, unit key, record)], in the records' order
    row_names: tuple[str, ...]  # the row key's parts, as a mismatch names them
    clusters: Callable[[list[dict]], Callable[[tuple, list[dict]], object]]  # the point's records -> (unit key, its
    #   records) -> its cluster, ordered as the bootstrap takes them
    ratios: tuple[Ratio, ...]
    reference_exact: bool  # whether the greedy reference's exact match is given (1 by definition) or left out


def tokens_and_wall(batch: list[dict]) -> tuple:
    """A batch's tokens and wall (its slowest row's latency)."""
    totals = unit_totals(batch)
    return totals["tokens"], totals["wall"]


def decode_tokens_and_wall(batch: list[dict]) -> tuple | None:
    """The same after both prefills; None where a row has no prefill time."""
    totals = unit_totals(batch)
    return None if totals["decode_wall"] is None else (totals["decode_tokens"], totals["decode_wall"])


def batch_clusters(samples: list[dict]) -> Callable[[tuple, list[dict]], int]:
    cluster = clusters_of(samples)
    return lambda key, batch: cluster[key[1]]


def batch_rows(samples: list[dict]) -> list[tuple]:
    return [((s.get("repeat", 0), s["sample_id"]), unit_of(s), s) for s in samples]


def units_of(samples: list[dict], pairing: Pairing) -> dict[tuple, list[dict]]:
    """unit key -> its records, in the records' order."""
    by_unit: dict[tuple, list[dict]] = defaultdict(list)
    for _, unit, s in pairing.rows(samples):
        by_unit[unit].append(s)
    return by_unit


SPEEDUP = Ratio("speedup", tokens_and_wall)
DECODE_SPEEDUP = Ratio("decode_speedup", decode_tokens_and_wall, every_pair=True)
BATCHES = Pairing(rows=batch_rows, row_names=("repeat", "sample_id"), clusters=batch_clusters,
                  ratios=(SPEEDUP, DECODE_SPEEDUP), reference_exact=True)


def paired_units(samples: list[dict], baseline: list[dict], pairing: Pairing = BATCHES) -> list[tuple]:
    """The unit keys both sides finished, in order."""
    return sorted(set(units_of(samples, pairing)) & set(units_of(baseline, pairing)))


def paired_clusters(samples: list[dict], baseline: list[dict], pairing: Pairing = BATCHES,
                    ratio_of: Ratio | None = None) -> list[tuple]:
    """Per cluster of the units both sides finished (a prompt batch, a request), summed over the repeats both
    finished, in cluster order: (point amount, point time, baseline amount, baseline time) of the ratio (default:
    the pairing's throughput ratio). The unit a ratio's bootstrap resamples: a prompt batch carries all its repeats,
    and the batches of one conversation's turns go together (clusters_of). Empty where the ratio needs every pair
    and one lacks it (no prefill time: no decode speedup)."""
    ratio_of = ratio_of or pairing.ratios[0]
    mine, theirs = units_of(samples, pairing), units_of(baseline, pairing)
    cluster = pairing.clusters(samples)
    clusters: dict = {}
    for key in sorted(set(mine) & set(theirs)):
        a, b = ratio_of.measure(mine[key]), ratio_of.measure(theirs[key])
        if a is None or b is None:
            if ratio_of.every_pair:
                return []
            continue
        total = clusters.setdefault(cluster(key, mine[key]), [0, 0.0, 0, 0.0])
        for i, value in enumerate((*a, *b)):
            total[i] += value
    return [tuple(clusters[index]) for index in sorted(clusters)]


def processes_of(batch: list[dict]) -> set:
    """The processes that measured a batch (records written before processes were recorded: their Ray worker, else
    EARLIER_PROCESS)."""
    return {s.get("process") or s.get("worker") or EARLIER_PROCESS for s in batch}  # an older Ray folder: its worker


def blocks_apart(samples: list[dict], baseline: list[dict]) -> dict | None:
    """Paired batches measured in server blocks that were not back to back (an engine in its own process runs each
    point's block of batches in a server of its own: records' extra back_to_back False, block_started_unix_s): how
    many, and the median minutes between the point's block start and its reference's; None where every pair was back
    to back (or the records predate the fields)."""
    mine, theirs = units(samples), units(baseline)
    gaps = []
    for key in set(mine) & set(theirs):
        extra = [s.get("extra") or {} for s in mine[key]]
        started = [e.get("block_started_unix_s") for e in extra if e.get("back_to_back") is False]
        reference = [(s.get("extra") or {}).get("block_started_unix_s") for s in theirs[key]]
        if started and started[0] is not None and reference and reference[0] is not None:
            gaps.append(abs(started[0] - reference[0]) / 60.0)
    return {"batches": len(gaps), "median_minutes": statistics.median(gaps)} if gaps else None


def cross_process_pairs(samples: list[dict], baseline: list[dict]) -> int:
    """Paired batches whose point and baseline were measured by different processes (a resumed run, a restarted
    worker): not back to back, so the machine may have changed in between."""
    mine, theirs = units(samples), units(baseline)
    return sum(1 for key in set(mine) & set(theirs) if processes_of(mine[key]) != processes_of(theirs[key]))
