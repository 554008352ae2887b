"""specdec_bench's speculation_profile.json: an acceptance form, no server settings. Its exact shape was not found in
any reference at hand; assumed here: {"num_speculative_tokens": K, "acceptance_rates": [c_1..c_K],
"acceptance_length": 1 + sum(r)}, c_i the conditional rate P(draft i accepted | drafts 1..i-1 were) = r_i / r_(i-1).
Read back as written."""
from __future__ import annotations

from eval.targets.base import AcceptanceForm, Target, rates_in

KEY = "acceptance_rates"


def export(rates: list[float]) -> dict:
    conditional = [r / before if before else 0.0 for r, before in zip(rates, [1.0] + rates[:-1])]
    return {"num_speculative_tokens": len(rates), KEY: [round(c, 6) for c in conditional],
            "acceptance_length": round(1 + sum(rates), 6)}


def parse(data: dict, where: str) -> list[float]:
    rates: list[float] = []
    for c in rates_in(data[KEY], KEY, where):
        rates.append(c * (rates[-1] if rates else 1.0))
    return rates


TARGET = Target(name="specdec_bench", title="specdec_bench", rank=2,
                acceptance=AcceptanceForm(suffix="speculation_profile.json", key=KEY, export=export, parse=parse,
                                          describe="specdec_bench's speculation_profile.json"))
