"""specdec_bench's speculation_profile.json: an acceptance form, no server settings. Its exact shape was not found in
any reference at hand; assumed here: {"num_speculative_tokens": K, "acceptance_rates": [c_1..c_K],
"acceptance_length": 1 + sum(r)}, c_i the conditional rate P(draft i accepted | drafts 1..i-1 were) = r_i / r_(i-1).
Read back as written."""
from __future__ import annotations

from eval.deploy.base import AcceptanceError, AcceptanceForm, Target, rates_in

KEY = "acceptance_rates"


def export(rates: list[float]) -> dict:
    conditional = [r / before if before else 0.0 for r, before in zip(rates, [1.0] + rates[:-1])]
    return {"num_speculative_tokens": len(rates), KEY: [round(c, 6) for c in conditional],
            "acceptance_length": round(1 + sum(rates), 6)}


LENGTH_TOLERANCE = 1e-3  # an acceptance_length written from the rates at 6 decimals agrees with them to this


def parse(data: dict, where: str) -> list[float]:
    rates: list[float] = []
    for c in rates_in(data[KEY], KEY, where):
        rates.append(c * (rates[-1] if rates else 1.0))
    length = data.get("acceptance_length")
    if length is not None and not (isinstance(length, (int, float)) and not isinstance(length, bool)
                                   and abs(length - (1 + sum(rates))) <= LENGTH_TOLERANCE):
        raise AcceptanceError(f"{where}: acceptance_length is {length!r} but its {KEY} give {1 + sum(rates):.6g} "
                              "(1 + the sum of the unconditional rates); mend one, or leave acceptance_length out")
    return rates


TARGET = Target(name="specdec_bench", title="specdec_bench", rank=2,
                acceptance=AcceptanceForm(suffix="speculation_profile.json", key=KEY, export=export, parse=parse,
                                          describe="specdec_bench's speculation_profile.json"))
