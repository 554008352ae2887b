"""The replay's predictions of a run (#33): every speculative point of our engine, static batches and load points,
replayed with a cost profile's step costs (eval/replay.py simulate) from the point's own schedule: its requests'
arrivals, prompt and output lengths and rounds as measured, beside the baseline replayed the same way. The figures
of the predicted schedule are computed by the same functions as the measured ones (eval/totals.py,
eval/served_figures.py).

    python -m eval.predict RUN_DIR [--costs PROFILE.json] [--concurrency 1,2,8] [--batch-size 1,4] [--out FILE]

Without --costs the run's own probes are the profile (costs.json in the folder, else progress.json's probes);
with a profile of another device (python -m runner.profile), what the run's acceptance would give there. A
concurrency or batch size the run did not measure is predicted from the requests of a measured one (the same
arrivals and rounds, another cap or grouping): a prediction without a measurement beside it.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from decode.methods import REGISTRY, caps_of
from decode.names import TARGET, label_of
from eval.costs import Profile, read_config, read_env, read_progress, run_costs
from eval.records import Point
from eval.replay import MissingCost, beyond_note, lacking, part_times, prediction_off, static_prediction
from eval.served_figures import load_prediction, replayed_figures
from eval.stats import ratio, ratio_of_totals
from eval.totals import paired_clusters
from utils import UserError, positive_ints
from utils.io import read_jsonl, write_json


def run_profile(folder: Path, progress: dict) -> Profile:
    """The run's own profile: costs.json where the run wrote one, else its probes in progress.json."""
    if (folder / "costs.json").exists():
        return Profile.load(folder / "costs.json")
    return run_costs(progress, read_env(folder), None, where=str(folder / "progress.json"))


def differences(profile: dict, run: dict) -> list[str]:
    """What the profile's meta and the run's (eval/costs.py run_costs: its config.yaml and env.json) both say and
    say otherwise, in words: the target, its dtype and quantization, the compile mode, the device."""
    def known(meta: dict, key: str):
        value = meta.get(key)
        if key == "device" and isinstance(value, str):
            value = value.split(":")[0]  # cuda:0 and cuda are one kind of device
        return None if value in (None, "auto", "") else value

    both = {key: (known(profile, key), known(run, key)) for key in
            ("target_model", "dtype", "quantization", "compile", "device", "device_name")}
    said = {key: pair for key, pair in both.items() if None not in pair and pair[0] != pair[1]}
    out = []
    if "target_model" in said:
        out.append(f"the profile is of {said['target_model'][0]}, the run of {said['target_model'][1]}: the prediction "
                   "holds as far as their steps cost the same (the same shapes: docs/predict.md)")
    numerics = [f"{key} {said[key][0]} against the run's {said[key][1]}" for key in ("dtype", "quantization")
                if key in said]
    if numerics:
        out.append(f"the profile's {' and '.join(numerics)}: the steps are priced in the profile's, the rounds are "
                   "the run's, and rounds do not transfer across dtypes or quantization (their kernels move logits "
                   "near ties: docs/predict.md)")
    if "compile" in said:
        out.append(f"the profile is of the {'compiled' if said['compile'][0] else 'eager'} engine, the run "
                   f"{'compiled' if said['compile'][1] else 'eager'}: its steps are priced as the profile's engine "
                   "runs them (a compiled batch keeps its rows to its end)")
    if "device" in said or "device_name" in said:
        out.append(f"the profile is of {profile.get('device')} ({profile.get('device_name') or '?'}), the run of "
                   f"{run.get('device')} ({run.get('device_name') or '?'}): the run's rounds priced on the profile's "
                   "device (where that transfer holds: docs/predict.md)")
    return out


PRICE_WITHIN = 1.25  # the target's step priced within this factor of what the run's probes measured
SHAPE_WITHIN = 1.10  # a step in units of the target's step (a draft's c, a verification's width): within this factor


def priced_otherwise(profile: Profile, run: Profile) -> list[str]:
    """Where the profile prices the steps the run's own probes timed otherwise than they ran, in one line: the
    target's 1-token step (how fast the machine ran) and, what decides K, each other step in units of the target's
    step at the same rows and cache (the draft's c, a verification's cost over a plain step), the furthest apart of
    those named. A profile of the same machine at another time can be another device: a machine whose memory is
    shared with other work prices wide verifications cheaper while it is slow. Empty where they agree within
    PRICE_WITHIN and SHAPE_WITHIN, or where no step is priced by both."""
    def apart(a: float, b: float) -> float:
        return max(a / b, b / a)

    speed, shape = None, None
    for p in run.steps:
        model, rows, width, kv = p["model"], int(p["rows"]), int(p["width"]), float(p["kv"])
        theirs, unit_run, unit_theirs = (profile.step_s(model, rows, width, kv), run.step_s(TARGET, rows, 1, kv),
                                         profile.step_s(TARGET, rows, 1, kv))
        if None in (theirs, unit_run, unit_theirs) or not (theirs > 0 and unit_run > 0 and unit_theirs > 0):
            continue
        if model == TARGET and width == 1:
            if speed is None or apart(p["s"], theirs) > apart(*speed[1:]):
                speed = ((rows, kv), p["s"], theirs)
            continue
        mine, priced = p["s"] / unit_run, theirs / unit_theirs
        if shape is None or apart(mine, priced) > apart(*shape[1:]):
            label = label_of(model)
            what = (f"the draft {label}'s {width}-token step" if label is not None else f"a verification of {width}")
            shape = (f"{what} at {rows} row{'s' * (rows > 1)} and a {kv:.0f}-token cache", mine, priced)
    said = []
    if speed is not None and apart(speed[1], speed[2]) > PRICE_WITHIN:
        (rows, kv), mine, priced = speed
        said.append(f"the target's step at {rows} row{'s' * (rows > 1)} ({kv:.0f}-token cache) ran {mine:.3f} s in "
                    f"the run and is priced {priced:.3f} s ({mine / priced:.2f}x)")
    if shape is not None and apart(shape[1], shape[2]) > SHAPE_WITHIN:
        what, mine, priced = shape
        said.append(f"{what} ran {mine:.2f}x the target's step in the run and is priced {priced:.2f}x")
    if not said:
        return []
    return [f"the profile prices this run's steps otherwise than its own probes timed them: {'; '.join(said)}. The "
            "figures are the profile's machine as it was profiled; profile the machine as it runs now (python -m "
            "runner.profile) to price this one"]


def against_own_probes(profile: Profile, folder: Path, progress: dict) -> list[str]:
    """priced_otherwise against the run's own profile (run_profile); nothing where the run has none to compare."""
    try:
        return priced_otherwise(profile, run_profile(folder, progress))
    except UserError:  # no probe, or one the run's own prediction would refuse: said where that is read
        return []


# ---- measured and predicted ------------------------------------------------------------------------------------

def static_measured(samples: list[dict], baseline: list[dict]) -> dict:
    clusters = paired_clusters(samples, baseline)
    return {"speedup": ratio_of_totals(clusters) if clusters else None,
            "tok_s": ratio(sum(c[0] for c in clusters), sum(c[1] for c in clusters)) if clusters else None,
            "parts_s": part_times(samples, baseline)}


def draft_label(point: Point, profile: Profile) -> str | None:
    """The profile's draft model for a point's draft: the same label, else the profile's only draft (a profile of
    synthetic shapes names its draft otherwise)."""
    if not REGISTRY[point.method].needs_draft:
        return None
    drafts = profile.drafts()
    if point.draft in drafts:
        return point.draft
    return drafts[0] if len(drafts) == 1 else point.draft


def points_and_references(samples: list[dict]) -> tuple[dict[Point, list[dict]], dict[str, list[dict]]]:
    """(point -> its rows, for every point of a method of ours; comparison -> its reference's rows, where the
    reference times its forwards)."""
    by_point: dict[Point, list[dict]] = defaultdict(list)
    for s in samples:
        if s.get("method") in REGISTRY:
            by_point[Point.of(s)].append(s)
    references = {p.comparison: rows for p, rows in by_point.items()
                  if REGISTRY[p.method].is_reference and caps_of(p.method).times_forwards}
    return by_point, references


def predict_run(samples: list[dict], profile: Profile, concurrency: list[int] | None = None,
                batch_sizes: list[int] | None = None) -> list[dict]:
    """A row per speculative point of our engine (and per what-if concurrency or batch size): measured and
    predicted figures, their ratio, or why no prediction."""
    by_point, references = points_and_references(samples)
    out = []
    for point, rows in by_point.items():
        spec = REGISTRY[point.method]
        if not spec.has_rounds or not caps_of(point.method).times_forwards:
            continue
        baseline = references.get(point.comparison)
        if baseline is None:
            continue
        loads = [None] if not point.serving else [None] + [c for c in concurrency or []
                                                          if c != rows[0].get("concurrency")]
        sizes = [None] if point.serving else [None] + [b for b in batch_sizes or [] if b != point.batch_size]
        for what_if in (loads if point.serving else sizes):
            row = {"label": point.label, "method": point.method, "gamma": point.gamma,
                   "serving": point.serving, "measured": None, "predicted": None}
            draft = draft_label(point, profile)
            if draft is not None and draft != point.draft:
                row["draft_priced_as"] = draft
            if point.serving:
                row["concurrency"] = what_if or rows[0].get("concurrency")
                row["rate"] = rows[0].get("request_rate")
                if what_if is None:
                    row["measured"] = replayed_figures(rows, baseline)
                try:
                    row["predicted"] = load_prediction(rows, baseline, profile, draft, what_if)
                except MissingCost as error:
                    row["missing"] = lacking(error)
            else:
                row["batch_size"] = what_if or point.batch_size
                if what_if is None:
                    row["measured"] = static_measured(rows, baseline)
                row["predicted"], missing = static_prediction(rows, baseline, profile, draft, what_if)
                if missing:
                    row["missing"] = missing
            if row["measured"] and row["predicted"]:
                row["measured_over_predicted"] = ratio(row["measured"]["speedup"], row["predicted"]["speedup"])
                row["prediction_off"] = prediction_off(row["measured"]["speedup"], row["predicted"],
                                                       row["measured"]["parts_s"])
            out.append(row)
    return sorted(out, key=lambda r: (r["serving"], r.get("concurrency") or 0, r.get("batch_size") or 0, r["label"]))


def _fmt(x, f="{:.2f}") -> str:
    return "-" if x is None else f.format(x)


def table(rows: list[dict], profile: Profile, costs: Path | None = None) -> str:
    """The printed prediction; costs: the --costs file (None: the run's own probes)."""
    meta = profile.meta
    where = f"{meta.get('device_name') or meta.get('device') or '?'}, torch {meta.get('torch') or '?'}"
    if costs is None:
        header = f"costs: the run's probes ({where})"
    else:  # a run's costs.json says "the run's probes" of the run that wrote it: given as --costs, another run's
        kind = "a run's probes" if meta.get("source") == "the run's probes" else "a profile"
        header = f"costs: {costs} ({kind}; {where})"
    lines = [header, "",
             "| point | load | measured speedup | predicted [95% CI] | measured / predicted | predicted tok/s | "
             "predicted TTFT P50 s | predicted TPOT ms |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, p = r["measured"] or {}, r["predicted"] or {}
        load = f"conc={r['concurrency']}" if r["serving"] else f"batch={r['batch_size']}"
        interval = p.get("speedup_ci95")
        predicted = _fmt(p.get("speedup")) + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
        lines.append(f"| {r['label']} | {load} | {_fmt(m.get('speedup'))} | "
                     f"{predicted if p else r.get('missing', '-')} | {_fmt(r.get('measured_over_predicted'))} | "
                     f"{_fmt(p.get('tok_s'))} | {_fmt(p.get('ttft_p50_s'))} | {_fmt(p.get('tpot_mean_ms'), '{:.0f}')} |")
    above = sorted({n for r in rows for n in ((r["predicted"] or {}).get("rows_priced_above") or [])})
    if above:
        lines += ["", f"a static batch's tail at {', '.join(map(str, above))} rows was priced at the smallest profiled "
                      "rows above it (the profile has no step at so few rows)"]
    off = [f"- {r['label']} at {'conc' if r['serving'] else 'batch'}={r.get('concurrency') or r.get('batch_size')}: "
           f"{r['prediction_off']}" for r in rows if r.get("prediction_off")]
    if off:
        lines += ["", "prediction_off (docs/predict.md):", *off]
    beyond = [(r["predicted"] or {}).get("caches_priced_beyond") for r in rows]
    if any(beyond):
        lines += ["", beyond_note([span for span in beyond if span], profile.caches())]
    withheld = [f"- {r['label']} at conc={r.get('concurrency')}: {r['predicted']['speedup_ci95_withheld']}"
                for r in rows if (r["predicted"] or {}).get("speedup_ci95_withheld")]
    if withheld:
        lines += ["", "no interval on the predicted speedup:", *withheld]
    within = [r["measured_over_predicted"] for r in rows if r.get("measured_over_predicted") is not None]
    if within:
        inside = sum(0.95 <= x <= 1.05 for x in within)
        lines += ["", f"measured / predicted within [0.95, 1.05] on {inside} of {len(within)} points "
                      f"(range {min(within):.3f} to {max(within):.3f})"]
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as every bad input
        print(f"error: {message}; see python -m eval.predict --help", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m eval.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--costs", type=Path, help="a cost profile (python -m runner.profile); default: the run's")
    parser.add_argument("--concurrency", type=positive_ints,
                        help="concurrencies to predict besides those measured (load points), e.g. 1,2,8")
    parser.add_argument("--batch-size", type=positive_ints,
                        help="batch sizes to predict besides those measured (static points), e.g. 1,4")
    parser.add_argument("--out", type=Path, help="where to write the prediction (default RUN_DIR/prediction.json)")
    args = parser.parse_args(argv)
    folder = args.run_dir
    if not (folder / "samples.jsonl").exists():
        print(f"error: {folder} has no samples.jsonl: give a report folder of a run", file=sys.stderr)
        return 2
    try:
        concurrency, sizes = args.concurrency, args.batch_size
        progress, config = read_progress(folder), read_config(folder)
        profile = Profile.load(args.costs) if args.costs else run_profile(folder, progress)
        if not profile.steps:
            raise UserError(f"{args.costs} has no steps: give a profile with steps (python -m runner.profile)"
                            if args.costs else f"no profile: {folder} has no costs.json and progress.json holds no "
                            "probe; give --costs PROFILE.json (python -m runner.profile writes one)")
        samples = read_jsonl(folder / "samples.jsonl")
    except UserError as error:  # ProfileError too
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = predict_run(samples, profile, concurrency, sizes)
    if not rows:
        print(f"error: {folder} has no speculative point of our engine with its baseline to replay (another engine's "
              "points, or no baseline, or no records)", file=sys.stderr)
        return 2
    text = table(rows, profile, args.costs)
    substituted = sorted({r["draft_priced_as"] for r in rows if r.get("draft_priced_as")})
    if substituted:
        text += f"\n\nthe draft model priced as the profile's {', '.join(substituted)} (the profile's only draft)"
    for difference in differences(profile.meta, run_costs({}, read_env(folder), config).meta) + (
            against_own_probes(profile, folder, progress) if args.costs else []):
        text += f"\n{difference}"
    print(text)
    return written(args.out or folder / "prediction.json",
                   {"costs": str(args.costs) if args.costs else "the run's probes", "profile_meta": profile.meta,
                    "points": rows})


def written(out: Path, payload: dict) -> int:
    """The command's JSON written to `out` and named: its exit code (2, one line, where it cannot be written)."""
    try:
        write_json(out, payload)
    except OSError as error:
        print(f"error: cannot write {out} ({error.strerror or error}); give a writable --out FILE", file=sys.stderr)
        return 2
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
