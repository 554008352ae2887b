"""Speculative decoding with a draft model (Leviathan et al. 2023), our engine, with a draft-length
schedule: constant, heuristic, confidence, cost_model or recommended (decode/drafters/schedules.py)."""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from decode.methods.base import MethodSpec, option
from decode.names import draft_model

SCHEDULES = ("constant", "heuristic", "confidence", "cost_model", "recommended")  # the draft-length schedules (decode/drafters/
#   schedules.py SCHEDULES: a test keeps them equal)
MEASURED = ("cost_model",)  # those that read the measured c and v and the draft's prefill cost


@dataclass(frozen=True)
class Trees:
    tree_top_k: int = option(4, "dynamic trees: children per expanded node; prompt lookup's matches for a dynamic "
                                "tree", ge=1, le=16)


@dataclass(frozen=True)
class Confidence:
    confidence: float = option(0.4, "confidence schedule, and hybrid's draft branch: a row stops drafting after the "
                                    "step whose top probability falls under this", gt=0, lt=1)


@dataclass(frozen=True)
class Recommendation:
    recommendation: str | None = option(None, "recommended schedule: the recommend.json (python -m eval.recommend) "
                                              "whose K by batch and context it follows")

    def check_config(self, config) -> None:
        """At the config's load: a recommended schedule needs a recommendation that reads, of the run's target, with a
        candidate of each draft model (ValueError: the config's one line). The run reads it again at each point."""
        if "recommended" not in config.speculative.schedule or "speculative" not in config.methods:
            return
        if self.recommendation is None:
            raise ValueError("speculative.schedule recommended follows a recommendation: set speculative."
                             "recommendation to a recommend.json (python -m eval.recommend RUN_DIR)")
        data = read_recommendation(self.recommendation)
        theirs = (data.get("profile_meta") or {}).get("target_model")
        if theirs and not same_model(theirs, config.target.model):
            raise ValueError(f"speculative.recommendation: {self.recommendation} recommends for the target {theirs}, "
                             f"the run's is {config.target.model}; give a recommendation of this target")
        for draft in config.draft:
            if draft.kind == "model":
                recommended_table(data, draft.name, config.load is not None, self.recommendation)


@dataclass(frozen=True)
class Options(Confidence, Trees, Recommendation):
    pass


def read_recommendation(path: str) -> dict:
    """recommend.json's content; ValueError naming the file where it is missing, unreadable or not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"speculative.recommendation: cannot read {path} ({error.strerror or error}); give the "
                         "recommend.json that python -m eval.recommend RUN_DIR wrote") from None
    except ValueError as error:
        raise ValueError(f"speculative.recommendation: {path} is not JSON ({error}); give the recommend.json that "
                         "python -m eval.recommend RUN_DIR wrote") from None
    if not isinstance(data, dict) or not isinstance(data.get("loads"), list):
        raise ValueError(f"speculative.recommendation: {path} has no loads; give the recommend.json that "
                         "python -m eval.recommend RUN_DIR wrote")
    problem = recommendation_problem(data)
    if problem:
        raise ValueError(f"speculative.recommendation: {path}: {problem}; give the recommend.json that "
                         "python -m eval.recommend RUN_DIR wrote, or mend that key")
    return data


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def recommendation_problem(data: dict) -> str | None:
    """The first key of recommend.json that is not as eval.recommend writes it, named by its place (loads[0].
    candidates[1].speedup) with what it holds and what it should; None where each key read is of its kind: a load a
    {load, context, candidates} whose batch=B or conc=C names a count, a candidate a name, a speedup above 0, a K (or
    null), an interval of two numbers (or null), its axes a mapping; best, where given, one of its candidates."""
    def say(where: str, value, should: str) -> str:
        return f"{where} is {json.dumps(value)[:40]}, not {should}"
    for key in ("profile_meta", "draft_prefill"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return say(key, data[key], "a mapping")
    for i, load in enumerate(data["loads"]):
        at = f"loads[{i}]"
        if not isinstance(load, dict):
            return say(at, load, "a load ({load, context, candidates})")
        name = load.get("load")
        if not isinstance(name, str):
            return say(f"{at}.load", name, "a load's name such as batch=1 or conc=4")
        kind, _, value = name.partition("=")
        if kind in ("batch", "conc") and not (value.isdigit() and int(value) >= 1):
            return say(f"{at}.load", name, f"{kind}= a count of at least 1")
        if load.get("context") is not None and not _count(load["context"]):
            return say(f"{at}.context", load["context"], "a context length in tokens (or null)")
        candidates = load.get("candidates")
        if not isinstance(candidates, list):
            return say(f"{at}.candidates", candidates, "a list of candidates")
        for j, c in enumerate(candidates):
            where = f"{at}.candidates[{j}]"
            if not isinstance(c, dict):
                return say(where, c, "a candidate ({candidate, speedup, gamma, ...})")
            if not isinstance(c.get("candidate"), str):
                return say(f"{where}.candidate", c.get("candidate"), "a candidate's name")
            if not (_number(c.get("speedup")) and c["speedup"] > 0):
                return say(f"{where}.speedup", c.get("speedup"), "a predicted speedup above 0")
            if c.get("gamma") is not None and not _count(c["gamma"]):
                return say(f"{where}.gamma", c["gamma"], "a K (a whole number above 0, or null for off)")
            interval = c.get("speedup_ci95")
            if interval is not None and not (isinstance(interval, list) and len(interval) == 2
                                             and all(_number(x) for x in interval)):
                return say(f"{where}.speedup_ci95", interval, "an interval [low, high] (or null)")
            if c.get("axes") is not None and not isinstance(c["axes"], dict):
                return say(f"{where}.axes", c["axes"], "a mapping of the candidate's axes")
        if "best" in load and load["best"] not in [c["candidate"] for c in candidates]:
            return say(f"{at}.best", load["best"], "one of its candidates")
    return None


def same_model(a: str, b: str) -> bool:
    """Two targets named alike as eval.recommend compares a profile's (eval/recommend.py model_name): last path
    component, lower case, without synthetic: and its options; one beginning the other is the same."""
    def name(x):
        return str(x).removeprefix("synthetic:").split("?")[0].rstrip("/").split("/")[-1].lower()
    return name(a).startswith(name(b)) or name(b).startswith(name(a))


def follows(candidate: dict, draft: str) -> bool:
    """A candidate the recommended schedule can run: "off", or a chain of this draft at a constant K."""
    axes = candidate.get("axes") or {}
    return candidate.get("candidate") == "off" or (
        candidate.get("method") == "speculative" and candidate.get("draft") == draft and candidate.get("gamma")
        and axes.get("tree") is None and axes.get("schedule") in (None, "constant"))


def recommended_table(data: dict, draft: str, served: bool, path: str = "recommend.json"
                      ) -> dict[int, dict[int | None, int]]:
    """recommend.json -> batch -> context (None: as measured) -> K (0: off): at each load and context, the candidate
    of the highest predicted speedup among those this schedule runs (`follows`; eval.recommend's best where it is one
    of them; equal speedups go to off, then the shorter K), leaving out each K tied with off (its interval reaches 1:
    speculation that cannot be told from off is not run). Loads at a concurrency (conc=C) under a load, at a static batch
    size (batch=B) for fixed batches, the other kind where the file has none of these; rates are no batch size and
    are left out, and so is a load where the draft was not a candidate. ValueError where no load is left."""
    return {batch: {context: 0 if best["candidate"] == "off" else int(best["gamma"])
                    for context, (best, _, _) in by_context.items()}
            for batch, by_context in _choices(data, draft, served, path).items()}


def catch_up_prices(data: dict, draft: str, served: bool, path: str = "recommend.json"
                    ) -> tuple[dict[int, dict[int | None, float]], float] | None:
    """What the recommended schedule weighs a catch-up with (RecommendedSchedule.catch_up_repaid): batch -> context
    -> the seconds a row saves per token at the recommended K once its draft has caught up (off's seconds a token,
    `per_token`, times 1 - 1 / the K's decode speedup: after the prefills, which the catch-up is charged for apart;
    0 where off is recommended), and the draft's prefill line's slope (seconds per row-token fed, eval.recommend's
    draft_prefill). None where the file lacks either (written before eval.recommend priced catch-ups or gave decode
    speedups)."""
    line = (data.get("draft_prefill") or {}).get(draft_model(draft)) or {}
    slope = line.get("s_per_row_token")
    if not isinstance(slope, (int, float)) or slope < 0:
        return None
    savings: dict[int, dict[int | None, float]] = {}
    for batch, by_context in _choices(data, draft, served, path).items():
        for context, (best, off_, _) in by_context.items():
            if best["candidate"] == "off":
                savings.setdefault(batch, {})[context] = 0.0
                continue
            per_token, speedup = _per_token(off_, batch), best.get("decode_speedup")
            if per_token is None or not (isinstance(speedup, (int, float)) and speedup > 0):
                return None
            savings.setdefault(batch, {})[context] = max(0.0, per_token * (1 - 1 / speedup))
    return savings, float(slope)


def _per_token(off_: dict | None, batch: int) -> float | None:
    """A row's seconds a token without speculation at a load: off's TPOT where the load has one, else batch / off's
    tok/s; None where off has neither."""
    tpot, tok_s = (off_ or {}).get("tpot_mean_ms"), (off_ or {}).get("tok_s")
    if isinstance(tpot, (int, float)) and tpot > 0:
        return tpot / 1000
    if isinstance(tok_s, (int, float)) and tok_s > 0:
        return batch / tok_s
    return None


def plain_prices(data: dict, draft: str, served: bool, path: str = "recommend.json"
                 ) -> dict[int, dict[int | None, float]] | None:
    """What the recommended schedule prices a plain step of the batch with (RecommendedSchedule.enabling): batch ->
    context -> a row's seconds a token without speculation (`_per_token`: off's TPOT at the load, else batch / off's
    tok/s). None where a load lacks off or both of its figures."""
    plain: dict[int, dict[int | None, float]] = {}
    for batch, by_context in _choices(data, draft, served, path).items():
        for context, (_, off_, _) in by_context.items():
            per_token = _per_token(off_, batch)
            if per_token is None:
                return None
            plain.setdefault(batch, {})[context] = per_token
    return plain


def round_prices(data: dict, draft: str, served: bool, path: str = "recommend.json"
                 ) -> dict[int, dict[int | None, dict[int, tuple[float, float]]]] | None:
    """What the recommended schedule weighs a round of rows at different contexts with (RecommendedSchedule.
    round_lengths): batch -> context -> K -> (the K's predicted decode speedup, after the prefills; the tokens a row
    commits per round at it), for every K of the draft eval.recommend predicted there, tied with off or not (of two
    candidates of one K, the faster). None where a candidate lacks either (a file written before eval.recommend gave
    tokens per round)."""
    prices: dict[int, dict[int | None, dict[int, tuple[float, float]]]] = {}
    for batch, by_context in _choices(data, draft, served, path).items():
        for context, (_, _, runnable) in by_context.items():
            at = prices.setdefault(batch, {}).setdefault(context, {})
            for c in runnable:
                if c.get("candidate") == "off":
                    continue
                speedup, tokens = c.get("decode_speedup"), c.get("tokens_per_round")
                if not (isinstance(speedup, (int, float)) and isinstance(tokens, (int, float)) and speedup > 0
                        and tokens >= 1):
                    return None
                k = int(c["gamma"])
                if k not in at or speedup > at[k][0]:  # of two candidates of one K, the faster
                    at[k] = float(speedup), float(tokens)
    return prices


def lone_prices(data: dict, draft: str, served: bool, path: str = "recommend.json"
                ) -> dict[int | None, tuple[int, float]] | None:
    """What the recommended schedule runs a row alone in flight with (RecommendedSchedule, `lone`): at the load of
    one row of the kind the table reads (concurrency 1 under a load, batch 1 for fixed batches), context -> (the K of
    the highest predicted speedup, a K tied with off included; 0 where off's is as high or that K's decode speedup is
    not above 1; the seconds the row saves a token once its draft has its context: off's seconds a token x (1 - 1 /
    that decode speedup), a token's seconds off's TPOT where the load has one, else 1 / off's tok/s). At one row the
    schedule prices the draft's prefill for each row (its catch-up, at this saving), where the end-to-end speedup
    carries it on average over the calibration's prompts and budgets. None where the file has no such load, or the
    chosen K lacks its decode speedup or off its seconds a token (a file written before eval.recommend gave them)."""
    by_context = _choices(data, draft, served, path).get(1)
    if by_context is None:
        return None
    lone: dict[int | None, tuple[int, float]] = {}
    for context, (_, off_, runnable) in by_context.items():
        best = min(runnable, key=ranked)
        if best["candidate"] == "off":
            lone[context] = 0, 0.0
            continue
        per_token, speedup = _per_token(off_, 1), best.get("decode_speedup")
        if per_token is None or not (isinstance(speedup, (int, float)) and speedup > 0):
            return None
        lone[context] = (int(best["gamma"]), per_token * (1 - 1 / speedup)) if speedup > 1 else (0, 0.0)
    return lone


def tied_with_off(candidate: dict) -> bool:
    """Whether the candidate's predicted speedup cannot be told from off's: its 95% interval reaches 1 (off's is
    [1, 1]; eval.recommend says it as a tie). Without an interval, its point estimate decides."""
    interval = candidate.get("speedup_ci95")
    return bool(interval) and isinstance(interval[0], (int, float)) and interval[0] <= 1.0


def ranked(candidate: dict) -> tuple:
    """The order the schedule picks by: the highest predicted speedup; on a tie off, then the shorter K."""
    return -candidate["speedup"], candidate["candidate"] != "off", candidate.get("gamma") or 0


def _choices(data: dict, draft: str, served: bool, path: str
             ) -> dict[int, dict[int | None, tuple[dict, dict | None, list[dict]]]]:
    """batch -> context -> (the candidate recommended_table follows, "off" of the same load, every candidate the
    schedule can run there, tied with off or not); ValueError where no load is left."""
    tables: dict[str, dict] = {"batch": {}, "conc": {}}
    for load in data.get("loads") or []:
        kind, _, value = str(load.get("load", "")).partition("=")
        runnable = [c for c in load.get("candidates") or [] if follows(c, draft)]
        if kind not in tables or not value.isdigit() or all(c.get("candidate") == "off" for c in runnable):
            continue
        off_ = next((c for c in runnable if c.get("candidate") == "off"), None)
        # a K tied with off is not run: the best of the others
        untied = [c for c in runnable if c is off_ or not tied_with_off(c)] if off_ is not None else runnable
        best = min(untied, key=ranked)
        tables[kind].setdefault(int(value), {})[load.get("context")] = best, off_, runnable
    preferred, other = ("conc", "batch") if served else ("batch", "conc")
    table = tables[preferred] or tables[other]
    if not table:
        raise ValueError(f"speculative.recommendation: {path} has no batch or concurrency load with a candidate of "
                         f"the draft {draft} (speculative at a constant K); give a recommendation of a run that "
                         "measured it")
    return table


def schedule_for(ctx, point, draft_label: str | None, max_new_tokens: int | None = None):
    """The point's schedule; cost_model reads the c and v measured in this run (runner/probes.py), recommended the
    recommendation's table (speculative.recommendation)."""
    from decode.drafters.schedules import make_schedule

    name = point.schedule or SCHEDULES[0]
    if name == "recommended":
        path = ctx.options[point.method].recommendation
        data = ctx.memory.get(("recommended", path))
        if data is None:  # read at the point's first batch (the config's load checked it)
            data = ctx.memory[("recommended", path)] = read_recommendation(path)
        served = ctx.load is not None
        key = ("recommended prices", path, draft_label, served)
        prices = ctx.memory.get(key)
        if prices is None:  # the point's tables, read from the file once (the schedule only reads them)
            prices = ctx.memory[key] = {"table": recommended_table(data, draft_label, served, path),
                                        "catch_up": catch_up_prices(data, draft_label, served, path),
                                        "rounds": round_prices(data, draft_label, served, path),
                                        "lone": lone_prices(data, draft_label, served, path),
                                        "plain": plain_prices(data, draft_label, served, path)}
        return make_schedule(name, point.gamma, budget=max_new_tokens, most_rows=ctx.load.concurrency if served else None,
                             **prices)
    if name not in MEASURED:
        return make_schedule(name, point.gamma, confidence=ctx.options[point.method].confidence)
    costs = ctx.costs  # a CostProbe (eval/records.py), or None where the probes did not run
    c = costs.c_for(draft_label) if costs else None
    if c is None or not costs.v:
        raise ValueError("the cost_model schedule needs the measured costs c and v, and the cost probes did not run")
    # the warmup always runs the draft (its kernels are what it warms) and decides nothing
    return make_schedule(name, point.gamma, c=c, v=dict(costs.v), evidence=evidence_of(ctx, point),
                         prefill_cost=costs.draft_prefill.get(draft_label),
                         budget=None if ctx.warming_up else max_new_tokens)


def evidence_of(ctx, point):
    """What cost_model learnt on this point's earlier batches (warmup included): its rows' prior, how long rows
    run, how many batches it skipped (PointEvidence)."""
    from decode.drafters.schedules import PointEvidence

    return ctx.memory.setdefault(("cost_model", point.key), PointEvidence(point.gamma))


def tree_for(ctx, point, sampling):
    """The point's token tree drafter (decode/drafters/draft_tree.py), None for a chain."""
    from decode.drafters.draft_tree import DynamicTree, StaticTree
    from decode.tree_layout import AUTO, branching_or_budget, static_parents

    label = getattr(point, "tree", None)
    if label is None:
        return None
    if label == AUTO:
        from decode.drafters.draft_tree import AutoTree

        return AutoTree.for_point(ctx, point, sampling)
    shape = branching_or_budget(label)
    if isinstance(shape, int):
        return DynamicTree(shape, ctx.options[point.method].tree_top_k, sampling)
    return StaticTree(static_parents(shape), sampling)


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters import DraftModelDrafter  # torch loads when a method runs, not with the registry
    from decode.generate import generate_speculative

    tree = tree_for(ctx, point, generation.sampling)
    schedule = None if tree is not None else schedule_for(ctx, point, point.draft, generation.max_new_tokens)
    drafter = DraftModelDrafter(ctx.drafts[point.draft], ctx.target_vocab_size, generation.sampling, generator,
                                schedule=schedule, tree=tree, context=point.draft_context)
    records = generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                   ctx.clock, synthetic_acceptance=point.synthetic_acceptance, load=ctx.load)
    evidence = getattr(schedule, "evidence", None)  # cost_model's; the warmup's budget is not the run's
    # (a served run is no batch that runs to its longest row: cost_model's prefill decision is not taken there)
    if evidence is not None and not ctx.warming_up and ctx.load is None:
        evidence.finish([r.new_tokens for r in records], [r.stop_reason == "eos" for r in records])
    return records


SPEC = MethodSpec("speculative", "a draft model proposes up to gamma tokens a round (its schedule decides how many), "
                  "the target verifies them in one forward (our engine)",
                  axes=("draft", "gamma", "schedule", "tree", "draft_context", "synthetic_acceptance"), run=run, has_rounds=True,
                  tree_auto=True, options=Options, schedules=SCHEDULES, measured_schedules=MEASURED)
