"""A lent GPU's minutes in one planned command: every figure of the GPU goal table, measured in one process, the
table printed last, its records written (docs/gpu.md).

    python benchmarks/gpu_session.py OUT_DIR                # on the GPU machine, from the repository root
    python benchmarks/gpu_session.py --plan                 # the steps and their budgets, then exit
    python benchmarks/gpu_session.py OUT_DIR --dry-run      # every step's code path on the CPU, tiny shapes, seconds

Each step has a budget (STEPS); together they are at most TOTAL_S (480 s: 8 minutes). A step starts only where its
budget fits in what is left of the total (else it is skipped and says so), and is interrupted at its budget (a timer
signal: the rest of its figures are left unmeasured, and its row says so). The models are built and captured
(`engine.compile: cudagraphs`) on first need, so any step runs without the ones before it; `capture` does it first.
The timings run before the `rounds` step, whose profiler session leaves later launches slower (runner/probes.py).

Out: OUT_DIR/records.json (each step's status, seconds, budget and figures), OUT_DIR/goals.json (the goal table's
rows: figure, measured value, its interval where it has one, goal, status), OUT_DIR/goals.md (the table as printed);
strict JSON. The dry run also checks the round counters (host reads a round, the rounds' busy-share readings, the
capture counters) and exits 1 where one is off; on a GPU a FAIL row does not change the exit code, a step that
raised does (1).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import signal
import sys
import time
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.fake_cuda import fake_cuda  # noqa: E402
from utils.versions import installed_versions  # noqa: E402

TOTAL_S = 480
LIBRARIES = ("torch", "transformers", "accelerate", "bitsandbytes", "nvidia-ml-py", "numpy")
GAMMA, ACCEPTANCE = 4, 0.8


@dataclass(frozen=True)
class Step:
    name: str
    budget_s: int
    what: str


STEPS = (
    Step("env", 10, "library versions, the device, NVML's energy counter"),
    Step("bandwidth", 15, "device-to-device copy bandwidth (bytes read + written a second): the bytes floors' rate"),
    Step("capture", 100, "target and draft shapes captured (compile: cudagraphs) at every batch capacity and width"),
    Step("floor", 20, "the baseline's 1-token step at batch 1 against its bytes floor (weights + KV read / bandwidth)"),
    Step("speculative", 95, "baseline and speculative at a set acceptance, gamma 4, each batch size; energy at "
                            "batch 1; the step table; each point against its replay"),
    Step("eagle3", 40, "an EAGLE-3 head of the target shape at the set acceptance, batch 1"),
    Step("served", 70, "served at each concurrency, baseline and speculative (overlap on and off where the engine "
                       "has the switch); energy at the highest"),
    Step("nf4", 45, "the pair in bitsandbytes nf4: step against its bytes floor, speculative at the set acceptance"),
    Step("hf", 60, "transformers' static cache + compiled generate, and its assisted generation, batch 1"),
    Step("rounds", 20, "host reads a round (counted), the GPU's busy share inside rounds (profiler kernels)"),
    Step("table", 5, "the capture total, the crossover, the goal table (printed last)"),
)


@dataclass(frozen=True)
class Goal:
    key: str
    figure: str
    goal: str
    step: str
    test: tuple = ()  # ("max", x) | ("min", x) | ("eq", x) | ("range", lo, hi); empty: measured only


GOALS = (
    Goal("floor", "target shape, batch 1: baseline step / bytes floor", "<= 1.3", "floor", ("max", 1.3)),
    Goal("reads", "host round-trips a round", "1", "rounds", ("eq", 1)),
    Goal("busy", "GPU busy share inside rounds", ">= 90%", "rounds", ("min", 0.9)),
    Goal("spec_b1", "speculative / baseline, acceptance 0.8, gamma 4, batch 1: draft model", ">= 1.6x", "speculative",
         ("min", 1.6)),
    Goal("eagle3_b1", "the same, an EAGLE-3 head of the target shape", ">= 2.3x", "eagle3", ("min", 2.3)),
    Goal("spec_b8", "the same, draft model, batch 8 (dry run: 2)", "measured", "speculative"),
    Goal("spec_b32", "the same, draft model, batch 32 (dry run: 4)", "measured", "speculative"),
    Goal("served_c1", "served at concurrency 1, overlap off", "measured", "served"),
    Goal("served_c8", "served at concurrency 8 (dry run: 2), overlap off", "measured", "served"),
    Goal("served_c32", "served at concurrency 32 (dry run: 4), overlap off", "measured", "served"),
    Goal("served_overlap", "served, overlap on, highest concurrency", "measured", "served"),
    Goal("crossover", "first batch / concurrency where speculation stops paying", "measured", "table"),
    Goal("nf4_floor", "nf4 pair: target step / bytes floor", "<= 1.6", "nf4", ("max", 1.6)),
    Goal("nf4_spec", "nf4 pair: speculative / baseline at acceptance 0.8", ">= 1.4x", "nf4", ("min", 1.4)),
    Goal("replay", "measured / replayed, the points' extremes", "within [0.95, 1.05]", "speculative",
         ("range", 0.95, 1.05)),
    Goal("hf_baseline", "ours / transformers' static cache + compiled generate", ">= 1.0", "hf", ("min", 1.0)),
    Goal("hf_assisted", "ours / transformers' assisted generation", ">= 1.5", "hf", ("min", 1.5)),
    Goal("energy_b1", "J per output token, speculative / baseline, batch 1", "with its interval", "speculative"),
    Goal("energy_c32", "J per output token, speculative / baseline, highest concurrency", "with its interval",
         "served"),
    Goal("capture_s", "capture seconds, all steps of the run", "<= 120", "table", ("max", 120)),
)


@dataclass(frozen=True)
class Shapes:
    """What a session runs: the full mission shapes on a GPU, tiny ones for the CPU dry run."""
    target: str
    draft: str
    dtype: torch.dtype
    prompt_tokens: int
    new_tokens: int
    batch1_prompts: int  # batch 1: each prompt its own batch (the interval is over prompts)
    batches: tuple[int, ...]
    concurrency: tuple[int, ...]
    copy_bytes: int
    reps: int


FULL = Shapes("synthetic:qwen3-4b", "synthetic:qwen3-0.6b", torch.bfloat16, 64, 64, 8, (1, 8, 32), (1, 8, 32),
              1 << 30, 20)
DRY = Shapes("synthetic:qwen3-tiny", "synthetic:qwen3-tiny?layers=1", torch.float32, 8, 8, 2, (1, 2, 4), (1, 2, 4),
             8 << 20, 3)


class StepOverrun(Exception):
    """A step ran to its budget: the timer's signal interrupts it."""


class Skip(Exception):
    """A step (or one of its figures) that cannot run here: the message says why."""


# -- small helpers -----------------------------------------------------------------------------------------------------
def finite(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def strict(obj):
    """JSON-safe: NaN and infinities as null, tuples as lists, numbers rounded to 6 significant digits."""
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.6g}") if math.isfinite(obj) else None
    return obj


def write_json(path: Path, payload) -> None:
    path.write_text(json.dumps(strict(payload), indent=1, allow_nan=False) + "\n")


def verdict(goal: Goal, value) -> str:
    """pass / FAIL against the goal's test, 'measured' for a row without one."""
    if not goal.test:
        return "measured"
    kind, *bounds = goal.test
    ok = {"max": lambda v: v <= bounds[0], "min": lambda v: v >= bounds[0], "eq": lambda v: v == bounds[0],
          "range": lambda v: bounds[0] <= v <= bounds[1]}[kind](value)
    return "pass" if ok else "FAIL"


def plan_text(total_s: int = TOTAL_S) -> str:
    lines = [f"{'step':<12} {'budget':>7}  what", *(f"{s.name:<12} {s.budget_s:>6}s  {s.what}" for s in STEPS),
             f"{'total':<12} {sum(s.budget_s for s in STEPS):>6}s  of at most {total_s} s", "", "goal rows (step):"]
    lines += [f"  {g.key:<15} {g.step:<12} {g.figure} [{g.goal}]" for g in GOALS]
    return "\n".join(lines)


# -- the device's counters ------------------------------------------------------------------------------------------
class Energy:
    """NVML's energy counter (nvidia-ml-py: nvmlDeviceGetTotalEnergyConsumption, millijoules since the driver loaded)
    read around a window; `why` says why there is none (no CUDA device, no nvidia-ml-py, a GPU without it)."""

    def __init__(self, device: torch.device):
        self.handle, self.why = None, None
        if device.type != "cuda":
            self.why = "no CUDA device: no energy counter"
            return
        try:
            import pynvml
        except ImportError:
            self.why = "nvidia-ml-py absent: carry its wheel (docs/gpu.md)"
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.nvml = pynvml
        except Exception as error:  # NVMLError_NotSupported and kin: a GPU or driver without the counter
            self.handle, self.why = None, f"NVML has no energy counter here ({type(error).__name__})"

    def read(self) -> float | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn, reps: int) -> float:
    """Seconds per call of fn, reps calls after one untimed; the device's queue drained on both sides."""
    fn()
    sync(device)
    began = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - began) / reps


# -- host reads a round: dispatch-level counting (tests/decode/test_host_syncs.py's rule) ------------------------------
READ_OPS = ("_local_scalar_dense", "is_nonzero", "nonzero", "masked_select", "_unique2", "unique_consecutive",
            "unique_dim")


def _from_host_to_device() -> bool:
    import traceback as tb
    return any(frame.name == "host_to_device" for frame in tb.extract_stack(limit=12))


class HostReads:
    """Counts, while entered, every op whose result the host waits for (item, bool, data-dependent shapes) and every
    copy of a tensor to the host (tolist, cpu) except of one the host made from Python data; `log` gets the marks
    the round wrapper adds, so reads split by round."""

    def __init__(self):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        self.log: list[str] = []
        read_ops = {getattr(torch.ops.aten, name).default for name in READ_OPS}
        log = self.log

        class Reads(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in read_ops:
                    log.append("read")
                return func(*args, **(kwargs or {}))

        host_made: dict = {}

        class Copies(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in (torch.Tensor.tolist, torch.Tensor.cpu):
                    ref = host_made.get(id(args[0]))
                    if args[0].device.type != "cpu" or ref is None or ref() is not args[0]:
                        log.append("read")
                out = func(*args, **kwargs)
                if func in (torch.tensor, torch.as_tensor, torch.from_numpy) and kwargs.get("device") is None \
                        and not _from_host_to_device():
                    host_made[id(out)] = weakref.ref(out)
                return out

        self.modes = (Copies(), Reads())

    def __enter__(self):
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)

    def per_round(self) -> list[int]:
        counts, current = [], None
        for event in self.log:
            if event == "begin":
                current = 0
            elif event == "end":
                counts.append(current)
                current = None
            elif current is not None:
                current += 1
        return counts


@contextlib.contextmanager
def round_hooks(on_begin=None, on_end=None, annotate: bool = False):
    """decode/generate.py's rounds wrapped (the module's `_speculative_round`, which the loop calls by name): a call
    before and after each, and a profiler annotation around it."""
    import decode.generate as engine

    real = engine._speculative_round

    def wrapped(*args, **kwargs):
        if on_begin:
            on_begin()
        try:
            if annotate:
                with torch.profiler.record_function("speculate.round"):
                    return real(*args, **kwargs)
            return real(*args, **kwargs)
        finally:
            if on_end:
                on_end()

    engine._speculative_round = wrapped
    try:
        yield
    finally:
        engine._speculative_round = real


@contextlib.contextmanager
def round_walls(walls: list):
    """Each round's wall on the host's clock (its start to its end mark: decode/generate.py _RoundRecorder)."""
    import decode.generate as engine

    real = engine._RoundRecorder.verified

    def verified(self):
        out = real(self)
        walls.append(self.verified_at - self.started)
        return out

    engine._RoundRecorder.verified = verified
    try:
        yield
    finally:
        engine._RoundRecorder.verified = real


@contextlib.contextmanager
def fake_cuda_marks(clock):
    """The dry run's clock marks its rounds with (fake) CUDA events, as on one CUDA device, and counts its
    synchronizes; yields the count list."""
    synchronizes: list = []
    replaced = fake_cuda(clock, lambda device=None: synchronizes.append(1))
    try:
        yield synchronizes
    finally:
        for module, name, value in replaced:
            setattr(module, name, value)


def kernel_busy_share(events, annotation: str = "speculate.round") -> tuple[float | None, int]:
    """The union of the device's kernel (and copy, memset) intervals inside the annotated rounds' spans, over the
    spans' total: (share, rounds seen); share None where no device activity was recorded (a CPU)."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.name == annotation and e.device_type == DeviceType.CPU)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == DeviceType.CUDA and not e.is_user_annotation)
    if not spans or not kernels:
        return None, len(spans)
    busy = 0.0
    for start, end in spans:
        clipped = [(max(a, start), min(b, end)) for a, b in kernels if b > start and a < end]
        reached = start
        for a, b in clipped:
            if b > reached:
                busy += b - max(a, reached)
                reached = b
    return busy / sum(end - start for start, end in spans), len(spans)


# -- models ---------------------------------------------------------------------------------------------------------
def weights_read_bytes(model) -> int:
    """The bytes one decode step reads of the weights: every parameter once (a tied head and embedding once), less an
    untied input embedding (a step reads its rows alone)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and embed.weight.data_ptr() != head.weight.data_ptr():
        total -= embed.weight.numel() * embed.weight.element_size()
    return total


def kv_read_bytes(model, rows: int, cache: int) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size() if next(model.parameters()).is_floating_point() else 2
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * cache * rows * element


class Session:
    """What the steps share: the arguments, the device, the shapes, the models (built and captured on first need),
    each figure measured, and the compiled models whose captures the table adds up."""

    def __init__(self, args):
        self.args, self.dry = args, args.dry_run
        self.shapes = DRY if self.dry else FULL
        if args.target:
            self.shapes = Shapes(**{**self.shapes.__dict__, "target": args.target})
        if args.draft:
            self.shapes = Shapes(**{**self.shapes.__dict__, "draft": args.draft})
        self.device = torch.device(args.device or ("cpu" if self.dry else "cuda:0"))
        self.figures: dict[str, dict] = {}
        self.compiled: list = []  # every CompiledModel of the session: its capture seconds
        self.cache: dict = {}
        self.energy = Energy(self.device)
        self.checks: list[str] = []  # the dry run's counter checks that failed

    # figures
    def put(self, key: str, value, interval=None, note: str = "", **extra) -> None:
        if value is not None and interval is None and "prompts" in note:
            note += " (no interval under 8 prompts)"
        self.figures[key] = {"value": finite(value) if value is not None else None, "interval": interval,
                             "note": note, **extra}

    # models
    def prompts(self, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        vocab = self.eager("target").config.vocab_size
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, min(vocab, 50_000), (rows, self.shapes.prompt_tokens), generator=generator)
        return ids.to(self.device), torch.ones_like(ids).to(self.device)

    def eager(self, which: str):
        """The synthetic target or draft, built on the device in the session's dtype (no compiled step)."""
        key = ("eager", which)
        if key not in self.cache:
            from utils.synthetic_models import build_model

            spec = self.shapes.target if which == "target" else self.shapes.draft
            model, _ = build_model(spec, self.shapes.dtype, "sdpa", device=self.device)
            self.cache[key] = model.to(self.device).eval().requires_grad_(False)
        return self.cache[key]

    def max_length(self) -> int:
        return self.shapes.prompt_tokens + self.shapes.new_tokens + GAMMA + 2

    def captured(self, which: str, head_layers: tuple = ()):
        """The model with engine.compile: cudagraphs attached, every width captured at every batch capacity of the
        session (its first need pays the capture, which the capture step times)."""
        key = ("captured", which, head_layers)
        if key not in self.cache:
            from decode.static_kv import CompiledModel, attach

            model = self.eager(which)
            twin = copy.copy(model)
            widths = (1, GAMMA + 1) if which == "target" else (1, 2)
            compiled = CompiledModel(twin, widths, self.max_length(), self.shapes.batches, mode="cudagraphs",
                                     head_layers=head_layers)
            attach(twin, compiled)
            began = time.perf_counter()
            ids, mask = self.prompts(max(self.shapes.batches))
            with torch.inference_mode():
                compiled.precompile(ids, mask)
            sync(self.device)
            compiled.warm = True
            self.compiled.append(compiled)
            self.cache[key] = twin
            self.cache[("ready_s",) + key] = time.perf_counter() - began
        return self.cache[key]


# -- runs ----------------------------------------------------------------------------------------------------------
def generation(session):
    from decode import Generation, Sampling

    return Generation(max_new_tokens=session.shapes.new_tokens, sampling=Sampling())


def run_point(session, target, drafter, ids, mask, acceptance=None, load=None, energy: bool = False, **options):
    """One batch (or served load) of the baseline (drafter None) or speculative decoding: (records, wall seconds,
    tokens, joules or None)."""
    from decode import Clock, generate_baseline, generate_speculative

    clock = Clock(session.device)
    joules = session.energy.read() if energy else None
    sync(session.device)
    began = time.perf_counter()
    with torch.inference_mode():
        if drafter is None:
            records = generate_baseline(target, ids, mask, generation(session), clock=clock, load=load)
        else:
            generator = torch.Generator(device=session.device).manual_seed(0)
            records = generate_speculative(target, drafter, ids, mask, generation(session), GAMMA, generator, clock,
                                           synthetic_acceptance=acceptance, load=load, **options)
    sync(session.device)
    wall = time.perf_counter() - began
    if joules is not None:
        joules = session.energy.read() - joules
    return records, wall, sum(r.new_tokens for r in records), joules


def draft_drafter(session, draft):
    from decode import DraftModelDrafter, Sampling

    vocab = session.eager("target").config.vocab_size
    return DraftModelDrafter(draft, vocab, Sampling(), torch.Generator(device=session.device).manual_seed(1))


def paired(clusters: list[tuple]) -> tuple[float | None, list | None]:
    """Ratio of totals over (a, b, c, d) clusters, (sum a / sum b) / (sum c / sum d), with its 95% paired bootstrap
    interval over them (eval/stats.py: None under its minimum of prompts)."""
    from eval.stats import bootstrap_ci, ratio_of_totals

    return ratio_of_totals(clusters), bootstrap_ci(clusters)


# -- steps ---------------------------------------------------------------------------------------------------------
def step_env(session) -> dict:
    device = session.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": str(device), "device_name": name, "versions": installed_versions(LIBRARIES),
            "energy_counter": session.energy.why or "NVML", "shapes": {
                k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in session.shapes.__dict__.items()}}


def step_bandwidth(session) -> dict:
    n = session.shapes.copy_bytes
    source = torch.empty(n, dtype=torch.uint8, device=session.device)
    source.fill_(1)
    target = torch.empty_like(source)
    seconds = timed(session.device, lambda: target.copy_(source), session.shapes.reps)
    session.cache["bandwidth"] = 2 * n / seconds
    del source, target
    return {"bytes_copied": n, "copy_s": seconds, "bytes_per_s": 2 * n / seconds}


def bandwidth(session) -> float:
    if "bandwidth" not in session.cache:
        step_bandwidth(session)
    return session.cache["bandwidth"]


def step_capture(session) -> dict:
    out = {}
    for which in ("target", "draft"):
        twin = session.captured(which)
        from decode.static_kv import compiled_of

        summary = compiled_of(twin).summary()
        out[which] = {"ready_s": session.cache[("ready_s", "captured", which, ())], "captures": summary["captures"],
                      "capture_s": summary["capture_s"], "mode": summary["mode"],
                      "cuda_graphs": summary["cuda_graphs"], "buffer_sets": summary["buffer_sets"]}
    if session.dry:  # a CPU runs the captured mode's steps uncaptured, through the same buffers: none counted
        for which in ("target", "draft"):
            if out[which]["captures"] != 0 or out[which]["mode"] != "cudagraphs":
                session.checks.append(f"capture counters of the {which}: {out[which]}")
    return out


def step_table_of(session, twin, rows: int, widths: tuple, read: bool) -> dict:
    """Seconds of one captured step at `rows` rows for each width, over the prompts' cache: a host read after each
    step where `read` (as a verification, or the baseline's step), none where not (a draft chain's steps)."""
    from decode.generate import prefill

    ids, mask = session.prompts(rows, seed=7)
    out = {}
    with torch.inference_mode():
        state, _ = prefill(twin, ids, mask)
        for width in widths:
            tokens = ids[:, :width].contiguous()
            kept = torch.zeros(rows, dtype=torch.long, device=session.device)
            none = np.zeros(rows, dtype=np.int64)

            def step():
                logits = state.forward(twin, tokens)
                if read:
                    logits[:, -1, :1].tolist()
                state.keep_prefix_of_last(width, kept, 0, kept_host=none)
            out[width] = timed(session.device, step, session.shapes.reps)
    return out


def step_floor(session) -> dict:
    twin = session.captured("target")
    model = session.eager("target")
    step_s = step_table_of(session, twin, 1, (1,), read=True)[1]
    weights, kv = weights_read_bytes(model), kv_read_bytes(model, 1, session.shapes.prompt_tokens)
    floor_s = (weights + kv) / bandwidth(session)
    session.put("floor", step_s / floor_s, note=f"step {step_s * 1e3:.3g} ms, floor {floor_s * 1e3:.3g} ms")
    return {"step_s": step_s, "weights_bytes": weights, "kv_bytes": kv, "floor_s": floor_s}


def replayed_s(records, c: float, v: dict) -> float:
    """The rounds a batch ran, priced by the step table: each round its widest draft's chain (k steps of c) and one
    verification (v at its compiled width, gamma + 1; a round without drafts, v at 1)."""
    rounds = max(len(r.rounds) for r in records)
    if not rounds:  # the baseline: a 1-token step for each token after the first, of its longest row
        return (max(r.new_tokens for r in records) - 1) * v[1]
    total = 0.0
    for index in range(rounds):
        drafted = max((r.rounds[index]["drafted"] for r in records if index < len(r.rounds)), default=0)
        total += drafted * c + (v[GAMMA + 1] if drafted else v[1])
    return total


def decode_s(records) -> float:
    """A static batch's decode: its slowest row's latency less the prefills (target's, then the draft's)."""
    return max(r.latency_s - r.prefill_s - r.draft_prefill_s for r in records)


def step_speculative(session) -> dict:
    target, draft = session.captured("target"), session.captured("draft")
    out, ratios = {}, []
    for batch in session.shapes.batches:
        c = step_table_of(session, draft, batch, (1,), read=False)[1]
        v = step_table_of(session, target, batch, (1, GAMMA + 1), read=True)
        prompts = session.shapes.batch1_prompts if batch == 1 else 1
        clusters, energy, replays = [], [], []
        for index in range(prompts):
            ids, mask = session.prompts(batch, seed=100 + index)
            base = run_point(session, target, None, ids, mask, energy=batch == 1)
            spec = run_point(session, target, draft_drafter(session, draft), ids, mask, ACCEPTANCE,
                             energy=batch == 1)
            clusters.append((spec[2], spec[1], base[2], base[1]))
            if base[3] is not None and spec[3] is not None:
                energy.append((spec[3], spec[2], base[3], base[2]))
            replays.append({"measured_decode_s": decode_s(spec[0]), "replayed_decode_s": replayed_s(spec[0], c, v),
                            "base_decode_s": decode_s(base[0]), "base_replayed_s": replayed_s(base[0], c, v)})
        speedup, interval = paired(clusters)
        measured = sum(r["measured_decode_s"] for r in replays) / sum(r["replayed_decode_s"] for r in replays)
        base_measured = sum(r["base_decode_s"] for r in replays) / sum(r["base_replayed_s"] for r in replays)
        ratios += [measured, base_measured]
        key = dict(zip(session.shapes.batches, ("spec_b1", "spec_b8", "spec_b32")))[batch]
        session.put(key, speedup, interval, note=f"batch {batch}, {prompts} prompt{'s' * (prompts > 1)}")
        out[batch] = {"speedup": speedup, "interval": interval, "c_s": c, "v_s": v, "prompts": prompts,
                      "measured_over_replayed": {"speculative": measured, "baseline": base_measured},
                      "tokens": [cl[0] for cl in clusters]}
        if batch == 1:
            session.cache["ours_b1"] = {"baseline_tok_s": sum(cl[2] for cl in clusters) / sum(cl[3] for cl in clusters)}
            if energy:
                value, band = paired(energy)
                session.put("energy_b1", value, band, note=f"{len(energy)} prompts, NVML")
                out["energy_b1"] = {"clusters": energy}
            else:
                session.put("energy_b1", None, note=session.energy.why)
    worst = max(ratios, key=lambda r: abs(r - 1.0))  # the point farthest from its replay decides the row
    session.put("replay", worst, note=f"{len(ratios)} points from {min(ratios):.3f} to {max(ratios):.3f} (decode, "
                                      "priced by this step's step table)", extremes=[min(ratios), max(ratios)])
    session.cache["crossover_static"] = {b: out[b]["speedup"] for b in session.shapes.batches}
    return out


def eagle3_layers(layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high target layers (decode/hidden.py numbering)."""
    return tuple(sorted({min(2, layers - 1), layers // 2, max(layers - 3, 0)}))


def step_eagle3(session) -> dict:
    from transformers import LlamaConfig

    from decode import Sampling
    from decode.drafters.head_drafters import Eagle3Drafter
    from decode.head_models import Eagle3Head

    model = session.eager("target")
    config = model.config
    layers = eagle3_layers(config.num_hidden_layers)
    draft_vocab = min(32000, config.vocab_size // 2)
    head_config = LlamaConfig(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                              num_attention_heads=config.num_attention_heads,
                              num_key_value_heads=config.num_key_value_heads, vocab_size=config.vocab_size,
                              max_position_embeddings=config.max_position_embeddings)
    torch.manual_seed(0)
    with torch.device(session.device):
        head = Eagle3Head(head_config, config.hidden_size, draft_vocab, layers)
    head.d2t.copy_(torch.arange(draft_vocab))  # draft id i is target id 2i
    head = head.to(session.shapes.dtype).eval().requires_grad_(False)
    target = session.captured("target", head_layers=layers)
    clusters = []
    for index in range(session.shapes.batch1_prompts):
        ids, mask = session.prompts(1, seed=100 + index)
        base = run_point(session, target, None, ids, mask)
        drafter = Eagle3Drafter(head, config.vocab_size, Sampling(),
                                torch.Generator(device=session.device).manual_seed(1))
        spec = run_point(session, target, drafter, ids, mask, ACCEPTANCE)
        clusters.append((spec[2], spec[1], base[2], base[1]))
    speedup, interval = paired(clusters)
    session.put("eagle3_b1", speedup, interval, note=f"head layers {list(layers)}, {len(clusters)} prompts")
    return {"layers": layers, "speedup": speedup, "interval": interval}


def served_pair(session):
    """The captured pair where the engine serves on captured steps; the eager pair where it refuses a load on a
    compiled model (decode/kv.py COMPILED_JOIN): (target, draft, which)."""
    from decode.generate import generate_baseline
    from decode.arrivals import Load

    target = session.captured("target")
    ids, mask = session.prompts(2, seed=301)
    try:
        with torch.inference_mode():
            generate_baseline(target, ids, mask, generation(session), load=Load([0.0, 0.0], 1))
    except ValueError:  # kept in the records' steps field; the rows say eager
        return session.eager("target"), session.eager("draft"), "eager: the engine serves no captured steps"
    return target, session.captured("draft"), "captured"


def step_served(session) -> dict:
    """Each concurrency C with max(C, 4) requests all arriving at 0, at most C in flight, on captured steps where the
    engine serves on them, else eager."""
    import inspect

    from decode.generate import generate_speculative
    from decode.arrivals import Load

    target, draft, which = served_pair(session)
    has_overlap = "overlap" in inspect.signature(generate_speculative).parameters
    out, names = {}, dict(zip(session.shapes.concurrency, ("served_c1", "served_c8", "served_c32")))
    for concurrency in session.shapes.concurrency:
        requests = max(concurrency, 4)
        ids, mask = session.prompts(requests, seed=300)
        load = Load([0.0] * requests, concurrency)
        highest = concurrency == max(session.shapes.concurrency)
        base = run_point(session, target, None, ids, mask, load=load, energy=highest)
        spec = run_point(session, target, draft_drafter(session, draft), ids, mask, ACCEPTANCE, load=load,
                         energy=highest)
        speedup = (spec[2] / spec[1]) / (base[2] / base[1])
        session.put(names[concurrency], speedup, note=f"{requests} requests, one run (no interval), {which}")
        out[concurrency] = {"speedup": speedup, "requests": requests, "steps": which, "base_tok_s": base[2] / base[1],
                            "spec_tok_s": spec[2] / spec[1]}
        if highest:
            if base[3] is not None and spec[3] is not None:
                session.put("energy_c32", (spec[3] / spec[2]) / (base[3] / base[2]),
                            note=f"concurrency {concurrency}, one window each (no interval)")
            else:
                session.put("energy_c32", None, note=session.energy.why)
            if has_overlap:
                on = run_point(session, target, draft_drafter(session, draft), ids, mask, ACCEPTANCE, load=load,
                               overlap=True)
                session.put("served_overlap", (on[2] / on[1]) / (base[2] / base[1]),
                            note=f"concurrency {concurrency}, overlap on")
            else:
                session.put("served_overlap", None, note="this engine has no overlap switch (generate_speculative)")
    session.cache["crossover_served"] = {c: out[c]["speedup"] for c in out}
    return out


def nf4_pair(session):
    """The session's pair with every linear layer but the head in bitsandbytes nf4 (bf16 compute)."""
    if session.device.type != "cuda":
        raise Skip("bitsandbytes' nf4 runs here on CUDA only")
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise Skip("bitsandbytes absent: carry its wheel (docs/gpu.md)") from None
    pair = []
    for which in ("target", "draft"):
        model = copy.deepcopy(session.eager(which))
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear) and child_name != "lm_head":
                    quantized = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                                  compute_dtype=torch.bfloat16, quant_type="nf4")
                    quantized.weight = bnb.nn.Params4bit(child.weight.data.cpu(), requires_grad=False,
                                                         quant_type="nf4")
                    setattr(module, child_name, quantized.to(session.device))
        pair.append(model)
    return pair


def step_nf4(session) -> dict:
    target, draft = nf4_pair(session)
    ids, mask = session.prompts(1, seed=500)
    from decode.generate import prefill

    with torch.inference_mode():
        state, _ = prefill(target, ids, mask)
        token = ids[:, :1].contiguous()
        kept, none = torch.zeros(1, dtype=torch.long, device=session.device), np.zeros(1, dtype=np.int64)

        def step():
            state.forward(target, token)[:, -1, :1].tolist()
            state.keep_prefix_of_last(1, kept, 0, kept_host=none)
        step_s = timed(session.device, step, session.shapes.reps)
    weights = weights_read_bytes(target)
    floor_s = (weights + kv_read_bytes(session.eager("target"), 1, session.shapes.prompt_tokens)) / bandwidth(session)
    session.put("nf4_floor", step_s / floor_s, note=f"eager (nf4 outside the captured path), step "
                                                    f"{step_s * 1e3:.3g} ms, floor {floor_s * 1e3:.3g} ms")
    clusters = []
    for index in range(max(2, session.shapes.batch1_prompts // 2)):  # eager steps: half the prompts fit the budget
        ids, mask = session.prompts(1, seed=100 + index)
        base = run_point(session, target, None, ids, mask)
        spec = run_point(session, target, draft_drafter(session, draft), ids, mask, ACCEPTANCE)
        clusters.append((spec[2], spec[1], base[2], base[1]))
    speedup, interval = paired(clusters)
    session.put("nf4_spec", speedup, interval, note=f"eager, {len(clusters)} prompts (no interval under 8)")
    return {"step_s": step_s, "weights_bytes": weights, "floor_s": floor_s, "speedup": speedup}


def step_hf(session) -> dict:
    """transformers' own fast paths on the same shapes, batch 1, greedy, the same prompts: the static cache with its
    compiled forward (generate compiles it itself; the dry run turns compiling off), and assisted generation with the
    same draft (gamma 4 constant); ours: the captured baseline and speculative at the pair's own acceptance."""
    target, draft = session.eager("target"), session.eager("draft")
    tokens = session.shapes.new_tokens
    def config(**fields):
        made = copy.deepcopy(target.generation_config)
        made.update(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                    disable_compile=session.dry, **fields)
        return made
    static_config = config(cache_implementation="static")
    assisted_config = config(num_assistant_tokens=GAMMA, num_assistant_tokens_schedule="constant",
                             assistant_confidence_threshold=0.0)

    def static(ids, mask):
        return target.generate(input_ids=ids, attention_mask=mask, generation_config=static_config)

    def assisted(ids, mask):
        return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft,
                               generation_config=assisted_config)

    ours_target, ours_draft = session.captured("target"), session.captured("draft")
    out = {}
    # assisted first: the static cache's first call compiles the whole target, which may take the rest of the budget
    for key, theirs, drafts in (("hf_assisted", assisted, True), ("hf_baseline", static, False)):
        clusters, drafted = [], [0, 0]
        with torch.inference_mode():
            ids, mask = session.prompts(1, seed=99)
            began = time.perf_counter()
            theirs(ids, mask)  # the warmup (the static cache's: generate's compile)
            sync(session.device)
            warmup_s = time.perf_counter() - began
            for index in range(session.shapes.batch1_prompts):
                ids, mask = session.prompts(1, seed=100 + index)
                sync(session.device)
                began = time.perf_counter()
                generated = theirs(ids, mask)
                sync(session.device)
                their_s, their_tokens = time.perf_counter() - began, generated.shape[1] - ids.shape[1]
                ours = run_point(session, ours_target, draft_drafter(session, ours_draft) if drafts else None,
                                 ids, mask)
                clusters.append((ours[2], ours[1], their_tokens, their_s))
                rounds = [r for record in ours[0] for r in record.rounds]
                drafted[0] += sum(r["drafted"] for r in rounds)
                drafted[1] += sum(r["accepted"] for r in rounds)
        value, interval = paired(clusters)
        if drafts:
            detail = f"ours accepted {drafted[1]} of {drafted[0]} drafts" if drafted[0] else "no drafts"
        else:
            detail = ("generate's compile off in the dry run" if session.dry else
                      f"their warmup (generate's compile) {warmup_s:.0f} s")
        session.put(key, value, interval, note=f"{len(clusters)} prompts; {detail}")
        out[key] = {"ratio": value, "interval": interval, "warmup_s": warmup_s}
    return out


def step_rounds(session) -> dict:
    """The round counters at batch 1 on the captured pair: host reads a round (counted at dispatch, a run of its
    own), the rounds' marks against their wall (the parts add up to it: events read after a later read), and the
    GPU's busy share inside rounds from the profiler's kernel intervals (CUDA events cannot give it: a stream
    reaches its end event after the last kernel whether the GPU worked or waited for the host)."""
    target, draft = session.captured("target"), session.captured("draft")
    ids, mask = session.prompts(1, seed=700)
    from decode import Clock, generate_speculative

    counter = HostReads()
    synchronizes: list = []
    real_sync = torch.cuda.synchronize
    if session.device.type == "cuda":
        torch.cuda.synchronize = lambda device=None: (synchronizes.append(1), real_sync(device))[1]
    try:
        with round_hooks(lambda: counter.log.append("begin"), lambda: counter.log.append("end")), counter, \
                torch.inference_mode():
            records = generate_speculative(target, draft_drafter(session, draft), ids, mask, generation(session),
                                           GAMMA, torch.Generator(device=session.device).manual_seed(0),
                                           Clock(session.device), synthetic_acceptance=ACCEPTANCE)
    finally:
        torch.cuda.synchronize = real_sync
    reads = counter.per_round()
    if reads:
        session.put("reads", max(reads), note=f"{len(reads)} rounds, reads a round {min(reads)}-{max(reads)}")
    # the marks against the wall: draft and verification seconds of the rounds over their host wall
    walls: list = []
    clock = Clock(session.device)
    marks = fake_cuda_marks(clock) if session.dry else contextlib.nullcontext([])
    with marks as fake_syncs, round_walls(walls), torch.inference_mode():
        from decode import generate_speculative as speculative

        spans = speculative(target, draft_drafter(session, draft), ids, mask, generation(session), GAMMA,
                            torch.Generator(device=session.device).manual_seed(0), clock,
                            synthetic_acceptance=ACCEPTANCE)[0]
    marked = (spans.draft_s - spans.draft_prefill_s) + (spans.target_s - spans.prefill_s)
    marks_share = marked / sum(walls) if walls else None
    # the profiler's kernels inside the rounds
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    with round_hooks(annotate=True), profile(activities=activities) as traced, torch.inference_mode():
        generate_speculative(target, draft_drafter(session, draft), ids, mask, generation(session), GAMMA,
                             torch.Generator(device=session.device).manual_seed(0), Clock(session.device),
                             synthetic_acceptance=ACCEPTANCE)
    busy, seen = kernel_busy_share(traced.events())
    del traced
    note = f"profiler kernels over {seen} rounds; marks / wall {marks_share:.3f}" if marks_share is not None else ""
    session.put("busy", busy, note=note if busy is not None else f"no CUDA kernels on a {session.device.type}; "
                f"marks / wall {marks_share:.3f} over {len(walls)} rounds")
    out = {"reads_per_round": reads, "synchronizes_in_counted_run": len(synchronizes),
           "marks_over_wall": marks_share, "rounds_walled": len(walls), "busy_share": busy, "rounds_profiled": seen,
           "fake_synchronizes": len(fake_syncs)}
    if session.dry:
        if not reads or set(reads) != {1}:
            session.checks.append(f"host reads a round {reads}, not 1 each")
        if not walls or abs(marked - sum(walls)) > 0.002 * len(walls):  # 2 ms a round: the host's work after a mark
            session.checks.append(f"the rounds' marks {marked:.4f} s against their wall {sum(walls):.4f} s over "
                                  f"{len(walls)} rounds: the parts do not add up")
        if seen != len(reads):
            session.checks.append(f"the profiler saw {seen} rounds of {len(reads)}")
    return out


def step_table(session) -> dict:
    from decode.static_kv import compiled_of  # noqa: F401  (the compiled models' summaries)

    capture_s = sum(sum(c.capture_s) for c in session.compiled)
    captures = sum(len(c.capture_s) for c in session.compiled)
    if session.device.type == "cuda":
        longest = max((seconds for c in session.compiled for seconds in c.capture_s), default=0.0)
        session.put("capture_s", capture_s, note=f"{captures} graphs over {len(session.compiled)} models, the "
                                                 f"longest {longest:.2f} s")
    else:
        session.put("capture_s", None, note=f"a {session.device.type} runs the captured steps uncaptured "
                                            f"({captures} captures, {len(session.compiled)} models)")
    static = session.cache.get("crossover_static", {})
    served = session.cache.get("crossover_served", {})
    losing = [f"batch {b}" for b, s in sorted(static.items()) if s is not None and s < 1.0] + \
             [f"concurrency {c}" for c, s in sorted(served.items()) if s is not None and s < 1.0]
    measured = bool(static or served)
    session.put("crossover", None, note=("none: speculation paid at every point" if not losing else
                                         f"slower from {losing[0]} ({', '.join(losing)})") if measured else
                "neither the static nor the served points ran", where=losing[0] if losing else None)
    return {"capture_s": capture_s, "captures": captures}


STEP_FUNCTIONS = {"env": step_env, "bandwidth": step_bandwidth, "capture": step_capture, "floor": step_floor,
                  "speculative": step_speculative, "eagle3": step_eagle3, "served": step_served, "nf4": step_nf4,
                  "hf": step_hf, "rounds": step_rounds, "table": step_table}


# -- the session -------------------------------------------------------------------------------------------------------
def _alarm(signum, frame):
    raise StepOverrun()


def run_steps(session, total_s: float, only: set | None = None, skip: set | None = None,
              budgets: dict | None = None, after_step=None) -> list[dict]:
    """Every step in order within its budget and the total; a record each. after_step(records) after each step:
    what a session killed from outside leaves behind."""
    deadline = time.monotonic() + total_s
    records = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for step in STEPS:
            budget = (budgets or {}).get(step.name, step.budget_s)
            left = deadline - time.monotonic()
            record = {"step": step.name, "budget_s": budget, "status": "ok", "seconds": 0.0, "detail": ""}
            records.append(record)
            if (only and step.name not in only and step.name != "table") or (skip and step.name in skip):
                record.update(status="skipped", detail="not asked for (--only / --skip)")
                continue
            if budget > left:
                record.update(status="skipped", detail=f"its budget {budget} s past the total's {max(left, 0):.0f} "
                                                       "s left")
                continue
            began = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                record["figures"] = STEP_FUNCTIONS[step.name](session)
            except StepOverrun:
                record.update(status="over budget", detail=f"interrupted at its budget of {budget} s")
            except Skip as why:
                record.update(status="skipped", detail=str(why))
            except Exception as error:  # a step's failure is its row's, the others go on
                record.update(status="error", detail=f"{type(error).__name__}: {str(error)[:300]}",
                              trace=traceback.format_exc(limit=6)[-3000:])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            record["seconds"] = time.monotonic() - began
            print(f"== {step.name}: {record['status']}, {record['seconds']:.1f} s of {budget} s"
                  f"{': ' + record['detail'] if record['detail'] else ''}", flush=True)
            if after_step is not None:
                after_step(records)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return records


def goal_rows(session, records: list[dict]) -> list[dict]:
    by_step = {r["step"]: r for r in records}
    rows = []
    for goal in GOALS:
        figure = session.figures.get(goal.key)
        step = by_step.get(goal.step, {})
        row = {"key": goal.key, "figure": goal.figure, "goal": goal.goal, "step": goal.step, "value": None,
               "interval": None, "note": ""}
        if figure is not None:
            row.update(value=figure["value"], interval=figure.get("interval"), note=figure.get("note", ""))
            if figure["value"] is None:
                row["status"] = "not measured" if goal.key != "crossover" else "measured"
            else:
                row["status"] = verdict(goal, figure["value"])
                if session.dry and goal.test:  # tiny shapes on a CPU: the code path, not the goal
                    row["status"] = f"dry: {row['status']}"
        elif step.get("status") not in (None, "ok"):
            row.update(status=step["status"], note=step.get("detail", ""))
        else:
            row.update(status="not measured", note="its step ran without measuring it")
        rows.append(row)
    return rows


def fmt(value) -> str:
    """Three significant digits, trailing zeros kept (2.00 is not 2); integers as they are."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:#.3g}"


def table_text(rows: list[dict]) -> str:
    lines = ["| figure | measured | goal | status | note |", "|---|---|---|---|---|"]
    for row in rows:
        measured = fmt(row["value"])
        if row["interval"]:
            measured += f" [{fmt(row['interval'][0])}, {fmt(row['interval'][1])}]"
        lines.append(f"| {row['figure']} | {measured} | {row['goal']} | {row['status']} | {row['note']} |")
    return "\n".join(lines)


def arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="the folder for records.json, goals.json and goals.md")
    parser.add_argument("--plan", action="store_true", help="print the steps, their budgets and the goal rows; exit")
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with tiny shapes")
    parser.add_argument("--device", help="default cuda:0 (cpu in the dry run)")
    parser.add_argument("--total-s", type=float, default=TOTAL_S, help=f"the session's bound (default {TOTAL_S})")
    parser.add_argument("--only", default="", help="steps to run, comma-separated (the table always runs)")
    parser.add_argument("--skip", default="", help="steps to skip, comma-separated")
    parser.add_argument("--target", help=f"the target's synthetic spec (default {FULL.target})")
    parser.add_argument("--draft", help=f"the draft's synthetic spec (default {FULL.draft})")
    return parser, parser.parse_args(argv)


def main(argv=None) -> int:
    parser, args = arguments(argv)
    if args.plan:
        print(plan_text(int(args.total_s)))
        return 0
    names = {s.name for s in STEPS}
    asked = {n for n in (args.only + "," + args.skip).split(",") if n}
    if asked - names:
        print(f"gpu_session: unknown step {sorted(asked - names)[0]!r}: choose among "
              f"{', '.join(s.name for s in STEPS)}", file=sys.stderr)
        return 2
    if args.out is None:
        print("gpu_session: give the output folder (OUT_DIR), or --plan", file=sys.stderr)
        return 2
    if not args.total_s > 0:
        print("gpu_session: --total-s must be a number of seconds above 0", file=sys.stderr)
        return 2
    from utils.synthetic_models import parse

    for spec in (args.target, args.draft):
        if spec is None:
            continue
        try:
            if not spec.startswith("synthetic:"):
                raise ValueError("the session builds its models from published shapes")
            parse(spec)
        except ValueError as why:
            print(f"gpu_session: {spec!r} is not a synthetic spec to build (synthetic:NAME?layers=L): {why}",
                  file=sys.stderr)
            return 2
    if not args.dry_run and args.device in (None,) and not torch.cuda.is_available():
        print("gpu_session: no CUDA device here: run it on a GPU, or with --dry-run (the CPU, tiny shapes)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:  # a small shared CPU: more threads than free cores make every op wait on the others
        torch.set_num_threads(1)
    session = Session(args)
    started = time.monotonic()

    def written(records: list[dict]) -> str:
        rows = goal_rows(session, records)
        write_json(args.out / "records.json", {"total_s": args.total_s, "seconds": time.monotonic() - started,
                                               "dry_run": args.dry_run, "steps": records,
                                               "figures": session.figures, "checks_failed": session.checks})
        write_json(args.out / "goals.json", rows)
        text = table_text(rows)
        (args.out / "goals.md").write_text(text + "\n")
        return text

    records = run_steps(session, args.total_s, set(filter(None, args.only.split(","))),
                        set(filter(None, args.skip.split(","))), after_step=written)
    text = written(records)
    for failed in session.checks:
        print(f"dry-run check failed: {failed}")
    print(f"session {time.monotonic() - started:.1f} s of at most {args.total_s:.0f} s; records in {args.out}")
    if args.dry_run:
        print("dry run: tiny shapes on the CPU; each row shows its figure's code ran, its 'dry:' verdict says "
              "nothing of a GPU")
    print(text, flush=True)
    errors = [r["step"] for r in records if r["status"] == "error"]
    return 1 if session.checks or errors else 0


if __name__ == "__main__":
    sys.exit(main())
