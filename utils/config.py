"""The YAML experiment: schema, flat seed-style configs, `--set` overrides, one-line errors."""
from __future__ import annotations

import difflib
import json
import math
import re
import types
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator,
                      model_validator)

from decode.methods import ENGINE_SECTIONS, REGISTRY as _METHODS
from utils import ConfigError  # noqa: F401 (importable from here)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Strict):
    model: str = Field(description="hub id, local folder, local .gguf file, an offline model's short name, or "
                                   "synthetic:NAME?layers=L&noise=X (docs/models-and-data.md)")
    label: str | None = Field(None, description="the name a draft goes by in the report (default: from `model`)")
    gguf_file: str | None = Field(None, description="GGUF file inside `model` (a folder or hub repo)")
    revision: str | None = Field(None, description="hub revision (a branch, tag or commit)")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="auto: float32 on a CPU; bfloat16 on GPUs with native bf16 (compute capability >= 8.0), "
                            "float16 on older ones, where bf16 is only emulated; bfloat16 with quantization "
                            "torchao-int4")
    quantization: Literal["none", "8bit", "4bit", "torchao-int4", "torchao-int8"] = Field(
        "none", description="4bit / 8bit: bitsandbytes (4bit is nf4 with double quantization, computing in dtype); "
                            "torchao-int4 / torchao-int8: torchao's weight-only linears (int4 in groups of 128, "
                            "computing in bfloat16: dtype auto or bfloat16; int8 per channel), which run on a CPU too")
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="auto: sdpa, except where flash_attention_2 can run (CUDA, fp16/bf16, flash-attn 2): "
                            "both are then timed at load on the largest batch size and the fastest that gives "
                            "sdpa's greedy tokens is kept; the notes say which and why. flash_attention_2 where it "
                            "cannot run is refused with the reason")
    device_map: str | dict[str, Any] | None = Field(None, description="'auto' or module -> device: split a model "
                                                    "over several devices (accelerate)")
    max_memory: dict[str, str] | None = Field(None, description="device -> size, with device_map: "
                                                               "{0: 70GiB, 1: 70GiB, cpu: 100GiB}")
    kind: Literal["model", "eagle", "eagle3", "medusa"] = Field(
        "model", description="a draft: model (a causal LM of the target's vocabulary; every draft method), or a head "
                             "for the target that reads its hidden states (a local folder): "
                             + ", ".join(f"{kind} ({', '.join(n for n, s in _METHODS.items() if kind in s.draft_kinds)})"
                                         for kind in ("eagle", "eagle3", "medusa")))

    @field_validator("model")
    @classmethod
    def _home(cls, value: str) -> str:
        """~ in a local path is the home folder."""
        return str(Path(value).expanduser()) if value.startswith("~") else value

    @property
    def name(self) -> str:
        """The label in the report: `label`, else the model's last path component."""
        if self.label:
            return self.label
        base = self.model.rstrip("/").split("/")[-1].split(":")[-1]
        return base.removesuffix(".gguf") or self.model


class DatasetConfig(Strict):
    path: str = Field(description="hub id, local .json/.jsonl/.parquet/.csv (optionally .gz; a relative path is looked "
                                  "up in the current folder, then in the repository), or pkg://package/file")
    name: str | None = Field(None, description="hub config name (main for openai/gsm8k)")
    split: str = Field("test", description="hub split; a local file is read whole")
    preset: Literal["gsm8k", "humaneval", "humaneval_edit", "mt_bench", "none"] = Field(
        "none", description="gsm8k (the question; the answer after #### kept for accuracy), humaneval (the code "
                            "prompt), humaneval_edit (a HumanEval task as an edit loop of 3 turns with dataset.turns: "
                            "write it; fix a failing test, the code quoted; add type hints, the code quoted), mt_bench "
                            "(the first turn; all with dataset.turns): the prompt field, the reference and an instruction")
    prompt_field: str | None = Field(None, description="the field holding the prompt (a list: its first turn; all its turns with turns); "
                                                       "default: the preset's, else the one field among prompt, "
                                                       "question, instruction, input, text, turns (none or several "
                                                       "is refused)")
    num_samples: int | None = Field(None, ge=1, description="the first N rows; default: all (a file with fewer runs "
                                                            "what it has, and the notes say so)")
    per_group: int | None = Field(None, ge=1, description="the first N rows of each group_by value (e.g. 2 of each "
                                                          "MT-Bench category), in file order, before num_samples; a prompt's sample_id stays "
                                                          "its row in the file")
    chat_template: Literal["auto", True, False] = Field(
        "auto", description="auto: apply the target tokenizer's chat template where it has one")
    system_prompt: str | None = Field(None, description="system message for the chat template")
    max_prompt_tokens: int | None = Field(None, ge=1, description="longer prompts are cut or dropped "
                                                                  "(prompt_overflow); both are counted in the report")
    prompt_overflow: Literal["truncate", "skip"] = Field(
        "truncate", description="a prompt (of any turn) over max_prompt_tokens or over the target's context "
                                "(max_position_embeddings less generation.max_new_tokens): truncate keeps its last "
                                "tokens, skip drops it (and the rest of its conversation)")
    group_by: str | None = Field(None, description="a field (e.g. category): figures per group as well as overall; "
                                                   "'turn' (with turns): per turn of a conversation")
    turns: int | Literal["all"] = Field(1, description="a row whose prompt is a list of turns (MT-Bench's turns, or a "
                                                       "messages list: its user messages) runs as a conversation of "
                                                       "its first N turns (all: every turn); turn k's prompt is the "
                                                       "chat template over the earlier turns and the target's greedy "
                                                       "answers to them, generated once before timing (docs/models-and-data.md#conversations)")

    @field_validator("turns", mode="before")
    @classmethod
    def _turns(cls, value):
        if value != "all" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"turns must be a whole number >= 1 or 'all', got {value!r}")
        return value
    enable_thinking: bool | None = Field(None, description="passed to the chat template (Qwen3 thinks unless false); "
                                                             "null: the template's default")

    @model_validator(mode="after")
    def _per_group(self):
        if self.per_group is not None and self.group_by in (None, "turn"):
            raise ValueError("per_group takes the first N rows of each dataset.group_by value: set group_by to a "
                             "field of the file (e.g. category), or drop per_group")
        return self


class GenerationConfig(Strict):
    max_new_tokens: int = Field(128, ge=1, description="per sample, EOS included")
    do_sample: bool = Field(False, description="false: greedy; true: sampling with temperature, top_k and top_p (the "
                                               "model's own generation defaults are never applied)")
    temperature: list[float] = Field([1.0], description="with do_sample; a list sweeps, each with its own baseline; "
                                                        "0 in a list is a greedy point; finite and >= 0; a list with "
                                                        "do_sample: false is refused")
    top_k: int | None = Field(None, ge=1, description="sampling: only the k most likely tokens")
    top_p: float | None = Field(None, gt=0, le=1, description="sampling: only the most likely tokens up to this mass")

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, value, info: ValidationInfo):
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("temperature list is empty; give at least one value")
        for v in values:
            # NaN passes `v < 0` and every comparison after it: it would reach the sampler and decode garbage
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy) or a list of them, got {v!r}")
        if len(set(values)) != len(values):
            raise ValueError(f"temperature list {values} repeats a value; list each once")
        if len(values) == 1 and values[0] == 0:
            raise ValueError("temperature 0 alone is greedy decoding: set do_sample: false instead")
        # one temperature with do_sample: false is the default (1.0) and ignored; a list asks for a sweep that
        # greedy decoding would silently collapse into one greedy point
        if len(values) > 1 and info.data.get("do_sample") is False:
            raise ValueError(f"{values} lists several temperatures but do_sample: false decodes greedily; set "
                             "do_sample: true to sample at those temperatures, or drop the temperature list")
        return [float(v) for v in values]

    def temperatures(self) -> list[float | None]:
        """The sweep's temperatures; None = greedy."""
        if not self.do_sample:
            return [None]
        return [t if t > 0 else None for t in self.temperature]


def _sweep(value, key: str) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{key} list is empty; give at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{key} must be an integer or a list of integers, got {v!r}")
        if v < 1:
            raise ValueError(f"{key} must be >= 1, got {v}")
    if len(set(values)) != len(values):
        raise ValueError(f"{key} list {values} repeats a value; list each once")
    return values


SCHEDULES = tuple(dict.fromkeys(s for spec in _METHODS.values() for s in spec.schedules))  # the methods' (their
#   MethodSpec.schedules)


def tree_labels(value) -> list[str | None]:
    """speculative.tree -> its labels (decode/tree_layout.py tree_label). One entry (null, auto, {dynamic: N}, a branching
    list [3, 2, 1, 1], or a label as the records write it: "3-2-1-1", "dynamic-24") or a list of entries (a sweep);
    a list of integers is one branching list, not a sweep."""
    from decode.tree_layout import tree_label

    def integer(k) -> bool:
        return isinstance(k, int) and not isinstance(k, bool)

    if not isinstance(value, list) or (value and all(integer(k) for k in value)):
        return [tree_label(value)]
    if value and all(isinstance(k, (int, float)) and not isinstance(k, bool) for k in value):
        raise ValueError(f"tree {json.dumps(value)}: a branching list has one integer >= 1 per depth, "
                         "e.g. [3, 2, 1, 1]")
    if not value:
        raise ValueError("tree list is empty; give null (a chain), a branching list such as [3, 2, 1, 1], "
                         "{dynamic: 24}, auto, or a list of these")
    if any(integer(k) for k in value):
        raise ValueError(f"tree list {json.dumps(value)} mixes integers with other entries; in a list of trees "
                         "write each branching list in brackets, e.g. [null, [3, 2, 1, 1]]")
    labels = [tree_label(entry) for entry in value]
    if len(set(labels)) != len(labels):
        raise ValueError(f"tree list {json.dumps(labels)} repeats a tree; list each once")
    return labels


class SpeculativeAxes(Strict):
    """speculative:'s sweeps; SpeculativeConfig adds the methods' options (MethodSpec.options)."""
    gamma: list[int] = Field([4], description="max draft tokens per round; a list is a sweep")
    schedule: list[Literal[SCHEDULES]] = Field(
        ["constant"], description="draft-length schedule of draft-model methods; a list is a sweep")
    exit_layer: list[int] | None = Field(None, description="early_exit: the target's first N layers draft, 1 <= N < "
                                                           "the target's layers (checked before the run where the "
                                                           "target's config is on disk, else at load); a list sweeps")
    draft_context: list[int | None] = Field(
        [None], description="speculative and hybrid: the draft model is prefilled with each prompt's last N tokens "
                            "only (a window: its prefill costs N tokens, not the prompt's; it drafts on what it saw "
                            "and on every token generated after), the target still reads the whole prompt; null: the "
                            "whole prompt; a list sweeps (null in a list: also the whole prompt)")
    tree: list[str | None] = Field(
        [None], description="token trees of speculative and prompt_lookup (decode/tree_layout.py): null (a chain of gamma), "
                            "a branching list [3, 2, 1, 1] (a static tree: every node at depth d-1 has k_d children; "
                            "its depth replaces gamma), {dynamic: N} (EAGLE-2's dynamic tree of N nodes, depth gamma) "
                            "or auto (the shape the cost model picks, depth at most gamma); a list of these sweeps "
                            "(a list of integers is one shape). At most 256 nodes; tree points take no schedule")
    synthetic_acceptance: list[float | None] = Field(
        [None], description="a set alpha in (0, 1), or a list of them (a sweep; null in a list: also the real "
                            "acceptance): draft and target run their real forwards, but each draft is accepted by a "
                            "seeded Bernoulli(alpha) chain, not by the target; its points measure the cost at that "
                            "alpha (marked synthetic, no exact match). null: off")

    @field_validator("gamma", mode="before")
    @classmethod
    def _gamma(cls, value):
        return _sweep(value, "gamma")

    @field_validator("exit_layer", mode="before")
    @classmethod
    def _exit_layer(cls, value):
        return None if value is None else _sweep(value, "exit_layer")

    @field_validator("tree", mode="before")
    @classmethod
    def _tree(cls, value):
        return tree_labels(value)

    @field_validator("synthetic_acceptance", mode="before")
    @classmethod
    def _synthetic_acceptance(cls, value):
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("synthetic_acceptance list is empty; give null (off), a number in (0, 1), or a list of them")
        for v in values:
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1):
                raise ValueError(f"synthetic_acceptance must be a number strictly between 0 and 1 (the set alpha), "
                                 f"null, or a list of these, got {v!r}")
        if len(set(values)) != len(values):
            raise ValueError(f"synthetic_acceptance list {values} repeats a value; list each once")
        return [None if v is None else float(v) for v in values]

    @field_validator("draft_context", mode="before")
    @classmethod
    def _draft_context(cls, value):
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("draft_context list is empty; give null (the whole prompt), a token count >= 1, or a list "
                             "of them")
        for v in values:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"draft_context must be a whole number of tokens >= 1 (the draft's window over the "
                                 f"prompt), null (the whole prompt), or a list of these, got {v!r}")
        if len(set(values)) != len(values):
            raise ValueError(f"draft_context list {values} repeats a value; list each once")
        return values

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value):
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("schedule list is empty; give at least one of " + ", ".join(SCHEDULES))
        if len(set(values)) != len(values):
            raise ValueError(f"schedule list {values} repeats a value; list each once")
        return values


def _option_fields() -> dict:
    """Every method's options (MethodSpec.options, dataclasses of option(...) fields) as pydantic fields, once each:
    a method that reads another's option inherits its declaration (hybrid: suffix's), so the two agree."""
    import dataclasses
    import typing

    declared = {}
    for spec in _METHODS.values():
        if spec.options is None:
            continue
        hints = typing.get_type_hints(spec.options)
        for f in dataclasses.fields(spec.options):
            declared.setdefault(f.name, (hints[f.name], Field(f.default, description=f.metadata["description"],
                                                               **f.metadata["bounds"])))
    return declared


SpeculativeConfig = create_model("SpeculativeConfig", __base__=SpeculativeAxes, __module__=__name__,
                                 __doc__="speculative: its sweeps and the options of the methods (decode/methods: each "
                                         "method's file declares the options it reads)", **_option_fields())


class ClusterConfig(Strict):
    backend: Literal["none", "ray"] = Field("none", description="none: this process; ray: a Ray cluster")
    address: str = Field("local", description="local: start a local Ray instance; auto, ray://host:port or host:port "
                                              "as ray.init takes them")
    num_workers: int | None = Field(None, ge=1, description="workers (one device each); default: as many as fit")
    num_gpus: float = Field(0, ge=0, allow_inf_nan=False, description="GPUs per worker, in Ray's terms")
    num_cpus: float = Field(1, ge=0.01, allow_inf_nan=False, description="CPUs per worker, in Ray's terms")
    max_retries: int = Field(2, ge=0, description="a unit whose worker died is retried this many times")


class EngineConfig(Strict):
    cpu_linear: Literal["auto", "default", "onednn_packed"] = Field(
        "auto", description="auto: oneDNN prepacked linears on a CPU in float32 without quantization, for every "
                            "method alike; default: nn.Linear; onednn_packed: require it")
    pack_batch_hint: int = Field(4, ge=1, le=64, description="the batch size the oneDNN weights are packed for")
    compile: bool | Literal["cudagraphs"] = Field(
        False, description="static KV caches and one torch.compile'd graph per decode step shape (on CUDA a CUDA "
                           "graph: one launch per step); cudagraphs: the same static caches and step inputs, each step "
                           "captured with torch.cuda.graph, no inductor (a CPU runs them uncaptured); "
                           "docs/compiled-engine.md. Refused for device_map, flash_attention_2 and cpu_linear: "
                           "onednn_packed")
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "auto", description="torch.compile's mode; auto: reduce-overhead (CUDA graphs) on CUDA, default on a CPU")
    compile_backend: Literal["inductor", "eager"] = Field(
        "inductor", description="torch.compile's backend; eager: dynamo's graph capture without code generation "
                                "(checks that the step compiles as one graph, quickly; no speed-up)")
    compile_scope: Literal["whole", "regional"] = Field(
        "whole", description="what torch.compile traces: whole, each decode step as one graph; regional, one "
                             "decoder layer, compiled once and run for every layer (compile seconds nearly flat in "
                             "depth; the rest of the step eager, and on CUDA a CUDA graph per layer); "
                             "docs/compiled-engine.md. Not read with engine.compile: cudagraphs")
    overlap: bool = Field(False, description="the compiled mode's fused chain rounds (a draft model at a constant "
                                             "schedule): round k + 1 launched from round k's device results before "
                                             "the host reads round k (docs/compiled-engine.md); needs engine.compile")


class SloConfig(Strict):
    ttft_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="a request meets the SLO with its time "
                                                                             "to first token at most this (seconds)")
    tpot_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="... and its mean time per output token "
                                                                              "after the first at most this (ms)")


MAX_REQUESTS = 10_000  # a load point's requests
MAX_IN_FLIGHT = 1024  # requests in flight at once (the largest batches serving engines usually run)
MAX_ARRIVALS_S = 24 * 3600  # a load point's arrivals, waited for in real time
MAX_THINK_S = 3600.0  # a conversation's wait before each later turn, in real time


class LoadConfig(Strict):
    """A serving run (docs/load.md): requests arrive and leave, each load point runs every method on the same
    arrival schedule, with continuous batching (a finished row's slot takes the next waiting request)."""
    concurrency: list[int] | None = Field(None, description="closed loop: at most C requests in flight, the next "
                                                            "starts when one finishes; a list sweeps")
    request_rate: list[float | Literal["inf"]] | None = Field(
        None, description="requests per second (inf: all at once; conversations: first turns per second), capped by "
                          "concurrency where given; a list sweeps")
    arrival: Literal["poisson", "constant"] = Field("poisson", description="gaps between arrivals at request_rate: "
                                                                          "gamma-distributed (poisson at burstiness 1) "
                                                                          "or equal")
    burstiness: float = Field(1.0, gt=0, allow_inf_nan=False, description="poisson arrivals: the gamma shape of the "
                                                                          "gaps (1: Poisson; below 1 burstier), as "
                                                                          "vLLM's bench serve")
    requests: int | None = Field(None, ge=1, description="requests per load point (at most 10,000; at most 1,024 in "
                                                         "flight); default: the dataset's prompts (more cycle through "
                                                         "them)")
    think_s: float = Field(0.0, ge=0, le=MAX_THINK_S, allow_inf_nan=False,
                           description="conversations (dataset.turns): a turn arrives this many seconds after its "
                                       "previous turn's last token (closed loop per conversation); request_rate then "
                                       "paces the conversations' first turns")
    slo: SloConfig = Field(SloConfig(), description="for goodput: the requests per second that meet every limit given")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value):
        return None if value is None else _sweep(value, "load.concurrency")

    @field_validator("request_rate", mode="before")
    @classmethod
    def _rate(cls, value):
        if value is None:
            return None
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("load.request_rate list is empty; give at least one rate, or leave it out")
        rates = []
        for v in values:
            if isinstance(v, str) and v.strip().lower() in ("inf", ".inf", "infinity"):
                v = math.inf
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v <= 0:
                raise ValueError(f"load.request_rate must be a number > 0 (requests per second) or inf, got {v!r}")
            rates.append("inf" if math.isinf(v) else float(v))
        if len(set(rates)) != len(rates):
            raise ValueError(f"load.request_rate list {values} repeats a value; list each once")
        return rates

    @field_validator("requests", mode="before")
    @classmethod
    def _requests(cls, value):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"load.requests must be an integer >= 1 (requests per load point), got {value!r}")
        return value

    @model_validator(mode="after")
    def _some_load(self):
        if self.concurrency is None and self.request_rate is None:
            raise ValueError("load needs concurrency (a closed loop of C requests in flight) or request_rate "
                             "(requests per second), e.g. load: {concurrency: [1, 4]}")
        return self

    def check_scale(self, requests: int, starts: int | None, given: str = "load.requests") -> None:
        """The bounds of a load point, before anything runs (ValueError naming the bound and why): its requests are
        held and written as records per method; every request that may be in flight is one row of the probes' and the
        warmup's batch; its arrivals, `starts` of them at request_rate (the requests that follow none: with
        conversations, the first turns; None: not known yet), are waited for in real time. given: where `requests`
        came from."""
        if requests > MAX_REQUESTS:
            raise ValueError(f"{given}: {requests} requests per load point; at most {MAX_REQUESTS} (each request is "
                             "held in memory and written as a record, for every method and load point): lower "
                             "load.requests, and add repeats for more data")
        in_flight = max(min(c, requests) for c in self.concurrency) if self.concurrency else requests
        if in_flight > MAX_IN_FLIGHT:
            cap = ("load.concurrency" if self.concurrency else
                   f"no load.concurrency: all {requests} requests ({given})")
            raise ValueError(f"{cap} may be in flight at once, {in_flight} rows; at most {MAX_IN_FLIGHT} (the most "
                             "that can be in flight is one batch of the warmup and the cost probes, its KV cache held "
                             f"for every row): give load.concurrency <= {MAX_IN_FLIGHT}")
        for rate in self.request_rate or [] if starts is not None else []:
            if rate != "inf" and starts / rate > MAX_ARRIVALS_S:
                what = f"{starts} requests ({given})" if starts == requests else \
                    f"the {starts} conversations' first turns of {requests} requests ({given})"
                raise ValueError(f"load.request_rate {rate:g}/s spreads {what} over {starts / rate:.10g} s "
                                 f"({starts / rate / 3600:.3g} h); a load point's arrivals may span at most "
                                 f"{MAX_ARRIVALS_S} s ({MAX_ARRIVALS_S // 3600} h: they are waited for in real time): "
                                 "raise load.request_rate or lower load.requests")

    def points(self, requests: int) -> list[tuple[int, float | None]]:
        """The load points as (concurrency, rate): rate None = all at once (inf); no concurrency given = no cap
        (every request may be in flight: `requests`)."""
        rates = [None if r == "inf" else r for r in (self.request_rate or ["inf"])]
        return [(c if c is not None else requests, r) for r in rates for c in (self.concurrency or [None])]


class ReportConfig(Strict):
    summary_file_name: str | None = Field(None, description="an extra copy of summary.json under this name")
    plots: bool = Field(True, description="write the PNG plots")


# runner/session.py seeds each batch's generator with seed * 1_000_003 + batch_index * 101 + repeat, and torch
# takes seeds up to 2**64 - 1: the largest seed leaves 2**40 for batch_index * 101 + repeat (10**10 batches)
SEED_MAX = (2 ** 64 - 1 - 2 ** 40) // 1_000_003


class Config(Strict):
    name: str = Field("experiment", description="names the report folder: letters, digits, '.', '_', '-'")
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    seed: int = Field(0, description=f"seeds sampling: each batch's generator is derived from it, the batch index and "
                                     f"the repeat; 0 to {SEED_MAX}")
    target: ModelConfig = Field(description="the model measured")
    draft: list[ModelConfig] = Field([], description="a draft model, or a list: each against the same baseline; "
                                                     "needed where a method drafts with a model")
    dataset: DatasetConfig = Field(description="the prompts")
    generation: GenerationConfig = GenerationConfig()
    speculative: SpeculativeConfig = SpeculativeConfig()
    batch_size: list[int] = Field([1], description="prompts per batch (left padded); a list sweeps")
    methods: list[str] = Field(["baseline", "speculative"], description="any of the methods (docs/methods.md)")
    warmup: int = Field(1, ge=0, description="untimed runs of every point on the first batch of each comparison, "
                                             "before timing")
    repeats: int | Literal["auto"] = Field(
        1, description="reruns of every batch (averaging each prompt's timing noise; the interval is over prompts, "
                       "so repeats do not narrow it); auto: repeat a comparison while a speedup CI reaches beyond "
                       "+-ci_target of its figure, up to max_repeats, none started after time_budget_s; it stops at "
                       "once where points have too few prompts for an interval, and needs the baseline in methods")
    max_repeats: int = Field(5, ge=1, description="repeats: auto stops here")
    ci_target: float = Field(0.10, gt=0, description="repeats: auto stops once every speedup CI is within +-this share")
    time_budget_s: float | None = Field(None, gt=0, description="repeats: auto starts no new repeat after this")
    load: LoadConfig | None = Field(None, description="a serving run: load points replace batch_size "
                                                      "(docs/load.md)")
    engine: EngineConfig = EngineConfig()
    report: ReportConfig = ReportConfig()
    cluster: ClusterConfig = ClusterConfig()

    @field_validator("draft", mode="before")
    @classmethod
    def _drafts(cls, value):
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    @field_validator("seed", mode="before")
    @classmethod
    def _seed(cls, value):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
            raise ValueError(f"seed must be an integer from 0 to {SEED_MAX} (per-batch seeds derived from it must fit "
                             f"torch's 64 bits), got {value}")
        return value

    @field_validator("repeats", mode="before")
    @classmethod
    def _repeats(cls, value):
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"repeats must be an integer >= 1 or auto, got {value!r}")
        return value

    @model_validator(mode="after")
    def _methods_and_drafts(self):
        from decode.methods import REGISTRY

        for method in self.methods:
            spec = REGISTRY[method]
            if spec.needs_draft and not any(d.kind in spec.draft_kinds for d in self.draft):
                if spec.draft_kinds == ("model",):
                    raise ValueError(f"method {method} needs a draft model: add draft: {{model: ...}}, or drop {method}")
                raise ValueError(f"method {method} needs a draft of kind {' or '.join(spec.draft_kinds)}: add draft: "
                                 f"{{model: ..., kind: {spec.draft_kinds[0]}}}, or drop {method}")
            if "exit_layer" in spec.axes and not self.speculative.exit_layer:
                raise ValueError(f"method {method} needs speculative.exit_layer (the target layers that draft), "
                                 "e.g. exit_layer: [4, 8]")
        engines = {REGISTRY[m].engine for m in self.methods}
        for engine in sorted(engines):
            reference = next(name for name, spec in REGISTRY.items() if spec.is_reference and spec.engine == engine)
            if self.repeats == "auto" and reference not in self.methods:
                raise ValueError(f"repeats: auto repeats until the speedup intervals settle, and there is no speedup "
                                 f"without {reference} in methods: add {reference}, or set repeats to a number")
        for engine in sorted(engines & set(ENGINE_SECTIONS)):  # what each engine refuses of the config
            ENGINE_SECTIONS[engine].CHECK(self)
        heads = {kind for m in self.methods for kind in REGISTRY[m].head_kinds}  # drafts our engine loads as heads
        for index, draft in enumerate(self.draft):
            if draft.kind in heads:
                for key, value, default in [("quantization", draft.quantization, "none"),
                                            ("device_map", draft.device_map, None), ("gguf_file", draft.gguf_file, None)]:
                    if value != default:
                        raise ValueError(f"draft[{index}].{key}: {value!r} applies to a causal LM; a {draft.kind} head "
                                         f"is a local folder loaded whole, in the target's dtype: drop {key}")
        labels = [d.name for d in self.draft]
        if len(set(labels)) != len(labels):
            raise ValueError(f"draft labels {labels} repeat; give each draft its own label: ...")
        self._check_options()
        self._check_trees()
        self._check_synthetic()
        self._check_draft_context()
        if self.load is not None:
            self._check_load()
        if self.engine.compile:
            self._check_compilable()
        elif self.engine.overlap:
            raise ValueError("engine.overlap overlaps the compiled mode's fused rounds; set engine.compile: true (or "
                             "cudagraphs), or drop engine.overlap")
        return self

    def _check_options(self) -> None:
        """Each method of the run gets its typed options (its own checks refuse what it cannot take). An option of a
        method that is not in methods is kept and unused: a config keeps its options while --set changes methods. Options
        that depend on the rest of the config check it (their check_config: ValueError)."""
        for options in self.method_options.values():  # each method's own checks: ValueError
            if hasattr(options, "check_config"):
                options.check_config(self)

    @property
    def method_options(self) -> dict:
        """method -> its typed options (MethodSpec.options) for each method of the run that reads some: what the
        runner hands it (RunContext.options)."""
        values = self.speculative.model_dump()
        return {m: _METHODS[m].typed_options(values) for m in self.methods if _METHODS[m].options}

    def _check_trees(self) -> None:
        """A tree applies to the methods whose axes have it (on either engine: engine.compile compiles its widths)."""
        from decode.methods import REGISTRY

        if self.speculative.tree == [None]:
            return
        self._needs_a_taker("tree")
        if self.speculative.tree == ["auto"]:  # auto prices a drafter's forward: other tree methods would get no point
            left_out = [m for m in self.methods if "tree" in REGISTRY[m].axes and not REGISTRY[m].tree_auto]
            if left_out:
                takers = ", ".join(name for name, spec in REGISTRY.items() if spec.tree_auto)
                raise ValueError(f"speculative.tree: auto is the tree of a drafter with a forward to price ({takers}), "
                                 f"and {left_out[0]} "
                                 "takes static and dynamic trees only, so it would not run; add null or a static tree "
                                 "to the list, e.g. tree: [null, auto]")

    def _check_draft_context(self) -> None:
        """speculative.draft_context windows the prefill of our engine's draft model: refuse it where no method has one."""
        if self.speculative.draft_context != [None]:
            self._needs_a_taker("draft_context")

    def _needs_a_taker(self, axis: str) -> None:
        """Refuse speculative.<axis> set where no method of the run sweeps it (its value would be dropped unseen)."""
        from decode.methods import REGISTRY

        if not any(axis in REGISTRY[m].axes for m in self.methods):
            takers = " or ".join(name for name, spec in REGISTRY.items() if axis in spec.axes)
            raise ValueError(f"speculative.{axis} applies to {takers} only, and methods has none of them: add one, or "
                             f"set {axis}: null")

    def _check_synthetic(self) -> None:
        """speculative.synthetic_acceptance replaces the acceptance of our engine's chains: refuse what has none."""
        from decode.methods import REGISTRY

        if self.speculative.synthetic_acceptance == [None]:
            return
        takers = ", ".join(name for name, spec in REGISTRY.items() if "synthetic_acceptance" in spec.axes)
        # a method with no axis is the target alone (each engine's reference, hf_generate): it takes no acceptance
        others = [m for m in self.methods if REGISTRY[m].axes and "synthetic_acceptance" not in REGISTRY[m].axes]
        if others:
            raise ValueError(f"speculative.synthetic_acceptance applies to {takers} (our engine) only, and {others[0]} "
                             "has no equivalent: drop it from methods, or set synthetic_acceptance: null")
        if not any("synthetic_acceptance" in REGISTRY[m].axes for m in self.methods):
            raise ValueError(f"speculative.synthetic_acceptance applies to {takers} only, and methods has none of them: "
                             "add one, or set synthetic_acceptance: null")
        if self.speculative.tree != [None]:
            raise ValueError("speculative.synthetic_acceptance applies to a chain of drafts, not to token trees: set "
                             "speculative.tree: null, or synthetic_acceptance: null")

    def _check_load(self) -> None:
        """A serving run: every method must take requests that arrive and leave."""
        from decode.methods import REGISTRY

        if self.load.requests is not None:  # the first turns among them are known once the dataset is read
            self.load.check_scale(self.load.requests, self.load.requests if self.dataset.turns == 1 else None)

        fixed = [m for m in self.methods if not REGISTRY[m].serves]
        if fixed:
            takers = ", ".join(name for name, spec in REGISTRY.items() if spec.serves)
            raise ValueError(f"load: {fixed[0]} runs fixed batches only (transformers' generate has no continuous "
                             f"batching); drop it from methods, or drop load. Under load: {takers}")
        if self.load.think_s and self.dataset.turns == 1:
            raise ValueError(f"load.think_s: {self.load.think_s} paces a conversation's turns, and dataset.turns is 1 (no "
                             "conversations); set dataset.turns: 2 (or all), or leave think_s out")
        if self.repeats == "auto":
            raise ValueError("load: repeats: auto settles fixed batches' intervals; under load give repeats a number")
        if self.batch_size != [1]:
            raise ValueError("load replaces batch_size (a serving run's batch is the requests in flight, up to "
                             "load.concurrency): drop batch_size, or drop load for fixed batches")

    def _check_compilable(self) -> None:
        """engine.compile compiles plain torch modules on one device with a mask it builds: refuse what is not."""
        for cap in {_METHODS[m].draft_cap for m in self.methods} - {None}:
            longest = getattr(self.speculative, cap)
            if longest and longest > min(self.speculative.gamma):
                raise ValueError(f"speculative.{cap}: {longest} drafts past gamma, and engine.compile sizes its static "
                                 f"caches and graphs for gamma; set engine.compile: false, or leave {cap} out")
        for role, model in [("target", self.target)] + [(f"draft[{i}]", d) for i, d in enumerate(self.draft)]:
            if role != "target" and model.kind != "model":
                continue
            if model.device_map is not None:
                raise ValueError(f"engine.compile: {role} is split by device_map, and a compiled step runs on one "
                                 f"device; drop {role}.device_map, or set engine.compile: false")
            if self.engine.cpu_linear == "onednn_packed":
                raise ValueError("engine.cpu_linear: onednn_packed cannot be compiled (inductor lowers nn.Linear "
                                 "itself); set cpu_linear: auto, or engine.compile: false")
            if model.attn_implementation == "flash_attention_2":
                raise ValueError(f"engine.compile: {role}.attn_implementation flash_attention_2 takes no prebuilt "
                                 "attention mask; use auto or sdpa with engine.compile")

    @property
    def longest_draft(self) -> int:
        """The most tokens a round of ours may draft: the largest gamma, or a method's draft cap past it
        (MethodSpec.draft_cap: hybrid's speculative.hybrid_max_draft)."""
        caps = [getattr(self.speculative, _METHODS[m].draft_cap) or 0 for m in self.methods if _METHODS[m].draft_cap]
        return max([max(self.speculative.gamma), *caps])

    @property
    def exit_layers(self) -> list[int]:
        """speculative.exit_layer where a method sweeps it, else [] (a list no method uses is not checked)."""
        from decode.methods import REGISTRY

        used = any("exit_layer" in REGISTRY[m].axes for m in self.methods)
        return list(self.speculative.exit_layer or []) if used else []

    @property
    def max_repeats_planned(self) -> int:
        return self.max_repeats if self.repeats == "auto" else self.repeats

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch(cls, value):
        return _sweep(value, "batch_size")

    @field_validator("device")
    @classmethod
    def _device(cls, value):
        if not re.fullmatch(r"cpu|cuda(:\d+)?", value):
            raise ValueError(f"device must be cpu, cuda or cuda:N, got {value!r}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value):
        if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise ValueError(f"name {value!r} is used in a folder name: use letters, digits, '.', '_' or '-'")
        return value

    @field_validator("methods")
    @classmethod
    def _methods(cls, value):
        from decode.methods import REGISTRY

        if not value:
            raise ValueError("methods is empty; list at least one of " + ", ".join(REGISTRY))
        for method in value:
            if method not in REGISTRY:
                close = difflib.get_close_matches(method, list(REGISTRY), n=1, cutoff=0.5)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(f"method '{method}' is not known{hint}; methods: {', '.join(REGISTRY)}")
        if len(set(value)) != len(value):
            raise ValueError(f"methods {value} repeats a method; list each once")
        return value


# ---- seed-style flat configs -------------------------------------------------------------------

# each engine's own section (decode/methods/__init__.py ENGINE_SECTIONS: the key is the engine's name), after the rest
Config = create_model("Config", __base__=Config, __doc__=Config.__doc__, __module__=__name__,
                      **{name: (module.SECTION, module.SECTION()) for name, module in ENGINE_SECTIONS.items()})


FLAT_KEYS = {"draft_model", "target_model", "k", "max_new_tokens", "max_length", "num_samples", "dataset",
             "batch_size", "device", "quantized", "summary_file_name", "name", "seed", "temperature", "do_sample"}


def is_flat(raw: dict) -> bool:
    return "draft_model" in raw or "target_model" in raw


def from_flat(raw: dict) -> dict:
    """Map a seed-style flat config onto the schema (README: 'Seed-style configs')."""
    unknown = set(raw) - FLAT_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"config key '{key}' is not a flat-style key{_did_you_mean(key, FLAT_KEYS)}")
    quantized = raw.get("quantized", False)
    quantization = {True: "4bit", False: "none", None: "none", "4bit": "4bit", "8bit": "8bit", "none": "none"}.get(quantized)
    if quantization is None:
        raise ConfigError(f"quantized: {quantized!r} is not valid; use true (4-bit), false, '4bit' or '8bit'")
    dataset = raw.get("dataset") or {}
    if isinstance(dataset, str):
        dataset = {"path": dataset}
    if not isinstance(dataset, dict):
        raise ConfigError("dataset must be a mapping like {path: openai/gsm8k, name: main}")
    dataset = dict(dataset)
    path = str(dataset.get("path", ""))
    preset = next((p for key, p in [("gsm8k", "gsm8k"), ("humaneval", "humaneval"), ("human_eval", "humaneval"),
                                    ("mt_bench", "mt_bench"), ("mt-bench", "mt_bench")] if key in path.lower()), None)
    if preset and "preset" not in dataset:
        dataset["preset"] = preset
    if "num_samples" in raw:
        dataset["num_samples"] = raw["num_samples"]
    generation = {k: raw[k] for k in ("max_new_tokens", "temperature", "do_sample") if k in raw}
    if "max_length" in raw:
        max_length, new = raw["max_length"], raw.get("max_new_tokens", GenerationConfig().max_new_tokens)
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length <= new:
            raise ConfigError(f"max_length: {max_length!r} must be an integer above max_new_tokens ({new}); "
                              "it caps prompt + new tokens")
        dataset["max_prompt_tokens"] = max_length - new
    out: dict[str, Any] = {
        "target": {"model": raw.get("target_model"), "quantization": quantization},
        "draft": {"model": raw.get("draft_model"), "quantization": quantization},
        "dataset": dataset, "generation": generation,
    }
    for key in ("name", "seed", "device", "batch_size"):
        if key in raw:
            out[key] = raw[key]
    if "k" in raw:
        out["speculative"] = {"gamma": raw["k"]}
    if "summary_file_name" in raw:
        out["report"] = {"summary_file_name": raw["summary_file_name"]}
    return out


# ---- loading and overrides ---------------------------------------------------------------------

def _did_you_mean(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(options))}"


def _path_keys(path: str) -> list[str | int]:
    """`draft[0].kind` or `draft.0.kind` -> ["draft", 0, "kind"]; ConfigError for an empty or malformed part."""
    keys: list[str | int] = []
    for part in path.strip().split("."):
        match = re.fullmatch(r"([^\[\]]*)((?:\[\d+\])*)", part)
        if not match or not (match.group(1) or match.group(2)):
            raise ConfigError(f"--set {path!r}: empty or malformed key '{part}' in the dotted path (write a list's "
                              "item as draft[0].kind or draft.0.kind)")
        name, indices = match.groups()
        if name:
            keys.append(int(name) if name.isdigit() else name)
        keys += [int(i) for i in re.findall(r"\d+", indices)]
    return keys


def apply_override(raw: dict, assignment: str) -> None:
    """`a.b.c=value` with value parsed as YAML (`--set speculative.gamma=[2,4]`); a list's item by its index
    (`--set draft[1].kind=medusa`; a single draft written as a mapping is draft[0])."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set speculative.gamma=[2,4]")
    path, text = assignment.split("=", 1)
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        raise ConfigError(f"--set {path}: value {text!r} is not valid YAML") from None
    keys = _path_keys(path)
    if isinstance(keys[0], int):
        raise ConfigError(f"--set {path}: the config is a mapping; start with a key, e.g. draft[0].kind")
    node: Any = raw
    for depth, key in enumerate(keys):
        where = _shown(keys[:depth + 1])
        last = depth == len(keys) - 1
        if isinstance(key, int):
            if isinstance(node, dict) and key == 0 and isinstance(keys[depth - 1], str):  # a mapping: its item 0
                if last:
                    raise ConfigError(f"--set {path}: '{_shown(keys[:depth])}' is a mapping; set its keys")
                continue
            if not isinstance(node, list):
                raise ConfigError(f"--set {path}: '{_shown(keys[:depth])}' is not a list, cannot index it")
            if key >= len(node):
                raise ConfigError(f"--set {path}: '{_shown(keys[:depth])}' has {len(node)} item(s), so {where} does "
                                  f"not exist; indices start at 0")
            if last:
                node[key] = value
            else:
                node = node[key]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"--set {path}: '{_shown(keys[:depth])}' is not a mapping, cannot set a key inside it")
        if last:
            node[key] = value
            break
        child = node.get(key)
        if child is None:
            if isinstance(keys[depth + 1], int):
                raise ConfigError(f"--set {path}: '{where}' is not set in the config, so it has no item "
                                  f"{keys[depth + 1]}; set it whole (e.g. --set {where}=[...])")
            child = node[key] = {}
        node = child


def _shown(keys: list[str | int]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else ("." if i else "") + k for i, k in enumerate(keys))


_UNION_TAGS = {"int", "float", "str", "bool", "none", "list", "dict", "constrained-int", "constrained-float"}


def _location(error: dict) -> str:
    """The config key an error is about, without the union members' tags pydantic adds (dataset.turns.int)."""
    return ".".join(str(p) for p in error["loc"]
                    if not (isinstance(p, str) and ("[" in p or p.startswith("function-") or p in _UNION_TAGS)))


def _model_at(path: list[str]):
    import typing

    model: Any = Config
    for key in path:
        if key.isdigit():  # an index into a list field: its item type
            continue
        field = model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return None
        model = field.annotation
        if typing.get_origin(model) is list:
            model = typing.get_args(model)[0]
        if typing.get_origin(model) in (typing.Union, types.UnionType):  # an optional section (load: ... | None)
            model = next((arg for arg in typing.get_args(model) if isinstance(arg, type) and issubclass(arg, BaseModel)),
                         model)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def validate(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"config must be a YAML mapping of keys, got {type(raw).__name__}; see configs/default.yaml")
    if is_flat(raw):
        raw = from_flat(raw)
    try:
        config = Config.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        if first["loc"][:2] == ("draft", 0) and isinstance(raw.get("draft"), dict):  # a single draft, written as a mapping
            first = {**first, "loc": ("draft",) + tuple(first["loc"][2:])}
        where = _location(first)
        if first["type"] == "extra_forbidden":
            parent = _model_at([str(p) for p in first["loc"][:-1] if not isinstance(p, int)])
            options = parent.model_fields if parent else {}
            hint = _did_you_mean(str(first["loc"][-1]), options)
            if parent is SpeculativeConfig and "did you mean" in hint:  # the axes and every method's options
                hint += f" (speculative's keys: {', '.join(options)})"
            raise ConfigError(f"config key '{where}' is not known{hint}") from None
        if first["type"] == "missing":
            raise ConfigError(f"config key '{where}' is required; see the config reference in README.md") from None
        message = first["msg"].removeprefix("Value error, ")
        if not where:
            raise ConfigError(f"config: {message}") from None
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) and first["type"] != "value_error" else f" (got {got!r})"
        raise ConfigError(f"config key '{where}': {message}{shown if first['type'] != 'value_error' else ''}") from None
    if config.exit_layers:  # against the target's depth where its config files are here (else once it loads)
        from utils.models import check_exit_layers

        check_exit_layers(config)
    return config


def load_config(path: str | Path, overrides: list[str] = ()) -> tuple[Config, dict]:
    """Returns the validated config and the resolved raw mapping (saved as config.yaml)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config configs/default.yaml or another file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    if raw is None:
        raise ConfigError(f"config file {path} is empty; see configs/default.yaml")
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of keys, got a {type(raw).__name__}")
    if is_flat(raw):
        raw = from_flat(raw)
    for assignment in overrides:
        apply_override(raw, assignment)
    config = validate(raw)
    return config, config.model_dump(mode="json")
