"""A run's groups: dataset.group_by's values (e.g. MT-Bench's categories) and, for conversations (dataset.turns), each
turn; figures are given per group beside the overall ones, for fixed batches (eval/summary.py) and under load
(eval/served_figures.py)."""
from __future__ import annotations

import re

TURN = "turn"  # the field of a conversation's turn groups ("turn 1", "turn 2", ...)


def natural(text: str) -> list:
    """A sort key that orders the numbers inside a text by value: 'turn 2' before 'turn 10'."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def groups_of(samples: list[dict], group_by: str | None) -> list[tuple[str, str]]:
    """A point's groups as (group, the field it groups by), in order: group_by's values, then, where the records hold
    several turns of conversations (dataset.turns) and group_by is not turn itself, each turn ('turn 1', 'turn 2',
    ...): figures per category and per turn in one report."""
    groups = [(g, TURN if group_by == TURN else group_by) for g in
              sorted({s["group"] for s in samples if s.get("group") is not None}, key=natural)] if group_by else []
    turns = sorted({s["turn"] for s in samples if s.get("turn") is not None})
    if group_by != TURN and len(turns) > 1:
        taken = {g for g, _ in groups}
        groups += [(f"turn {t}", TURN) for t in turns if f"turn {t}" not in taken]
    return groups


def in_group(s: dict, group: str, field: str) -> bool:
    return f"turn {s.get('turn')}" == group if field == TURN and s.get("turn") is not None else s.get("group") == group


def group_text(group: str, field: str | None) -> str:
    """How notes name a group: 'turn 2', 'category=writing'."""
    return group if field == TURN else f"{field or 'group'}={group}"
