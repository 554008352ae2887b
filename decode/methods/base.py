"""What a method is to the rest of the tool: one MethodSpec in the registry (decode/methods/__init__.py).

Config validation, the sweep plan, the runner, eval, the table and the plots ask the spec. A serving target
(eval/deploy/) emits our method's recommendation as its engine's method whose counterpart it is (that method's
engine_config or deploy); it names our methods only in the reasons it gives where it has no equivalent (and SGLang,
an engine this benchmark does not run, as the counterparts of its declared algorithms). Configs and tests name them
all.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

@dataclass
class RunContext:
    """What a method's run function may use. Passed explicitly; nothing reaches a method through globals."""
    target: object  # the target nn.Module
    tokenizer: object
    drafts: dict  # draft label -> nn.Module
    target_vocab_size: int  # output rows of the target's LM head
    pad_id: int
    clock: object  # decode.Clock
    costs: object = None  # eval.records.CostProbe of this batch size (the cost_model schedule), None: not measured
    options: dict = field(default_factory=dict)  # method -> its typed options (MethodSpec.options), as the config set
    #   them: a method reads ctx.options[point.method]
    memory: dict = field(default_factory=dict)  # what a method learns across the batches of a point, by point
    load: object = None  # decode/arrivals.py Load: a serving run's arrivals and concurrency; None: a fixed batch
    warming_up: bool = False  # the untimed warmup runs (a shorter max_new_tokens): learn nothing about lengths
    groups: dict = field(default_factory=dict)  # a prompt's token ids (tuple) -> its group (dataset.group_by), if any
    repeat: int = 0  # the repeat running (runner/session.py): the suffix cache is kept per repeat (methods/suffix.py)


@dataclass(frozen=True)
class EngineText:
    """What the report says of an engine other than ours: declared by its reference method, read by eval (the
    others' methods, in decode/methods/__init__.py ENGINE_TEXTS)."""
    title: str  # its name in tables and notes
    methods: str  # its methods together, as the report names them
    no_prediction: str  # why its points have no c, v or prediction (fixed batches)
    no_prediction_load: str  # ... under load
    drift_probe: str  # what its drift probe times
    legend: str  # the legend's engines entry
    # the record extra's keys of its own per-request latency (None: the client's latency_s) and TTFT
    request_times: tuple[str | None, str] | None = None


@dataclass(frozen=True)
class EngineCaps:
    """What an engine can do, declared once by its reference method (MethodSpec.engine_caps) and asked wherever the
    answer differs between engines (decode/methods/__init__.py ENGINE_CAPS, runner/engines/base.py Engine.caps):
    nothing outside an engine's own files compares its name."""
    home: bool = False  # runs its methods in this process (runner/session.py Session) and loads the prompts and
    #   tokenizer every engine takes; its points are the run's own (the cost probes, the profile, the prediction)
    times_forwards: bool = False  # times a draft and a target forward apart: c, v, the cost probes, the replay's
    #   prediction and the draft time share apply to its points
    probes_numerics: bool = False  # probes the numerics of its models (progress.json numerics)
    compiles: bool = False  # engine.compile applies to its methods (decode/compile_plan.py)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    description: str  # one line, for the README and the report legend
    axes: tuple[str, ...]  # the point axes it sweeps (eval/axes.py; every method has the comparison axes)
    run: Callable | None  # (ctx: RunContext, point, prompt_ids [B,P], prompt_mask [B,P], generation, generator) -> list[RowRecord]; None: another engine's (engine_config)
    has_rounds: bool = False  # records carry per-round drafted/accepted/emitted: speculation figures apply
    is_reference: bool = False  # the autoregressive baseline every ratio is computed against
    per_row_timing: bool = True  # False: one wall time per batch, no TTFT or forward counts (transformers' peers)
    max_batch_size: int | None = None  # None: any; 1: batch size 1 only (other sizes are reported as skipped)
    serves: bool = True  # runs under load (config load:): requests that arrive and leave, with continuous batching
    peer: bool = False  # transformers' implementation, run for comparison
    engine: str = "ours"  # the engine that runs it (runner/engines/<engine>): "ours" (this process, run) or another
    #   (its engine_config)
    draft_kinds: tuple[str, ...] = ("model",)  # the kinds of draft entry (config draft[i].kind) its draft axis takes
    engine_config: Callable | None = None  # (point, drafts: label -> ModelConfig, its typed options or None) -> the
    #   point's settings for another engine (its speculative configuration; None: the target alone)
    counterpart: str | None = None  # our engine's method that does the same (another engine's draft-model method:
    #   speculative at constant gamma): the report's engine comparison puts the two side by side, and a serving
    #   target emits the recommendation of our method as this one's settings (eval/deploy/)
    deploy: Callable | None = None  # (choice: eval/deploy/base.py Choice) -> (the flags that deploy it on its engine's
    #   server, notes): what the serving target emits for a recommendation of its counterpart (None: its engine's
    #   target derives them otherwise, from engine_config)
    engine_package: str | None = None  # a package another engine needs for it (checked in its environment before
    #   the run)
    engine_text: EngineText | None = None  # on another engine's reference method: what the report says of it
    engine_caps: EngineCaps | None = None  # on an engine's reference method: what the engine can do (None: nothing
    #   of EngineCaps)
    memory: str = ""  # what it learns across requests and shares between them (the report's notes say it)
    tree_auto: bool = False  # takes `tree: auto` (its drafter drafts a tree a depth per draft forward, priced by its
    #   measured c: decode/drafters/draft_tree.py AutoTree)
    draft_sources: tuple[str, ...] = ()  # a drafter of several sources (hybrid): the sources it may draft from, each
    #   listed in the report's acceptance per source (a source never chosen: zero rows, not left out)
    # what callers ask of a method instead of its name (tests/test_import_graph.py refuses a method's name elsewhere)
    options: type | None = None  # a dataclass of the settings under speculative: it reads (not axes), each field an
    #   option(...): the config types speculative: from the union of them and hands it an instance (RunContext.options)
    schedules: tuple[str, ...] = ()  # the draft-length schedules its schedule axis takes
    measured_schedules: tuple[str, ...] = ()  # those of them that read this run's measured c and v and the draft's
    #   prefill cost (runner/probes.py times every draft length up to gamma, and the prefill)
    draft_cap: str | None = None  # the option that lets a round draft past gamma (its value: the longest draft; None
    #   or unset: gamma): the probes time those widths, engine.compile refuses it past gamma
    prices_rounds: bool = False  # its drafter picks each round's source and length by the measured costs: the probes
    #   time every chain up to its longest draft, trees of two chains, and the draft's prefill
    head_kinds: tuple[str, ...] = ()  # the draft kinds it loads as a head on the target (a local folder, whole, in the
    #   target's dtype: no quantization, device_map or gguf_file)

    @property
    def needs_draft(self) -> bool:
        return "draft" in self.axes

    def typed_options(self, values: dict):
        """Its options (an instance of `options`) from the speculative section's values; ValueError where its own
        checks (the dataclass's __post_init__) refuse them. None: it reads none."""
        if self.options is None:
            return None
        return self.options(**{f.name: values[f.name] for f in fields(self.options) if f.name in values})


def option(default, description: str, **bounds):
    """A field of a method's options dataclass: a setting under speculative: (the config's key is the field's name).
    The config types it from this: its annotation, the default, the description (docs/config.md), and `bounds`, the
    constraints pydantic's Field takes (ge, le, gt, lt, strict, allow_inf_nan). The registry loads without pydantic."""
    return field(default=default, metadata={"description": description, "bounds": bounds})
