"""A toy figure, declared in this one file as a new figure would be (tests/eval/test_figure_table.py registers it):
rounds per new token, at a fixed-batch point and at a load point, for methods with rounds only."""
from eval.figure_table import Column, Figure


def rounds_per_token(inputs) -> dict:
    rounds = sum(len(s.get("rounds") or []) for s in inputs.samples)
    tokens = sum(s["new_tokens"] for s in inputs.samples)
    return {"toy_rounds_per_token": rounds / tokens if tokens else None}


TOY = Figure("toy_rounds_per_token", legend="toy: speculation rounds / new tokens, over every record of the point",
             columns=(Column("toy r/tok", ("toy_rounds_per_token",), "{:.3f}", terminal=True),),
             served_columns=(Column("toy r/tok", ("toy_rounds_per_token",), "{:.3f}", terminal=True),),
             served_csv=(("toy_rounds_per_token", float("inf")),),
             static=rounds_per_token, served=rounds_per_token, applies=lambda spec, caps: spec.has_rounds)
