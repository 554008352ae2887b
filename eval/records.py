"""The one record schema: a line of samples.jsonl. The runner writes it, resume reads it, eval derives
every figure from it. A record is one prompt run by one method at one sweep point."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# The named axes of a sweep point. None = the axis does not apply to the point's method.
AXES = ("method", "draft", "gamma", "schedule", "exit_layer", "batch_size", "temperature")
# Points that share these are compared with one another (and with the same baseline).
COMPARISON_AXES = ("batch_size", "temperature")


@dataclass(frozen=True)
class Point:
    """One point of the sweep: a method and the value of each axis that applies to it.

    temperature None = greedy decoding; a float = sampling at that temperature.
    """
    method: str
    batch_size: int
    draft: str | None = None  # the draft's label (config draft[i].label), for methods with a draft model
    gamma: int | None = None  # max draft tokens per round
    schedule: str | None = None  # draft-length schedule: constant | heuristic | confidence | cost_model
    exit_layer: int | None = None  # early_exit: layers of the target that draft
    temperature: float | None = None

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, axis) for axis in AXES)

    @property
    def label(self) -> str:
        shown = {"draft": "draft={}", "gamma": "gamma={}", "schedule": "{}", "exit_layer": "exit={}",
                 "batch_size": "batch={}", "temperature": "T={}"}
        parts = [self.method] + [shown[axis].format(getattr(self, axis)) for axis in AXES[1:]
                                 if getattr(self, axis) is not None]
        if self.temperature is None:
            parts.append("greedy")
        return " ".join(parts)

    @property
    def comparison(self) -> tuple:
        """The baseline this point is compared with shares these values."""
        return tuple(getattr(self, axis) for axis in COMPARISON_AXES)

    @classmethod
    def of(cls, record: dict) -> "Point":
        return cls(**{axis: record.get(axis) for axis in AXES})


@dataclass
class SampleRecord:
    """One line of samples.jsonl. Times in seconds; None = not measured by this method."""
    # the point
    method: str
    batch_size: int
    draft: str | None
    gamma: int | None
    schedule: str | None
    exit_layer: int | None
    temperature: float | None
    # where it ran
    sample_id: int
    repeat: int
    batch_index: int
    batch_rows: int  # rows in this batch: a batch is complete on disk when this many records are
    group: str | None  # dataset.group_by's value for this prompt (e.g. MT-Bench category)
    prompt_tokens: int
    preset: str
    reference: str | None
    # what happened
    output_ids: list[int]
    output_text: str
    new_tokens: int
    stop_reason: str  # "eos" | "length"
    latency_s: float  # from the batch's start to this row's last token
    prefill_s: float | None  # TTFT; None for methods timed per batch only (hf_*)
    target_forwards: int | None  # None: not counted (hf_*)
    draft_forwards: int | None
    target_s: float
    draft_s: float
    draft_prefill_s: float
    rounds: list[dict] | None  # methods with rounds: [{"drafted", "accepted", "emitted"}] per round
    peak_memory_bytes: int | None  # CUDA: the batch's peak allocated memory
    worker: str | None = None  # the worker that measured it (a Ray run), else None
    extra: dict = field(default_factory=dict)

    @property
    def point(self) -> Point:
        return Point.of(asdict(self))

    @property
    def batch_key(self) -> tuple:
        return batch_key(asdict(self))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> "SampleRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})


def batch_key(record: dict) -> tuple:
    """A point's batch: one (repeat, batch_index) of it. Resume keeps or reruns whole batches."""
    return Point.of(record).key + (record.get("repeat", 0), record["batch_index"])
