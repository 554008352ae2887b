"""What to deploy (#55): for each load and context length asked, every method and K the run measured, and "off" (the
target alone), predicted by the replay of the run's own schedule (eval/predict.py, eval/replay.py) on a cost profile;
the best named with its margin over the runner-up, a tie said as a tie, and its settings for each serving target
(eval/deploy/).

    python -m eval.recommend RUN_DIR [--costs PROFILE.json] [--batch 1,4] [--concurrency 1,2,4] [--rate 2.0]
                             [--context 512,4096] [--out FILE]
    python -m eval.recommend --acceptance FILE --costs PROFILE.json [--batch ...] [--prompt-tokens N] [--new-tokens N]

A K the run did not measure is a candidate only where the per-position acceptance supports it: below a measured K
of a draft model's chain (derived_rounds). --context re-prices each request at that context length with the rounds
measured near it (at_context). --acceptance reads a target's acceptance form (eval/acceptance_io.py) instead of a
run's rounds.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
from collections import defaultdict
from pathlib import Path

from decode.k_model import TIE, conditional, pick
from decode.methods import FIXED, REGISTRY, caps_of
from eval import acceptance_io, deploy
from eval.axes import comparison_axes
from eval.costs import TARGET, Profile, read_config, read_env, read_progress, run_costs
from eval.groups import natural
from eval.predict import against_own_probes, differences, draft_label, points_and_references, run_profile, written
from eval.records import Point
from eval.replay import (CLUSTER_DRAWS, OFF_BY, MissingCost, Pricer, lacking, load_resamples, priced_k,
                         profile_resamples, replay_load, replay_static, static_prediction)
from eval.served_figures import by_repeat, load_prediction, replayed_figures
from eval.stats import BOOTSTRAP_SEED, MIN_PROMPTS, expanded_interval, misses
from eval.totals import clusters_of, units
from utils import UserError, positive_ints
from utils.io import read_jsonl, write_json

MIN_BIN_ROUNDS = 30  # a context bin with fewer rounds is not its own acceptance: the point's rounds are used instead
FAR = 2  # a context asked this many times beyond every round's is said to be read from other contexts
LOAD_AXES = tuple(axis.name for axis in comparison_axes())
OFF = "off"


# ---- candidates: the run's speculative points, by what they are (their point axes), at every load ---------------------

def key_of(point: Point) -> tuple:
    """A candidate: a point's values but its comparison axes (load, batch, temperature)."""
    return tuple(sorted((k, v) for k, v in point.without(*LOAD_AXES).items() if v is not None))


def label_of(key: tuple) -> str:
    """The method, then its other axes as k=v (a schedule by its name)."""
    values = dict(key)
    return " ".join([str(values.get("method"))] + [str(v) if k == "schedule" else f"{k}={v}"
                                                   for k, v in key if k != "method"])


def chain(rows: list[dict]) -> bool:
    """Every round a chain of the point's gamma (no tree, no sources, a constant schedule), fewer drafted only where
    the tokens left cap it (left - 1: a row's last rounds): per-position acceptance means one thing there."""
    def capped(s: dict) -> bool:
        left = int(s.get("new_tokens") or 0) - 1
        for r in s.get("rounds") or []:
            if r.get("drafted") not in (s.get("gamma"), left - 1) or "batch_nodes" in r or "sources" in r:
                return False
            left -= r["emitted"]
        return True
    return all(s.get("schedule") in (None, FIXED) and capped(s) for s in rows)


def agreements(rounds: list[dict]) -> list[bool | None]:
    """Whether the draft's proposal agreed with the token the row emitted, at each emitted position: a round accepting
    a of d agrees at its first a, disagrees at the next where a < d (the target's correction); where a = d the next
    token is the target's bonus, never proposed: unknown (None)."""
    out: list[bool | None] = []
    for r in rounds:
        a, d = r["accepted"], r["drafted"]
        out += ([True] * a + [False if a < d else None])[:r["emitted"]]
    return out


def deep_acceptance(rows: list[dict]) -> float:
    """The chance given to a bonus position (one a full round never tested, after a run of agreements): the share of
    full rounds that accepted their last draft having accepted all before it, by the rule of succession ((s + 1) /
    (n + 2): 14 of 14 is not a certainty); the whole acceptance rate, so smoothed, where no round reached its last
    draft."""
    gamma = max((s.get("gamma") or 0 for s in rows), default=0)
    deep = [r for s in rows for r in s.get("rounds") or [] if r["drafted"] == gamma and r["accepted"] >= gamma - 1]
    if deep:
        return (sum(r["accepted"] == gamma for r in deep) + 1) / (len(deep) + 2)
    rounds = [r for s in rows for r in s.get("rounds") or []]
    return (sum(r["accepted"] for r in rounds) + 1) / (sum(r["drafted"] for r in rounds) + 2)


def derived_rounds(rounds: list[dict], k: int, bonus: float = 1.0, rng: random.Random | None = None,
                   to_length: bool = True) -> list[dict]:
    """The rounds a draft model's chain of k drafts (k below the measured gamma) runs over the same tokens. A chain's
    proposal at a position depends only on the tokens before it, which are the target's wherever a round starts, so
    whether it agrees is a property of the position (exact under greedy decoding): the measured rounds give it at
    every position but the bonus tokens, each drawn agreeing with chance `bonus` (deep_acceptance). Rounds of k then
    replay those positions: each drafts k, accepts up to the first disagreement, emits one more. A row that ran to
    max_new_tokens (to_length) drafts min(k, tokens left - 1), as the engine caps it; one that stopped at its EOS
    drafted k to its end (the cap counts from max_new_tokens). (Taking each measured round's first k, as before,
    counted rounds that start after a correction only: it undercounted every k.)"""
    rng = rng or random.Random(BOOTSTRAP_SEED)
    agree = [rng.random() < bonus if a is None else a for a in agreements(rounds)]
    out, pos = [], 0
    while pos < len(agree):
        left = len(agree) - pos
        drafted = min(k, left - 1) if to_length else k
        accepted = 0
        while accepted < min(drafted, left - 1) and agree[pos + accepted]:
            accepted += 1
        out.append({"drafted": drafted, "accepted": accepted, "emitted": accepted + 1})
        pos += accepted + 1
    return out


def derived(rows: list[dict], k: int) -> list[dict]:
    bonus = deep_acceptance(rows)
    return [dict(s, gamma=k, rounds=derived_rounds(s.get("rounds") or [], k, bonus,
                                                    random.Random(f"{BOOTSTRAP_SEED}:{k}:{i}"),
                                                    to_length=s.get("stop_reason") != "eos"))
            for i, s in enumerate(rows)]


def candidates(samples: list[dict]) -> tuple[dict, dict, list[str], set]:
    """(candidate key -> its points -> their rows, comparison -> the baseline's rows, notes, the derived keys): every
    speculative point of our engine with rounds, and below each draft model chain's measured gamma every K it did not
    measure (derived)."""
    by_point, references = points_and_references(samples)
    out: dict[tuple, dict] = defaultdict(dict)
    for point, rows in by_point.items():
        spec = REGISTRY[point.method]
        if spec.has_rounds and caps_of(point.method).times_forwards and point.comparison in references and \
                not point.synthetic_acceptance:
            out[key_of(point)][point] = rows
    notes, measured = [], set(out)
    for key, points in list(out.items()):
        values = dict(key)
        if not (REGISTRY[values["method"]].needs_draft and values.get("gamma") and values.get("tree") is None
                and all(chain(rows) for rows in points.values())):
            continue
        for k in range(1, values["gamma"]):
            new = tuple(sorted({**values, "gamma": k}.items()))
            if new in measured or new in out:
                continue
            out[new] = {point: derived(rows, k) for point, rows in points.items()}
            notes.append(f"{label_of(new)}: not measured, derived from gamma={values['gamma']}'s rounds (where "
                         "the draft agreed with each token, replayed in rounds of "
                         f"{k}): a prediction from another K, marked (derived)")
    return dict(out), references, notes, set(out) - measured


# ---- context length -----------------------------------------------------------------------------------------------

def round_contexts(s: dict) -> list[int]:
    """Each round's context: the prompt and the tokens generated before it (the first from the prefill)."""
    out, so_far = [], int(s["prompt_tokens"]) + 1
    for r in s.get("rounds") or []:
        out.append(so_far)
        so_far += r["emitted"]
    return out


def nearest(context: int, asked: list[int]) -> int:
    """The asked context length nearest a round's, in ratio (a bin spans from the geometric mean with the one
    below to that with the one above)."""
    return min(asked, key=lambda c: (abs(math.log(max(context, 1) / c)), c))


def bin_rounds(rows: list[dict], asked: list[int]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {c: [] for c in asked}
    for s in sorted(rows, key=lambda s: (s.get("repeat", 0), s.get("request") or 0, s.get("sample_id") or 0)):
        for r, context in zip(s.get("rounds") or [], round_contexts(s)):
            out[nearest(context, asked)].append(r)
    return out


def tokens_per_round(rows: list[dict], k: int | None) -> float | None:
    """The tokens a row commits per round (accepted + 1: block efficiency) over the rows' rounds that drafted k and
    were not cut short where they stand (the tokens left draft fewer, an EOS cuts what it emits); a round `dealt` cut
    to a row's tokens counts as the round it was dealt (cut by its outcome, a long round is the one cut: leaving it
    out would bias the figure low); all rounds where none is left; None without rounds. With the predicted decode
    speedup (after the prefills) it gives a round's cost in plain steps (tokens / decode speedup)."""
    rounds = [r.get("dealt_from", r) for s in rows for r in s.get("rounds") or []]
    full = [r for r in rounds if r.get("drafted") == k and r["emitted"] == r["accepted"] + 1] or rounds
    return sum(r["emitted"] for r in full) / len(full) if full else None


def dealt(rows: list[dict], pool: list[dict]) -> list[dict]:
    """Each row's rounds re-dealt from `pool` in order (cycling), as many as its tokens need; the last round cut to
    the tokens left."""
    out, cursor = [], 0
    for s in rows:
        need, rounds = int(s["new_tokens"]) - 1, []
        while need > 0:
            r = pool[cursor % len(pool)]
            cursor += 1
            emitted = min(r["emitted"], need)
            rounds.append(dict(r, emitted=emitted, accepted=min(r["accepted"], emitted - 1), dealt_from=r)
                          if emitted < r["emitted"] else dict(r))
            need -= emitted
        out.append(dict(s, rounds=rounds))
    return out


def at_context(rows: list[dict], baseline: list[dict], context: int, binned: dict[int, list[dict]]
               ) -> tuple[list[dict], list[dict], str | None]:
    """The rows and the baseline's at a context length: each request's prompt that long (the cache the steps are
    priced at), its rounds dealt from those measured near that context (bin_rounds); a bin with fewer than
    MIN_BIN_ROUNDS rounds: the point's own rounds, and a note saying so."""
    pool, said = binned[context], []
    if len(pool) < MIN_BIN_ROUNDS:
        said.append(f"context {context}: {len(pool)} rounds measured near it (fewer than {MIN_BIN_ROUNDS}): the "
                    "point's rounds at every context are used")
        pool = [r for s in rows for r in s.get("rounds") or []]
    measured = [c for s in rows for c in round_contexts(s)]
    # one context asked bins every round to it, however far: how far is said
    if measured and max(measured) * FAR < context:
        said.append(f"context {context}: every round was measured at {max(measured)} tokens or fewer (under 1/{FAR} "
                    "of it): its acceptance is read from far shorter contexts")
    elif measured and min(measured) > context * FAR:
        said.append(f"context {context}: every round was measured at {min(measured)} tokens or more (over {FAR}x "
                    "it): its acceptance is read from far longer contexts")
    mine = dealt([dict(s, prompt_tokens=context) for s in rows], pool) if pool else rows
    return mine, [dict(s, prompt_tokens=context) for s in baseline], "; ".join(said) or None


# ---- one load's prediction of every candidate ----------------------------------------------------------------------

def load_name(kind: str, value) -> str:
    """A load as printed and keyed in recommend.json; a rate with the concurrency of the point it was measured at
    (check_loads: a rate is read at each concurrency that measured it)."""
    if kind == "rate":
        rate, concurrency = value
        return f"rate={rate}/s conc={concurrency}"
    return {"batch": "batch={}", "concurrency": "conc={}"}[kind].format(value)


def measured_at(points: dict, kind: str, value) -> tuple[Point, int | None] | None:
    """The candidate's point a load is predicted from, and the what-if (None: the point measured it): a static batch
    size from a static point, a concurrency from a load point, a rate only from a point at that rate."""
    static = sorted((p for p in points if p.concurrency is None), key=lambda p: p.batch_size or 0)
    served = sorted((p for p in points if p.concurrency is not None), key=lambda p: (p.concurrency, p.request_rate or 0))
    if kind == "batch":
        same = [p for p in static if p.batch_size == value]
        return (same[0], None) if same else (static[0], value) if static else None
    if kind == "concurrency":
        same = [p for p in served if p.concurrency == value]
        return (same[0], None) if same else (served[0], value) if served else None
    rate, concurrency = value
    same = [p for p in served if p.request_rate == rate and p.concurrency == concurrency]
    return (same[0], None) if same else None


LOAD_LATENCY = ("ttft_p50_s", "tpot_mean_ms", "e2e_p50_s")  # a load's latency figures, each with its interval
LATENCY_NAMES = {"latency_s": "latency", "ttft_p50_s": "TTFT P50", "tpot_mean_ms": "TPOT", "e2e_p50_s": "E2E P50"}


def without_stray_intervals(figures: dict) -> list[str]:
    """Drops each latency interval that misses its own point (figures[k] outside figures[k + '_ci95']), as a load's
    speedup interval is withheld (eval/served_figures.py withheld): the resamples re-draw requests into the load, which
    changes who runs beside whom, so their spread can sit beside the replay of what ran; an interval that misses its
    point is no interval of it. Returns why, one line a figure dropped."""
    said = []
    for key, name in LATENCY_NAMES.items():
        point, interval = figures.get(key), figures.get(f"{key}_ci95")
        if not misses(point, interval):
            continue
        figures[f"{key}_ci95"] = None
        said.append(f"{name}'s replay of what ran ({point:.4g}) lies outside its resamples' [{interval[0]:.4g}, "
                    f"{interval[1]:.4g}]: no interval")
    return said


def clamp_of(rows: list[dict], what_if: int | None) -> int:
    """The rows a measured batch's tail is priced at (Pricer clamp_rows): its batch size; a what-if's, none."""
    return 0 if what_if is not None else max(int(s.get("batch_size") or 1) for s in rows)


def latency_clusters(replayed: list[dict]) -> list[tuple[float, int]]:
    """Per prompt batch (with its repeats; a conversation's batches together, as the throughput's clusters): (the
    seconds of its requests, how many), in batch order."""
    cluster, out = clusters_of(replayed), {}
    for (_, index), batch in units(replayed).items():
        seconds, count = out.get(cluster[index], (0.0, 0))
        out[cluster[index]] = (seconds + sum(s["latency_s"] for s in batch), count + len(batch))
    return [out[k] for k in sorted(out)]


def static_latency_ci95(rows: list[dict], profile: Profile, draft: str | None, speculative: bool,
                        what_if: int | None, clamp: int, batches: int) -> list[float] | None:
    """The mean request seconds' 95% interval, by the bootstrap the speedup's takes (eval/replay.py joint_interval):
    per resampled profile (profile_resamples: the probes' timing spread) the batches replayed, then the prompt
    batches drawn with replacement CLUSTER_DRAWS times (the acceptance's spread over prompts), the same seed; the
    expanded percentile interval. None with fewer than MIN_PROMPTS batches."""
    if batches < MIN_PROMPTS:
        return None
    rng, values = random.Random(BOOTSTRAP_SEED), []
    for costs in profile_resamples(profile):
        clusters = latency_clusters(replay_static(rows, Pricer(costs, draft, clamp_rows=clamp), speculative, what_if))
        for _ in range(CLUSTER_DRAWS):
            drawn = rng.choices(clusters, k=len(clusters))
            values.append(sum(c[0] for c in drawn) / sum(c[1] for c in drawn))
    return expanded_interval(values, batches)


def load_latency_ci95(rows: list[dict], baseline: list[dict], profile: Profile, draft: str | None,
                      speculative: bool, what_if: int | None) -> dict:
    """TTFT P50, TPOT and E2E P50's 95% intervals, by the bootstrap the speedup's takes (eval/served_figures.py
    load_prediction): the same paired resamples of the requests (load_resamples), each priced by a resample of the
    profile; the side asked replayed. None each with fewer than MIN_PROMPTS paired requests."""
    draws, values = load_resamples(rows, baseline), {k: [] for k in LOAD_LATENCY}
    for (mine, theirs), costs in zip(draws, profile_resamples(profile, len(draws))):
        side = mine if speculative else theirs
        figures = replayed_figures(*[replay_load(side, Pricer(costs, draft if speculative else None), speculative,
                                                 what_if)] * 2)
        for k in LOAD_LATENCY:
            if figures[k] is not None:
                values[k].append(figures[k])
    n = len({s.get("request") for s in (rows if speculative else baseline)})
    return {f"{k}_ci95": expanded_interval(values[k], n) if draws else None for k in LOAD_LATENCY}


def off_latency_ci95(kind: str, baseline: list[dict], profile: Profile, what_if: int | None, clamp: int) -> dict:
    """The baseline's latency intervals, as a candidate's."""
    if kind == "batch":
        batches = len(latency_clusters(replay_static(baseline, Pricer(profile, clamp_rows=clamp), False, what_if)))
        return {"latency_s_ci95": static_latency_ci95(baseline, profile, None, False, what_if, clamp, batches)}
    return load_latency_ci95(baseline, baseline, profile, None, False, what_if)


def predicted(kind: str, rows: list[dict], baseline: list[dict], profile: Profile, draft: str | None,
              what_if: int | None) -> tuple[dict | None, dict | None, str | None]:
    """(the candidate's figures, the baseline's, why not): speedup with its interval, tok/s with the speedup's
    interval carried to it, and latency (a static batch: the mean request's seconds; a load: TTFT P50, TPOT, E2E
    P50), both sides replayed alike."""
    if kind == "batch":
        figures, missing = static_prediction(rows, baseline, profile, draft, what_if)
        if figures is None:
            return None, None, missing
        clamp = clamp_of(rows, what_if)
        mine = replay_static(rows, Pricer(profile, draft, clamp_rows=clamp), True, what_if)
        theirs = replay_static(baseline, Pricer(profile, clamp_rows=clamp), False, what_if)
        speedup = figures["speedup"]
        base_tok_s = figures["tok_s"] / speedup if speedup else None
        spec = {"speedup": speedup, "speedup_ci95": figures["speedup_ci95"], "tok_s": figures["tok_s"],
                "latency_s": sum(s["latency_s"] for s in mine) / len(mine),
                "latency_s_ci95": static_latency_ci95(rows, profile, draft, True, what_if, clamp,
                                                      len(latency_clusters(mine)))}
        base = {"tok_s": base_tok_s, "latency_s": sum(s["latency_s"] for s in theirs) / len(theirs)}
    else:
        try:
            figures = load_prediction(rows, baseline, profile, draft, what_if)
            base_figures = replayed_figures(*[replay_load(baseline, Pricer(profile), False, what_if)] * 2)
        except MissingCost as error:
            return None, None, lacking(error)
        spec = {k: figures.get(k) for k in ("speedup", "speedup_ci95", "speedup_ci95_withheld", "tok_s",
                                            "ttft_p50_s", "tpot_mean_ms", "e2e_p50_s")}
        spec.update(load_latency_ci95(rows, baseline, profile, draft, True, what_if))
        base = {k: base_figures.get(k) for k in ("tok_s", "ttft_p50_s", "tpot_mean_ms", "e2e_p50_s")}
    spec["decode_speedup"] = decode_speedup(figures.get("parts_s"), rows, baseline)
    interval = spec.get("speedup_ci95")
    spec["tok_s_ci95"] = ([base["tok_s"] * interval[0], base["tok_s"] * interval[1]]
                          if interval and base.get("tok_s") else None)
    return spec, base, None


def decode_speedup(parts: dict | None, rows: list[dict], baseline: list[dict]) -> float | None:
    """The speedup after the prefills, from the replay's parts (eval/replay.py part_times): the candidate's decode
    tokens a second (each row's tokens after its first, over its draft steps' and verifications' seconds) over the
    baseline's (over its steps'), each side over its own rows (a sampled run's rows stop at EOS apart). A round's cost
    in plain steps is its tokens over it."""
    if not parts:
        return None
    spent, base = (parts.get("draft_steps_s") or 0) + (parts.get("verifications_s") or 0), parts.get("baseline_steps_s")
    mine, theirs = (sum(max(int(s.get("new_tokens") or 0) - 1, 0) for s in side) for side in (rows, baseline))
    if not (spent > 0 and base and base > 0 and mine and theirs):
        return None
    return (mine / spent) / (theirs / base)


def tied(a: dict, b: dict) -> bool:
    """Two predictions tie where their 95% intervals overlap; where either has none (fewer than MIN_PROMPTS prompt
    batches or requests), where they are within OFF_BY of each other ("off" is exactly 1, its interval [1, 1])."""
    ia, ib = a.get("speedup_ci95"), b.get("speedup_ci95")
    if ia and ib:
        return ia[0] <= ib[1] and ib[0] <= ia[1]
    return abs(a["speedup"] / b["speedup"] - 1) <= OFF_BY


def choose(rows: list[dict]) -> dict:
    """The best by predicted speedup (the same baseline: by throughput), by the one model's rule (decode/k_model.py
    pick: speedups within its relative TIE go to off, then the shorter K), its margin over the runner-up (best's
    speedup over runner-up's), and every candidate tied with it."""
    def order(r: dict) -> tuple:
        return r["candidate"] != OFF, r.get("gamma") or 0, r["candidate"]
    best = rows[pick({i: r["speedup"] for i, r in enumerate(rows)}, order=lambda i: order(rows[i]))]
    ranked = [best] + sorted((r for r in rows if r is not best), key=lambda r: (-r["speedup"], order(r)))
    runner = ranked[1] if len(ranked) > 1 else None
    return {"best": best["candidate"], "runner_up": runner and runner["candidate"],
            "margin": best["speedup"] / runner["speedup"] if runner else None,
            "tie": bool(runner and tied(best, runner)),
            "tied_with": [r["candidate"] for r in ranked[1:] if tied(best, r)]}


def recommend_load(cands: dict, references: dict, profile: Profile, kind: str, value,
                   context: int | None, asked_contexts: list[int], derived_keys: frozenset = frozenset()) -> dict:
    """One load (and context length): every candidate and "off" predicted, and the choice."""
    rows, notes, base, no_interval = [], [], None, []
    where_said = load_name(kind, value) + ("" if context is None else f" at {context} tokens")
    for key, points in sorted(cands.items(), key=lambda kv: label_of(kv[0])):
        where = measured_at(points, kind, value)
        if where is None:
            continue
        point, what_if = where
        mine, theirs = points[point], references[point.comparison]
        if context is not None:
            mine, theirs, note = at_context(mine, theirs, context, bin_rounds(mine, asked_contexts))
            note = note and f"{label_of(key)}: {note}"
            if note and note not in notes:
                notes.append(note)
        draft = draft_label(point, profile)
        spec, baseline, missing = predicted(kind, mine, theirs, profile, draft, what_if)
        if spec is None or spec["speedup"] is None:
            notes.append(f"{label_of(key)}: {missing or 'no prediction'}")
            continue
        values = dict(key)
        rows.append({"candidate": label_of(key), "method": values["method"], "gamma": values.get("gamma"),
                     "draft": values.get("draft"), "measured_at": point.label,
                     "what_if": what_if is not None, "derived": key in derived_keys, "axes": values, **spec,
                     "tokens_per_round": tokens_per_round(mine, values.get("gamma"))})
        notes.extend(f"{where_said}, {label_of(key)}: {why}" for why in without_stray_intervals(rows[-1]))
        if spec.get("speedup_ci95_withheld"):
            notes.append(f"{label_of(key)}: no interval: {spec['speedup_ci95_withheld']}; a tie is within {OFF_BY:.0%}")
        elif spec.get("speedup_ci95") is None:
            no_interval.append(label_of(key))
        if base is None:
            base, off_from = baseline, (theirs, what_if, clamp_of(mine, what_if))
    if no_interval:
        notes.append(f"{load_name(kind, value)}: no interval for {', '.join(no_interval)} (fewer than {MIN_PROMPTS} "
                     f"prompt batches or requests): a tie is within {OFF_BY:.0%}")
    if base is None:
        return {"load": load_name(kind, value), "context": context, "candidates": [], "notes": notes}
    rows.append({"candidate": OFF, "method": None, "gamma": None, "draft": None, "speedup": 1.0,
                 "speedup_ci95": [1.0, 1.0], **base, "tok_s_ci95": [base["tok_s"]] * 2 if base.get("tok_s") else None,
                 **off_latency_ci95(kind, off_from[0], profile, *off_from[1:])})
    notes.extend(f"{where_said}, {OFF}: {why}" for why in without_stray_intervals(rows[-1]))
    return {"load": load_name(kind, value), "context": context, "candidates": rows, **choose(rows), "notes": notes}


def recommend(samples: list[dict], profile: Profile, loads: list[tuple[str, object]],
              contexts: list[int] | None = None) -> tuple[list[dict], list[str]]:
    """Every load x context length's recommendation, and the notes on the candidates. UserError where the run has no
    candidate, or a load no candidate (nor off) can be priced at."""
    cands, references, notes, derived_keys = candidates(samples)
    if not cands:
        raise UserError("the run has no speculative point of our engine with rounds and its baseline: give a run "
                        "that measured one")
    out = []
    for kind, value in loads:
        for context in contexts or [None]:
            result = recommend_load(cands, references, profile, kind, value, context, contexts or [],
                                    frozenset(derived_keys))
            if not result["candidates"]:
                why = "; ".join(result["notes"]) or "no candidate was measured at such a load"
                raise UserError(f"{load_name(kind, value)} cannot be priced ({why}): give a profile with those "
                                "steps (python -m runner.profile), or another load")
            out.append(result)
    return out, notes


def by_category(samples: list[dict], profile: Profile, loads: list[tuple[str, object]],
                contexts: list[int] | None = None) -> list[dict]:
    """Each category's (dataset.group_by's group) recommendation from its own prompts: its rounds, its lengths, its
    interval (the same bootstrap over its prompts). A category where a measured candidate has fewer than
    MIN_BIN_ROUNDS rounds says so and gets no figure; one whose loads cannot be priced, likewise."""
    out = []
    for group in sorted({s["group"] for s in samples if s.get("group") is not None}, key=natural):
        mine = [s for s in samples if s.get("group") == group]
        cands, references, _, derived_keys = candidates(mine)
        counts = sorted((sum(len(s.get("rounds") or []) for rows in points.values() for s in rows), label_of(key))
                        for key, points in cands.items() if key not in derived_keys)
        if not counts or counts[0][0] < MIN_BIN_ROUNDS:
            n, label = counts[0] if counts else (0, "any candidate")
            out.append({"category": group, "loads": [],
                        "note": f"category={group}: {n} rounds of {label} (fewer than {MIN_BIN_ROUNDS}): too few to "
                                "say which is best"})
            continue
        results = [recommend_load(cands, references, profile, kind, value, context, contexts or [],
                                  frozenset(derived_keys))
                   for kind, value in loads for context in contexts or [None]]
        unpriced = [r for r in results if not r["candidates"]]
        out.append({"category": group, "loads": [r for r in results if r["candidates"]],
                    "note": f"category={group}: {', '.join(r['load'] for r in unpriced)} not priced (no candidate "
                            "measured there)" if unpriced else None})
    return out


def category_table(categories: list[dict]) -> str:
    """The best per category, load and context, with its interval and margin; a category too small, said so."""
    lines = ["| category | load | context | best | speedup [95% CI] | tok/s [95% CI] | choice |",
             "|---|---|---|---|---|---|---|"]
    for category in categories:
        for result in category["loads"]:
            best = next(r for r in result["candidates"] if r["candidate"] == result["best"])
            choice = (f"tie with {', '.join(result['tied_with'])}" if result["tie"] else
                      f"{result['margin']:.3f}x {result['runner_up']}" if result["runner_up"] else "only one")
            lines.append(f"| {category['category']} | {result['load']} | {result['context'] or 'as measured'} | "
                         f"{best['candidate']}{' (derived)' if best.get('derived') else ''} | "
                         f"{_interval(best['speedup'], best.get('speedup_ci95'))} | "
                         f"{_interval(best.get('tok_s'), best.get('tok_s_ci95'), '{:.1f}')} | {choice} |")
        if category["note"]:
            lines.append(f"| {category['category']} | - | - | - | - | - | {category['note']} |")
    return "\n".join(lines)


def model_name(name) -> str | None:
    """A model's name as compared across profiles: its last path component, lower case, without synthetic: and the
    synthetic shape's options (synthetic:qwen3-4b?layers=6 is qwen3-4b)."""
    if not name:
        return None
    return str(name).removeprefix("synthetic:").split("?")[0].rstrip("/").split("/")[-1].lower() or None


def check_target(profile_meta: dict, run_meta: dict, costs: Path) -> None:
    """A --costs profile of another target than the run's: UserError. The same where one name begins the other (a
    profile of synthetic shapes names the architecture, qwen2.5-coder-1.5b for qwen2.5-coder-1.5b-instruct)."""
    mine, theirs = model_name(profile_meta.get("target_model")), model_name(run_meta.get("target_model"))
    if mine and theirs and not (mine.startswith(theirs) or theirs.startswith(mine)):
        raise UserError(f"{costs} profiles the target {profile_meta['target_model']}, the run measured "
                        f"{run_meta['target_model']}: its steps do not price this run's; give a profile of "
                        f"{run_meta['target_model']} (python -m runner.profile)")


def context_notes(profile: Profile, contexts: list[int] | None) -> list[str]:
    """What the profile's caches say of each context asked: a profile timed at one cache prices every context's
    steps alike; a context outside its caches is extrapolated along their line (eval/costs.py _along)."""
    caches = profile.caches()
    if not contexts or not caches:
        return []
    if len(caches) == 1:
        return [f"the profile timed its steps at one cache ({caches[0]} tokens): at every --context the steps cost "
                "the same; only the acceptance and the prefill change (profile longer caches: python -m runner.profile)"]
    return [f"context {c}: outside the profile's caches ({caches[0]}-{caches[-1]} tokens): its steps are extrapolated "
            f"along their line, {c / caches[-1]:.1f}x the longest" if c > caches[-1] else
            f"context {c}: below the profile's caches ({caches[0]}-{caches[-1]} tokens): its steps are extrapolated"
            for c in contexts if not caches[0] <= c <= caches[-1]]


def default_loads(samples: list[dict]) -> list[tuple[str, object]]:
    """The loads the run measured: each static batch size, each load point's concurrency."""
    static = sorted({int(s["batch_size"]) for s in samples if s.get("concurrency") is None and s.get("batch_size")})
    served = sorted({int(s["concurrency"]) for s in samples if s.get("concurrency") is not None})
    return [("batch", b) for b in static] + [("concurrency", c) for c in served]


def check_loads(samples: list[dict], loads: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The loads asked, each rate once per concurrency the run measured it at ((rate, concurrency): a rate's
    arrivals at another concurrency are another load); a load kind the run has no point of, or a rate it did not
    measure: UserError."""
    static = any(s.get("concurrency") is None for s in samples)
    rates = sorted({s["request_rate"] for s in samples if s.get("request_rate") is not None})
    out: list[tuple[str, object]] = []
    for kind, value in loads:
        if kind == "batch" and not static:
            raise UserError("--batch needs static points and the run has load points only: give --concurrency")
        if kind == "concurrency" and not any(s.get("concurrency") is not None for s in samples):
            raise UserError("--concurrency needs load points and the run has static batches only: give --batch")
        if kind == "rate" and value not in rates:
            raise UserError(f"--rate {value}: the run measured rates {rates or 'none'}; a rate not measured is not "
                            "predicted (its arrivals are drawn by the runner): give a measured one, or --concurrency")
        if kind == "rate":
            out += [("rate", (value, c)) for c in sorted({int(s["concurrency"]) for s in samples
                                                          if s.get("request_rate") == value})]
        else:
            out.append((kind, value))
    return out


# ---- acceptance from a file: records made from its rates -------------------------------------------------------------

def imported_samples(rates: list[float], profile: Profile, prompt_tokens: int, new_tokens: int,
                     loads: list[tuple[str, object]]) -> list[dict]:
    """A run's records made from an acceptance (eval/acceptance_io.py): MIN_PROMPTS x the largest batch asked
    requests of prompt_tokens and new_tokens, each a static batch of one (regrouped to the batches asked) and a load
    point whose requests all arrive at 0 (at the concurrencies asked), their rounds dealt in order from the rates'
    pool; the baseline's the same. The draft: the profile's only draft model."""
    drafts = profile.drafts()
    if len(drafts) != 1:
        raise UserError(f"--acceptance prices a draft model's chain: the profile has drafts {drafts or 'none'}; give a "
                        "profile of one draft model")
    widest = max([int(v) for k, v in loads if k != "rate"] + [1])
    n, k = MIN_PROMPTS * widest, len(rates)
    pool = acceptance_io.synthetic_rounds(rates)
    out = []
    for served in (False, True):
        rows = []
        for i in range(n):
            row = {"method": "baseline", "sample_id": i, "repeat": 0, "batch_index": i, "batch_size": 1,
                   "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "draft": None, "gamma": None}
            if served:
                row.update(batch_size=None, concurrency=n, request=i, arrival_s=0.0)
            rows.append(row)
        spec = dealt([dict(r, method="speculative", draft=drafts[0], gamma=k, schedule=FIXED) for r in rows], pool)
        out += rows + spec
    return out


# ---- the command's checks of its inputs ----------------------------------------------------------------------------

def unnamed_target(meta: dict, costs: Path, run_target: str | None) -> list[str]:
    """A --costs profile that names no target: nothing to check it against, said."""
    if meta.get("target_model"):
        return []
    against = f"not checked against the run's target ({run_target})" if run_target else "its target is unknown"
    return [f"{costs} names no target_model: {against}; the figures price whatever model it timed"]


ROUND_KEYS = ("drafted", "accepted", "emitted")


def check_records(samples: list[dict], path: Path) -> None:
    """Records launch.py wrote: at least one, each field this reads of the type it reads (UserError naming the first
    record that is not, by its line among the records)."""
    if not samples:
        raise UserError(f"{path} holds no record (a torn last line is skipped): give the report folder of a run that "
                        "measured a batch")
    def wrong(s: dict) -> str | None:
        if not isinstance(s.get("method"), (str, type(None))):
            return "method"
        for key in ("prompt_tokens", "new_tokens", "batch_size", "concurrency", "gamma"):
            value = s.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                return key
        rounds = s.get("rounds")
        if rounds is not None and not (isinstance(rounds, list) and all(
                isinstance(r, dict) and all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool)
                                            and r[k] >= 0 for k in ROUND_KEYS) for r in rounds)):
            return "rounds"
        return None
    for number, s in enumerate(samples, 1):
        key = wrong(s)
        if key is not None:
            raise UserError(f"{path}: record {number} has {key} {json.dumps(s.get(key))[:60]}, not what launch.py "
                            "writes; mend or delete that line")


def incomplete(progress: dict, samples: list[dict]) -> str | None:
    """Why the run's records are less than it planned (progress.json: a status other than finished, a point with
    fewer batches, or a load point fewer repeats, than planned); None where it finished."""
    status = progress.get("status")
    rows: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        if s.get("method") in REGISTRY:
            rows[Point.of(s).label].append(s)
    short = []
    for label, planned in (progress.get("planned") or {}).items():
        mine = rows.get(label, [])
        done = len(by_repeat(mine)) if any(s.get("concurrency") is not None for s in mine) else len(units(mine))
        if isinstance(planned, int) and done < planned:
            short.append(f"{label}: {done} of {planned}")
    if status in (None, "finished", "finished with failures") and not short:
        return None
    return (f"the run is incomplete (status {status or 'unknown'}"
            + (f"; {len(short)} point(s) short of their plan, e.g. {short[0]}" if short else "") + "): the "
            "recommendation reads part of what was planned and may change once it finishes (python launch.py "
            "--resume RUN_DIR)")


def target_positions(config: dict) -> int | None:
    """The run's target's positions (max_position_embeddings) from config.yaml's target, read where that costs no
    download, conversion or weights (a synthetic shape, a local folder, the hub cache, an offline model converted
    before); None where it cannot be read so."""
    target = config.get("target") if isinstance(config.get("target"), dict) else {}
    model = str(target.get("model") or "")
    try:
        if model.startswith("synthetic:"):
            from utils.synthetic_models import build_config

            text = build_config(model)[1]
        else:
            from transformers import AutoConfig

            from utils.offline_models import OFFLINE_MODELS, cache_root
            where = cache_root() / model if model in OFFLINE_MODELS else Path(model).expanduser()
            gguf_file = target.get("gguf_file")
            if model.endswith(".gguf"):
                where, gguf_file = where.parent, where.name
            text = AutoConfig.from_pretrained(str(where) if where.exists() else model, gguf_file=gguf_file,
                                              revision=target.get("revision"), local_files_only=True)
        text = text.get_text_config() if hasattr(text, "get_text_config") else text
    except Exception:  # not readable here (not cached, not a model): nothing to check against
        return None
    positions = getattr(text, "max_position_embeddings", None)
    return positions if isinstance(positions, int) and not isinstance(positions, bool) else None


def check_contexts(contexts: list[int] | None, config: dict, samples: list[dict]) -> None:
    """A --context whose requests (that prompt and the run's new tokens) do not fit the target's positions:
    UserError."""
    positions = target_positions(config) if contexts else None
    if positions is None:
        return
    new = max((int(s.get("new_tokens") or 0) for s in samples), default=0)
    too_long = [c for c in contexts if c + new > positions]
    if too_long:
        raise UserError(f"--context {too_long[0]}: the target {config['target']['model']} has {positions} positions "
                        f"(its max_position_embeddings) and the run's requests generate up to {new} tokens; give a "
                        f"context of at most {positions - new}")


def off_everywhere(results: list[dict]) -> list[str]:
    """Where off is the choice at every load and context: why, with the closest candidate."""
    if not results or any(r["best"] != OFF for r in results):
        return []
    closest = max((c for r in results for c in r["candidates"] if c["candidate"] != OFF), key=lambda c: c["speedup"],
                  default=None)
    said = "off at every load and context asked: no candidate's predicted speedup is above the target alone's"
    if closest:
        interval = closest.get("speedup_ci95")
        said += f"; the closest, {closest['candidate']}, at {closest['speedup']:.2f}x" + (
            f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
    ties = [r["load"] + (f" ctx={r['context']}" if r["context"] else "") for r in results if r["tied_with"]]
    # a candidate tied with off is not shown slower: off is the choice on the tie, not a verdict that drafts lose
    return [said + (f"; at {', '.join(ties)} candidates tie with off (their intervals reach 1): off is chosen on the "
                    "tie, the drafts are not shown to lose there" if ties else
                    f"; none ties with off (each interval below 1, or without one more than {OFF_BY:.0%} below): the "
                    "drafts do not pay at these loads")]


def not_writable(out: Path) -> str | None:
    """Why `out` cannot be written (its folder missing or read-only, a folder in its place); None where it can."""
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        return "a folder"
    if not folder.is_dir():
        return f"no folder {folder}"
    if not os.access(out if out.exists() else folder, os.W_OK):
        return "not writable"
    return None


# ---- the command --------------------------------------------------------------------------------------------------

def _fmt(x, f="{:.2f}") -> str:
    return "-" if x is None else f.format(x)


def _interval(x, interval, f="{:.2f}") -> str:
    return _fmt(x, f) + (f" [{f.format(interval[0])}, {f.format(interval[1])}]" if interval else "")


def table(results: list[dict]) -> str:
    lines = ["| load | context | candidate | speedup [95% CI] | tok/s [95% CI] | latency [95% CI] | choice |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        for r in result["candidates"]:
            latency = (f"{_interval(r['latency_s'], r.get('latency_s_ci95'))} s/request"
                       if r.get("latency_s") is not None else
                       f"TTFT {_interval(r.get('ttft_p50_s'), r.get('ttft_p50_s_ci95'))} s, "
                       f"TPOT {_interval(r.get('tpot_mean_ms'), r.get('tpot_mean_ms_ci95'), '{:.0f}')} ms, "
                       f"E2E {_interval(r.get('e2e_p50_s'), r.get('e2e_p50_s_ci95'))} s")
            if r["candidate"] == result["best"]:
                choice = (f"tie with {', '.join(result['tied_with'])}" if result["tie"] else
                          f"best, {result['margin']:.3f}x {result['runner_up']}" if result["runner_up"] else "best")
            else:
                choice = ""
            what_if = (" (what-if)" if r.get("what_if") else "") + (" (derived)" if r.get("derived") else "")
            lines.append(f"| {result['load']} | {result['context'] or 'as measured'} | {r['candidate']}{what_if} | "
                         f"{_interval(r['speedup'], r.get('speedup_ci95'))} | "
                         f"{_interval(r.get('tok_s'), r.get('tok_s_ci95'), '{:.1f}')} | {latency} | {choice} |")
    return "\n".join(lines)


def settings_of(results: list[dict], config: dict) -> dict:
    """Each load's choice as each engine's settings. Where an engine has no equivalent of the choice, that engine
    gets the best candidate it runs ("off" included), said in a note."""
    drafts, options = deploy.drafts_of(config), config.get("speculative") or {}
    options = options if isinstance(options, dict) else {}

    def of(r: dict) -> dict:
        return deploy.settings(None if r["candidate"] == OFF else r["axes"], drafts, options)

    by_load = []
    for result in results:
        ranked = sorted(result["candidates"], key=lambda r: (-r["speedup"], r["candidate"] != OFF, r["candidate"]))
        best = next(r for r in ranked if r["candidate"] == result["best"])
        s = of(best)
        for engine, why in list(s["no_equivalent"].items()):
            for r in ranked:
                other = of(r) if r is not best else s
                if engine not in other["no_equivalent"]:
                    s[engine] = other[engine]
                    del s["no_equivalent"][engine]
                    s["notes"].append(f"{engine}: {best['candidate']} has no equivalent ({why}): the best it runs, "
                                      f"{r['candidate']} ({r['speedup']:.2f}x against {best['speedup']:.2f}x)")
                    break
        by_load.append((deploy.load_label(result), s))
    return deploy.emitted(by_load)


def exported(samples: list[dict], folder: Path) -> dict:
    """Each measured chain candidate's per-position acceptance in every target's form, written under
    folder/acceptance/."""
    cands, _, _, derived_keys = candidates(samples)
    out = {}
    (folder / "acceptance").mkdir(exist_ok=True)
    for key, points in cands.items():
        values = dict(key)
        if key in derived_keys:
            continue
        rows = [s for p, r in points.items() for s in r]
        if not values.get("gamma") or not chain(rows) or any(s.get("gamma") != values["gamma"] for s in rows):
            continue
        rates = acceptance_io.position_rates([r for s in rows for r in s.get("rounds") or []], values["gamma"])
        if rates is None:
            continue
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label_of(key))
        for target, form in acceptance_io.forms():
            name, data = f"{slug}.{form.suffix}", form.export(rates)
            if isinstance(data, str):
                (folder / "acceptance" / name).write_text(data + "\n")
            else:
                write_json(folder / "acceptance" / name, data)
            out.setdefault(label_of(key), {})[target] = str(folder / "acceptance" / name)
    return out


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as every bad input
        print(f"error: {message}; see python -m eval.recommend --help", file=sys.stderr)
        sys.exit(2)


def positive_floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers such as 1.5,3") from None
    if not all(math.isfinite(x) and x > 0 for x in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every rate is a finite number of requests a second above 0, "
                                         "e.g. 2.0")
    return values


def draft_prefill_lines(profile: Profile) -> dict:
    """Each draft model's prefill line from the profile (eval/costs.py prefill_line): what the recommended schedule
    prices a row's catch-up at, where a row that ran off would start drafting (decode/drafters/schedules.py)."""
    models = sorted({p["model"] for p in profile.prefills if p["model"] != TARGET})
    return {model: dict(zip(("intercept_s", "s_per_row_token"), profile.prefill_line(model))) for model in models}


def k_model_of(samples: list[dict], profile: Profile) -> dict:
    """recommend.json's "k_model" (decode/k_model.py KModel): the profile's steps at its own rows, widths and caches
    for the target and each draft model, each draft model's prefill line, and per draft the conditional acceptance
    b_1..b_K of its measured chain of the largest K (overall, and per category with at least MIN_BIN_ROUNDS rounds),
    with the median context of its rounds."""
    steps = {}
    for model in sorted({p["model"] for p in profile.steps}):
        points = [[r, w, kv, profile.step_s(model, r, w, kv)] for r in profile.rows_measured(model)
                  for w in profile.widths_measured(model) for kv in profile.caches()]
        steps[model] = [p for p in points if p[3] is not None]
    cands, _, _, derived_keys = candidates(samples)
    acceptance = {}
    for key, points in sorted(cands.items(), key=lambda kv: dict(kv[0]).get("gamma") or 0):  # the largest K last
        values, rows = dict(key), [s for r in points.values() for s in r]
        if key in derived_keys or not REGISTRY[values["method"]].needs_draft or values.get("tree") is not None \
                or not values.get("gamma") or not chain(rows):
            continue
        groups: dict = defaultdict(list)
        for s in rows:
            groups[s.get("group")].extend(s.get("rounds") or [])
        rates = acceptance_io.position_rates([r for s in rows for r in s.get("rounds") or []], values["gamma"])
        contexts = sorted(c for s in rows for c in round_contexts(s))
        if rates is None or not contexts:
            continue
        acceptance[values["draft"]] = {
            "rates": conditional(rates), "context": contexts[len(contexts) // 2],
            "by_category": {g: conditional(acceptance_io.position_rates(rounds, values["gamma"]))
                            for g, rounds in groups.items() if g is not None and len(rounds) >= MIN_BIN_ROUNDS}}
    return {"steps": steps, "draft_prefill": draft_prefill_lines(profile), "acceptance": acceptance, "tie": TIE}


def model_choices(results: list[dict], model: dict, profile: Profile, new_tokens: int) -> None:
    """Each batch or concurrency load's K by the one model (decode/k_model.py, as the recommended schedule decides a
    round), per draft with acceptance: at the load's rows and its context (as measured: the median of the draft's
    rounds'), each K's round priced as the replay prices it, a concurrency's with its requests' draft prefills (each
    a prompt of that context, new_tokens long: k_model.admissions); None where the profile prices no K there."""
    for result in results:
        kind, _, value = result["load"].partition("=")
        if kind not in ("batch", "conc"):
            continue
        result["model_k"] = {}
        for draft, accepted in model["acceptance"].items():
            context = result["context"] or accepted["context"]
            try:
                k = priced_k(Pricer(profile, draft), accepted["rates"], int(value), context,
                             range(len(accepted["rates"]) + 1), (context, new_tokens) if kind == "conc" else None)
            except ValueError:
                k = None
            result["model_k"][draft] = k


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m eval.recommend", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?", help="a report folder of our engine's run")
    parser.add_argument("--costs", type=Path, help="a cost profile (python -m runner.profile); default: the run's")
    parser.add_argument("--batch", type=positive_ints, help="static batch sizes, e.g. 1,4")
    parser.add_argument("--concurrency", type=positive_ints, help="concurrencies, e.g. 1,2,4")
    parser.add_argument("--rate", type=positive_floats, help="request rates the run measured, e.g. 2.0")
    parser.add_argument("--context", type=positive_ints, help="context lengths in tokens, e.g. 512,4096")
    parser.add_argument("--acceptance", type=Path, help=f"{acceptance_io.json_forms()} instead of a run's rounds "
                        "(needs --costs)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="with --acceptance: each request's prompt")
    parser.add_argument("--new-tokens", type=int, default=128, help="with --acceptance: each request's new tokens")
    parser.add_argument("--out", type=Path, help="where to write it (default RUN_DIR/recommend.json)")
    args = parser.parse_args(argv)
    loads = ([("batch", b) for b in args.batch or []] + [("concurrency", c) for c in args.concurrency or []]
             + [("rate", r) for r in args.rate or []])
    said_first: list[str] = []
    warnings: list[str] = []
    try:
        if args.acceptance is not None and args.run_dir is not None:
            # the acceptance replaces the run's rounds: RUN_DIR would be read for nothing, its target unchecked
            raise UserError(f"{args.run_dir} and --acceptance {args.acceptance}: give one (RUN_DIR predicts from the "
                            "run's rounds, --acceptance FILE --costs PROFILE.json from the file's rates)")
        if args.acceptance is not None:
            if args.costs is None:
                raise UserError("--acceptance needs --costs PROFILE.json: the acceptance says how many tokens a round "
                                "accepts, the profile what each step costs")
            if args.prompt_tokens < 1 or args.new_tokens < 2:
                raise UserError("--prompt-tokens is at least 1 and --new-tokens at least 2")
            if any(kind == "rate" for kind, _ in loads):
                raise UserError("--rate needs a run's measured arrivals: with --acceptance give --batch or --concurrency")
            rates, _ = acceptance_io.read(args.acceptance)
            profile = Profile.load(args.costs)
            said_first += unnamed_target(profile.meta, args.costs, None)
            loads = loads or [("batch", 1)]
            samples = imported_samples(rates, profile, args.prompt_tokens, args.new_tokens, loads)
            config, folder = {}, None
        else:
            folder = args.run_dir
            if folder is None or not (folder / "samples.jsonl").exists():
                raise UserError(f"{folder or 'no RUN_DIR'} has no samples.jsonl: give a report folder of a run (or "
                                "--acceptance FILE --costs PROFILE.json)")
            progress, config = read_progress(folder), read_config(folder)
            profile = Profile.load(args.costs) if args.costs else run_profile(folder, progress)
            if args.costs:
                run_meta = run_costs({}, read_env(folder), config).meta
                check_target(profile.meta, run_meta, args.costs)
                said_first += unnamed_target(profile.meta, args.costs, run_meta.get("target_model"))
                said_first += differences(profile.meta, run_meta) + against_own_probes(profile, folder, progress)
            samples = read_jsonl(folder / "samples.jsonl")
            check_records(samples, folder / "samples.jsonl")
            warnings = [w for w in [incomplete(progress, samples)] if w]
            loads = loads or default_loads(samples)
            loads = check_loads(samples, loads)
            check_contexts(args.context, config, samples)
        if not profile.steps:
            raise UserError(f"{args.costs or folder} has no steps: give --costs PROFILE.json (python -m runner.profile)")
        if not any(p["model"] == TARGET for p in profile.prefills):
            # older folders (their probes timed the steps only): as eval.predict says of them, once instead of per row
            raise UserError(f"{args.costs or folder}: the profile lacks the target's prefill (no prefill profiled): "
                            "give --costs PROFILE.json of a profile with it (python -m runner.profile --config "
                            f"{folder / 'config.yaml' if folder is not None else 'CONFIG.yaml'})")
        results, notes = recommend(samples, profile, loads, args.context)
        k_model = k_model_of(samples, profile)
        model_choices(results, k_model, profile, max((int(s.get("new_tokens") or 0) for s in samples), default=1))
        categories = by_category(samples, profile, loads, args.context)
        notes = said_first + context_notes(profile, args.context) + notes + off_everywhere(results)
    except UserError as error:  # ProfileError and AcceptanceError too
        print(f"error: {error}", file=sys.stderr)
        return 2
    emitted = settings_of(results, config)
    out = args.out or (folder / "recommend.json" if folder is not None else Path("recommend.json"))
    unwritable = not_writable(out)
    if unwritable:  # said before RUN_DIR/acceptance/ is written, not after
        print(f"error: cannot write {out} ({unwritable}); give a writable --out FILE", file=sys.stderr)
        return 2
    try:
        acceptance = exported(samples, folder) if folder is not None else {}
    except OSError as error:
        print(f"error: cannot write {folder / 'acceptance'} ({error.strerror or error}); make the run folder "
              "writable", file=sys.stderr)
        return 2
    said = list(dict.fromkeys(notes + [n for r in results for n in r["notes"]]))
    per_batch = deploy.per_batch_size(results, emitted)
    print("\n".join([f"warning: {w}" for w in warnings] + [table(results)] + (["", "by category:", category_table(categories)] if categories else [])
                    + ["", "settings, ready to paste:", *deploy.lines(emitted)]
                    + deploy.per_batch_lines(per_batch)
                    + ([""] + [f"- {n}" for n in said] if said else [])))
    return written(out, {"costs": str(args.costs) if args.costs else "the run's probes",
                         "acceptance": str(args.acceptance) if args.acceptance else None, "warnings": warnings,
                         "profile_meta": profile.meta, "loads": results, "settings": emitted,
                         "per_batch_size": per_batch,
                         "draft_prefill": draft_prefill_lines(profile), "k_model": k_model,
                         "exported_acceptance": acceptance, "notes": notes,
                         **({"by_category": categories} if categories else {})})


if __name__ == "__main__":
    sys.exit(main())
