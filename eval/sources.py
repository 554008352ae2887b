"""Acceptance per draft source, for drafters that draw from several (hybrid, decode/drafters/hybrid.py).

A round of such a drafter records, per row, "sources": {source: [drafted, accepted]}: the tokens that source drafted
for the row in that round and how many of them lie on the accepted path (each accepted token belongs to one source's
branch). A source's acceptance is pooled over rounds: the sum of its accepted tokens over the sum of its drafted
tokens, over every round of every sequence that drafted from it; rounds in which it did not draft add nothing.
"""
from __future__ import annotations

from eval.stats import ratio


def acceptance_by_source(rounds: list[dict], offered: tuple[str, ...] = ()) -> dict | None:
    """{source: {"drafted", "accepted", "acceptance", "rounds"}} over the rounds that recorded sources, with a zero row
    (acceptance None) for each source `offered` (decode/methods MethodSpec.draft_sources) that never drafted: never
    chosen, not absent; None for a drafter of one source."""
    totals: dict[str, list[int]] = {source: [0, 0, 0] for source in offered}
    for r in rounds:
        for source, (drafted, accepted) in (r.get("sources") or {}).items():
            entry = totals.setdefault(source, [0, 0, 0])
            entry[0] += drafted
            entry[1] += accepted
            entry[2] += 1
    if not totals or not rounds:
        return None
    return {source: {"drafted": d, "accepted": a, "acceptance": ratio(a, d), "rounds": n}
            for source, (d, a, n) in sorted(totals.items())}


def source_text(table: dict) -> str:
    """'draft 0.412 (17/41 in 12 rounds); lookup ...'."""
    return "; ".join(f"{source} {'-' if e['acceptance'] is None else format(e['acceptance'], '.3f')} "
                     f"({e['accepted']}/{e['drafted']} in {e['rounds']} rounds)" for source, e in table.items())


def source_lines(runs: list[dict]) -> list[str]:
    """The report's block: per point that drew from several sources, its acceptance per source."""
    mixed = [r for r in runs if (r.get("metrics") or {}).get("acceptance_by_source")]
    if not mixed:
        return []
    lines = ["", "Acceptance per draft source (accepted tokens from a source / tokens it drafted, pooled over rounds; "
             "legend: acceptance_by_source):"]
    return lines + [f"- {r['label']}: {source_text(r['metrics']['acceptance_by_source'])}" for r in mixed]
