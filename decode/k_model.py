"""One model of a speculative round and the one rule that picks its K, shared by the recommendation (eval/recommend.py),
the replay (eval/replay.py) and the recommended schedule (decode/drafters/schedules.py). Torch-free.

A chain round of K drafts over the rows in flight, at the batch's longest context (every row's forward runs over it):

    tokens   E(K) = 1 + b_1 + b_1 b_2 + ... + b_1 ... b_K     b_i = P(draft i accepted | drafts 1..i-1 accepted)
    seconds  S(K) = the draft's first forward (`fed` tokens a row: its catch-up and the last token) + K - 1 draft steps
                    + the target's verification, K + 1 tokens wide;   S(0) = one target step, 1 token wide

Served (requests arriving): each request pays the draft's prefill of its prompt, P, once, at its admission where the
schedule drafts, and lives about new_tokens / E(K) rounds; with `rows` in flight (Little's law: that many join over a
lifetime), a round of K > 0 carries rows x P x E(K) / new_tokens seconds of them (`admissions`). A static batch's
prefill is paid before its first round: none.

K = argmax over the candidates, 0 (off) among them, of E(K) / S(K). The tie rule: every K whose value is within a
relative TIE of the best ties with it, and the smallest of them wins (off before any K), as do the candidates
eval.recommend ranks (`pick`'s order).

recommend.json's "k_model" holds what the runtime reads: the step table T(model, rows, width, context) in seconds of the
target ("target") and each draft model ("draft:LABEL"), each draft model's prefill line, and each draft's conditional
rates b_1..b_K, overall and per category where the run has them.
"""
from __future__ import annotations

from typing import Callable

from decode.names import TARGET, draft_model

TIE = 1e-9  # values this close (relative) are one value: the smaller K (or the earlier candidate) is taken


def expected_tokens(rates: list[float], k: int) -> float:
    """E(K): the tokens a row commits in a round of K drafts, from the conditional rates b_1.. (a K past them: 0)."""
    out, survive = 1.0, 1.0
    for b in rates[:k]:
        survive *= b
        out += survive
    return out


def round_parts(target: Callable[[int], float | None], draft: Callable[[int], float | None], k: int, fed: int = 1,
                nodes: int | None = None) -> tuple[float, float] | None:
    """(the draft's seconds, the target's) of a round of K at the rows and context the callables price: target(width)
    a verification that wide, draft(width) a draft forward feeding that many tokens a row; None where one is not
    priced. nodes: the drafted tokens the target verifies where they are not the K the draft model drafted (a source
    that costs no forward drafts them too: hybrid's free sources and trees), K where None."""
    width = (k if nodes is None else nodes) + 1
    if k == 0:
        verify = target(width)
        return None if verify is None else (0.0, verify)
    first, step, verify = draft(fed), draft(1), target(width)  # in this order: a pricer names the first it lacks
    return None if None in (first, step, verify) else (first + (k - 1) * step, verify)


def round_seconds(target, draft, k: int, fed: int = 1, nodes: int | None = None) -> float | None:
    parts = round_parts(target, draft, k, fed, nodes)
    return None if parts is None else sum(parts)


def feed_seconds(draft: Callable[[int], float | None], fed: int) -> float | None:
    """What a round pays to feed the draft `fed` tokens a row (its catch-up, or on an empty cache its deferred
    prefill) beyond the one token a caught-up round feeds: round_parts' draft seconds at `fed` less at 1."""
    wide, narrow = round_parts(lambda w: 0.0, draft, 1, fed), round_parts(lambda w: 0.0, draft, 1)
    return None if wide is None or narrow is None else wide[0] - narrow[0]


def window_tokens(prompt: int, window: int | None) -> int:
    """The tokens the draft prefills of a prompt: its window's (speculative.draft_context), at most; all without one."""
    return prompt if window is None else min(prompt, int(window))


def admissions(rates: list[float], rows: int, prefill: float | None, new_tokens: int) -> Callable[[int], float]:
    """Served: the seconds a round of K carries of the draft prefills of the requests joining (module doc), `prefill`
    one request's; none where it is not priced."""
    if prefill is None:
        return lambda k: 0.0
    return lambda k: rows * prefill * expected_tokens(rates, k) / max(new_tokens, 1)


def pick(values: dict, order: Callable | None = None):
    """The key of the highest value; of those within a relative TIE of it, the least by `order` (the key itself where
    none: the smallest K)."""
    best = max(values.values())
    return min((key for key, v in values.items() if v >= best - abs(best) * TIE), key=order)


def best_k(rates: list[float], target: Callable[[int], float], draft: Callable[[int], float], candidates,
           scale: Callable[[int], float] | None = None, extra: Callable[[int], float] | None = None) -> int:
    """The K of `candidates` (0 included where it is one) of the most tokens a second: E(K) / (S(K) x scale(K) +
    extra(K)); scale: the runtime's measured over priced seconds of such rounds, extra: seconds a round of K pays
    besides (a catch-up's share). A K whose round cannot be priced (a callable returns None) is no candidate."""
    values = {}
    for k in candidates:
        seconds = round_seconds(target, draft, k)
        if seconds is None:
            continue
        seconds = seconds * (scale(k) if scale else 1.0) + (extra(k) if extra and k else 0.0)
        if seconds > 0:
            values[k] = expected_tokens(rates, k) / seconds
    if not values:
        raise ValueError("no K of the candidates can be priced")
    return pick(values)


def conditional(unconditional: list[float]) -> list[float]:
    """r_1..r_K (the share of rounds whose first i drafts were accepted) -> b_1..b_K."""
    out, before = [], 1.0
    for r in unconditional:
        out.append(r / before if before > 0 else 0.0)
        before = r
    return out


def between(known: dict, x, value: Callable | None = None) -> float | None:
    """known[x] where measured, else linear between the nearest measured keys below and above x (value(key): the
    value at a key, known[key] where none); None outside them."""
    value = value or known.__getitem__
    if x in known:
        return value(x)
    below = max((k for k in known if k < x), default=None)
    above = min((k for k in known if k > x), default=None)
    if below is None or above is None:
        return None
    return value(below) + (value(above) - value(below)) * (x - below) / (above - below)


def line(points: dict[float, float], x: float) -> float:
    """Linear between the nearest two points; beyond them, the line through the last two with its slope at least 0,
    never below the cheapest (a step's seconds along its cache, a prefill's along its length); one point: its value."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    below, above = [p for p in xs if p <= x], [p for p in xs if p >= x]
    if below and above:
        lo, hi = below[-1], above[0]
        return points[lo] if lo == hi else points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    lo, hi = (xs[-2], xs[-1]) if below else (xs[0], xs[1])
    near = hi if below else lo
    slope = max((points[hi] - points[lo]) / (hi - lo), 0.0)
    return max(points[near] + slope * (x - near), min(points.values()))


class KModel:
    """recommend.json's "k_model": steps {model: [[rows, width, context, seconds], ...]}, draft_prefill {model:
    {intercept_s, s_per_row_token}}, acceptance {draft label: {"rates": [b_1..], "by_category": {name: [b_1..]}}}."""

    def __init__(self, data: dict, where: str = "recommend.json"):
        try:
            self.steps: dict[str, dict] = {}
            for model, points in data["steps"].items():
                for rows, width, context, seconds in points:
                    by_rows = self.steps.setdefault(model, {}).setdefault(int(rows), {})
                    by_rows.setdefault(int(width), {})[float(context)] = float(seconds)
            self.prefill = {m: (float(p["intercept_s"]), float(p["s_per_row_token"]))
                            for m, p in (data.get("draft_prefill") or {}).items()}
            self.acceptance = {d: {"rates": [float(b) for b in a["rates"]],
                                   "by_category": {c: [float(b) for b in r] for c, r in
                                                   (a.get("by_category") or {}).items()}}
                               for d, a in data["acceptance"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"{where}'s k_model is not a step table and acceptance (written by python -m "
                             "eval.recommend); write it again") from None
        if TARGET not in self.steps:
            raise ValueError(f"{where}'s k_model has no target steps; write it again with a profile of the target")

    def seconds(self, model: str, rows: int, width: int, context: float) -> float | None:
        """A step of `model`: linear between tabulated widths (None outside them), along the cache and between tabulated
        rows as eval/costs.py prices it; at rows beyond the table's (the runtime decides at any rows in flight, where
        the replay leaves them unpriced) along the line through the nearest two (`line`)."""
        def at(by_width: dict) -> float | None:
            return between(by_width, width, lambda w: line(by_width[w], context))

        table = self.steps.get(model) or {}
        if rows in table and (exact := at(table[rows])) is not None:
            return exact  # what the line through every tabulated rows gives there, without pricing the others
        known = {r: s for r, s in ((r, at(by_width)) for r, by_width in table.items()) if s is not None}
        return line(known, rows) if known else None

    def draft_forward(self, draft: str, rows: int, width: int, context: float) -> float | None:
        """The draft's forward feeding `width` tokens a row, as the replay prices it (eval/replay.py draft_first): 1, a
        step; 2, its 2-token step (its 1-token one where untabulated); wider, the more of that and its prefill line at
        rows x width."""
        model = draft_model(draft)
        step = self.seconds(model, rows, 1, context)
        if width <= 1 or step is None:
            return step
        two = self.seconds(model, rows, 2, context)
        first = step if two is None else two
        prefill = self.prefill_seconds(model, rows, width)
        return first if width == 2 or prefill is None else max(first, prefill)

    def prefill_seconds(self, model: str, rows: int, tokens: float) -> float | None:
        """A prefill of `rows` prompts `tokens` long on the model's prefill line (as eval/costs.py prefill_s)."""
        fit = self.prefill.get(model)
        return None if fit is None else max(fit[0] + fit[1] * rows * tokens, 0.0)

    def rates(self, draft: str, category: str | None = None) -> list[float]:
        accepted = self.acceptance[draft]
        return accepted["by_category"].get(category, accepted["rates"]) if category else accepted["rates"]

    def choose(self, draft: str, rows: int, context: float, gamma: int, category: str | None = None,
               scale: Callable[[int], float] | None = None, extra: Callable[[int], float] | None = None,
               served: tuple[float, int] | None = None) -> int:
        """The K (0..gamma, at most as many as the acceptance has rates) of `best_k` at these rows and context;
        served: (a joining request's prompt tokens, its new tokens), where requests arrive (`admissions`: its prefill
        on the draft's prefill line, as the replay prices one at admission)."""
        rates = self.rates(draft, category)
        joining = admissions(rates, rows, self.prefill_seconds(draft_model(draft), 1, served[0]), served[1]) \
            if served else (lambda k: 0.0)
        return best_k(rates, lambda w: self.seconds(TARGET, rows, w, context),
                      lambda w: self.draft_forward(draft, rows, w, context), range(min(gamma, len(rates)) + 1), scale,
                      lambda k: (extra(k) if extra else 0.0) + joining(k))
