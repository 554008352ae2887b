"""One process's models, prompts and settings, and how it runs a unit of work.

The single-process runner and every Ray worker hold one Session each: `load` once (runner/loading.py: the models,
their attention, trees and compiled steps; runner/probes.py: their numerics), then `prepare` a comparison (warm-up,
cost probes; a `Prepared`) and `run_unit` for each unit assigned to it. A Session returns records and events; it
never writes the report folder.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch

from decode import Clock, Generation, Sampling
from decode.methods import HOME_ENGINE, REGISTRY, RunContext, caps_of
from decode.arrivals import Load
from eval.records import Comparison, CostProbe, Point
from runner import loading
from runner.attention import settle_attention
from runner.energy import EnergyMeter
from runner.load import load_of, request_count, request_fields, requests_of
from runner.plan import Unit, batches_of, comparisons, left_pad, order_of, points_of, skipped_reason
from runner.records import UnitResult, failure, record_of
from runner.probes import RUNTIME_ERRORS, comparison_costs, drift_probe, one_line, probe_numerics
from runner.loading import eos_set
from utils.data import expand_conversations, load_prompts


def quiet_heap() -> None:
    """Collect, then freeze what is left (gc.freeze): the objects alive now (models, the compiler's graphs and
    caches: millions after a compile) leave the collector's view, so an oldest-generation collection inside a timed
    batch walks only what the batches allocate. After a compiled run's warmup on a CPU such a collection took 250 to
    400 ms (docs/engine.md). Serving engines freeze their heaps after warm-up for the same reason. What an earlier
    call froze is unfrozen and collected first: a frozen object that became garbage since (a warmup's drafter and its
    cache, in a reference cycle) is freed at the next comparison, not kept for the run. Session.release_models
    unfreezes before it collects."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@dataclass
class Prepared:
    """A comparison, warmed up and probed: our engine's points of it, those that cannot run there and why, its costs,
    its notes."""
    points: list = field(default_factory=list)  # Points, in plan order (runner/plan.py points_of)
    failed: set = field(default_factory=set)  # Points
    failures: list[dict] = field(default_factory=list)  # failure() of each
    costs: CostProbe | None = None
    fewer_rows: dict = field(default_factory=dict)  # rows -> CostProbe: a load point's costs at 1 row (Session.prepare)
    notes: list[str] = field(default_factory=list)

    def fail(self, point: Point, status: str, error: str) -> None:
        self.failed.add(point)
        self.failures.append(failure(point, status, error))


def eos_ids(tokenizer, model) -> tuple[int, ...]:
    """A loaded model's EOS set (runner/loading.py eos_set)."""
    return eos_set(tokenizer, model.generation_config.eos_token_id)


class Session:
    def __init__(self, config, device: torch.device, worker: str | None = None, status=None):
        self.config, self.device, self.worker = config, device, worker
        self._loading = loading.status_of(status)  # what -> a context manager showing what loads (rich), or none
        self.clock = Clock(device)  # replaced at load by one that syncs every device the models use
        self.prepared: dict[Comparison, Prepared] = {}
        self._batches: dict[int, list[list]] = {}  # batch size -> the prompts in batches (batches())
        self.notes: list[str] = []
        self._answers: dict[tuple, str] = {}  # prompt token ids -> the target's greedy answer (conversations)

    # -- loading ----------------------------------------------------------------------------------
    def load(self) -> None:
        self._released = False
        config = self.config
        torch.manual_seed(config.seed)
        if not any(caps_of(m).home for m in config.methods):
            return self.load_prompts_only()
        self.target, self.drafts, self.clock = loading.load_models(config, self.device, self._loading)
        self.tokenizer = self.target.tokenizer
        # a load point's rows in flight need its count; a prompt is cut to the target's context (prompt_room)
        self.prompt_set = load_prompts(config.dataset, self.tokenizer, loading.prompt_room(config, self.target))
        for role, _, loaded in self.roles(models_only=True):  # attn_implementation auto, where it has a choice
            settle_attention(loaded, max(c.batch_size for c in self._comparisons()),
                             config.longest_draft + 1, self.clock)
        loading.check_trees(config, self.target, self.drafts)
        self.eos = eos_ids(self.tokenizer, self.target.model)
        self.pad_id = self.tokenizer.pad_token_id
        loading.refuse_ragged_batches_if_wrong(config, self.target, self.drafts)
        self.prompt_set = expand_conversations(self.prompt_set, config.dataset, self.tokenizer, self._answer)
        points = self._points()
        compile_note = loading.compile_models(config, self.target, self.drafts, points,
                                              max(len(p.token_ids) for p in self.prompt_set.prompts)) \
            if config.engine.compile else None
        self.notes = loading.model_notes(config, self.target, self.drafts, self.prompt_set) + \
            ([compile_note] if compile_note else [])
        self.numerics = probe_numerics(config, self.roles(models_only=True), points, *self._numerics_batch())
        self.context = RunContext(target=self.target.model, tokenizer=self.tokenizer,
                                  drafts={label: d.model for label, d in self.drafts.items()},
                                  target_vocab_size=self.target.vocab_size, pad_id=self.pad_id, clock=self.clock,
                                  options=config.method_options,
                                  groups={tuple(p.token_ids): p.group for p in self.prompt_set.prompts
                                          if p.group is not None})

    def _answer(self, token_ids: list[int]) -> str:
        """The target's greedy answer to a prompt, at batch 1, eager (a conversation's earlier turn: utils/data.py
        expand_conversations), at most generation.max_new_tokens."""
        from decode import generate_baseline

        cache = self._answers  # a reload (after another engine ran) asks again: the same answers
        if tuple(token_ids) in cache:
            return cache[tuple(token_ids)]
        ids = torch.tensor([token_ids], device=self.device)
        with torch.inference_mode():
            row = generate_baseline(self.target.model, ids, torch.ones_like(ids), self.generation(None))[0]
        cache[tuple(token_ids)] = self.tokenizer.decode(row.output_ids, skip_special_tokens=True)
        return cache[tuple(token_ids)]

    def roles(self, models_only: bool = False) -> list[tuple]:
        """(role, draft label or None, LoadedModel) of every model loaded (runner/loading.py roles)."""
        return loading.roles(getattr(self, "target", None), getattr(self, "drafts", {}), models_only)

    def _comparisons(self) -> list[Comparison]:
        """The run's comparisons, as the sweep plans them (runner/experiment.py): a load point's batch size is the
        most requests it can have in flight, min(concurrency, its requests)."""
        load = getattr(self.config, "load", None)
        return comparisons(self.config, request_count(self.config, len(self.prompt_set.prompts)) if load else None)

    def _points(self) -> list[Point]:
        """Every point of our engine in the run."""
        return [p for c in self._comparisons() for p in points_of(self.config, c, engine=HOME_ENGINE)]

    def _numerics_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Two of the prompts, of different lengths (a ragged batch), for the numerics probe; with engine.compile at
        most the run's largest batch size of them (the compiled step's buffers hold no more)."""
        prompts = [p.token_ids for p in self.prompt_set.prompts[:2]]
        if len(prompts) == 1 or len(prompts[0]) == len(prompts[1]):  # make the batch ragged
            prompts = [prompts[0], prompts[0][: max(1, len(prompts[0]) // 2)]]
        if self.config.engine.compile:
            prompts = prompts[:max(self.config.batch_size)]
        return left_pad(prompts, self.pad_id, self.device)

    def compiled_models(self) -> dict:
        """role -> the CompiledModel of each loaded model (engine.compile), for warm flags and the report."""
        return loading.compiled_models(self.config, getattr(self, "target", None), getattr(self, "drafts", {}))

    def _graphs_compiled(self) -> int:
        return sum(model.compiles for model in self.compiled_models().values())

    def _graphs_recorded(self) -> int:
        """CUDA graphs captured so far (cudagraph trees; 0 without CUDA graphs, or where torch cannot tell)."""
        return sum(model.recordings or 0 for model in self.compiled_models().values())

    @property
    def released(self) -> bool:
        return getattr(self, "_released", False)

    def release_models(self) -> None:
        """Drop the models (another engine runs next and needs the memory); run_unit's caller reloads them (load) if
        units of our engine come after. Prompts and tokenizer stay. On CUDA the caching allocator's blocks go back to the device
        (and, with engine.compile, the CUDA graphs' memory pools with dynamo's caches), so that what another engine
        reads as free memory is free."""
        self.target, self.drafts, self.context = None, {}, None
        self.prepared.clear()  # a reload warms up and measures again
        self._released = True
        if self.config.engine.compile:  # the compiled graphs hold the models' buffers (and CUDA graph pools)
            torch._dynamo.reset()
        gc.unfreeze()  # quiet_heap's frozen objects are collectable again: the models' cycles among them
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def load_prompts_only(self) -> None:
        """Every method runs in another engine: the tokenizer and the prompts, no model (it loads its own)."""
        from utils.models import generation_eos, load_tokenizer

        with self._loading("tokenizer"):
            self.tokenizer = load_tokenizer(self.config.target, "target")
        self.target, self.drafts = None, {}
        self.prompt_set = load_prompts(self.config.dataset, self.tokenizer)
        if self.prompt_set.conversations:
            from utils import UserError

            raise UserError("dataset.turns: a conversation's later turns carry the target's answers, which our "
                            "engine's baseline generates; add baseline to methods, or set dataset.turns: 1")
        self.eos = eos_set(self.tokenizer, generation_eos(self.config.target))
        self.pad_id = self.tokenizer.pad_token_id
        self.notes = loading.prompt_notes(self.prompt_set)
        self.numerics = None
        self.context = None

    def generation(self, temperature: float | None, max_new_tokens: int | None = None) -> Generation:
        g = self.config.generation
        sampling = Sampling(False) if temperature is None else Sampling(True, temperature, g.top_k, g.top_p)
        return Generation(max_new_tokens or g.max_new_tokens, sampling, self.eos)

    def batches(self, batch_size: int) -> list[list]:
        """The prompts in batches of batch_size, sliced once per batch size."""
        if batch_size not in self._batches:
            self._batches[batch_size] = batches_of(self.prompt_set.prompts, batch_size)
        return self._batches[batch_size]

    def prompts_of(self, unit: Unit) -> list:
        """The unit's prompts: its batch, or a serving unit's requests (runner/load.py)."""
        if unit.serving:
            return requests_of(self.prompt_set.prompts, self.config.load.requests)
        return self.batches(unit.batch_size)[unit.batch_index]

    def probe_batch(self, comparison: Comparison) -> list:
        """What a comparison's warmup and cost probes run, as a fixed batch: its first batch; a serving
        comparison's first batch_size requests (cycling through the prompts), batch_size being the most that can be
        in flight, min(concurrency, its requests)."""
        return self.prompts_of(Unit(comparison, 0, 0))[:comparison.batch_size]

    def load_of(self, unit: Unit) -> Load | None:
        """A serving unit's requests' arrival times and concurrency (decode/arrivals.py Load); None: a fixed batch."""
        if not unit.serving:
            return None
        return load_of(self.config, unit, self.prompts_of(unit))

    def batch_tensors(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad([p.token_ids for p in batch], self.pad_id, self.device)

    # -- per comparison ---------------------------------------------------------------------------
    def prepare(self, comparison: Comparison, known_costs: CostProbe | None = None) -> Prepared:
        """Warm up every point on this comparison's first batch (a serving comparison's: its first requests, as
        many as can be in flight, as a fixed batch: probe_batch), then measure c and v there (once per comparison)."""
        if comparison in self.prepared:
            return self.prepared[comparison]
        points = points_of(self.config, comparison, engine=HOME_ENGINE)
        self.context.load = None  # the warmup and the probes run a fixed batch
        state = Prepared(points=points, costs=known_costs)
        for point in points:
            reason = skipped_reason(point)
            if reason:
                state.fail(point, "skipped", reason)
        ids, mask = self.batch_tensors(self.probe_batch(comparison))
        compiled = self.compiled_models()
        for model in compiled.values():  # a graph compiled from here to the warmup's end is not a late one
            model.warm = False
        with torch.inference_mode():
            for model in compiled.values():  # compiled before the probes time them, and frozen
                model.precompile(ids, mask)
            quiet_heap()
            if state.costs is None:
                state.costs = self._measure_costs([p for p in points if p not in state.failed], ids, mask, state,
                                                  self.prompt_lengths(comparison))
                if state.costs is not None and comparison.serving and ids.shape[0] > 1:
                    state.fewer_rows = self._one_row_costs(comparison, points, state)
            self.context.costs = state.costs
            self._warm_up(points, state, ids, mask, comparison.temperature)
            for role, model in self.compiled_models().items():
                if role not in compiled:  # early exit's views, built by the warmup
                    model.precompile(ids, mask)
                model.warm = True
        quiet_heap()  # what the compiler and the warmup built stays out of the timed batches' collections
        self.prepared[comparison] = state
        return state

    def prompt_lengths(self, comparison: Comparison) -> list[int]:
        """The lengths in tokens of every prompt the comparison runs (a serving comparison's: its requests')."""
        prompts = self.prompts_of(Unit(comparison, 0, 0)) if comparison.serving else self.prompt_set.prompts
        return [len(p.token_ids) for p in prompts]

    def _probe_costs(self, points, ids, mask, lengths=None, binned: bool = True) -> CostProbe | None:
        """runner/probes.py comparison_costs of the points with rounds, on the batch ids, mask, at the caches of
        prompts of these lengths (binned: one per length bin where they differ widely)."""
        spec_points = [p for p in points if REGISTRY[p.method].has_rounds]
        sampling = self.generation(spec_points[0].temperature).sampling if spec_points else None
        return comparison_costs(self.config, self.target, self.context.drafts, spec_points, ids, mask, self.clock,
                                sampling, lengths, binned)

    def _measure_costs(self, points, ids, mask, state: Prepared, lengths=None) -> CostProbe | None:
        """_probe_costs; where the probes fail (e.g. CUDA out of memory) the points may still run, with no
        prediction, and the cost_model schedule cannot: the notes say so."""
        spec_points = [p for p in points if REGISTRY[p.method].has_rounds]
        try:
            return self._probe_costs(points, ids, mask, lengths)
        except RUNTIME_ERRORS as error:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            where = f"worker {self.worker}, " if self.worker else ""
            state.notes.append(f"{where}batch={ids.shape[0]}: cost probes failed ({type(error).__name__}: "
                               f"{one_line(error)}); the batches {'it' if self.worker else 'this process'} runs get no "
                               "predicted speedup, and the cost_model schedule cannot run there")
            for point in spec_points:
                if point.schedule in REGISTRY[point.method].measured_schedules:
                    state.fail(point, "failed", "cost probes failed: " + one_line(error))
            return None

    def _one_row_costs(self, comparison: Comparison, points, state: Prepared) -> dict:
        """A load point's rows fall to 1 as requests leave and arrive: its costs at 1 row too (its first request), so
        that the replay prices its steps at fewer rows (eval/costs.py: linear in the rows between probed counts).
        {1: CostProbe}; {} where the probe fails (the note says so: the replay then lacks those rows, nothing else)."""
        ids, mask = self.batch_tensors(self.probe_batch(comparison)[:1])
        try:
            # at the same median cache as the full rows' probe: the replay prices fewer rows between the two
            one = self._probe_costs([p for p in points if p not in state.failed], ids, mask,
                                    self.prompt_lengths(comparison), binned=False)
        except RUNTIME_ERRORS as error:
            state.notes.append(f"{comparison.label}: the cost probe at 1 row failed ({type(error).__name__}: "
                               f"{one_line(error)}); the replay prices no step at fewer rows than "
                               f"{comparison.batch_size}")
            return {}
        return {1: one} if one is not None else {}

    def _warm_up(self, points, state: Prepared, ids, mask, temperature) -> None:
        """Each point on the comparison's first batch, on the run's shapes, before any timing."""
        if not self.config.warmup:
            return
        short = self.generation(temperature, min(self.config.generation.max_new_tokens,
                                                 2 * self.config.longest_draft + 2))
        self.context.warming_up = True
        try:
            for point in points:
                if point in state.failed:
                    continue
                for _ in range(self.config.warmup):
                    try:
                        REGISTRY[point.method].run(self.context, point, ids, mask, short,
                                                   torch.Generator(ids.device).manual_seed(0))
                    except RUNTIME_ERRORS as error:
                        state.fail(point, "failed", f"{type(error).__name__}: {one_line(error)}")
                        break
        finally:
            self.context.warming_up = False

    # -- per unit ---------------------------------------------------------------------------------
    def run_unit(self, unit: Unit, done: set[tuple] = frozenset(), on_point=None) -> UnitResult:
        """Every point of the unit's comparison on the unit's batch (a serving unit: its requests, arriving on its
        schedule), back to back, in the unit's order (order_of). done: batch keys already on disk (not rerun).
        on_point(point, outcome): called after each point."""
        self.context.repeat = unit.repeat  # before the warmup too: it reads the repeat's suffix cache
        state = self.prepare(unit.comparison)
        batch = self.prompts_of(unit)
        ids, mask = self.batch_tensors(batch)
        result = UnitResult(failures=list(state.failures), costs=state.costs, fewer_rows=dict(state.fewer_rows),
                            notes=list(state.notes),
                            worker=self.worker)
        points = state.points
        self.context.costs = state.costs
        self.context.load = self.load_of(unit)
        try:
            self._run_points(unit, points, state, batch, ids, mask, result, done, on_point)
        except KeyboardInterrupt as interrupt:  # the points that finished are measured: the executor keeps them
            interrupt.partial = result
            raise
        finally:
            self.context.load = None
        return result

    def _run_points(self, unit: Unit, points, state: Prepared, batch, ids, mask, result: UnitResult, done,
                    on_point) -> None:
        # the drift probe as the unit starts; a load point's also after each point: every method serves the whole
        # load back to back, so the machine can change speed inside one unit, between the baseline and a method
        with torch.inference_mode():
            probe_ids, probe_mask = self.batch_tensors(batch[:unit.batch_size]) if unit.serving else (ids, mask)
            result.drift_probe_s = drift_probe(self.target.model, probe_ids, probe_mask, self.clock)
            for point in order_of(points, unit):
                if point in state.failed or point.key + (unit.repeat, unit.batch_index) in done:
                    continue
                graphs, recorded = self._graphs_compiled(), self._graphs_recorded()
                outcome = self._run_point(point, unit, batch, ids, mask)
                late = ["compiled a graph"] if graphs < self._graphs_compiled() else []
                late += ["recorded a CUDA graph"] if recorded < self._graphs_recorded() else []
                if late and not isinstance(outcome, str):
                    # engine.compile: a graph compiled or captured inside this timed batch; it is now: measure again
                    result.notes.append(f"engine.compile: {point.label} {' and '.join(late)} inside a timed batch "
                                        f"(batch size {unit.batch_size}); that batch was run again")
                    quiet_heap()  # the new graph's objects too
                    outcome = self._run_point(point, unit, batch, ids, mask)
                if not self.energy_meter().available:
                    result.notes.append(f"energy: not measured, so energy_j_per_token is null: {self.energy_meter().why}")
                if isinstance(outcome, str):
                    state.failed.add(point)
                    result.failures.append(failure(point, "failed", outcome))
                else:
                    rows, rate = outcome
                    result.rows.extend(rows)
                    result.rates[point.label] = rate
                if unit.serving:
                    result.drift_after_s.append(drift_probe(self.target.model, probe_ids, probe_mask, self.clock))
                if on_point:
                    on_point(point, outcome)

    def energy_meter(self) -> EnergyMeter:
        """The device's energy counter (runner/energy.py), opened at the first timed batch."""
        if getattr(self, "_energy", None) is None:
            self._energy = EnergyMeter(self.device)
        return self._energy

    def _run_point(self, point: Point, unit: Unit, batch, ids, mask) -> tuple[list[dict], float] | str:
        """Run one point on one batch; returns its records and tok/s, or the error text."""
        import os

        seed = self.config.seed * 1_000_003 + unit.batch_index * 101 + unit.repeat
        generator = torch.Generator(self.device).manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            if os.environ.get("SPECULATE_INJECT_FAILURE") == point.label:  # fault injection for the tests
                raise RuntimeError("injected failure")
            before = self.energy_meter().read()  # the batch's (a load point's span's) joules: energy_j
            records = REGISTRY[point.method].run(self.context, point, ids, mask, self.generation(point.temperature),
                                                 generator)
            energy = self.energy_meter().spent(before)
        except torch.cuda.OutOfMemoryError as error:
            torch.cuda.empty_cache()
            return "CUDA out of memory: " + one_line(error)
        except RUNTIME_ERRORS as error:
            return f"{type(error).__name__}: {one_line(error)}"
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        per_round = REGISTRY[point.method].has_rounds
        rows = [record_of(point, unit, prompt, record, self.tokenizer, self.config.dataset.preset, per_round, len(batch),
                          peak, self.worker, energy_j=energy, **request_fields(self.context.load, index))
                for index, (prompt, record) in enumerate(zip(batch, records))]
        # a served load point's span: from its start to its last token (eval's span); a batch's: its longest row
        wall = max(r.finish_s for r in records) if unit.serving else max(r.latency_s for r in records)
        return rows, (sum(r.new_tokens for r in records) / wall if wall > 0 else 0.0)
