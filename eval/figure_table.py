"""The report's figures, declared once: this table is the only place that lists them, as eval/axes.py AXES is for the
axes.

A figure is a named value of a run's metrics (summary.json) with what the report says of it: its legend text, the
columns of the fixed-batch table (summary.md, the terminal's headline columns) and of the serving table, its fields of
summary.csv and serving.csv, and under load its fields of each group's row. Each column and CSV field carries its
place among its table's columns (`at`): the tables' orders are not the legend's. A figure that is computed declares
how: `static` for a fixed-batch point, `served` for a load point (often the same function: a load point is a batch
whose rows arrive, and what differs is how its records pair with the baseline's, Inputs.pairing), when it applies
(from the method's MethodSpec and its engine's EngineCaps), and what it gives (`gives`: one computation may give
several figures, each with its own legend entry or named in one's text, `also`). run_metrics and serving_metrics are
the loop over these computations in the table's order, each reading the figures before it; a computation that gives
a figure its entry does not declare is refused, and tests/eval/test_figure_table.py finds a legend entry nothing
computes and a computed figure no legend describes.

Everything that lists figures derives from FIGURES: the legend (summary.json, legend()), the report's columns and CSVs
(eval/report.py), the figures run_metrics and serving_metrics compute and a load point's group rows. A new figure
computed from what the records already hold is one entry (register(), or a line here) with its computation:
tests/eval/test_figure_table.py registers a toy figure declared in one file (tests/eval/toy_figure.py) and finds it in
every output. A figure that needs a new measurement also takes the code that measures it (our engine's runner/ and
decode/, each other engine's worker) and its field in the records (eval/records.py); a plotted one a plot in
eval/report.py, whose plots are listed there, not read from this table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from decode.methods import ENGINE_TEXTS, REGISTRY, caps_of
from eval.energy import FIGURES as ENERGY_FIGURES, energy_per_token, served_energy_per_token
from eval.figures import (accuracy, batch_costs, draft_time_share, latency, new_tokens, outputs_match, prefill_share,
                          reference_accepted_tokens, round_figures, sample_count, speedups, synthetic, throughputs,
                          time_per_output_token, time_to_first_token, tokens_per_target_call)
from eval.served_figures import (REQUESTS, e2e_figures, itl_figures, max_in_flight_figures, occupancy_costs,
                                 occupancy_figures, queue_figures, rate_figures, served_acceptance, served_pairs,
                                 served_replay, tpot_figures, ttft_figures)
from eval.totals import BATCHES, Pairing
from eval.flags import (COST_SPREAD_LIMIT, DRIFT_LIMIT, FLIP_REACH, HOST_BOUND_BUSY, HOST_BOUND_EXCESS,
                        HOST_BOUND_MIN_C, NUMERICS_DRIFT)
from eval.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, MIN_PROMPTS

STATIC, SERVED = "static", "served"  # a fixed-batch point, a load point (config load:)
LOAD = " (load)"  # a legend entry of a load point's figure whose fixed-batch one has the plain name


@dataclass(frozen=True)
class Format:
    """How a cell shows its value beyond the column's format: what a figure with an interval or in other units
    declares once, for every table that shows it."""
    scale: float = 1.0  # the value times this (seconds shown in milliseconds: 1000)
    interval: str | None = None  # the format of each end of its 95% interval (metric path + "_ci95"), shown after
    #   the value as "[lo, hi]"; None: it has none
    count: bool = False  # with no interval where the run is flagged few_samples: "(n=k)", the pairs behind it
    flagged: bool = False  # " !" where the run has any flag (the measured speedup: the notes say why)

    def shown(self, value):
        """The value in the units the cell shows."""
        return value if self.scale == 1 else value * self.scale


PLAIN = Format()
MS = Format(scale=1000)  # seconds, shown in milliseconds
CI = Format(interval="{:.2f}")  # a value with its interval
RATIO = Format(interval="{:.2f}", count=True)  # a paired ratio: its interval, or how few pairs it rests on
MEASURED = Format(interval="{:.2f}", count=True, flagged=True)  # the measured speedup, which the flags are about


@dataclass(frozen=True)
class Column:
    header: str  # its header in the table
    paths: tuple[str, ...]  # the metric paths ("latency_s.p50") its cell shows; several share a cell, "a / b"
    fmt: str  # the format of each value
    at: float = math.inf  # its place among its table's columns (default: after every other)
    terminal: bool = False  # also one of the terminal's headline columns
    only_with: str | None = None  # shown only in a table where a run has this key ("tree": a tree point)
    kind: Format = PLAIN  # how its cells show the value (units, interval, flags)


@dataclass(frozen=True)
class Inputs:
    """What a figure's computation may read: the point, its records and its baseline's (None: none ran), how they
    pair (eval/totals.py BATCHES at a fixed batch, eval/served_figures.py REQUESTS at a load point), the figures
    computed before it, and what the run measured besides: at a fixed batch its cost probe and cost profile, at a load point
    its probes by batch size, its profile and the config's SLO."""
    point: object  # eval.records Point
    samples: list
    baseline: list | None
    metrics: dict
    pairing: Pairing = BATCHES
    costs: object = None  # eval.records CostProbe at the point's batch size (fixed batches)
    profile: object = None  # eval.costs' cost profile of the run (None: a group's figures, or none)
    probes: dict | None = None  # batch size -> CostProbe (load points)
    slo: dict | None = None  # config load.slo (load points)


def _always(spec, caps) -> bool:
    return True


def _has_rounds(spec, caps) -> bool:
    return spec.has_rounds


@dataclass(frozen=True)
class Figure:
    name: str  # its key in the legend (and, where it computes one, in a run's metrics)
    legend: str | None = None  # the legend's text; None: no legend entry (a column of another figure's entry)
    served_only: bool = False  # its legend entry is a serving run's only (a figure of load points)
    columns: tuple[Column, ...] = ()  # its columns of the fixed-batch table (summary.md; terminal ones in the terminal)
    served_columns: tuple[Column, ...] = ()  # its columns of the serving table
    csv: tuple[str, ...] = ()  # summary.csv fields besides its columns' paths, after every column's
    served_csv: tuple[tuple[str, float], ...] = ()  # serving.csv fields, each (metric path, its place)
    per_group: tuple[tuple[str, str], ...] = ()  # under load, its fields of each group's row (by_group), each (field,
    #   the metric path it shows): a group's requests get every figure a load point does, its row these
    group_columns: tuple[Column, ...] = ()  # its columns of the per-group table under load (paths: per_group fields)
    static: Callable | None = None  # (Inputs) -> {metric: value} at a fixed-batch point; None: another entry's
    #   computation gives it, or it has no fixed-batch form
    served: Callable | None = None  # (Inputs) -> {metric: value} at a load point; None: likewise
    applies: Callable = _always  # (MethodSpec, EngineCaps) -> whether the point's method and engine have it
    gives: tuple[str, ...] = ()  # the metrics its computations return, both forms (computed() holds them to it);
    #   () with a computation: its own metric
    also: tuple[str, ...] = ()  # the further metrics its legend text describes, each named in it
    outside: str | None = None  # an entry that is no metric of a point: where it is (a run's own key, a summary's)
    measured_only: bool = False  # a figure some machines cannot measure (a device counter): its legend entry and CSV
    #   fields only in a summary some run of which has it, so that a folder that never measured it reports as before

    @property
    def metric(self) -> str:
        """Its metric's key: "ttft_s (load)" is a load point's ttft_s."""
        return self.name.removesuffix(LOAD)

    @property
    def given(self) -> tuple[str, ...]:
        if self.static is None and self.served is None:
            return ()
        return self.gives or (self.metric,)


def register(figure: Figure) -> Figure:
    """A figure added to the table (after the others): every output lists it from then on."""
    if any(f.name == figure.name for f in FIGURES):
        raise ValueError(f"figure {figure.name!r} is already in the table")
    FIGURES.append(figure)
    return figure


def legend(served: bool = False, measured: set | None = None) -> dict[str, str]:
    """The legend of a summary: every figure's text, those of load points too where it has a serving section;
    measured: the metrics some run of it has (None: all), without which a measured_only figure has no entry."""
    return {f.name: f.legend for f in FIGURES if f.legend is not None and (served or not f.served_only)
            and _shown(f, measured)}


def _shown(figure: Figure, measured: set | None) -> bool:
    return not figure.measured_only or measured is None or figure.metric in measured


def measured_in(runs: list[dict]) -> set:
    """The metrics some of these summary runs have (not null)."""
    return {k for run in runs for k, v in (run.get("metrics") or {}).items() if v is not None}


def columns(served: bool = False) -> list[Column]:
    """The columns of the fixed-batch table (served: of the serving table), in their places."""
    found = [c for f in FIGURES for c in (f.served_columns if served else f.columns)]
    return sorted(found, key=lambda c: c.at)


def column_of(path: str, served: bool = False) -> Column:
    """The column that shows a metric path (served: of the serving table)."""
    return next(c for c in columns(served) if c.paths[0] == path)


def group_columns() -> list[Column]:
    """The columns of the per-group table under load, in their places."""
    return sorted((c for f in FIGURES for c in f.group_columns), key=lambda c: c.at)


def csv_fields(measured: set | None = None) -> list[str]:
    """summary.csv's metric paths: every column's, then the figures' own fields (measured: as legend())."""
    hidden = {path for f in FIGURES if not _shown(f, measured) for path in
              [c.paths[0] for c in f.columns] + list(f.csv)}
    return [p for p in [c.paths[0] for c in columns()] + [field for f in FIGURES for field in f.csv] if p not in hidden]


def served_csv_fields(measured: set | None = None) -> list[str]:
    """serving.csv's metric paths, in their places (measured: as legend())."""
    return [path for path, _ in sorted((pair for f in FIGURES if _shown(f, measured) for pair in f.served_csv),
                                       key=lambda pair: pair[1])]


def computed(form: str, inputs: Inputs) -> dict:
    """The figures of a point: each entry's computation of this form (STATIC, SERVED) where it applies to the point's
    method and engine, in the table's order, each reading the figures computed before it."""
    point = inputs.point
    spec, caps = REGISTRY[point.method], caps_of(point.method)
    out: dict = {}
    for figure in FIGURES:
        compute = figure.static if form == STATIC else figure.served
        if compute is not None and figure.applies(spec, caps):
            found = compute(replace(inputs, metrics=dict(out)))
            undeclared = set(found) - set(figure.given)
            if undeclared:  # a figure the legend checks (described(), computed_metrics()) would not see
                raise ValueError(f"figure table: {figure.name}'s computation gives {sorted(undeclared)}, which its entry "
                                 "does not declare (gives)")
            out.update(found)
    return out


def requests_figure(figures: Callable) -> Callable:
    """A figure of a load point's requests alone (eval/served_figures.py REQUEST_FIGURES: (requests, SLO) -> figures)
    as the table computes it."""
    def compute(inputs):
        return figures(inputs.samples, inputs.slo)

    compute.__name__ = figures.__name__
    return compute


def computed_metrics(form: str) -> set[str]:
    """The metrics the table's computations of this form give."""
    return {name for f in FIGURES if (f.static if form == STATIC else f.served) is not None for name in f.given}


def described() -> set[str]:
    """The metrics a legend entry describes: its own, and those its text names (also)."""
    return {name for f in FIGURES if f.legend is not None
            for name in ((f.metric,) if f.outside is None else ()) + f.also}


def uncomputed() -> list[str]:
    """Legend entries of a metric that no computation of their form gives (a load point's: served_only)."""
    return [f.name for f in FIGURES if f.legend is not None and f.outside is None
            and f.metric not in computed_metrics(SERVED if f.served_only else STATIC)]


def undescribed() -> list[str]:
    """Computed metrics with no legend: no entry's own, none its text names."""
    return sorted((computed_metrics(STATIC) | computed_metrics(SERVED)) - described())


def run_metrics(point, samples: list[dict], baseline: list[dict] | None, costs, profile=None) -> dict:
    """Every figure of one run (a point, overall or one group) against its baseline's samples (None: none ran)."""
    return computed(STATIC, Inputs(point, samples, baseline, {}, costs=costs, profile=profile))


def serving_metrics(point, samples: list[dict], baseline: list[dict] | None, probes: dict, slo: dict | None,
                    profile=None) -> dict:
    """Every figure of one serving point against the baseline of its load point (None: none ran). Both with their
    slots (eval/served_figures.py with_slots)."""
    return computed(SERVED, Inputs(point, samples, baseline, {}, REQUESTS, profile=profile, probes=probes, slo=slo))


def group_metrics(point, samples: list[dict], baseline: list[dict]) -> dict:
    """A group of a load point's requests against the baseline's same requests: the fields the table gives per group
    (Figure.per_group), computed as the load point's figures are, with no probe, profile or SLO (the group's
    requests share the load point's schedule, its occupancy and its span); a figure that does not apply to the
    method (acceptance: rounds only) is left out."""
    metrics = serving_metrics(point, samples, baseline, {}, None)
    out = {}
    for field, path in (pair for f in FIGURES for pair in f.per_group):
        head, *rest = path.split(".")
        if head in metrics:
            value = metrics[head]
            for part in rest:
                value = (value or {}).get(part)
            out[field] = value
    return out


FIGURES: list[Figure] = [
    Figure("label", columns=(Column("point", ("label",), "{}", 0, terminal=True),), served_columns=(Column("point", ("line",), "{}", 0, terminal=True),)),
    Figure("status", legend="ok: every planned batch measured; partial: fewer batches than planned (a failure or an interruption): "
                            "marked 'partial done/planned' in the tables and hollow in the plots, its ratios pair only the batches "
                            "it has, and it takes no part in best; failed / skipped: not measured (the error says why)",
           columns=(Column("status", ("status",), "{}", 10, terminal=True),),
           served_columns=(Column("status", ("status",), "{}", 10),),
           outside="a run's own key"),
    Figure("batches", legend="a batch is one (repeat, batch_index) of a point; done: measured, paired: also measured by the "
                             "baseline (every ratio uses only these), planned: what the sweep planned (every repeat), prompts: the "
                             "distinct prompt batches paired (what an interval rests on; a conversation's turns, with their batches, count "
                             "once), cross_process: paired batches whose "
                             "baseline another process measured (a resumed run, a restarted worker), blocks_apart (where "
                             "any): paired batches measured in server blocks that were not back to back, and the median "
                             "minutes between them",
           outside="a run's own key"),
    Figure("samples", legend="sequences measured (rows of samples.jsonl)",
           static=sample_count),
    Figure("new_tokens", legend="N: generated tokens up to and including EOS, no prompt, no padding; counted alike for every method",
           static=new_tokens),
    Figure("throughput_tok_s", static=throughputs,
           gives=("throughput_tok_s", "throughput_tok_s_repeats", "throughput_tok_s_std"),
           also=("throughput_tok_s_repeats", "throughput_tok_s_std"), legend="sum(N) / sum(batch wall times), a batch's wall time being its slowest row's latency; "
                                      "throughput_tok_s_repeats: the same per repeat, throughput_tok_s_std their standard deviation",
           columns=(Column("tok/s", ("throughput_tok_s",), "{:.2f}", 20, terminal=True),)),
    Figure("speedup", legend="throughput(point) / throughput(baseline) over the batches both finished: same prompts, batch size, "
                             "temperature and run (the ratio of total tokens over total wall, not a mean of ratios)",
           columns=(Column("speedup [95% CI]", ("speedup",), "{:.2f}", 30, terminal=True, kind=MEASURED),),
           gives=("speedup", "speedup_ci95", "decode_speedup", "decode_speedup_ci95", "speedup_tput",
                  "speedup_tput_ci95", "speedup_tpot", "speedup_tpot_ci95"),
           static=speedups, served=speedups),
    Figure("speedup_ci95", legend=f"95% paired bootstrap CI over prompts: resample the prompt batches with replacement (the batches "
                                  f"holding one conversation's turns together, dataset.turns: they are not independent), each carrying "
                                  f"all its repeats of the point and of the baseline (tokens and wall, measured back to back), "
                                  f"recompute the ratio of totals ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}: a rebuild "
                                  "gives the same numbers) and take the expanded percentile interval (Hesterberg 2015: the tails cut "
                                  "at Phi(-sqrt(n/(n-1)) t_(0.975, n-1)) instead of 2.5%, since the plain percentile interval covers "
                                  "only ~85% of the time at 5 prompts and ~90% at 10). It covers how the ratio varies from prompt to "
                                  "prompt, the question being 'on prompts like these'; repeats average each prompt's timing noise and "
                                  f"do not narrow it by sqrt(repeats). Fewer than {MIN_PROMPTS} prompt batches: null and flagged "
                                  "few_samples. Tables print 'speedup [lo, hi]' (or 'speedup (n=k)' with no interval), plots draw "
                                  "error bars",
           csv=("speedup_ci95",)),
    Figure("decode_speedup", legend="the same over decode throughput = sum(N - 1) / sum(batch wall - target prefill - draft prefill), "
                                    "the part speculation can speed up; decode_speedup_ci95 likewise; null for methods timed per "
                                    "batch only (no prefill time). hybrid prefills its draft model in the first round that drafts "
                                    "with it, if any: that prefill is decode time here",
           columns=(Column("dec speedup [95% CI]", ("decode_speedup",), "{:.2f}", 40, kind=RATIO),),
           csv=("decode_speedup_ci95",),
           also=("decode_speedup_ci95",)),
    Figure("latency_s", legend="per sequence: wall time from its batch's start to its last token, device synchronised; mean, p50, "
                               "p90, p99",
           columns=(Column("lat p50 s", ("latency_s.p50",), "{:.3f}", 180, terminal=True),
                    Column("lat p90 s", ("latency_s.p90",), "{:.3f}", 190),),
           static=latency),
    Figure("tpot_s", legend="time per output token: latency / N per sequence", columns=(Column('TPOT ms', ('tpot_s.mean',), '{:.1f}', 220, kind=MS),),
           static=time_per_output_token),
    Figure("energy_j_per_token", legend="our engine, where the device has an energy counter (NVML's on a CUDA GPU, RAPL on a CPU "
                                        "where the kernel lets it be read; runner/energy.py): the device's joules read around "
                                        "each timed batch (a load point: over its span, per repeat) / its new tokens, summed "
                                        "over batches: sum(J) / sum(N); energy_j_per_token_ci95: its 95% bootstrap interval over "
                                        "prompt batches, each with all its repeats (a batch is the least the counter reads; "
                                        f"fewer than {MIN_PROMPTS}: null), none at a load point (its requests share one "
                                        "reading); energy_ratio: J/token of the point / the baseline's over the batches (a load "
                                        "point: the repeats) both finished, energy_ratio_ci95 its paired interval as "
                                        "speedup_ci95 (none at a load point). The counter is the whole device's (its idle "
                                        "power and any other process's work count) and NVML's updates only every few "
                                        "milliseconds: read it over batches, not steps. Null where not measured (no counter, "
                                        "another engine, records written before it was read); the notes say why",
           columns=(Column("J/tok [95% CI]", ("energy_j_per_token",), "{:.4f}", 250, only_with="energy_j_per_token",
                           kind=Format(interval="{:.4f}")),
                    Column("energy ratio [95% CI]", ("energy_ratio",), "{:.2f}", 251, only_with="energy_j_per_token",
                           kind=RATIO),),
           served_columns=(Column("J/tok", ("energy_j_per_token",), "{:.4f}", 220, only_with="energy_j_per_token"),
                           Column("energy ratio", ("energy_ratio",), "{:.2f}", 221, only_with="energy_j_per_token"),),
           csv=("energy_j_per_token_ci95", "energy_ratio_ci95"),
           served_csv=(("energy_j_per_token", 520), ("energy_ratio", 530)),
           static=energy_per_token, served=served_energy_per_token, gives=ENERGY_FIGURES, measured_only=True,
           also=("energy_j_per_token_ci95", "energy_ratio", "energy_ratio_ci95")),
    Figure("ttft_s", legend="time to first token: the prefill", columns=(Column('TTFT s', ('ttft_s.mean',), '{:.3f}', 200),),
           static=time_to_first_token),
    Figure("prefill_share", legend="(target prefill + draft prefill) / latency, summed over samples: the part speculation cannot "
                                   "speed up",
           columns=(Column("prefill %", ("prefill_share",), "{:.0%}", 210),),
           static=prefill_share),
    Figure("draft_time_share", legend="time spent drafting / latency, summed over samples",
           static=draft_time_share, applies=_has_rounds),
    Figure("block_efficiency", legend="tau = N / target forwards, the prefill forward and its token included: mean tokens per "
                                      "target call (baseline 1.0)",
           columns=(Column("tau", ("block_efficiency",), "{:.3f}", 70, terminal=True),),
           static=tokens_per_target_call),
    Figure("mean_accepted_tokens", legend="MAT = sum(emitted e_r) / rounds R, the correction or bonus token included: what vLLM and "
                                          "SGLang call acceptance length, Spec-Bench's #MAT (baseline 1.0); for a tree the same: its "
                                          "accepted path length plus one, per round",
           columns=(Column("MAT", ("mean_accepted_tokens",), "{:.3f}", 80),),
           static=reference_accepted_tokens),
    Figure("tree", legend="the shape of a round's draft (config speculative.tree): null, a chain of gamma; '3-2-1-1', a static tree "
                          "with 3 children at the root, 2 under each of those, ...; 'dynamic-N', EAGLE-2's dynamic tree keeping the "
                          "best N nodes; 'auto', the shape the tree policy picks. A tree's round verifies all its nodes in one target "
                          "forward and accepts one path from the root. The tables show the tree and nodes/rd columns where a point "
                          "has a tree",
           outside="an axis: a run's own key"),
    Figure("rounds", legend="R: speculation rounds (target verification forwards after the prefill), all sequences",
           gives=("rounds", "acceptance_rate", "mean_accepted_tokens", "alpha", "per_position_acceptance",
                  "accepted_histogram", "drafted_per_round", "max_drafted", "zero_draft_rounds",
                  "constant_draft_length", "acceptance_by_depth_rank", "acceptance_by_source", "acceptance_pooled",
                  "acceptance_per_request", "mean_accepted_tokens_pooled", "mean_accepted_tokens_per_request",
                  "alpha_rounds"),
           static=round_figures, served=served_acceptance, applies=_has_rounds),
    Figure("acceptance_rate", legend="sum(accepted a_r) / sum(drafted gamma_r) over all rounds of all sequences; rounds that "
                                     "drafted nothing add nothing; null when no round drafted a token. For a tree: accepted path "
                                     "length / nodes verified (besides the root), which falls as the tree widens whatever its "
                                     "accepted path: compare trees by MAT and acceptance_by_depth_rank",
           columns=(Column("accept", ("acceptance_rate",), "{:.3f}", 60, terminal=True),)),
    Figure("acceptance_by_source", legend="hybrid: per draft source (lookup, suffix, draft), its accepted tokens / the tokens it "
                                          "drafted, pooled over every round of every sequence in which it drafted (a token counts "
                                          "as accepted when it lies on the round's accepted path); drafted, accepted and rounds "
                                          "beside it; every source the method offers is listed, one never chosen with 0 rounds "
                                          "(acceptance null); fixed batches and under load alike"),
    Figure("acceptance_by_depth_rank", legend="p(d, r) = hits / trials per depth d (1: the root's children) and sibling rank r (0: "
                                              "the drafter's first choice at its parent): hits = rounds whose accepted path's node at "
                                              "depth d has rank r, trials = rounds that reached depth d (accepted the path to d - 1) "
                                              "with more than r children there. Unconditional on the siblings before r: the chance "
                                              "that the rank-r child is the one accepted once its parent is (Sequoia's positional "
                                              "acceptance). A chain has rank 0 only and p(d, 0) = P(draft d accepted | drafts 1..d-1 "
                                              "accepted). In summary.json a list per depth: {depth, p, hits, trials}, each list by "
                                              "rank; the report prints 'd1: r0 p (trials), r1 ...' per tree point"),
    Figure("per_position_acceptance", legend="P(draft i accepted) = rounds with a_r >= i / rounds that drafted at least i; "
                                             "unconditional (not given that draft i-1 was accepted). With a constant draft length "
                                             "and no round cut by max_new_tokens it is count_i / rounds. For a tree, i is a depth: "
                                             "rounds whose accepted path reached depth i / rounds whose tree did"),
    Figure("accepted_histogram", legend="rounds with a_r = 0, 1, ..., gamma, over the rounds that drafted at least one token"),
    Figure("constant_draft_length", legend="true when the rounds drafted gamma: every round, but for rounds cut by the max_new_tokens "
                                           "budget (the engine drafts at most max_new_tokens - generated - 1), and at least one round "
                                           "drafted the full gamma: then Leviathan's model at gamma applies; null for a tree"),
    Figure("drafted_per_round", legend="mean drafted tokens per round (a tree: nodes verified besides the root, the tables' nodes/rd); "
                                       "zero_draft_rounds: share of rounds that drafted nothing (a plain target step)",
           columns=(Column("nodes/rd", ("drafted_per_round",), "{:.2f}", 50, only_with="tree"),),
           also=("zero_draft_rounds",)),
    Figure("alpha", legend="Leviathan's alpha from the rounds, for every schedule: the alpha with sum_r E[a_r | gamma_r, alpha] = "
                           "sum_r a_r over the rounds that drafted, E[a | g, alpha] = alpha (1 - alpha^g) / (1 - alpha); every draft "
                           "accepted gives 1, none 0; null when no round drafted a token. Not solved from tau, which counts the "
                           "prefill's forward and token and so reads low for short outputs. Null for a tree: Leviathan's model is "
                           "of a chain (acceptance_by_depth_rank describes a tree); a chain point some of whose rounds were trees "
                           "(hybrid's merged trees) solves it from its chain rounds only",
           columns=(Column("alpha", ("alpha",), "{:.3f}", 90, kind=Format(interval="{:.3f}")),)),
    Figure("draft_cost_ratio_c", legend="one draft step / one baseline step, each timed as the run executes it (a draft step: its "
                                        "1-token forward and its token's choice; a baseline step: the target's 1-token forward, its "
                                        "token's choice, greedy its top-2 gap, and the host read), medians of interleaved repetitions "
                                        "measured in the run at this batch size, on the first batch's prompts cut or grown to the "
                                        "cache of the comparison's median prompt + max_new_tokens / 2 tokens; where its prompts "
                                        "differ widely in length, also at each length bin's (bins spanning a factor of 2, at most "
                                        "4), and each run, overall and per group, reads the one nearest its rows' mean cache "
                                        "(prompt + half the new tokens): cost_context gives both, and a note names the runs whose "
                                        "probe was timed more than 2x from it",
           columns=(Column("c", ("draft_cost_ratio_c",), "{:.3f}", 100),),
           gives=("draft_cost_ratio_c", "verify_cost_ratio_v", "draft_cost_ratio_c_run", "verify_cost_ratio_v_run",
                  "weight_bytes_ratio", "draft_busy_share", "target_busy_share", "predicted_speedup",
                  "predicted_speedup_v1", "efficiency", "decode_efficiency", "predicted_speedup_replay",
                  "predicted_speedup_replay_ci95", "predicted_decode_speedup_replay", "replay_efficiency",
                  "replay_decode_efficiency", "replay", "replay_missing", "prediction_off", "verify_cost_by_nodes",
                  "cost_rows", "cost_batch_sizes"),
           static=batch_costs, served=occupancy_costs),
    Figure("verify_cost_ratio_v", legend="one chain verification of gamma+1 tokens (the target forward, the acceptance, the host read, "
                                         "the rollback) / one baseline step, measured likewise; for a tree of n nodes besides its "
                                         "root, v(n): one (n+1)-token target forward through the tree mask (null for auto, whose n "
                                         "varies)",
           columns=(Column("v", ("verify_cost_ratio_v",), "{:.3f}", 120),)),
    Figure("draft_cost_ratio_c_run", legend="c as the run's records time it: the draft's time per draft forward after its prefill / "
                                            "the baseline's decode time per step, over the batches both finished (chains with a "
                                            "draft model, our engine); verify_cost_ratio_v_run: the target's time per round after "
                                            "the prefill / the same step. Beside c and v they say whether a decode efficiency off 1 "
                                            "comes from the probed costs (c, v unlike c_run, v_run) or from the tokens per round",
           also=("verify_cost_ratio_v_run",)),
    Figure("verify_cost_by_nodes", legend="tree points: v(n) at every node count n measured at the point's batch size (the "
                                          "verification of n nodes is an (n+1)-token forward; the run probes the n of each tree it "
                                          "sweeps, and 1, 2, 3, 4, 6, 8, 12, 16, 24, 32 for auto); the prediction interpolates "
                                          "linearly between them (v(0) = 1) and has none beyond the largest. The report's 'Costs of "
                                          "the trees' prints it per batch size"),
    Figure("weight_bytes_ratio", legend="the draft's weight bytes / the target's, as loaded (the tensors each model holds: "
                                        "parameters, buffers, oneDNN-packed or bitsandbytes-quantized weights, a tied embedding "
                                        "once): what c comes near where decoding is memory bound; the tables' 'bytes' column, "
                                        "beside c",
           columns=(Column("bytes", ("weight_bytes_ratio",), "{:.3f}", 110),)),
    Figure("draft_busy_share", legend="CUDA only: the GPU's busy time (its kernels' time, from the profiler) in the draft's 1-token "
                                      "forward / that forward's wall time; target_busy_share: the same for the target's; null on a "
                                      "CPU",
           also=("target_busy_share",)),
    Figure("predicted_speedup", legend="(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + v)); predicted_speedup_v1 uses v = 1 "
                                       "(Leviathan et al. 2023, Thm 3.8). Only where the model applies: a constant draft length, a "
                                       "draft model, c and v measured; else null and the notes say why. A tree: sum_r E[e_r] / "
                                       "sum_r (D_r c + v(n_r)) over the point's rounds, E[e_r] = 1 + the sum over the round's nodes "
                                       "of the product of p(depth, rank) (acceptance_by_depth_rank, the point's own) along the "
                                       "node's path (Sequoia's expected accepted length; a (depth, rank) never tried counts 0), D_r "
                                       "the round's draft forwards (its tree's depth unless the round records draft_forwards), each "
                                       "priced as a 1-token draft forward c (0 for a drafter without a model), n_r the nodes the "
                                       "round's target forward verified (the batch's widest tree, which a row with a smaller tree or "
                                       "none waits for too; older records without it: the row's own); predicted_speedup_v1 uses "
                                       "v(n) = 1",
           columns=(Column("pred", ("predicted_speedup",), "{:.3f}", 130, terminal=True),),
           also=("predicted_speedup_v1",)),
    Figure("efficiency", legend="measured speedup / predicted speedup: how close the implementation comes to the algorithm's limit; "
                                "decode_efficiency: decode speedup / predicted speedup",
           columns=(Column("eff", ("efficiency",), "{:.3f}", 140),
                    Column("dec eff", ("decode_efficiency",), "{:.3f}", 150),),
           also=("decode_efficiency",)),
    Figure("predicted_speedup_replay", legend="the replay of the point's own schedule (eval/replay.py, docs/predict.md): its batches, "
                                              "or under a load its requests at their arrivals, as the engine's loop runs them (admit, "
                                              "round, evict), each request with its measured prompt length, new tokens and rounds, "
                                              "each step priced by the run's cost profile (costs.json: the probes' steps by rows and "
                                              "width, and the prefills), beside the baseline replayed the same way; the speedup of "
                                              "the replayed schedules, computed as the measured one is. Every method of our engine "
                                              "with rounds (draft model, prompt lookup, suffix, schedules, trees, hybrid). A static "
                                              "batch's tail, once rows leave, is priced at the smallest probed rows above it where "
                                              "fewer were not probed (replay.rows_priced_above). _ci95: 200 replays, each of the prompt "
                                              "batches (requests under a load) drawn with replacement and priced by the probes' "
                                              "repetitions drawn with replacement: the acceptance's spread over prompts and the "
                                              "probes' timing spread. "
                                              "predicted_decode_speedup_replay: after the prefills. replay: the replayed figures "
                                              "(under a load also TTFT P50, TPOT and E2E P50); replay_missing: what the profile "
                                              "lacks where it cannot run. replay_efficiency: speedup / it; replay_decode_efficiency: "
                                              "decode speedup / the decode one",
           columns=(Column("replay [95% CI]", ("predicted_speedup_replay",), "{:.3f}", 160, terminal=True, kind=CI),
                    Column("replay eff", ("replay_efficiency",), "{:.3f}", 170),),
           served_columns=(Column("replay [95% CI]", ("predicted_speedup_replay",), "{:.2f}", 180, terminal=True, kind=CI),
                           Column("TTFT P50 s replay", ("replay.ttft_p50_s",), "{:.3f}", 190),
                           Column("TPOT ms replay", ("replay.tpot_mean_ms",), "{:.1f}", 200),),
           served_csv=(("predicted_speedup_replay", 460), ("predicted_speedup_replay_ci95", 470), ("replay.ttft_p50_s", 480), ("replay.tpot_mean_ms", 490), ("replay.e2e_p50_s", 500)),
           gives=("predicted_speedup_replay", "predicted_speedup_replay_ci95", "replay", "replay_missing",
                  "prediction_off"),
           also=("predicted_speedup_replay_ci95", "predicted_decode_speedup_replay", "replay", "replay_missing",
                 "replay_efficiency", "replay_decode_efficiency"),
           served=served_replay),
    Figure("exact_match", legend="greedy only: share of samples whose tokens equal the baseline's on the same prompt and repeat; "
                                 "mismatches list where each starts (first_mismatch, a token index) and, where the baseline "
                                 "recorded it, baseline_gap: the baseline's top-1 minus top-2 logit at that token (null: the outputs "
                                 "differ in length only); null for a synthetic-acceptance point (its output is not the target's)",
           columns=(Column("exact", ("exact_match",), "{:.3f}", 230, terminal=True),),
           served_columns=(Column("exact", ("exact_match",), "{:.3f}", 210),),
           served_csv=(("exact_match", 510),),
           gives=("exact_match", "mismatches"), also=("mismatches",), static=outputs_match, served=outputs_match),
    Figure("synthetic_acceptance", legend="config speculative.synthetic_acceptance: the set alpha of a synthetic point (null: the "
                                          "real acceptance). Draft and target run their real forwards (gamma drafts, one verification "
                                          "of gamma + 1 tokens), but draft i of a round is accepted iff drafts 1..i-1 were and an "
                                          "independent Bernoulli(alpha) draw says yes (drawn on the device from the batch's seeded "
                                          "generator: reproducible), whatever the tokens; the round then emits the target's own token "
                                          "after the accepted prefix (its argmax, or a draw from p). The output mixes draft and target "
                                          "tokens and is not the target's: exact_match is null and no exactness flag applies. What it "
                                          "measures is the system's cost at that alpha on any pair (random weights included): its "
                                          "speedup against the prediction from its measured alpha, c and v (efficiency) tests the cost "
                                          "model. Marked 'synthetic=alpha' in its label, a 'synthetic' column in the tables and "
                                          "summary.csv, metrics.synthetic true in summary.json, 'synthetic alpha=' in the plot legends; "
                                          "it takes no part in best. The report's 'Synthetic acceptance' table: set alpha, estimated "
                                          "alpha [95% CI], speedup [95% CI], predicted [at alpha's CI], c, v, measured / predicted [at the "
                                          "speedup's CI]",
           served_columns=(Column("synthetic", ("synthetic_acceptance",), "{:g}", 20, terminal=True,
                                  only_with="synthetic_acceptance"),),
           gives=("synthetic", "synthetic_acceptance", "alpha_ci95", "alpha_minus_set", "alpha_prompts", "exact_match",
                  "mismatches", "predicted_speedup_ci95", "efficiency", "efficiency_ci95"),
           also=("synthetic",), static=synthetic, served=synthetic),
    Figure("alpha_ci95", legend=f"synthetic points: 95% bootstrap CI of alpha over prompts: resample the prompts with replacement, "
                                f"each with all its repeats' rounds, solve alpha from the resample's rounds as alpha itself "
                                f"({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}, the expanded percentile interval as "
                                f"speedup_ci95's); a prompt, not a batch, is the unit, since each row draws its own acceptances; "
                                f"fewer than {MIN_PROMPTS} prompts: null ('(n=k)' in the tables). alpha_minus_set: the estimate "
                                "minus the set alpha; alpha_prompts: the prompts behind the interval. predicted_speedup_ci95: the "
                                "prediction at the interval's ends, c and v as measured (their own spread is not in it); efficiency_ci95: "
                                "the speedup's interval over the prediction (the prompts' spread alone)",
           csv=("alpha_ci95",),
           also=("alpha_minus_set", "alpha_prompts", "predicted_speedup_ci95", "efficiency_ci95")),
    Figure("accuracy", legend="GSM8K: share of answers (after the last '####', else the last number) equal to the reference; "
                              "accuracy_cut: answers cut at max_new_tokens before '####' (of accuracy_graded); when more than half "
                              "are cut the notes say the accuracy is not meaningful",
           columns=(Column("acc", ("accuracy",), "{:.3f}", 240, terminal=True),),
           gives=("accuracy", "accuracy_cut", "accuracy_graded"), also=("accuracy_cut", "accuracy_graded"),
           static=accuracy),
    Figure("flags", legend=f"a figure that cannot be trusted as it is, kept and marked '!' in the tables and plots (never a reference's speedup, 1 by definition), the notes say "
                           f"why: few_samples: fewer than {MIN_PROMPTS} prompt batches back the ratio, so it has no interval; "
                           f"cross_process: some of its batches were paired with a baseline another process measured (a resumed "
                           f"run, a restarted worker), not back to back; "
                           f"not_back_to_back: its batches were paired with its reference's measured in another server "
                           f"block (an engine in its own process), minutes apart; "
                           f"ci_wide: the speedup's CI reaches beyond +-ci_target (config, default 10%) of it (repeats: auto stops "
                           f"on this same rule); drift: the same 1-token target forward (timed by the same probe, within each "
                           f"process) or the baseline's tok/s on the same batches in different repeats moved by more than "
                           f"{DRIFT_LIMIT:.0%} (max / min - 1); cost_unstable: a cost probe this point uses has repetitions spread "
                           f"over (max - min) / median > {COST_SPREAD_LIMIT:.0%}, or the workers that ran it measured c or v that far "
                           f"apart; cost_implausible: v < 1 or c > 1; "
                           f"host_bound: the draft's forward waits on the host (Python dispatching eager kernels one by one) more "
                           f"than it computes: its GPU busy share below {HOST_BOUND_BUSY:.0%} where CUDA busy times exist, else c >= "
                           f"{HOST_BOUND_EXCESS:g}x the weight bytes ratio and c >= {HOST_BOUND_MIN_C:g}; its speedups then measure "
                           f"Python and kernel-launch overhead, not the memory-bound decoding that speculation exploits: the "
                           f"compiled engine (engine.compile: true)"
                           + "".join(f" or {t.title} (the {t.methods} methods)" for t in ENGINE_TEXTS.values()) +
                           f" measure the models (compiled and still below it: the engine's host work around its graphs, seen "
                           f"at 43% on an H100 for a 1B pair's draft); "
                           f"possible_bug: a greedy output differs from the baseline's "
                           f"where rounding cannot flip a token: at its first differing token the baseline's top-1 logit led its "
                           f"top-2 by more than {FLIP_REACH:g} x the drift, the target's numerics probe's max |logit diff| (over "
                           f"every verify width M the run uses, for a bf16 or quantized target; each logit moves by up to the drift), "
                           f"or the outputs differ in length only, or no probe ran; records without the baseline's gaps (older "
                           f"runs) flag any mismatch while the drift is at most {NUMERICS_DRIFT:g} (fp32 rounding is ~1e-5). A "
                           f"mismatch within reach of the drift is explained in the notes instead; "
                           f"int8_batch: an 8-bit target at batch > 1 is not exact by construction (LLM.int8 picks its outlier "
                           f"columns over all rows of a batch, so a row's logits depend on its neighbours): greedy mismatches there "
                           f"are expected (it replaces possible_bug), unless the point measured every sample equal; "
                           f"prediction_off: the measured speedup falls outside the replay's predicted interval (without one, more "
                           f"than 5% from it), whatever the measured speedup's own interval; the message names the parts of the "
                           f"schedule that ran more than 10% from what the replay priced (the draft's steps as c_run / c, the "
                           f"verifications as v_run / v, the prefills; under a load these three as the records time them, in units "
                           f"of the baseline's steps: a machine uniformly slower than its probes names none)",
           outside="a run's own key", also=("prediction_off",)),
    Figure("group", legend="dataset.group_by's value, or a conversation's turn ('turn 1', 'turn 2', ...: runs of conversations "
                           "give figures per turn besides group_by's; group_field says which); null: the overall run. At batch size 1 a group's figures are exact; at batch "
                           "size > 1 rows of different groups share a batch, and a group's batch wall time is its slowest row of "
                           "that group in the batch",
           outside="a run's own key"),
    Figure("engines", legend=" ".join(t.legend for t in ENGINE_TEXTS.values()) or None,
           outside="summary.json engines (eval/summary.py engine_comparison)"),
    Figure("best", legend="per comparison (batch size or load point, and temperature): each method's point with the highest "
                          "measured speedup among status ok points (flagged ones included and marked), and the gamma predicted "
                          "best among the gammas swept: by the replay of each gamma's own schedule where every gamma has one "
                          "(alpha_used null), else, for a constant draft length with measured costs, by Leviathan's model from "
                          "the best point's alpha, c and v; the report prints a method's line where it ran more than one point",
           outside="summary.json best (eval/summary.py best_points)"),
    Figure("best_method", legend="per comparison and engine, overall and per group: the method whose point has the highest "
                                 "measured speedup among status ok points (flagged ones included and marked), and its margin "
                                 "over the runner-up (the next method's best point): the ratio of the two points' throughputs "
                                 "over the prompt batches both finished (margin), with the 95% paired bootstrap interval over "
                                 "prompts of speedup_ci95, the runner-up in the baseline's place (margin_ci95; null below "
                                 f"{MIN_PROMPTS} prompt batches, margin_prompts says how many); verdict above, below or tied "
                                 "(the interval holds 1)",
           outside="summary.json best_method (eval/summary.py best_methods)"),
    Figure("serving", legend="a serving run (config load:): each load point (concurrency C: at most C requests in flight; "
                             "request_rate: arrivals per second, null = all at once; conversations: first turns per second, a later turn "
                             "arriving load.think_s after the turn before it ends) serves the same N requests on the same arrival "
                             "schedule for every method; summary.json's serving.runs holds one run per method and load point, "
                             "serving.crossovers the crossovers. Times per request from the load point's start: arrival, admission "
                             "(its prefill began), first token, finish; its clock starts at its slot: when it got one of the C "
                             "concurrency slots (vLLM bench serve's --max-concurrency semaphore), max(arrival, the earliest release "
                             "of a slot by a finishing request, in arrival order, then request order: a conversation's later turn arrives after its previous answer); with no cap binding, its arrival",
           served_only=True,
           outside="summary.json serving (eval/served_figures.py serving_section)"),
    Figure("ttft_s (load)", legend="time to first token = first token - slot: the prefill and any wait inside the engine for the "
                                   "next step (a joiner waits for the round in flight), not the client's wait for a slot (queue_s)",
           served_only=True, per_group=(("ttft_s_p50", "ttft_s.p50"),),
           group_columns=(Column("TTFT P50 s", ("ttft_s_p50",), "{:.3f}", 10),),
           served_columns=(Column("TTFT P50 / P99 s", ("ttft_s.p50", "ttft_s.p99"), "{:.3f}", 30, terminal=True),),
           served_csv=(("ttft_s.mean", 30), ("ttft_s.p50", 40), ("ttft_s.p90", 50), ("ttft_s.p99", 60)),
           served=requests_figure(ttft_figures)),
    Figure("by_group", legend="per group of a load point's requests (dataset.group_by's values, and a conversation's turns: 'turn 1', "
                              "'turn 2', ...): its requests' TTFT, TPOT and E2E P50, pooled acceptance and MAT, and the TPOT speedup "
                              "against the same requests of the baseline, with its 95% paired bootstrap interval over those requests "
                              "(null below 8); no throughput, since every group's requests share the load point's span",
           served_only=True,
           outside="a load point's metrics, its groups' fields the entries' per_group (eval/served_figures.py group_figures)"),
    Figure("queue_s", legend="the client's wait for a concurrency slot = slot - arrival (0 with no cap binding); not in TTFT, E2E or "
                             "the SLO, as in vLLM's bench serve",
           served_only=True,
           served_columns=(Column("queue P50 / P99 s", ("queue_s.p50", "queue_s.p99"), "{:.3f}", 70),),
           served_csv=(("queue_s.mean", 310), ("queue_s.p50", 320), ("queue_s.p90", 330), ("queue_s.p99", 340)),
           served=requests_figure(queue_figures)),
    Figure("max_in_flight", legend="the most requests in flight (admitted, not finished) at once; where the concurrency exceeds the "
                                   "load point's requests the notes say that at most that many could be",
           served_only=True,
           served_csv=(("max_in_flight", 300),),
           served=requests_figure(max_in_flight_figures)),
    Figure("tpot_s (load)", legend="time per output token after the first = (finish - first token) / (N - 1), for N > 1 (a "
                                   "one-token request has none)",
           served_only=True, per_group=(("tpot_s_p50", "tpot_s.p50"),),
           group_columns=(Column("TPOT P50 ms", ("tpot_s_p50",), "{:.1f}", 20, kind=MS),),
           served_columns=(Column("TPOT P50 / P99 ms", ("tpot_s.p50", "tpot_s.p99"), "{:.1f}", 40, terminal=True, kind=MS),),
           served_csv=(("tpot_s.mean", 70), ("tpot_s.p50", 80), ("tpot_s.p90", 90), ("tpot_s.p99", 100)),
           served=requests_figure(tpot_figures)),
    Figure("itl_s", legend="inter-token latency: the gaps between successive emissions of a request, pooled over requests; as in "
                           "vLLM a chunk of tokens emitted at once (a round's accepted drafts and its target token) is one gap, so "
                           "speculation has fewer, longer gaps: TPOT is the per-token figure",
           served_only=True,
           served_columns=(Column("ITL P50 / P99 ms", ("itl_s.p50", "itl_s.p99"), "{:.1f}", 50, kind=MS),),
           served_csv=(("itl_s.mean", 110), ("itl_s.p50", 120), ("itl_s.p90", 130), ("itl_s.p99", 140)),
           served=requests_figure(itl_figures)),
    Figure("e2e_s", legend="end to end = finish - slot. ttft_s, tpot_s, itl_s, e2e_s, queue_s: mean, p50, p90, p99 over the "
                           "requests (percentiles by linear interpolation between the closest ranks, numpy's default and vLLM's)",
           served_only=True, per_group=(("e2e_s_p50", "e2e_s.p50"),),
           group_columns=(Column("E2E P50 s", ("e2e_s_p50",), "{:.3f}", 30),),
           served_columns=(Column("E2E P50 / P99 s", ("e2e_s.p50", "e2e_s.p99"), "{:.3f}", 60),),
           served_csv=(("e2e_s.mean", 150), ("e2e_s.p50", 160), ("e2e_s.p90", 170), ("e2e_s.p99", 180)),
           served=requests_figure(e2e_figures)),
    Figure("output_tok_s", legend="total new tokens / span, span = the last finish - the load point's start (t = 0: the serving "
                                  "benchmark duration, the first request's arrival gap in it; summed "
                                  "over repeats); requests_per_s likewise; goodput_req_s: requests meeting every limit of config "
                                  "load.slo (TTFT from the slot <= ttft_s, TPOT <= tpot_ms) / span, null when no SLO is set; slo_met: their share",
           served_only=True,
           served_columns=(Column("tok/s", ("output_tok_s",), "{:.1f}", 80, terminal=True),
                           Column("req/s", ("requests_per_s",), "{:.2f}", 90),
                           Column("goodput req/s", ("goodput_req_s",), "{:.2f}", 100),),
           served_csv=(("requests", 0), ("output_tokens", 10), ("span_s", 20), ("output_tok_s", 190), ("requests_per_s", 200), ("goodput_req_s", 210), ("slo_met", 220)),
           served=requests_figure(rate_figures),
           gives=("requests", "output_tokens", "span_s", "output_tok_s", "requests_per_s", "goodput_req_s", "slo_met"),
           also=("requests_per_s", "goodput_req_s", "slo_met")),
    Figure("mean_in_flight", legend="occupancy: the time average over the span of the requests between admission and finish = "
                                    "sum(finish - admitted) / span; busy_in_flight: the same over the time at least one was in "
                                    "flight (what a step sees: idle time between arrivals left out)",
           served_only=True,
           served_columns=(Column("in flight", ("mean_in_flight",), "{:.2f}", 110),),
           served_csv=(("mean_in_flight", 230), ("busy_in_flight", 290)),
           served=requests_figure(occupancy_figures), gives=("mean_in_flight", "busy_in_flight"),
           also=("busy_in_flight",)),
    Figure("acceptance_pooled", legend="acceptance rate pooled over every round of every request, sum(accepted) / sum(drafted) (as "
                                       "vLLM's counters); acceptance_per_request: the mean over requests of each request's own (as "
                                       "specdec_bench); mean_accepted_tokens_pooled / _per_request: MAT = emitted / rounds, likewise; "
                                       "alpha from the chain rounds only (alpha_rounds of them; a tree round, hybrid's merged trees "
                                       "too, is described by acceptance_by_depth_rank); acceptance_by_source for a drafter of several "
                                       "sources, a source offered and never chosen with 0 rounds",
           served_only=True,
           per_group=(("acceptance_pooled", "acceptance_pooled"),
                      ("mean_accepted_tokens_pooled", "mean_accepted_tokens_pooled")),
           group_columns=(Column("accept pooled", ("acceptance_pooled",), "{:.3f}", 40),
                          Column("MAT pooled", ("mean_accepted_tokens_pooled",), "{:.2f}", 50)),
           served_columns=(Column("accept pooled / per-req", ("acceptance_pooled", "acceptance_per_request"), "{:.3f}", 120),
                           Column("MAT pooled / per-req", ("mean_accepted_tokens_pooled", "mean_accepted_tokens_per_request"), "{:.2f}", 130),),
           served_csv=(("acceptance_pooled", 240), ("acceptance_per_request", 250), ("mean_accepted_tokens_pooled", 260), ("mean_accepted_tokens_per_request", 270), ("alpha", 280), ("alpha_rounds", 350)),
           also=("acceptance_per_request", "mean_accepted_tokens_pooled", "mean_accepted_tokens_per_request",
                 "alpha_rounds")),
    Figure("speedup_tput", legend="(sum N / sum E2E) of the method / the baseline's over the requests both served at the same load "
                                  "point and temperature: a per-request token rate. By Little's law a system's tok/s = L x (sum N / "
                                  "sum E2E), L the mean requests in the system (queued or in flight) over the span, so the ratio is "
                                  "the system throughput ratio where both keep the same L (a closed loop at C always full: L = C, E2E "
                                  "from the slot); where requests queue in the engine, L differs between methods and output_tok_s_ratio (method / baseline "
                                  "output_tok_s, a reading without interval) is the system's ratio",
           served_only=True, per_group=(("requests_paired", "requests_paired"),),
           served_columns=(Column("speedup tput [95% CI]", ("speedup_tput",), "{:.2f}", 140, terminal=True, kind=MEASURED),
                           Column("tok/s ratio", ("output_tok_s_ratio",), "{:.2f}", 160),),
           served_csv=(("requests_paired", 360), ("speedup_tput", 370), ("output_tok_s_ratio", 410)),
           served=served_pairs, gives=("requests_paired", "output_tok_s_ratio"), also=("output_tok_s_ratio",)),
    Figure("speedup_tpot", legend="mean TPOT of the baseline / the method's, over the requests both served with N > 1",
           served_only=True, per_group=(("speedup_tpot", "speedup_tpot"), ("speedup_tpot_ci95", "speedup_tpot_ci95")),
           group_columns=(Column("speedup TPOT [95% CI]", ("speedup_tpot",), "{:.2f}", 60, kind=RATIO),),
           served_columns=(Column("speedup TPOT [95% CI]", ("speedup_tpot",), "{:.2f}", 150, terminal=True, kind=MEASURED),),
           served_csv=(("speedup_tpot", 390), ("speedup_tpot_ci95", 400))),
    Figure("speedup_tput_ci95", legend=f"95% paired bootstrap over requests (request i of both, with all its repeats; a "
                                       f"conversation's turns together, dataset.turns; the expanded "
                                       f"percentile interval as speedup_ci95), speedup_tpot_ci95 likewise; fewer than {MIN_PROMPTS} "
                                       "requests: null and flagged few_samples. Requests of one load point share the batch, so the "
                                       "interval covers how the ratio varies from request to request on that schedule, not from "
                                       "run to run",
           served_only=True,
           served_csv=(("speedup_tput_ci95", 380),),
           also=("speedup_tpot_ci95",)),
    Figure("predicted_speedup (load)", legend="Leviathan's (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + v)) at the load point's "
                                              "measured alpha (pooled chain rounds), with c and v at its occupancy while busy "
                                              "(busy_in_flight, cost_rows): linear between the batch sizes probed around it "
                                              "(cost_batch_sizes; each load point probes at min(C, its requests) and at 1), the "
                                              "nearest within "
                                              "10% outside them, null farther (the notes say why). Per-row decoding only: no prefill, "
                                              "no queue, no joining request",
           served_only=True,
           served_columns=(Column("pred", ("predicted_speedup",), "{:.2f}", 170, terminal=True),),
           served_csv=(("draft_cost_ratio_c", 420), ("verify_cost_ratio_v", 430), ("cost_rows", 440), ("predicted_speedup", 450)),
           also=("cost_rows", "cost_batch_sizes")),
    Figure("crossovers", legend="per method line and sweep along one load axis (the other held): measured: where the throughput "
                                "speedup's point estimate crosses 1 (the load where the straight line between the two loads around "
                                "the crossing meets 1; null beside 'all at once'), the verdict 'above 1 at every load measured' or "
                                "'below 1 at every load measured' where it never does, and highest_load_ci_above_1: the highest load "
                                "whose interval lies wholly above 1; predicted: the same on the predicted speedups; tpot: on the TPOT "
                                "speedup. A concurrency above a load point's requests is placed at the requests (no more can be in "
                                "flight), and of several such caps the lowest stands for them",
           served_only=True,
           outside="summary.json serving.crossovers (eval/served_figures.py crossovers)"),
    Figure("versus_fixed", legend="per load point and method line but gamma and schedule: each point whose schedule is not "
                                  "constant against the best fixed K there (the constant schedule's highest throughput speedup, "
                                  "a choice that favours the fixed K): tput_ratio, (sum N / sum E2E) over the fixed K's over "
                                  "the requests both served, with its 95% paired bootstrap interval over those requests "
                                  "(tput_ratio_ci95); verdict: above or below where the interval lies wholly above or below 1, "
                                  "tied where it holds 1, too few requests where fewer than 8 pair (a conversation's "
                                  "turns count once); output_tok_s_ratio: the "
                                  "system tok/s over the fixed K's (a reading)",
           served_only=True,
           outside="summary.json serving.versus_fixed (eval/served_figures.py versus_fixed)"),
]
