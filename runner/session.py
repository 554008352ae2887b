"""One process's models, prompts and settings, and how it runs a unit of work.

The single-process runner and every Ray worker hold one Session each: load once, then `prepare` a
(batch size, temperature) comparison (warm-up, cost probes) and `run_unit` for each batch assigned to
it. A Session returns records and events; it never writes the report folder.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import torch

from decode import Clock, Generation, Sampling, check_vocab_compatible
from decode.methods import REGISTRY, RunContext
from decode.vocab import VocabMismatch
from eval.records import CostProbe, Point, SampleRecord
from runner.attention import settle_attention
from decode.serving import Load
from runner.load import requests_of, schedule_of
from runner.plan import Unit, batches_of, comparisons, order_of, points_of, skipped_reason
from runner.probes import PROCESS, drift_probe, measure_costs, verify_widths
from utils import UserError
from utils.data import load_prompts
from utils.models import check_exit_layers, load_model, model_devices, release_file_mappings

# errors of a point at run time (the point fails, the sweep goes on); anything else is a bug
RUNTIME_ERRORS = (RuntimeError, FloatingPointError, ValueError, IndexError)
# the numerics probe of a bf16 or quantized model verifies M = gamma + 1 tokens for each gamma up to this (a wider
# gamma probes M = 17): each width costs a prefill and a verification of the probe's two short prompts
MAX_PROBED_GAMMA = 16


@dataclass
class UnitResult:
    rows: list[dict] = field(default_factory=list)  # records of every point that finished this batch
    failures: list[dict] = field(default_factory=list)  # {point axes, status, error}
    rates: dict = field(default_factory=dict)  # point label -> tok/s on this batch
    drift_probe_s: float | None = None
    costs: CostProbe | None = None  # the comparison's measured costs (sent with every unit; kept once per process)
    notes: list[str] = field(default_factory=list)
    worker: str | None = None
    process: str = PROCESS
    probe_process: str | None = None  # drift_probe_s measured elsewhere than `process` (a vLLM engine): keyed by this
    probe_name: str | None = None  # ... and named so in the report


def apply_engine(config, loaded) -> str:
    """Swap in the CPU linear kernels the config asks for; returns what was done, for the notes."""
    from utils.cpu_linear import pack_linears, usable

    if config.engine.compile:  # inductor compiles nn.Linear; it cannot lower oneDNN's packed weights
        return "nn.Linear, compiled"
    if config.engine.cpu_linear == "default" or loaded.quantization != "none" or not usable(loaded.model):
        return "nn.Linear"
    count = pack_linears(loaded.model, config.engine.pack_batch_hint)
    return f"oneDNN prepacked linear x{count} (batch hint {config.engine.pack_batch_hint})"


def left_pad(token_lists: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids, mask [B, P], left padded."""
    width = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return ids.to(device), mask.to(device)


def eos_ids(tokenizer, model) -> tuple[int, ...]:
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return tuple(sorted(eos))


def serving_fields(record) -> dict:
    """A served request's times (decode/serving.py): arrival, admission, first and last token, its emissions."""
    if getattr(record, "arrival_s", None) is None:
        return {}
    return {"arrival_s": record.arrival_s, "admitted_s": record.admitted_s, "first_token_s": record.first_token_s,
            "finish_s": record.finish_s, "emits": [list(e) for e in record.emits]}


def failure(point: Point, status: str, error: str) -> dict:
    return {**asdict(point), "status": status, "error": error}


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


class Session:
    def __init__(self, config, device: torch.device, worker: str | None = None, status=None):
        self.config, self.device, self.worker = config, device, worker
        self._status = status  # a context-manager factory showing what loads (rich), or None
        self.clock = Clock(device)  # replaced at load by one that syncs every device the models use
        self.prepared: dict[tuple, dict] = {}  # comparison -> {"failed": set of points, "costs": {...}}
        self.notes: list[str] = []

    # -- loading ----------------------------------------------------------------------------------
    def _loading(self, what: str):
        import contextlib

        return self._status(f"loading {what}") if self._status else contextlib.nullcontext()

    def load(self) -> None:
        self._released = False
        config = self.config
        torch.manual_seed(config.seed)
        if not any(REGISTRY[m].engine == "ours" for m in config.methods):
            return self.load_prompts_only()
        with self._loading("target model"):
            self.target = load_model(config.target, self.device, "target")
        check_exit_layers(config, self.target.model.config)  # a depth not readable before loading
        self.drafts = {}
        for index, draft_config in enumerate(config.draft):
            role = "draft" if len(config.draft) == 1 else f"draft[{index}]"
            if not any(REGISTRY[m].needs_draft and REGISTRY[m].engine == "ours" and draft_config.kind in
                       REGISTRY[m].draft_kinds for m in config.methods):
                continue  # a draft no method of this engine uses is not loaded (vLLM loads its own)
            with self._loading(f"draft model {draft_config.name}"):
                draft = load_model(draft_config, self.device, role)
            try:
                check_vocab_compatible(self.target.tokenizer, draft.tokenizer, self.target.vocab_size, draft.vocab_size)
            except VocabMismatch as error:
                raise UserError(f"{role}.model: {error}") from None
            self.drafts[draft_config.name] = draft
        for loaded in [self.target, *self.drafts.values()]:
            loaded.kernels = apply_engine(config, loaded)
            release_file_mappings(loaded.model)  # weights in memory of their own: the mmap'd files close
        devices = {d for loaded in [self.target, *self.drafts.values()] for d in model_devices(loaded.model)}
        others = tuple(sorted((d for d in devices if d.type == "cuda" and d != self.device), key=str))
        if others:  # a model split over several GPUs: every clock read synchronises all of them
            self.clock = Clock(self.device, extra_devices=others)
        for loaded in [self.target, *self.drafts.values()]:  # attn_implementation auto, where it has a choice
            settle_attention(loaded, max(config.batch_size), max(config.speculative.gamma) + 1, self.clock)
        self._check_trees()
        self.tokenizer = self.target.tokenizer
        self.prompt_set = load_prompts(config.dataset, self.tokenizer)
        self.eos = eos_ids(self.tokenizer, self.target.model)
        self.pad_id = self.tokenizer.pad_token_id
        self._refuse_ragged_batches_if_wrong()
        compile_note = self._compile_models() if config.engine.compile else None
        self.notes = self._notes() + ([compile_note] if compile_note else [])
        self.numerics = self._probe_numerics()
        self.context = RunContext(target=self.target.model, tokenizer=self.tokenizer,
                                  drafts={label: d.model for label, d in self.drafts.items()},
                                  target_vocab_size=self.target.vocab_size, pad_id=self.pad_id, clock=self.clock,
                                  options=config.speculative.model_dump())

    def _check_trees(self) -> None:
        """speculative.tree: the models must take a tree mask (decode/kv.py tree_support_problem); flash-attn 2 that
        attn_implementation auto picked gives way to sdpa, as in the compiled mode."""
        from decode.kv import tree_support_problem

        if all(label is None for label in getattr(self.config.speculative, "tree", [None])):
            return
        for role, loaded in [("target", self.target)] + [(f"draft {label}", d) for label, d in self.drafts.items()]:
            if loaded.attn_implementation == "flash_attention_2" and self.config_attention(role) == "auto":
                loaded.model.set_attn_implementation("sdpa")
                loaded.attn_implementation = "sdpa"
            problem = tree_support_problem(loaded.model)
            if problem:
                raise UserError(f"{role} {loaded.source}: {problem}")

    def config_attention(self, role: str) -> str:
        """The attn_implementation the config asked for a role ("target", "draft <label>")."""
        if role == "target":
            return self.config.target.attn_implementation
        label = role.split(" ", 1)[1]
        return next(d.attn_implementation for d in self.config.draft if d.name == label)

    def _compile_models(self) -> str:
        """engine.compile: each model gets static buffers sized for this run and a compiled step per width it uses
        (decode/compile_plan.py compile_widths: the target 1, gamma + 1 and its trees' n + 1; a draft 1 and 2 and its
        tree forwards)."""
        from decode.compile_plan import compile_widths
        from decode.static_kv import CompiledModel, CompileRefused, attach
        from runner.probes import AUTO_TREE_NODES

        config = self.config
        points = [p for c in comparisons(config, 1) for p in points_of(config, *c, engine="ours")]
        plan = compile_widths(points, config.speculative.tree_top_k, AUTO_TREE_NODES)
        longest = max(len(p.token_ids) for p in self.prompt_set.prompts)
        # a row holds its prompt and its new tokens, plus one round's columns beyond them; the cost_model schedule's
        # draft prefill probe feeds the prompt twice (runner/probes.py draft_prefill_cost). Rounded up to 64
        needed = longest + config.generation.max_new_tokens + plan["round"] + 1
        if any(p.schedule == "cost_model" for p in points):
            needed = max(needed, 2 * longest)
        max_length = -(-needed // 64) * 64
        mode = None if config.engine.compile_mode == "auto" else config.engine.compile_mode
        for role, loaded in [("target", self.target)] + [(f"draft {label}", d) for label, d in self.drafts.items()]:
            if loaded.attn_implementation == "flash_attention_2":  # auto picked it; the compiled mode builds masks
                loaded.model.set_attn_implementation("sdpa")
                loaded.attn_implementation = "sdpa"
            steps, trees = plan["target"] if role == "target" else plan["drafts"].get(role.split(" ", 1)[1], ((1,), ()))
            try:
                compiled = CompiledModel(loaded.model, steps, max_length, tuple(config.batch_size), mode,
                                         config.engine.compile_backend, trees)
            except CompileRefused as error:
                raise UserError(f"{role} {loaded.source}: {error}") from None
            attach(loaded.model, compiled)
        widths = "; ".join(f"{role} {list(compiled_of_role.step_widths)}"
                           + (f", trees {list(compiled_of_role.tree_widths)}" if compiled_of_role.tree_widths else "")
                           for role, compiled_of_role in self.compiled_models().items())
        return (f"engine.compile: static KV caches of {max_length} columns, a graph per step width ({widths}) and "
                f"batch size (torch.compile, backend {config.engine.compile_backend}, mode {compiled.mode}), compiled "
                "in each comparison's probes and warmup; a step of fewer tokens runs padded to the next width")

    def compiled_models(self) -> dict:
        """role -> the CompiledModel of each loaded model (engine.compile), for warm flags and the report."""
        from decode.static_kv import compiled_of

        if not self.config.engine.compile or self.target is None:
            return {}
        loaded = [("target", self.target)] + [(label, d) for label, d in self.drafts.items()]
        compiled = {role: compiled_of(m.model) for role, m in loaded if compiled_of(m.model) is not None}
        for role, model in list(compiled.items()):  # early exit's views of the target
            for index, view in enumerate(model.views):
                compiled[f"{role} view {index}"] = view
        return compiled

    def _graphs_compiled(self) -> int:
        return sum(model.compiles for model in self.compiled_models().values())

    def _graphs_recorded(self) -> int:
        """CUDA graphs captured so far (cudagraph trees; 0 without CUDA graphs, or where torch cannot tell)."""
        return sum(model.recordings or 0 for model in self.compiled_models().values())

    @property
    def released(self) -> bool:
        return getattr(self, "_released", False)

    def release_models(self) -> None:
        """Drop the models (vLLM runs next and needs the memory); run_unit's caller reloads them (load) if units of
        our engine come after. Prompts and tokenizer stay. On CUDA the caching allocator's blocks go back to the device
        (and, with engine.compile, the CUDA graphs' memory pools with dynamo's caches), so that what another engine
        reads as free memory is free."""
        import gc

        self.target, self.drafts, self.context = None, {}, None
        self.prepared.clear()  # a reload warms up and measures again
        self._released = True
        if self.config.engine.compile:  # the compiled graphs hold the models' buffers (and CUDA graph pools)
            torch._dynamo.reset()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def load_prompts_only(self) -> None:
        """Every method runs in vLLM: the tokenizer and the prompts, no model (vLLM loads its own)."""
        from utils.models import generation_eos, load_tokenizer

        with self._loading("tokenizer"):
            self.tokenizer = load_tokenizer(self.config.target, "target")
        self.target, self.drafts = None, {}
        self.prompt_set = load_prompts(self.config.dataset, self.tokenizer)
        eos = set(generation_eos(self.config.target))
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos = tuple(sorted(eos))
        self.pad_id = self.tokenizer.pad_token_id
        self.notes = list(self._prompt_notes())
        self.numerics = None
        self.context = None

    def _refuse_ragged_batches_if_wrong(self) -> None:
        """A model whose position bias follows cache slots (ALiBi from slot indices) decodes a left-padded
        row wrongly, silently: probe it once at load, and refuse batches of several prompts for it."""
        if max(self.config.batch_size) == 1:
            return
        from decode.probes import ragged_batch_problem

        for role, loaded in [("target", self.target)] + [(f"draft {label}", d) for label, d in self.drafts.items()]:
            with torch.inference_mode():
                problem = ragged_batch_problem(loaded.model)
            if problem:
                raise UserError(f"batch_size: {role} {loaded.source}: {problem}")

    def _notes(self) -> list[str]:
        loaded = [("target", self.target)] + [(f"draft {label}", d) for label, d in self.drafts.items()]
        notes = [f"{role}: {m.source} ({m.dtype}, {m.attn_implementation}, quantization {m.quantization}, {m.kernels})"
                 for role, m in loaded]
        notes += [f"{role}: attention {m.attention_note}" for role, m in loaded if m.attention_note]
        notes += self._prompt_notes()
        if any(not REGISTRY[m].per_row_timing and REGISTRY[m].engine == "ours" for m in self.config.methods):
            notes.append("transformers' peers (hf_*): one wall time per batch (per-row latency = batch time), "
                         "no TTFT or forward counts")
        return notes

    def _prompt_notes(self) -> list[str]:
        notes = []
        if self.prompt_set.guessed_field:
            notes.append(f"dataset: no prompt_field given; the prompts are the '{self.prompt_set.field_name}' column "
                         f"(the one common prompt name among the fields {', '.join(self.prompt_set.fields)})")
        notes.extend(self.prompt_set.notes)
        return notes

    def _probe_numerics(self) -> dict:
        """Per model: how far one multi-token forward is from the same tokens fed one by one, and a row in
        a ragged batch from the row alone. Greedy exactness rests on these being tiny (fp32); in bf16 or with
        quantized kernels they are not, and the report weighs each greedy mismatch against them (eval/flags.py).
        A quantized or non-fp32 model is probed at every verify width M the run uses (its kernels may take
        another path at another M: a chain's gamma + 1, a tree's nodes + 1), a quantized one also at M = 1 (a
        batch-1 baseline's kernel); fp32 unquantized once, at M = 5. With engine.compile the probe runs the
        compiled step (decode/probes.py), on at most the run's largest batch size of prompts."""
        from decode.probes import numerics_probe

        prompts = [p.token_ids for p in self.prompt_set.prompts[:2]]
        if len(prompts) == 1 or len(prompts[0]) == len(prompts[1]):  # make the batch ragged
            prompts = [prompts[0], prompts[0][: max(1, len(prompts[0]) // 2)]]
        if self.config.engine.compile:  # the compiled step's buffers hold at most the largest batch size
            prompts = prompts[:max(self.config.batch_size)]
        ids, mask = left_pad(prompts, self.pad_id, self.device)
        result = {"drafts": {}}
        with torch.inference_mode():
            for role, loaded in [("target", self.target)] + [(label, d) for label, d in self.drafts.items()]:
                try:
                    probe = numerics_probe(loaded.model, ids, mask, self._probe_widths(loaded),
                                           single_steps=loaded.quantization != "none")
                except RUNTIME_ERRORS as error:
                    probe = {"error": one_line(error)}
                for key, value in list(probe.items()):  # NaN logits (broken weights) give no difference to report
                    if isinstance(value, dict):  # the readings per verify width
                        probe[key] = {width: None if diff != diff else diff for width, diff in value.items()}
                    elif isinstance(value, float) and value != value:
                        probe[key] = None
                        probe["error"] = "the model returned NaN logits"
                probe.update(dtype=loaded.dtype, quantization=loaded.quantization)
                if role == "target":
                    result["target"] = probe
                else:
                    result["drafts"][role] = probe
        return result

    def _probe_widths(self, loaded) -> tuple[int, ...]:
        """The verify widths of the run's speculative points for a quantized or non-fp32 model: M = gamma + 1 of a
        chain (gamma capped at MAX_PROBED_GAMMA), nodes + 1 of a tree (runner/probes.py verify_widths). fp32
        unquantized drifts ~1e-5 at any M, far below a gap that a flip needs: one probe, M = 5."""
        if loaded.quantization == "none" and loaded.dtype == "float32":
            return (5,)
        config = self.config
        points = [p for c in comparisons(config, 1) for p in points_of(config, *c, engine="ours")
                  if REGISTRY[p.method].has_rounds and p.gamma]
        trees = [p for p in points if getattr(p, "tree", None) is not None]
        widths = {min(gamma, MAX_PROBED_GAMMA) + 1 for gamma in config.speculative.gamma} | verify_widths(trees)
        return tuple(sorted(widths))

    def generation(self, temperature: float | None, max_new_tokens: int | None = None) -> Generation:
        g = self.config.generation
        sampling = Sampling(False) if temperature is None else Sampling(True, temperature, g.top_k, g.top_p)
        return Generation(max_new_tokens or g.max_new_tokens, sampling, self.eos)

    def batches(self, batch_size: int) -> list[list]:
        return batches_of(self.prompt_set.prompts, batch_size)

    def prompts_of(self, unit: Unit) -> list:
        """The unit's prompts: its batch, or a serving unit's requests (runner/load.py)."""
        if unit.serving:
            return requests_of(self.prompt_set.prompts, self.config.load.requests)
        return self.batches(unit.batch_size)[unit.batch_index]

    def load_of(self, unit: Unit) -> Load | None:
        """A serving unit's requests' arrival times and concurrency (decode/serving.py Load); None: a fixed batch."""
        if not unit.serving:
            return None
        return Load(schedule_of(self.config, unit, len(self.prompt_set.prompts)), unit.concurrency)

    def batch_tensors(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad([p.token_ids for p in batch], self.pad_id, self.device)

    # -- per comparison ---------------------------------------------------------------------------
    def prepare(self, comparison: tuple, known_costs: CostProbe | None = None) -> dict:
        """Warm up every point on this comparison's first batch (a serving comparison's: its first `concurrency`
        requests), then measure c and v there (once per comparison). Returns {"failures": [...], "costs": {...} or
        None, "notes": [...]}."""
        key = comparison
        if key in self.prepared:
            return self.prepared[key]
        batch_size, temperature = comparison[:2]
        points = points_of(self.config, *comparison, engine="ours")
        self.context.load = None  # the warmup and the probes run a fixed batch
        state = {"failed": set(), "failures": [], "costs": known_costs, "notes": []}
        for point in points:
            reason = skipped_reason(point)
            if reason:
                state["failed"].add(point)
                state["failures"].append(failure(point, "skipped", reason))
        ids, mask = self.batch_tensors(self.batches(batch_size)[0])
        compiled = self.compiled_models().values()
        for model in compiled:  # this comparison's shapes compile in its probes and warmup, not after
            model.warm = False
        with torch.inference_mode():
            if state["costs"] is None:
                state["costs"] = self._measure_costs(points, ids, mask, state)
            self.context.costs = state["costs"]
            self._warm_up(points, state, ids, mask, temperature)
            compiled = self.compiled_models().values()  # the warmup may have built early exit's views
            for model in compiled:
                model.precompile(ids, mask)
                model.warm = True
        self.prepared[key] = state
        return state

    def _measure_costs(self, points, ids, mask, state) -> dict | None:
        spec_points = [p for p in points if REGISTRY[p.method].has_rounds and p not in state["failed"]]
        if not spec_points:
            return None
        gammas = sorted({p.gamma for p in spec_points if p.gamma})
        widths = verify_widths(spec_points)  # gamma + 1 of a chain, nodes + 1 of a tree
        cost_model = any(p.schedule == "cost_model" for p in spec_points)
        if cost_model:  # it picks any draft length up to gamma, and weighs the draft's prefill
            widths |= set(range(2, max(gammas) + 2))
        hybrid = [p.gamma for p in spec_points if p.method == "hybrid"]
        if hybrid:  # hybrid picks any chain up to gamma, or a tree of two chains up to 2 gamma nodes (timed as chains)
            widths |= set(range(2, 2 * max(hybrid) + 2))
        try:
            if os.environ.get("SPECULATE_INJECT_FAILURE") == "costs":  # fault injection for the tests
                raise RuntimeError("injected failure in the cost probes")
            chains = verify_widths([p for p in spec_points if getattr(p, "tree", None) is None])
            if cost_model:
                chains |= set(range(2, max(gammas) + 2))
            if hybrid:
                chains |= set(range(2, 2 * max(hybrid) + 2))
            # each step timed as the run executes it, at the mean cache of decoding (the prompt + max_new_tokens / 2)
            return measure_costs(self.target.model, self.context.drafts, ids, mask, sorted(widths), self.clock,
                                 draft_prefill=cost_model, tree_widths=widths - chains,
                                 sampling=self.generation(spec_points[0].temperature).sampling,
                                 context=self.config.generation.max_new_tokens // 2,
                                 target_vocab_size=self.target.vocab_size)
        except RUNTIME_ERRORS as error:  # e.g. CUDA out of memory: the points may still run; no prediction
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            where = f"worker {self.worker}, " if self.worker else ""
            state["notes"].append(f"{where}batch={ids.shape[0]}: cost probes failed ({type(error).__name__}: "
                                  f"{one_line(error)}); the batches {'it' if self.worker else 'this process'} runs get no predicted "
                                  "speedup, and the cost_model schedule cannot run there")
            for point in spec_points:
                if point.schedule == "cost_model":
                    state["failed"].add(point)
                    state["failures"].append(failure(point, "failed", "cost probes failed: " + one_line(error)))
            return None

    def _warm_up(self, points, state, ids, mask, temperature) -> None:
        """Each point on the comparison's first batch, on the run's shapes, before any timing."""
        if not self.config.warmup:
            return
        short = self.generation(temperature, min(self.config.generation.max_new_tokens,
                                                 2 * max(self.config.speculative.gamma) + 2))
        self.context.warming_up = True
        try:
            for point in points:
                if point in state["failed"]:
                    continue
                for _ in range(self.config.warmup):
                    try:
                        REGISTRY[point.method].run(self.context, point, ids, mask, short,
                                                   torch.Generator(ids.device).manual_seed(0))
                    except RUNTIME_ERRORS as error:
                        state["failed"].add(point)
                        state["failures"].append(failure(point, "failed", f"{type(error).__name__}: {one_line(error)}"))
                        break
        finally:
            self.context.warming_up = False

    # -- per unit ---------------------------------------------------------------------------------
    def run_unit(self, unit: Unit, done: set[tuple] = frozenset(), on_point=None) -> UnitResult:
        """Every point of the unit's comparison on the unit's batch, back to back, in the unit's order (order_of).
        done: batch keys already on disk (not rerun). on_point(point, rate): called after each point."""
        state = self.prepare(unit.comparison)
        batch = self.prompts_of(unit)
        ids, mask = self.batch_tensors(batch)
        result = UnitResult(failures=list(state["failures"]), costs=state["costs"], notes=list(state["notes"]),
                            worker=self.worker)
        points = points_of(self.config, *unit.comparison, engine="ours")
        self.context.costs = state["costs"]
        self.context.load = self.load_of(unit)
        try:
            self._run_points(unit, points, state, batch, ids, mask, result, done, on_point)
        except KeyboardInterrupt as interrupt:  # the points that finished are measured: the executor keeps them
            interrupt.partial = result
            raise
        finally:
            self.context.load = None
        return result

    def _run_points(self, unit: Unit, points, state, batch, ids, mask, result: UnitResult, done, on_point) -> None:
        with torch.inference_mode():
            probe_ids, probe_mask = self.batch_tensors(batch[:unit.batch_size]) if unit.serving else (ids, mask)
            result.drift_probe_s = drift_probe(self.target.model, probe_ids, probe_mask, self.clock)
            for point in order_of(points, unit):
                if point in state["failed"] or point.key + (unit.repeat, unit.batch_index) in done:
                    continue
                graphs, recorded = self._graphs_compiled(), self._graphs_recorded()
                outcome = self._run_point(point, unit, batch, ids, mask)
                late = ["compiled a graph"] if graphs < self._graphs_compiled() else []
                late += ["recorded a CUDA graph"] if recorded < self._graphs_recorded() else []
                if late and not isinstance(outcome, str):
                    # engine.compile: a graph compiled or captured inside this timed batch; it is now: measure again
                    result.notes.append(f"engine.compile: {point.label} {' and '.join(late)} inside a timed batch "
                                        f"(batch size {unit.batch_size}); that batch was run again")
                    outcome = self._run_point(point, unit, batch, ids, mask)
                if isinstance(outcome, str):
                    state["failed"].add(point)
                    result.failures.append(failure(point, "failed", outcome))
                else:
                    rows, rate = outcome
                    result.rows.extend(rows)
                    result.rates[point.label] = rate
                if on_point:
                    on_point(point, outcome)

    def _run_point(self, point: Point, unit: Unit, batch, ids, mask) -> tuple[list[dict], float] | str:
        """Run one point on one batch; returns its records and tok/s, or the error text."""
        seed = self.config.seed * 1_000_003 + unit.batch_index * 101 + unit.repeat
        generator = torch.Generator(self.device).manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            if os.environ.get("SPECULATE_INJECT_FAILURE") == point.label:  # fault injection for the tests
                raise RuntimeError("injected failure")
            records = REGISTRY[point.method].run(self.context, point, ids, mask, self.generation(point.temperature),
                                                 generator)
        except torch.cuda.OutOfMemoryError as error:
            torch.cuda.empty_cache()
            return "CUDA out of memory: " + one_line(error)
        except RUNTIME_ERRORS as error:
            return f"{type(error).__name__}: {one_line(error)}"
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        rows = []
        for prompt, record in zip(batch, records):
            prefill = record.prefill_s
            rows.append(SampleRecord(
                **asdict(point), sample_id=prompt.sample_id, repeat=unit.repeat, batch_index=unit.batch_index,
                batch_rows=len(batch), group=prompt.group, prompt_tokens=len(prompt.token_ids),
                preset=self.config.dataset.preset, reference=prompt.reference, output_ids=record.output_ids,
                output_text=self.tokenizer.decode(record.output_ids, skip_special_tokens=True),
                new_tokens=record.new_tokens, stop_reason=record.stop_reason, latency_s=record.latency_s,
                prefill_s=None if prefill is None or prefill != prefill else prefill,
                target_forwards=record.target_forwards, draft_forwards=record.draft_forwards,
                target_s=record.target_s, draft_s=record.draft_s, draft_prefill_s=record.draft_prefill_s,
                rounds=record.rounds if REGISTRY[point.method].has_rounds else None, peak_memory_bytes=peak,
                top2_gaps=[float(f"{gap:.4g}") for gap in record.top2_gaps] or None,
                worker=self.worker, process=PROCESS, **serving_fields(record)).to_json())
        wall = max(r.latency_s for r in records)
        return rows, (sum(r.new_tokens for r in records) / wall if wall > 0 else 0.0)
