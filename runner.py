"""The harness: load, warm up, run every method on the same batches with synchronised timing, write
raw records per batch, and rebuild the report from them. One thin adapter per method, one contract:
(batch) -> list[RowRecord]."""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml

from decode import (Clock, DraftModelDrafter, Generation, RowRecord, Sampling, check_vocab_compatible,
                    generate_baseline, generate_speculative)
from decode.kv import KVState
from decode.vocab import VocabMismatch
from eval.metrics import summarize
from eval.report import print_table, write_report
from utils import UserError
from utils.config import Config
from utils.data import load_prompts, resolve_path
from utils.io import append_jsonl, read_jsonl, write_atomic, write_json
from utils.models import check_model_config, load_model, resolve_device

EXIT_OK, EXIT_BAD_INPUT, EXIT_POINTS_FAILED, EXIT_INTERRUPTED = 0, 2, 3, 130
GAMMA_METHODS = ("speculative", "hf_assisted")


@dataclass(frozen=True)
class Point:
    method: str
    gamma: int | None
    batch_size: int

    @property
    def label(self) -> str:
        return f"{self.method}" + (f" gamma={self.gamma}" if self.gamma else "") + f" batch={self.batch_size}"


@dataclass
class Progress:
    """progress.json: what the samples cannot say by themselves."""
    status: str = "running"
    failures: list[dict] = field(default_factory=list)
    costs: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    prompts: dict = field(default_factory=dict)


def points_for(config: Config, batch_size: int) -> list[Point]:
    points = []
    for method in config.methods:
        for gamma in (config.speculative.gamma if method in GAMMA_METHODS else [None]):
            points.append(Point(method, gamma, batch_size))
    return points


def generation_settings(config: Config, tokenizer, model) -> Generation:
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    g = config.generation
    return Generation(g.max_new_tokens, Sampling(g.do_sample, g.temperature, g.top_k, g.top_p), tuple(sorted(eos)))


def left_pad(token_lists: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), width), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return ids.to(device), mask.to(device)


# ---- one adapter per method ---------------------------------------------------------------------

def hf_generation_config(generation: Generation, pad_id: int, gamma: int | None = None):
    """transformers' GenerationConfig with exactly our settings (the model's own defaults, such as a
    repetition penalty or sampling on, must not leak into a comparison)."""
    from transformers import GenerationConfig

    s = generation.sampling
    kwargs = dict(max_new_tokens=generation.max_new_tokens, do_sample=s.do_sample, eos_token_id=list(generation.eos_token_ids),
                  pad_token_id=pad_id, repetition_penalty=1.0)
    if s.do_sample:
        kwargs.update(temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p or 1.0)
    else:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    if gamma is not None:
        kwargs.update(num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    return GenerationConfig(**kwargs)


def run_hf(target, draft, ids, mask, generation: Generation, gamma, pad_id, clock: Clock) -> list[RowRecord]:
    """transformers' generate(), or its assisted generation when a draft is given (one wall time per batch)."""
    config = hf_generation_config(generation, pad_id, gamma if draft is not None else None)
    if draft is not None:  # assisted generation reads its schedule from the assistant's config
        for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
            setattr(draft.generation_config, key, getattr(config, key))
    start = clock.now()
    output = target.generate(input_ids=ids, attention_mask=mask, generation_config=config, assistant_model=draft)
    elapsed = clock.now() - start
    records = []
    for row in output[:, ids.shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in generation.eos_token_ids), None)
        tokens = row[:cut] if cut else row[: generation.max_new_tokens]
        records.append(RowRecord(output_ids=tokens, stop_reason="eos" if cut else "length", prefill_s=float("nan"),
                                 latency_s=elapsed, target_forwards=0, target_s=elapsed))
    return records


class Methods:
    """Binds the loaded models to the method adapters."""

    def __init__(self, target, draft, generation: Generation, pad_id: int, target_vocab: int, clock: Clock):
        self.target, self.draft, self.generation = target, draft, generation
        self.pad_id, self.target_vocab, self.clock = pad_id, target_vocab, clock

    def run(self, point: Point, ids, mask, generator, generation: Generation | None = None) -> list[RowRecord]:
        generation = generation or self.generation
        if point.method == "baseline":
            return generate_baseline(self.target, ids, mask, generation, generator, self.clock)
        if point.method == "speculative":
            drafter = DraftModelDrafter(self.draft, self.target_vocab, generation.sampling, generator)
            return generate_speculative(self.target, drafter, ids, mask, generation, point.gamma, generator, self.clock)
        if point.method == "hf_generate":
            return run_hf(self.target, None, ids, mask, generation, None, self.pad_id, self.clock)
        if point.method == "hf_assisted":
            return run_hf(self.target, self.draft, ids, mask, generation, point.gamma, self.pad_id, self.clock)
        raise ValueError(point.method)


def measure_costs(target, draft, ids, mask, gammas: list[int], clock: Clock, reps: int = 7) -> dict:
    """c = t(1-token draft forward) / t(1-token target forward); v_gamma = t((gamma+1)-token target
    forward) / t(1-token target forward), at this batch's cache length. The forwards are interleaved,
    one of each per repetition (after one untimed pass), so that drift of the machine touches every ratio
    alike; each time is the median over the repetitions."""
    states = {}
    for name, model in (("target", target), ("draft", draft)):
        states[name] = KVState()
        states[name].forward(model, ids, mask, last_only=True)
    probes = [("draft", draft, 1), ("target", target, 1)] + [("target", target, g + 1) for g in gammas]
    times: dict[tuple, list[float]] = {(name, width): [] for name, _, width in probes}
    no_rows_kept = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    for rep in range(reps + 1):
        for name, model, width in probes:
            tokens = ids[:, -1:].expand(-1, width).contiguous()
            start = clock.now()
            states[name].forward(model, tokens)
            elapsed = clock.now() - start
            states[name].keep_prefix_of_last(width, no_rows_kept, 0)  # back to the prompt's cache
            if rep:
                times[(name, width)].append(elapsed)
    median = {key: sorted(values)[len(values) // 2] for key, values in times.items()}
    target_one = median[("target", 1)]
    return {"c": median[("draft", 1)] / target_one,
            "v": {str(g): median[("target", g + 1)] / target_one for g in gammas},
            "target_forward_s": target_one}


# ---- the experiment -----------------------------------------------------------------------------

def environment(device: torch.device) -> dict:
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": version("transformers"),
        "bitsandbytes": version("bitsandbytes"), "flash_attn": version("flash-attn"), "datasets": version("datasets"),
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "cuda": torch.version.cuda, "git_commit": commit,
    }


def preflight(config: Config) -> torch.device:
    """Everything that can be refused before a model loads."""
    device = resolve_device(config.device)
    check_model_config(config.target, "target")
    check_model_config(config.draft, "draft")
    resolve_path(config.dataset.path)
    if config.engine.cpu_linear == "onednn_packed":
        for role, cfg in (("target", config.target), ("draft", config.draft)):
            if device.type != "cpu" or cfg.dtype not in ("auto", "float32") or cfg.quantization != "none":
                raise UserError(f"engine.cpu_linear: onednn_packed needs device cpu, float32 and no quantization "
                                f"({role} is {config.device}, {cfg.dtype}, quantization {cfg.quantization}); use auto")
    return device


def apply_engine(config: Config, loaded) -> str:
    """Swap in the CPU linear kernels the config asks for; returns what was done, for the notes."""
    from utils.cpu_linear import pack_linears, usable

    if config.engine.cpu_linear == "default" or loaded.quantization != "none" or not usable(loaded.model):
        return "nn.Linear"
    count = pack_linears(loaded.model, config.engine.pack_batch_hint)
    return f"oneDNN prepacked linear x{count} (batch hint {config.engine.pack_batch_hint})"


class Experiment:
    def __init__(self, config: Config, raw: dict, out_dir: Path, console, resume: bool = False):
        self.config, self.raw, self.out_dir, self.console, self.resume = config, raw, out_dir, console, resume
        self.samples_path = out_dir / "samples.jsonl"
        self.samples: list[dict] = []  # what samples.jsonl holds, kept in memory to rebuild the summary per batch
        self.progress = Progress()

    # -- folder ---------------------------------------------------------------------------------
    def prepare_folder(self) -> None:
        if self.resume:
            saved = self.out_dir / "config.yaml"
            if not saved.is_file():
                raise UserError(f"--resume {self.out_dir}: no config.yaml there; is it a report folder of this tool?")
            if yaml.safe_load(saved.read_text()) != self.raw:
                raise UserError(f"--resume {self.out_dir}: the config differs from the one this run started with; "
                                "resume with the same config and --set values (or none: the saved one is used)")
            progress = self.out_dir / "progress.json"
            if progress.is_file():
                saved_progress = json.loads(progress.read_text())
                self.progress.costs = saved_progress.get("costs", {})
            self.drop_incomplete_batches()
        else:
            if self.samples_path.exists():
                raise UserError(f"--output-dir {self.out_dir} already holds a run; use --resume {self.out_dir} "
                                "to continue it, or another folder")
            self.out_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.out_dir / "config.yaml", yaml.safe_dump(self.raw, sort_keys=False))

    def drop_incomplete_batches(self) -> None:
        """A kill can tear the write of a batch: keep only batches whose every row is on disk."""
        samples = read_jsonl(self.samples_path, repair=True)
        counts: dict[tuple, int] = {}
        for s in samples:
            counts[batch_key(s)] = counts.get(batch_key(s), 0) + 1
        self.samples = [s for s in samples if counts[batch_key(s)] == s["batch_rows"]]
        if len(self.samples) < len(samples):
            write_atomic(self.samples_path, "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in self.samples))

    def save_progress(self) -> None:
        write_json(self.out_dir / "progress.json", asdict(self.progress))

    def write_summary(self, plots: bool = False) -> dict:
        summary = summarize(self.samples, self.progress.failures, self.progress.costs, greedy=not self.config.generation.do_sample)
        summary["notes"] = self.progress.notes
        summary["status"] = self.progress.status
        summary["prompts"] = self.progress.prompts
        summary["order"] = ("per batch, every method runs on the same prompts back to back; the order of methods "
                            "rotates by one from batch to batch (and repeat to repeat)")
        write_report(self.out_dir, summary, self.config.name, self.config.report.summary_file_name,
                     with_plots=plots and self.config.report.plots)
        return summary

    # -- run ------------------------------------------------------------------------------------
    def run(self) -> int:
        device = preflight(self.config)
        self.prepare_folder()
        write_json(self.out_dir / "env.json", environment(device))
        self.progress.status = "running"
        self.save_progress()
        previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_interrupt)}
        try:
            self._run(device)
        except KeyboardInterrupt:
            self.progress.status = "interrupted"
            self.save_progress()
            self.write_summary(plots=True)
            self.console.print(f"[yellow]interrupted: the report holds every batch that finished; "
                               f"continue with --resume {self.out_dir}[/yellow]")
            return EXIT_INTERRUPTED
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        failed = any(f.get("status", "failed") == "failed" for f in self.progress.failures)
        self.progress.status = "finished with failures" if failed else "finished"
        self.save_progress()
        summary = self.write_summary(plots=True)
        print_table(summary, self.console)
        return EXIT_POINTS_FAILED if failed else EXIT_OK

    def _load(self, device):
        with self.console.status("loading target model"):
            target = load_model(self.config.target, device, "target")
        with self.console.status("loading draft model"):
            draft = load_model(self.config.draft, device, "draft")
        try:
            check_vocab_compatible(target.tokenizer, draft.tokenizer, target.vocab_size, draft.vocab_size)
        except VocabMismatch as error:
            raise UserError(f"draft.model: {error}") from None
        target.kernels, draft.kernels = apply_engine(self.config, target), apply_engine(self.config, draft)
        return target, draft

    def _run(self, device: torch.device) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

        config = self.config
        torch.manual_seed(config.seed)
        target, draft = self._load(device)
        self._tokenizer = target.tokenizer
        prompt_set = load_prompts(config.dataset, target.tokenizer)
        self.progress.prompts = {"source": prompt_set.source, "count": len(prompt_set.prompts),
                                 "truncated": prompt_set.truncated, "skipped_too_long": prompt_set.skipped_too_long,
                                 "mean_tokens": sum(len(p.token_ids) for p in prompt_set.prompts) / len(prompt_set.prompts)}
        self.progress.notes = [f"{role}: {m.source} ({m.dtype}, {m.attn_implementation}, quantization {m.quantization}, "
                               f"{m.kernels})" for role, m in (("target", target), ("draft", draft))]
        if "hf_assisted" in config.methods and any(b > 1 for b in config.batch_size):
            self.progress.notes.append("hf_assisted runs at batch size 1 only (transformers' assisted generation has no batching)")
        if target.quantization == "8bit":
            self.progress.notes.append(
                "target in bitsandbytes 8-bit: LLM.int8 quantizes a matmul's activations with outlier columns chosen "
                "over all its tokens, so a (gamma+1)-token verification is not numerically equal to token-by-token "
                "decoding; greedy exact_match below 1.0 comes from the target itself (4-bit and fp32 are batch-invariant)")
        if {"hf_generate", "hf_assisted"} & set(config.methods):
            self.progress.notes.append("hf_* methods: one wall time per batch (per-row latency = batch time), no TTFT or forward counts")
        self.save_progress()
        generation = generation_settings(config, target.tokenizer, target.model)
        pad_id = target.tokenizer.pad_token_id
        clock = Clock(device)
        methods = Methods(target.model, draft.model, generation, pad_id, target.vocab_size, clock)
        done = {batch_key(s) for s in self.samples}
        self.progress.failures = []

        total = sum(len(points_for(config, b)) * -(-len(prompt_set.prompts) // b) * config.repeats for b in config.batch_size)
        bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                  TimeElapsedColumn(), console=self.console, transient=False)
        with bar, torch.inference_mode():
            task = bar.add_task("running", total=total, rate="")
            for batch_size in config.batch_size:
                points = points_for(config, batch_size)
                batches = [prompt_set.prompts[i:i + batch_size] for i in range(0, len(prompt_set.prompts), batch_size)]
                failed: set[Point] = set()
                for point in points:
                    if point.method == "hf_assisted" and batch_size > 1:
                        self.progress.failures.append({**asdict(point), "status": "skipped",
                                                       "error": "transformers' assisted generation supports batch size 1 only"})
                        failed.add(point)
                first_ids, first_mask = left_pad([p.token_ids for p in batches[0]], pad_id, device)
                self._warm_up(methods, points, failed, first_ids, first_mask, generation)
                gammas = sorted({p.gamma for p in points if p.method == "speculative"})
                if gammas and str(batch_size) not in self.progress.costs:
                    bar.update(task, description=f"measuring costs batch={batch_size}")
                    self.progress.costs[str(batch_size)] = measure_costs(target.model, draft.model, first_ids, first_mask,
                                                                         gammas, clock)
                    self.save_progress()
                for repeat in range(config.repeats):
                    for batch_index, batch in enumerate(batches):
                        ids, mask = left_pad([p.token_ids for p in batch], pad_id, device)
                        shift = (batch_index + repeat) % len(points)
                        for point in points[shift:] + points[:shift]:
                            if point in failed or (point.method, point.gamma, batch_size, repeat, batch_index) in done:
                                bar.advance(task)
                                continue
                            bar.update(task, description=point.label)
                            rate = self._run_batch(methods, point, batch, batch_index, repeat, ids, mask, device)
                            if isinstance(rate, str):
                                failed.add(point)
                                self.progress.failures.append({**asdict(point), "status": "failed", "error": rate})
                                self.save_progress()
                                self.console.print(f"[red]{point.label} failed: {rate}; the sweep goes on[/red]")
                            else:
                                bar.update(task, rate=f"{rate:.1f} tok/s")
                            bar.advance(task)
                        self.write_summary()

    def _warm_up(self, methods, points, failed, ids, mask, generation) -> None:
        """Each method on this batch size's first batch, on the run's shapes, before any timing."""
        if not self.config.warmup:
            return
        short = Generation(min(generation.max_new_tokens, 2 * max(self.config.speculative.gamma) + 2),
                           generation.sampling, generation.eos_token_ids)
        for point in points:
            if point in failed:
                continue
            for _ in range(self.config.warmup):
                try:
                    methods.run(point, ids, mask, torch.Generator(ids.device).manual_seed(0), short)
                except (RuntimeError, FloatingPointError) as error:
                    failed.add(point)
                    self.progress.failures.append({**asdict(point), "status": "failed", "error": _one_line(error)})
                    break

    def _run_batch(self, methods: Methods, point: Point, batch, batch_index, repeat, ids, mask, device) -> float | str:
        """Run one method on one batch and append its records; returns tok/s, or the error text."""
        generator = torch.Generator(device).manual_seed(self.config.seed * 1_000_003 + batch_index * 101 + repeat)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            if os.environ.get("SPECULATE_INJECT_FAILURE") == point.label:  # fault injection for the tests
                raise RuntimeError("injected failure")
            records = methods.run(point, ids, mask, generator)
        except torch.cuda.OutOfMemoryError as error:
            torch.cuda.empty_cache()
            return "CUDA out of memory: " + _one_line(error)
        except (RuntimeError, FloatingPointError, ValueError, IndexError) as error:
            return f"{type(error).__name__}: {_one_line(error)}"
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        tokenizer_decode = self._decode
        rows = []
        for prompt, record in zip(batch, records):
            row = {"sample_id": prompt.sample_id, "method": point.method, "gamma": point.gamma,
                   "batch_size": point.batch_size, "repeat": repeat, "batch_index": batch_index, "batch_rows": len(batch),
                   "prompt_tokens": len(prompt.token_ids), "preset": self.config.dataset.preset,
                   **asdict(record), "new_tokens": record.new_tokens,
                   "output_text": tokenizer_decode(record.output_ids), "reference": prompt.reference,
                   "peak_memory_bytes": peak}
            if row["prefill_s"] != row["prefill_s"]:  # NaN: not measured by this method
                row["prefill_s"] = None
            rows.append(row)
        append_jsonl(self.samples_path, rows)
        self.samples.extend(rows)
        wall = max(r.latency_s for r in records)
        return sum(r.new_tokens for r in records) / wall if wall > 0 else 0.0

    _tokenizer = None

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if self._tokenizer else ""


def batch_key(sample: dict) -> tuple:
    return sample["method"], sample.get("gamma"), sample["batch_size"], sample.get("repeat", 0), sample["batch_index"]


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt
