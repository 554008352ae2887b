"""Hand-made records of samples.jsonl and progress.json for the eval tests: every figure is checked against
values worked out by hand from these, never recomputed with the function under test."""
from decode.methods import REGISTRY

SPEC_LABEL = "speculative draft=d gamma=2 constant batch=1 greedy"


def costs(c=0.3, v=None, target=(1.0, 1.02, 1.01), draft=(0.30, 0.31, 0.30), process=None) -> dict:
    """A CostProbe.to_json() of batch size 1 for draft d (its repetitions steady unless told), keyed as progress.json
    keeps it: per process."""
    v = v or {"2": 1.2}
    reps = {"1": list(target)} | {str(int(g) + 1): [x * v[g] for x in target] for g in v}
    probe = {"c_by_draft": {"d": c}, "v": v, "target_forward_s": target[0], "target_reps_s": reps,
             "draft_reps_s": {"d": list(draft)}, "draft_prefill": {}}
    return {"1": {process or "p1": probe}}


def record(method="baseline", sample_id=0, batch_index=0, repeat=0, batch_size=1, tokens=10, latency=1.0, prefill=0.1,
           rounds=None, gamma=None, output=None, group=None, draft=None, schedule=None, **extra):
    """One line of samples.jsonl, shaped by what the registry says of the method (never its name): a draft axis gets
    draft d, a schedule axis the constant schedule, a gamma axis gamma 2, unless told; a method with rounds counts
    the prefill plus one target forward per round, one without one forward per token."""
    spec = REGISTRY[method]
    with_rounds = spec.has_rounds
    row = {"method": method, "batch_size": batch_size, "draft": draft or ("d" if "draft" in spec.axes else None),
           "gamma": gamma or (2 if "gamma" in spec.axes else None),
           "schedule": schedule or ("constant" if "schedule" in spec.axes else None),
           "exit_layer": None, "temperature": None, "sample_id": sample_id, "repeat": repeat,
           "batch_index": batch_index, "batch_rows": batch_size, "group": group, "prompt_tokens": 5, "preset": "none",
           "reference": None, "output_ids": output if output is not None else list(range(tokens)), "output_text": "",
           "new_tokens": tokens, "stop_reason": "length", "latency_s": latency, "prefill_s": prefill,
           "target_forwards": 1 + len(rounds or []) if with_rounds else tokens, "draft_forwards": 0,
           "target_s": latency, "draft_s": 0.0, "draft_prefill_s": 0.0, "rounds": (rounds or []) if with_rounds else None,
           "peak_memory_bytes": None, "worker": None, "process": "p1"}
    row.update(extra)
    return row


def run(summary, method, group=None, **axes):
    return next(r for r in summary["runs"] if r["method"] == method and r["group"] == group
                and all(r[k] == v for k, v in axes.items()))


def paired_run(units=8, base_latency=2.0, spec_latency=1.0, jitter=0.0, repeats=1):
    """Batch size 1: per unit a baseline row (4 tokens in base_latency) and a speculative row (4 tokens, one round
    drafting 2 and accepting both, in spec_latency, alternately +-jitter)."""
    samples = []
    for repeat in range(repeats):
        for i in range(units):
            samples.append(record("baseline", i, i, repeat, tokens=4, latency=base_latency))
            samples.append(record("speculative", i, i, repeat, tokens=4, latency=spec_latency * (1 + jitter * (-1) ** i),
                                  rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]))
    return samples


def codes(summary, method="speculative", group=None):
    return sorted(f["code"] for f in run(summary, method, group)["flags"])
