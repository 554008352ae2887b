"""Acceptance carried between tools (#55): a run's per-position acceptance written in the forms other engines
replay, and read back from them, so that a cost profile and someone else's acceptance give a prediction
(python -m eval.recommend --acceptance FILE).

One number per draft position i (1..K): the unconditional rate r_i, the share of rounds whose first i drafts were
all accepted (r_1 >= r_2 >= ... >= r_K). Two forms carry it:

- vLLM's synthetic acceptance mode, a speculative_config fragment: {"rejection_sample_method": "synthetic",
  "num_speculative_tokens": K, "synthetic_acceptance_rates": [r_1, ..., r_K]} (vLLM's SpeculativeConfig: entry i
  is the marginal probability that the first i + 1 drafts are accepted; non-increasing; K entries).
- llama.cpp's synthetic acceptance (llama-server b11434, benchmarking only): `--spec-draft-n-max K
  --spec-synth-rates r_1,...,r_K`, the same unconditional rates, non-increasing.
- specdec_bench's speculation_profile.json. Its exact shape was not found in any reference at hand; assumed here:
  {"num_speculative_tokens": K, "acceptance_rates": [c_1, ..., c_K], "acceptance_length": 1 + sum(r)}, c_i the
  conditional rate P(draft i accepted | drafts 1..i-1 were) = r_i / r_(i-1). Read back as written.

Read back, the rates become rounds (synthetic_rounds): a fixed pool whose accepted lengths have those shares, laid
out evenly, so the same file always gives the same rounds and the same prediction.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from utils import UserError

VLLM_FORM, SPECDEC_FORM, LLAMA_FORM = "vllm", "specdec_bench", "llama_cpp"
FORMS = (VLLM_FORM, SPECDEC_FORM, LLAMA_FORM)
SYNTH_FLAG = "--spec-synth-rates"
POOL = 10_000  # rounds a read-back acceptance is laid out as: its rates to 4 decimals


class AcceptanceError(UserError, ValueError):
    """A file that is not an acceptance this reads: one line saying what is wrong (exit 2)."""


def position_rates(rounds: list[dict], gamma: int) -> list[float] | None:
    """Unconditional per-position rates of chain rounds drafting `gamma` (r_i: the share of rounds whose first i
    drafts were accepted), as the product of the conditional rates c_i = (rounds accepting at least i) / (rounds
    accepting at least i - 1 that drafted at least i): a round that drafted fewer (capped by the tokens left) says
    nothing of the positions it did not draft. None without a round."""
    rounds = [r for r in rounds if r.get("drafted")]
    if not rounds or not gamma:
        return None
    out, rate = [], 1.0
    for i in range(1, gamma + 1):
        tried = sum(r["accepted"] >= i - 1 and r["drafted"] >= i for r in rounds)
        rate *= sum(r["accepted"] >= i for r in rounds) / tried if tried else 0.0
        out.append(rate)
    return out


def to_vllm(rates: list[float]) -> dict:
    return {"rejection_sample_method": "synthetic", "num_speculative_tokens": len(rates),
            "synthetic_acceptance_rates": [round(r, 6) for r in rates]}


def to_specdec(rates: list[float]) -> dict:
    conditional = [r / before if before else 0.0 for r, before in zip(rates, [1.0] + rates[:-1])]
    return {"num_speculative_tokens": len(rates), "acceptance_rates": [round(c, 6) for c in conditional],
            "acceptance_length": round(1 + sum(rates), 6)}


def to_llama(rates: list[float]) -> str:
    """llama-server's synthetic acceptance (b11434, benchmarking only): K unconditional non-increasing rates, as
    many as --spec-draft-n-max."""
    return f"--spec-draft-n-max {len(rates)} {SYNTH_FLAG} " + ",".join(f"{round(r, 6):g}" for r in rates)


def export(rates: list[float], form: str) -> dict | str:
    return to_vllm(rates) if form == VLLM_FORM else to_llama(rates) if form == LLAMA_FORM else to_specdec(rates)


def parse_llama(text: str, where: str) -> list[float]:
    """llama.cpp's form: `--spec-synth-rates P0,P1,...` among its flags (with --spec-draft-n-max K, as many), or
    the bare list."""
    words = text.split()
    value, k = (words[0] if len(words) == 1 else None), None
    for flag, following in zip(words, words[1:]):
        value = following if flag == SYNTH_FLAG else value
        k = following if flag == "--spec-draft-n-max" else k
    try:
        rates = [float(x) for x in (value or "").split(",") if x.strip()]
    except ValueError:
        rates = None
    rates = _rates(rates, SYNTH_FLAG, where)
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise AcceptanceError(f"{where}: {SYNTH_FLAG} rises ({rates}); llama.cpp's rates are unconditional, each at "
                              "most the one before")
    if k is not None and k != str(len(rates)):
        raise AcceptanceError(f"{where}: --spec-draft-n-max is {k} but it has {len(rates)} rates; one rate per draft "
                              "position")
    return rates


def _rates(values, key: str, where: str) -> list[float]:
    if not (isinstance(values, list) and values and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        and math.isfinite(x) and 0 <= x <= 1 for x in values)):
        raise AcceptanceError(f"{where}: {key} is {values!r}, not a list of rates in [0, 1]; write one rate per "
                              "draft position")
    return [float(x) for x in values]


def parse(data, where: str = "the acceptance file") -> tuple[list[float], str]:
    """(unconditional rates r_1..r_K, the form read) of either form; AcceptanceError if neither."""
    if not isinstance(data, dict):
        raise AcceptanceError(f"{where} is not a JSON object: give vLLM's synthetic form or specdec_bench's "
                              "speculation_profile.json (docs/recommend.md)")
    if "synthetic_acceptance_rates" in data:
        rates, form = _rates(data["synthetic_acceptance_rates"], "synthetic_acceptance_rates", where), VLLM_FORM
        if any(b > a for a, b in zip(rates, rates[1:])):
            raise AcceptanceError(f"{where}: synthetic_acceptance_rates rise ({rates}); vLLM's are unconditional, "
                                  "each at most the one before")
    elif "acceptance_rates" in data:
        rates, form = [], SPECDEC_FORM
        for c in _rates(data["acceptance_rates"], "acceptance_rates", where):
            rates.append(c * (rates[-1] if rates else 1.0))
    else:
        raise AcceptanceError(f"{where} has neither synthetic_acceptance_rates (vLLM) nor acceptance_rates "
                              "(specdec_bench): give one of them (docs/recommend.md)")
    k = data.get("num_speculative_tokens")
    if k is not None and k != len(rates):
        raise AcceptanceError(f"{where}: num_speculative_tokens is {k!r} but it has {len(rates)} rates; one rate per "
                              "draft position")
    return rates, form


def read(path: Path) -> tuple[list[float], str]:
    """Either JSON form, or llama.cpp's flags (a file not starting with `{`)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise AcceptanceError(f"{path} does not exist: give an acceptance file (python -m eval.recommend RUN "
                              "writes them to RUN/acceptance/)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise AcceptanceError(f"{path} cannot be read ({error}); give vLLM's synthetic form, specdec_bench's "
                              "speculation_profile.json or llama.cpp's --spec-synth-rates") from None
    if not text.lstrip().startswith("{"):
        return parse_llama(text, str(path)), LLAMA_FORM
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise AcceptanceError(f"{path} is not JSON ({error}); give vLLM's synthetic form or specdec_bench's "
                              "speculation_profile.json") from None
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
