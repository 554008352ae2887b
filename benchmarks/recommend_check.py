"""Is what `python -m eval.recommend` says to deploy what a sweep measures best (#55)? Each load and context length of
one or more recommend.json files against sweeps that measured every K and the target alone there (on other prompts):
the recommended candidate's measured throughput over the best measured candidate's ("off" included), and whether
"off" was recommended exactly where speculation measured below 1.

    python benchmarks/recommend_check.py --recommend R.json [R.json ...] --sweeps RUN_DIR [RUN_DIR ...]
                                         [--within 0.03] [--json OUT.json]

A sweep's context length is its prompts' mean length (the baseline's rows); each recommended context is checked on
the sweep nearest it in ratio (eval/recommend.py nearest); where several sweeps read a load at that context (a load
read again), their readings pool: each candidate's tok/s their geometric mean, each sweep's repeats readings of their
own. A static batch size is checked on a sweep's static points
(throughput_tok_s, speedup and its interval), a concurrency on its load points by the system's throughput
(output_tok_s, and output_tok_s_ratio as the speedup, without interval: speedup_tput is a per-request rate, which
is the system's ratio only while every slot stays full, not in a short closed loop's tail). A candidate the
recommendation named but the sweep did not measure is said so, never guessed.

The checks, per load and context:
- within: the recommended candidate's measured tok/s is at least (1 - within) x the best measured's. Where the
  sweep ran repeats, each repeat's reading (static: sum(N) / sum(batch wall times); a load: its new tokens over its
  span) gives the ratio once per repeat both points ran, the two points measured in the same pass: a pooled ratio
  below 1 - within that some repeat reads at or above it is "unresolved" (the sweep's own readings disagree), not
  "no"; a single reading below it is "no (one reading)"; a miss where the sweep flagged either point `drift` (the
  machine changed speed during that load's points: eval/flags.py) says so, "(drift)", as the report does;
- off: "off" recommended (or the recommendation tied with off) exactly where no K measured a speedup of 1 or more,
  a K whose interval holds 1, or whose one reading (no interval) is within `within` of 1, counting as a tie either
  way.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from decode.methods.speculative import recommendation_problem  # noqa: E402
from eval.recommend import OFF, _fmt as _f, _interval as _ci, nearest  # noqa: E402
from eval.records import Point  # noqa: E402
from eval.served_figures import by_repeat, load_figures, timed, with_slots  # noqa: E402
from eval.totals import throughput  # noqa: E402
from utils.io import read_jsonl, write_json  # noqa: E402

WITHIN = 0.03


def repeat_readings(folder: Path) -> dict[str, dict[int, float]]:
    """A point's label -> repeat -> its tok/s in that repeat: a static point's sum(N) / sum(batch wall times)
    (throughput_tok_s per repeat, eval/totals.py throughput), a load point's new tokens over the repeat's span (its
    start, t = 0, to its last finish: output_tok_s per repeat, eval/served_figures.py load_figures). Keyed by repeat, so
    two points pair on the passes both ran."""
    points: dict[str, list[dict]] = {}
    for s in read_jsonl(folder / "samples.jsonl"):
        if s.get("method") is not None and s.get("new_tokens") is not None:
            points.setdefault(Point.of(s).label, []).append(s)
    out: dict[str, dict[int, float]] = {}
    for label, samples in points.items():
        for repeat, rows in by_repeat(samples).items():
            served = all(timed(s) and s.get("concurrency") is not None for s in rows)
            tok_s = (load_figures(with_slots(rows), None)["output_tok_s"] if served
                     else throughput(rows) if all(s.get("latency_s") is not None for s in rows) else None)
            if tok_s:
                out.setdefault(label, {})[repeat] = tok_s
    return out


def measured_points(folder: Path) -> dict:
    """(kind, value) -> candidate key -> {tok_s, tok_s_repeats, speedup, speedup_ci95}: a sweep's static points by
    batch size and its load points by concurrency; the baseline under OFF, a speculative point under (method, draft,
    gamma)."""
    summary = json.loads((folder / "summary.json").read_text())
    out: dict = {}
    readings = repeat_readings(folder)
    rows = [("batch", r, "batch_size", "throughput_tok_s", "speedup", "speedup_ci95")
            for r in summary.get("runs") or []]
    rows += [("concurrency", r, "concurrency", "output_tok_s", "output_tok_s_ratio", None)
             for r in (summary.get("serving") or {}).get("runs") or []]
    for kind, run, axis, tok_s, speedup, interval in rows:
        if run.get("status") != "ok" or run.get("group") is not None or run.get("request_rate") is not None:
            continue
        m = run["metrics"]
        key = OFF if run["method"] == "baseline" else candidate_key(run)
        out.setdefault((kind, int(run[axis])), {})[key] = {
            "tok_s": m.get(tok_s), "tok_s_repeats": readings.get(run["label"], {}),
            "speedup": 1.0 if key == OFF else m.get(speedup),
            "speedup_ci95": [1.0, 1.0] if key == OFF else m.get(interval) if interval else None,
            "label": run["label"], "drift": any(f.get("code") == "drift" for f in run.get("flags") or [])}
    return out


def context_of(folder: Path) -> float:
    rows = [s for s in read_jsonl(folder / "samples.jsonl") if s.get("method") == "baseline"]
    return sum(int(s["prompt_tokens"]) for s in rows) / len(rows)


def load_key(name: str) -> tuple[str, int] | None:
    """recommend.json's load name (batch=2, conc=4) as a sweep's (kind, value); a rate is not swept here."""
    kind, _, value = name.partition("=")
    return {"batch": ("batch", int(value)), "conc": ("concurrency", int(value))}.get(kind) if value.isdigit() else None


def candidate_key(row: dict):
    """A speculative point or candidate as (method, draft, gamma); "off" as OFF."""
    return OFF if row.get("candidate") == OFF else (row["method"], row.get("draft"), row.get("gamma"))


def speculation_pays(measured: dict, within: float = WITHIN) -> str:
    """'yes' where some K measured above 1 (its interval above 1, where it has one), 'no' where every K measured below
    1 (its interval below 1), else 'tied' (a K whose interval holds 1). A point without an interval is one reading:
    within the check's own tolerance of 1 (a reading of 1.01 or 0.98 at within 0.03, which the within check cannot
    tell from off either) it is a tie; beyond it, read as measured."""
    verdicts = set()
    for key, m in measured.items():
        if key == OFF or m["speedup"] is None:
            continue
        ci = m.get("speedup_ci95")
        verdicts.add(("yes" if ci[0] > 1 else "no" if ci[1] < 1 else "tied") if ci else
                     "tied" if abs(m["speedup"] - 1) < within else "yes" if m["speedup"] > 1 else "no")
    return "yes" if "yes" in verdicts else "tied" if "tied" in verdicts else "no"


def check(result: dict, measured: dict, within: float = WITHIN) -> dict:
    """One load and context's recommendation against the sweep's points there."""
    best_key = max(measured, key=lambda k: measured[k]["tok_s"] or 0.0)
    rec = next(r for r in result["candidates"] if r["candidate"] == result["best"])
    key = candidate_key(rec)
    out = {"load": result["load"], "context": result["context"], "recommended": result["best"],
           "predicted_speedup": rec["speedup"], "predicted_speedup_ci95": rec.get("speedup_ci95"),
           "tie": result.get("tie"), "tied_with": result.get("tied_with") or [],
           "best_measured": measured[best_key]["label"], "best_tok_s": measured[best_key]["tok_s"],
           "best_speedup": measured[best_key]["speedup"]}
    if key not in measured:
        return {**out, "measured": None, "ratio": None, "within": None, "off_right": None,
                "why": "the sweep did not measure the recommended candidate"}
    mine = measured[key]
    ratio = mine["tok_s"] / measured[best_key]["tok_s"]
    verdict, ratios = within_verdict(ratio, mine["tok_s_repeats"], measured[best_key]["tok_s_repeats"], within)
    # a miss read while the machine changed speed (the sweep's own flag on either point) is said to be one
    drift = bool(mine.get("drift") or measured[best_key].get("drift"))
    pays = speculation_pays(measured, within)
    # where the recommendation ties off with a K (their predicted intervals overlap) either answer is right
    tied_off = (key == OFF and bool(out["tied_with"])) or OFF in out["tied_with"]
    off_right = tied_off or pays == "tied" or ((key == OFF) == (pays == "no"))
    return {**out, "measured_tok_s": mine["tok_s"], "measured_speedup": mine["speedup"],
            "measured_speedup_ci95": mine.get("speedup_ci95"), "ratio": ratio, "ratio_repeats": ratios,
            "within": ratio >= 1 - within, "verdict": verdict, "drift": drift, "speculation_pays": pays,
            "off_right": off_right}


def within_verdict(ratio: float, mine: dict[int, float], best: dict[int, float], within: float
                   ) -> tuple[str, list[float]]:
    """(verdict, the ratio per repeat both points ran, in repeat order): "yes" where the pooled ratio is at least
    1 - within; else "unresolved" where some repeat reads at least that (the two measured in the same pass), "no"
    where every repeat reads below it, "no (one reading)" where the two share fewer than 2 repeats."""
    both = sorted(set(mine) & set(best))
    ratios = [mine[r] / best[r] for r in both] if len(both) > 1 else []
    if ratio >= 1 - within:
        return "yes", ratios
    if not ratios:
        return "no (one reading)", ratios
    return ("unresolved" if max(ratios) >= 1 - within else "no"), ratios


def checks(recommends: list[dict], sweeps: list[tuple[float, dict]], within: float = WITHIN) -> list[dict]:
    """Every load and context of the recommendations on the sweep nearest its context among those its context's bin
    holds (the recommendation's contexts bin a length to the nearest in ratio, eval/recommend.py nearest), every sweep
    at that context that measured the load pooled (`pooled`); where no sweep is in its bin, or none there measured
    the load, said so (never judged on another context's)."""
    out = []
    contexts = sorted({round(c) for c, _ in sweeps})
    for data in recommends:
        asked = sorted({r["context"] for r in data["loads"] if r.get("context")})
        for result in data["loads"]:
            where = load_key(result["load"])
            if where is None:
                continue
            mine = [c for c in contexts if not result["context"] or nearest(c, asked) == result["context"]]
            at = (nearest(result["context"], mine) if result["context"] else mine[0]) if mine else None
            have = [points[where] for c, points in sweeps if round(c) == at and where in points]
            if not have:  # no sweep in its context's bin measured this load: not judged on another context's
                why = "no sweep measured it" if mine else f"no sweep near context {result['context']}"
                out.append({"load": result["load"], "context": result["context"], "why": why})
                continue
            out.append({**check(result, pooled(have), within), "sweep_context": at, "readings": len(have)})
    return out


def pooled(readings: list[dict]) -> dict:
    """One load's points as several sweeps read them: a candidate's tok/s and speedup the geometric mean of its readings
    (two candidates read in the same sweeps then compare as the mean of their ratios in each, whatever each sweep's
    machine speed), each sweep's repeats its own (keyed (sweep, repeat), so two points pair on the passes both ran; a
    sweep without them one reading); an interval only where one sweep read it (none pools the readings' spread); drift
    where any was flagged. One sweep: as it read."""
    if len(readings) == 1:
        return readings[0]
    out: dict = {}
    for key in {k for points in readings for k in points}:
        read = [(i, points[key]) for i, points in enumerate(readings) if key in points]
        tok_s = [m["tok_s"] for _, m in read if m["tok_s"]]
        speedups = [m["speedup"] for _, m in read if m["speedup"] is not None]
        out[key] = {"tok_s": statistics.geometric_mean(tok_s) if tok_s else None,
                    "tok_s_repeats": {(i, r): x for i, m in read for r, x in
                                      (m["tok_s_repeats"] or ({-1: m["tok_s"]} if m["tok_s"] else {})).items()},
                    "speedup": statistics.geometric_mean(speedups) if speedups else None,
                    "speedup_ci95": read[0][1]["speedup_ci95"] if len(read) == 1 or key == OFF else None,
                    "label": read[0][1]["label"], "drift": any(m["drift"] for _, m in read)}
    return out


def short(label: str) -> str:
    """A candidate's label without the draft's name and the defaults; a draft model's chain as its K (K=3 for
    speculative draft=... gamma=3 constant)."""
    words = [w for w in str(label).split() if not w.startswith("draft=") and w not in ("constant", "greedy")
             and not w.startswith(("batch=", "conc="))]
    if len(words) == 2 and words[0] == "speculative" and words[1].startswith("gamma="):
        return "K=" + words[1].removeprefix("gamma=")
    return " ".join(words)


def table(rows: list[dict], within: float = WITHIN) -> str:
    lines = ["| load | context (sweep) | recommended: predicted speedup [95% CI] | its measured speedup [95% CI] | "
             f"best measured: speedup | recommended / best tok/s | within {within:.0%} | off right |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "recommended" not in r:
            lines.append(f"| {r['load']} | {r['context']} | - | - | - | - | - | {r['why']} |")
            continue
        tie = f" (tie with {', '.join(short(t) for t in r['tied_with'])})" if r.get("tie") else ""
        sweeps = f", {r['readings']} sweeps" if r.get("readings", 1) > 1 else ""
        lines.append(f"| {r['load']} | {r['context']} ({r['sweep_context']}{sweeps}) | {short(r['recommended'])}: "
                     f"{_ci(r['predicted_speedup'], r['predicted_speedup_ci95'])}{tie} | "
                     f"{_ci(r.get('measured_speedup'), r.get('measured_speedup_ci95'))} | "
                     f"{short(r['best_measured'])}: {_f(r['best_speedup'])} | {_f(r['ratio'], '{:.3f}')} | "
                     f"{verdict_cell(r)} | "
                     f"{'-' if r['off_right'] is None else 'yes' if r['off_right'] else '**no**'}"
                     f" ({r.get('speculation_pays', r.get('why'))}) |")
    n = [r for r in rows if r.get("within") is not None]
    unresolved = sum(r["verdict"] == "unresolved" for r in n)
    drifted = sum(not r["within"] and bool(r.get("drift")) for r in n)
    said = [f"{unresolved} of the rest unresolved by the repeats"] if unresolved else []
    said += [f"{drifted} of the misses read under the sweep's drift flag"] if drifted else []
    aside = " (" + "; ".join(said) + ")" if said else ""
    lines.append("")
    lines.append(f"within {within:.0%}: {sum(r['within'] for r in n)} of {len(n)}{aside}; off right: "
                 f"{sum(r['off_right'] for r in n)} of {len(n)}; worst ratio "
                 f"{min((r['ratio'] for r in n), default=float('nan')):.3f}")
    return "\n".join(lines)


def verdict_cell(r: dict) -> str:
    """The within column: yes, or the verdict in bold with each repeat's ratio where the sweep repeated."""
    if r["within"] is None:
        return "-"
    if r["verdict"] == "yes":
        return "yes"
    repeats = f" (repeats: {', '.join(f'{x:.3f}' for x in r['ratio_repeats'])})" if r["ratio_repeats"] else ""
    return f"**{r['verdict']}**{repeats}{' (drift)' if r.get('drift') else ''}"


def recommend_problem(data) -> str | None:
    """What of a recommend.json this cannot check (what the recommended schedule refuses, and a load without its
    best or a candidate without its method); None where it reads."""
    if not isinstance(data, dict) or not isinstance(data.get("loads"), list):
        return "it has no loads"
    problem = recommendation_problem(data)
    if problem:
        return problem
    for i, load in enumerate(data["loads"]):
        if load["candidates"] and "best" not in load:
            return f"loads[{i}] names no best"
        for j, c in enumerate(load["candidates"]):
            if "method" not in c:
                return f"loads[{i}].candidates[{j}] has no method"
    return None


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share from 0 up to 1, such as 0.03 (3%)")
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as every bad input
        print(f"error: {message}; see python benchmarks/recommend_check.py --help", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recommend", type=Path, nargs="+", required=True)
    parser.add_argument("--sweeps", type=Path, nargs="+", required=True)
    parser.add_argument("--within", type=fraction, default=WITHIN,
                        help="the share of the best measured tok/s a recommendation may miss by (default 0.03)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for path in args.recommend + [s / "summary.json" for s in args.sweeps]:
        if not path.is_file():
            print(f"error: {path} does not exist: give recommend.json files (python -m eval.recommend) and report "
                  "folders of finished sweeps", file=sys.stderr)
            return 2
    try:
        recommends = [json.loads(p.read_text()) for p in args.recommend]
        for path, data in zip(args.recommend, recommends):
            problem = recommend_problem(data)
            if problem:
                print(f"error: {path}: {problem}; give a recommend.json python -m eval.recommend wrote, or mend that "
                      "key", file=sys.stderr)
                return 2
        sweeps = [(context_of(s), measured_points(s)) for s in args.sweeps]
    except (ValueError, KeyError) as error:
        print(f"error: a file is not a recommend.json or a finished sweep's report ({type(error).__name__}: {error}); "
              "give the files python -m eval.recommend and launch.py wrote", file=sys.stderr)
        return 2
    rows = checks(recommends, sweeps, args.within)
    print(table(rows, args.within))
    if args.json:
        write_json(args.json, {"within": args.within, "rows": rows,
                               "recommend": [str(p) for p in args.recommend], "sweeps": [str(s) for s in args.sweeps]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
