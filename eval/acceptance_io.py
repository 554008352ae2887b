"""Acceptance carried between tools (#55): a run's per-position acceptance written in the forms other engines and
tools replay, and read back from them, so that a cost profile and someone else's acceptance give a prediction
(python -m eval.recommend --acceptance FILE).

One number per draft position i (1..K): the unconditional rate r_i, the share of rounds whose first i drafts were
all accepted (r_1 >= r_2 >= ... >= r_K). Each target of eval/deploy/ with an acceptance form writes and reads its
own; this module picks the form a file is in.

Read back, the rates become rounds (synthetic_rounds): a fixed pool whose accepted lengths have those shares, laid
out evenly, so the same file always gives the same rounds and the same prediction.
"""
from __future__ import annotations

import json
from pathlib import Path

from eval.deploy import AcceptanceError, with_acceptance

POOL = 10_000  # rounds a read-back acceptance is laid out as: its rates to 4 decimals

__all__ = ["AcceptanceError", "POOL", "export", "forms", "json_forms", "parse", "position_rates", "read", "synthetic_rounds"]


def forms() -> list:
    """(target's name, its acceptance form), in the targets' order."""
    return [(t.name, t.acceptance) for t in with_acceptance()]


def _named(descriptions: list[str]) -> str:
    return ", ".join(descriptions[:-1]) + " or " + descriptions[-1] if len(descriptions) > 1 else "".join(descriptions)


def json_forms() -> str:
    """The JSON forms as the bad-input lines name them."""
    return _named([form.describe for _, form in forms() if form.key is not None])


def position_rates(rounds: list[dict], gamma: int) -> list[float] | None:
    """Unconditional per-position rates of chain rounds drafting `gamma` (r_i: the share of rounds whose first i
    drafts were accepted), as the product of the conditional rates c_i = (rounds accepting at least i) / (rounds
    accepting at least i - 1 that drafted at least i): a round that drafted fewer (capped by the tokens left) says
    nothing of the positions it did not draft, and a round cut at an EOS among its drafts (it emitted only accepted
    drafts: emitted == accepted) nothing of the position after its last. None without a round."""
    rounds = [r for r in rounds if r.get("drafted")]
    if not rounds or not gamma:
        return None
    out, rate = [], 1.0
    for i in range(1, gamma + 1):
        tried = sum(r["accepted"] >= i - 1 and r["drafted"] >= i
                    and not (r["accepted"] == i - 1 and r.get("emitted", i) == r["accepted"]) for r in rounds)
        rate *= sum(r["accepted"] >= i for r in rounds) / tried if tried else 0.0
        out.append(rate)
    return out


def export(rates: list[float], name: str) -> dict | str:
    """The rates in target `name`'s form: a dict (JSON) or a str (a text form)."""
    return dict(forms())[name].export(rates)


def parse(data, where: str = "the acceptance file") -> tuple[list[float], str]:
    """(unconditional rates r_1..r_K, the target whose form it is) of a JSON form; AcceptanceError if none."""
    readable = [(name, form) for name, form in forms() if form.key is not None]
    if not isinstance(data, dict):
        raise AcceptanceError(f"{where} is not a JSON object: give {json_forms()} (docs/recommend.md)")
    titles = {t.name: t.title for t in with_acceptance()}
    found = [(name, form) for name, form in readable if form.key in data]
    if not found:
        keys = " nor ".join(f"{form.key} ({titles[name]})" for name, form in readable)
        raise AcceptanceError(f"{where} has neither {keys}: give one of them (docs/recommend.md)")
    if len(found) > 1:  # which of them would be read is no choice to make silently
        keys = " and ".join(f"{form.key} ({titles[name]})" for name, form in found)
        raise AcceptanceError(f"{where} has both {keys}: keep one form a file")
    name, form = found[0]
    rates = form.parse(data, where)
    k = data.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise AcceptanceError(f"{where}: num_speculative_tokens is {json.dumps(k)}, not a count; write the number of "
                              f"draft positions ({len(rates)} here) or leave it out")
    if k is not None and k != len(rates):
        raise AcceptanceError(f"{where}: num_speculative_tokens is {k!r} but it has {len(rates)} rates; one rate per "
                              "draft position")
    return rates, name


def read(path: Path) -> tuple[list[float], str]:
    """A JSON form, or the text form (a file not starting with `{`)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise AcceptanceError(f"{path} does not exist: give an acceptance file (python -m eval.recommend RUN "
                              "writes them to RUN/acceptance/)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise AcceptanceError(f"{path} cannot be read ({error}); give "
                              f"{_named([form.describe for _, form in forms()])}") from None
    if text.lstrip().startswith("["):  # JSON, but none of the forms: not a text form's flags
        raise AcceptanceError(f"{path} is a JSON list; give {json_forms()} (a JSON object), or llama.cpp's rates as "
                              "text (r_1,...,r_K)")
    if not text.lstrip().startswith("{"):
        name, form = next((name, form) for name, form in forms() if form.key is None)
        return form.parse(text, str(path)), name
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise AcceptanceError(f"{path} is not JSON ({error}); give {json_forms()}") from None
    return parse(data, str(path))


def synthetic_rounds(rates: list[float], pool: int = POOL) -> list[dict]:
    """Chain rounds of K = len(rates) drafts whose accepted lengths have the rates' shares: round(pool * (r_j -
    r_(j+1))) rounds accept exactly j, laid out evenly (each length at its own stride, merged), so that any stretch
    of rounds has about the shares of the whole. The rates are taken to 4 decimals: a file written at 6 and read
    back lays out the same pool."""
    k = len(rates)
    shares = [1.0] + [round(r, 4) for r in rates] + [0.0]
    counts = [round(pool * (shares[j] - shares[j + 1])) for j in range(k + 1)]
    placed = sorted((((n + 0.5) / count, j) for j, count in enumerate(counts) for n in range(count)))
    return [{"drafted": k, "accepted": j, "emitted": j + 1} for _, j in placed]
