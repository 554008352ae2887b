"""The one record schema: a line of samples.jsonl. The runner writes it, resume reads it, eval derives
every figure from it. A record is one prompt run by one method at one sweep point."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from decode.arrivals import RequestTimes
from decode.k_model import between
from eval.axes import AXES, Axis, comparison_axes, label_of

# The process of records, costs and drift readings written before processes were recorded (a resumed older folder)
EARLIER_PROCESS = "earlier"
# the keys of progress.json's costs and drift entries of one batch size as written before they were kept per process
OLD_COST_KEYS = ("c", "c_by_draft", "v", "reps_s", "target_forward_s", "draft_prefill", "target_reps_s",
                 "draft_reps_s", "workers")
OLD_DRIFT_KEYS = ("start_s", "end_s", "probes_s")


def per_process(entry: dict | None, old_keys: tuple) -> dict:
    """A costs or drift entry of one batch size, keyed by process: the keys of the older format (one process, before
    processes were recorded) become EARLIER_PROCESS's entry, beside any process keys a resumed run added."""
    entry = dict(entry or {})
    old = {k: entry.pop(k) for k in old_keys if k in entry}
    if old:
        entry.setdefault(EARLIER_PROCESS, old)
    return entry


def probe_process(process: str, engine: str, group) -> str:
    """progress.json's key of another engine's drift probe process: "<process>/<engine> <group>" (group: its worker
    group, runner/engines/process.py probe_group). Its processes entry carries the engine as data (probe_engine)."""
    return f"{process}/{engine} {group}"


def probe_engine(progress: dict, process: str) -> str | None:
    """The engine whose drift probe `process` keys (None: a process of the home engine): its processes entry's
    engine; a folder written before the entry carried it, the engine in its key (probe_process)."""
    entry = (progress.get("processes") or {}).get(process) or {}
    if entry.get("engine"):
        return entry["engine"]
    return process.split("/", 1)[1].split(" ", 1)[0] if "/" in process else None


class AxisValues:
    """The values of some axes (eval/axes.py), by name: immutable, hashable, compared by value; an axis not given is
    None (it does not apply). Its axes are read from the table when asked, so an axis declared later has a field."""
    __slots__ = ("_values",)

    @classmethod
    def axes(cls) -> list[Axis]:
        raise NotImplementedError

    def __init__(self, **values):
        known = {axis.name for axis in self.axes()}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no axis {unknown[0]!r} (eval/axes.py AXES)")
        object.__setattr__(self, "_values", {k: v for k, v in values.items() if v is not None})

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if any(axis.name == name for axis in self.axes()):
            return self._values.get(name)
        raise AttributeError(f"{type(self).__name__} has no axis {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._values == self._values

    def __hash__(self) -> int:
        return hash((type(self).__name__, frozenset(self._values.items())))

    def __reduce__(self):
        return _rebuild, (type(self), self._values)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.values().items() if v is not None)
        return f"{type(self).__name__}({shown})"

    def values(self) -> dict:
        """Every axis of the table, in order: its value or None (a record's axis fields)."""
        return {axis.name: self._values.get(axis.name) for axis in self.axes()}

    @property
    def key(self) -> tuple:
        return tuple(self._values.get(axis.name) for axis in self.axes())

    @property
    def label(self) -> str:
        return label_of(self.values(), self.axes())

    @property
    def serving(self) -> bool:
        """A serving point (config load:): its requests arrive and leave; else a fixed batch."""
        return self._values.get("concurrency") is not None

    @classmethod
    def of(cls, record: dict):
        """The axes' values of a record (samples.jsonl, a failure, a summary run): a field it lacks is None."""
        return cls(**{axis.name: record.get(axis.name) for axis in cls.axes()})


def _rebuild(cls, values: dict):
    return cls(**values)


class Point(AxisValues):
    """One point of the sweep: a method and the value of each axis (eval/axes.py) that applies to it. temperature
    None = greedy decoding; a float = sampling at that temperature."""
    __slots__ = ()

    @classmethod
    def axes(cls) -> list[Axis]:
        return AXES

    @property
    def comparison(self) -> "Comparison":
        """The baseline this point is compared with shares these values."""
        return Comparison(**{axis.name: self._values.get(axis.name) for axis in comparison_axes()})

    def without(self, *names: str) -> dict:
        """Its values but those axes' (a line across them: a plot's, the serving crossover's)."""
        return {k: v for k, v in self.values().items() if k not in names}


class Comparison(AxisValues):
    """The comparison axes' values: the points that share them run on the same batches against one baseline."""
    __slots__ = ()

    @classmethod
    def axes(cls) -> list[Axis]:
        return comparison_axes()


@dataclass
class SampleRecord(RequestTimes):
    """One line of samples.jsonl: its point's axis fields (eval/axes.py, a field each), a served request's times
    (RequestTimes), then these. Times in seconds; None = not measured by this method."""
    point: Point
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
    process: str | None = None  # the OS process that measured it (runner/probes.py PROCESS)
    # the device's joules over this row's batch (a load point's: its span in this repeat), the same on every row of
    # it (runner/energy.py); None: not measured (no counter, another engine, a record written before it was read)
    energy_j: float | None = None
    # the greedy baseline: per new token its top-1 minus top-2 logit (4 significant digits), else None
    top2_gaps: list[float] | None = None
    # a serving point's request, its times those of RequestTimes (decode/arrivals.py). latency_s is then finish -
    # arrival and prefill_s first token - arrival (raw facts, the client's wait for a slot included); the report's TTFT
    # and E2E start at the request's slot instead, derived from these times (eval/served_figures.py with_slots). None: a
    # fixed batch
    request: int | None = None  # a serving point's request index (request i is prompt i, cycling): with sample_id, the row
    # a conversation (dataset.turns): its first turn's sample_id, and this prompt's turn in it (1, 2, ...)
    conversation: int | None = None
    turn: int | None = None
    # served, a conversation's later turn: the request whose next turn it is; it arrived think_s after that one's
    # last token (closed loop per conversation, decode/arrivals.py Load), so its arrival_s is when that happened
    follows: int | None = None
    think_s: float | None = None
    extra: dict = field(default_factory=dict)

    def __getattr__(self, name: str):  # an axis: its point's value
        if name.startswith("_") or name == "point":
            raise AttributeError(name)
        return getattr(self.point, name)

    @property
    def batch_key(self) -> tuple:
        return batch_key(self.to_json())

    def to_json(self) -> dict:
        """The point's axes, then the fields in their order, a served request's times right after `request` (where
        they stood before RequestTimes held them)."""
        times = [f.name for f in fields(RequestTimes)]
        names = [f.name for f in fields(self) if f.name != "point" and f.name not in times]
        names[names.index("request") + 1:names.index("request") + 1] = times
        return {**self.point.values(), **{name: getattr(self, name) for name in names}}

    @classmethod
    def from_json(cls, row: dict) -> "SampleRecord":
        """A line as written; an axis added after it was written did not apply to it (None)."""
        names = {f.name for f in fields(cls)} - {"point"}
        return cls(point=Point.of(row), **{k: v for k, v in row.items() if k in names})


def batch_key(record: dict) -> tuple:
    """A point's batch: one (repeat, batch_index) of it. Resume keeps or reruns whole batches."""
    return Point.of(record).key + (record.get("repeat", 0), record["batch_index"])


@dataclass
class CostProbe:
    """The cost ratios of Leviathan's model measured at one batch size (runner/probes.py measure_costs), in units of
    one 1-token target forward. Written to progress.json as `to_json()`; the cost_model schedule reads it live.

    c: a 1-token draft forward per draft label; v: a (gamma+1)-token target forward per draft length gamma (a tree of
    n nodes besides its root verifies n+1 tokens: its v is keyed n, v_at_nodes). The
    repetitions behind each median are kept so the report can say when they disagree (cost_unstable). Beside c, what
    says whether it measures the models or the host (host_bound): each model's weight bytes as loaded, and on CUDA
    the GPU's busy time in a 1-token forward."""
    c_by_draft: dict[str, float] = field(default_factory=dict)
    v: dict[int, float] = field(default_factory=dict)
    target_forward_s: float | None = None  # the median baseline step (1-token target forward, its token chosen), seconds
    target_reps_s: dict[int, list[float]] = field(default_factory=dict)  # width -> repetitions (s)
    draft_reps_s: dict[str, list[float]] = field(default_factory=dict)  # draft label -> 1-token repetitions (s)
    # draft label -> repetitions (s) of its 2-token forward, a round's first after a full accept (the last draft and
    # the last token), priced in a chain of steps as the 1-token step is (runner/probes.py); none before it was probed
    draft_catch_up_reps_s: dict[str, list[float]] = field(default_factory=dict)
    draft_prefill: dict[str, dict] = field(default_factory=dict)  # draft label -> {fixed, per_token, width}
    workers: list[str] = field(default_factory=list)  # a Ray run: the workers whose probes these are (medians)
    target_weight_bytes: int | None = None  # bytes of the tensors the model holds (runner/probes.py weight_bytes)
    draft_weight_bytes: dict[str, int] = field(default_factory=dict)  # draft label -> the same
    target_busy_s: float | None = None  # CUDA: the GPU's busy time in a 1-token target forward (median), seconds
    draft_busy_s: dict[str, float] = field(default_factory=dict)  # draft label -> the same for its 1-token forward
    per_worker: dict = field(default_factory=dict, repr=False)  # worker -> its CostProbe (not written: each is)
    context_tokens: int | None = None  # the cache (prompt batch width + decoding_context) the steps were timed at
    # the prefills timed after the steps (runner/probes.py prefill_points): eval/costs.py prefill points,
    # {model, rows, tokens, s, reps_s}; none in folders written before them
    prefills: list[dict] = field(default_factory=list)
    # the same steps timed at other caches, where the comparison's prompts differ widely in length (runner/probes.py
    # context_bins): cache (context_tokens) -> a CostProbe of c, v and their repetitions alone; at_cache picks one
    by_context: dict[int, "CostProbe"] = field(default_factory=dict)

    def at_cache(self, cache: float | None) -> "CostProbe":
        """The probe timed nearest a run's mean decoding cache (in ratio: 100 is as far from 50 as from 200): this one
        or one of by_context, which keeps this one's weight bytes, draft prefill and prefills (timed once) and has
        no busy time (timed at this one's cache only)."""
        if cache is None or not self.by_context or not cache > 0:
            return self
        own = [(self.context_tokens, self)] if self.context_tokens else []
        candidates = own + [(k, p) for k, p in self.by_context.items() if k]
        _, chosen = min(candidates, key=lambda kp: abs(math.log(kp[0] / cache)))
        if chosen is self:
            return self
        return replace(self, c_by_draft=chosen.c_by_draft, v=chosen.v, target_forward_s=chosen.target_forward_s,
                       target_reps_s=chosen.target_reps_s, draft_reps_s=chosen.draft_reps_s,
                       draft_catch_up_reps_s=chosen.draft_catch_up_reps_s, context_tokens=chosen.context_tokens,
                       target_busy_s=None, draft_busy_s={}, by_context={},
                       per_worker={name: probe.at_cache(cache) for name, probe in self.per_worker.items()})

    def c_for(self, draft: str | None) -> float | None:
        return None if draft is None else self.c_by_draft.get(draft)

    def v_for(self, gamma: int | None) -> float | None:
        return None if gamma is None else self.v.get(int(gamma))

    def v_at_nodes(self, nodes: int) -> float | None:
        """v of a tree of `nodes` nodes besides its root: its verification is a (nodes+1)-token target forward, v keyed
        `nodes` where measured, else linear between the nearest measured node counts below and above (0 nodes: the
        1-token forward itself, 1.0 by definition); None above the largest measured."""
        return between({0: 1.0, **{int(n): x for n, x in self.v.items() if x is not None}}, nodes)

    def bytes_ratio_for(self, draft: str | None) -> float | None:
        """The draft's weight bytes / the target's: what c would be if both forwards only read their weights."""
        held = None if draft is None else self.draft_weight_bytes.get(draft)
        return held / self.target_weight_bytes if held and self.target_weight_bytes else None

    def busy_share_for(self, draft: str | None) -> float | None:
        """CUDA: the GPU's busy time / the wall time of a 1-token forward of the draft (of the target for None). The
        draft's wall time is c target forwards (c is the ratio of the two medians)."""
        if not self.target_forward_s:
            return None
        if draft is None:
            busy, wall = self.target_busy_s, self.target_forward_s
        else:
            c = self.c_for(draft)
            busy, wall = self.draft_busy_s.get(draft), None if c is None else c * self.target_forward_s
        return busy / wall if busy is not None and wall else None

    def repetitions(self, draft: str | None, gamma: int | None) -> dict[str, list[float]]:
        """The repetitions behind c_for(draft) and v_for(gamma), named for the report."""
        named = {"target 1-token": self.target_reps_s.get(1)}
        if gamma is not None:
            named[f"target {gamma + 1}-token"] = self.target_reps_s.get(gamma + 1)
        if draft is not None:
            named[f"draft {draft} 1-token"] = self.draft_reps_s.get(draft)
        return {name: values for name, values in named.items() if values}

    def to_json(self) -> dict:
        return {"c_by_draft": self.c_by_draft, "v": {str(k): x for k, x in self.v.items()},
                "target_forward_s": self.target_forward_s,
                "target_reps_s": {str(k): x for k, x in self.target_reps_s.items()},
                "draft_reps_s": self.draft_reps_s, "draft_catch_up_reps_s": self.draft_catch_up_reps_s,
                "draft_prefill": self.draft_prefill, "workers": self.workers,
                "target_weight_bytes": self.target_weight_bytes, "draft_weight_bytes": self.draft_weight_bytes,
                "target_busy_s": self.target_busy_s, "draft_busy_s": self.draft_busy_s,
                "context_tokens": self.context_tokens, "prefills": self.prefills,
                **({"by_context": {str(k): p.to_json() for k, p in sorted(self.by_context.items())}}
                   if self.by_context else {})}

    @classmethod
    def from_json(cls, row: dict | None) -> "CostProbe | None":
        """Also reads the untyped dict of report folders written before this class ("c", "reps_s" with names
        such as "target_3", "draft_1" for the first draft, "draft_<label>_1")."""
        if not row:
            return None
        c_by_draft = dict(row.get("c_by_draft") or {})
        target_reps = {int(k): x for k, x in (row.get("target_reps_s") or {}).items()}
        draft_reps = dict(row.get("draft_reps_s") or {})
        first = next(iter(c_by_draft), None)
        for name, values in (row.get("reps_s") or {}).items():  # the older format
            if name.startswith("target_"):
                target_reps[int(name.removeprefix("target_"))] = values
            elif name == "draft_1" and first is not None:
                draft_reps[first] = values
            elif name.startswith("draft_") and name.endswith("_1"):
                draft_reps[name[len("draft_"):-len("_1")]] = values
        return cls(c_by_draft=c_by_draft, v={int(k): x for k, x in (row.get("v") or {}).items()},
                   target_forward_s=row.get("target_forward_s"), target_reps_s=target_reps, draft_reps_s=draft_reps,
                   draft_catch_up_reps_s=dict(row.get("draft_catch_up_reps_s") or {}),
                   draft_prefill=dict(row.get("draft_prefill") or {}), workers=list(row.get("workers") or []),
                   target_weight_bytes=row.get("target_weight_bytes"),
                   draft_weight_bytes=dict(row.get("draft_weight_bytes") or {}), target_busy_s=row.get("target_busy_s"),
                   draft_busy_s=dict(row.get("draft_busy_s") or {}), context_tokens=row.get("context_tokens"),
                   prefills=[dict(p) for p in row.get("prefills") or []],
                   by_context={int(k): cls.from_json(p) for k, p in (row.get("by_context") or {}).items() if p})

    @classmethod
    def across_workers(cls, probes: dict[str, "CostProbe"]) -> "CostProbe | None":
        """The probes of the workers that ran a point (a Ray run; each worker measures its own): each ratio is the
        median over those workers, and `per_worker` keeps every worker's probe, so the report can say how far
        each worker's repetitions and the workers themselves disagree."""
        if not probes:
            return None
        if len(probes) == 1:
            (name, probe), = probes.items()
            return cls(**{**probe.__dict__, "workers": [name], "per_worker": {name: probe}})
        listed = list(probes.values())
        drafts = sorted({d for p in listed for d in p.c_by_draft})
        gammas = sorted({g for p in listed for g in p.v})
        return cls(c_by_draft={d: _median([p.c_by_draft.get(d) for p in listed]) for d in drafts},
                   v={g: _median([p.v.get(g) for p in listed]) for g in gammas},
                   target_forward_s=_median([p.target_forward_s for p in listed]),
                   draft_prefill=next((p.draft_prefill for p in listed if p.draft_prefill), {}),
                   prefills=next((p.prefills for p in listed if p.prefills), []),
                   target_weight_bytes=_median([p.target_weight_bytes for p in listed]),
                   draft_weight_bytes=_medians([p.draft_weight_bytes for p in listed]),
                   target_busy_s=_median([p.target_busy_s for p in listed]),
                   draft_busy_s=_medians([p.draft_busy_s for p in listed]),
                   context_tokens=_median([p.context_tokens for p in listed]),
                   by_context={k: cls.across_workers({n: p.by_context[k] for n, p in probes.items() if k in p.by_context})
                               for k in sorted({k for p in listed for k in p.by_context})},
                   workers=sorted(probes), per_worker=dict(probes))


def _medians(entries: list[dict]) -> dict:
    """Per key, the median over the entries that have it."""
    return {key: _median([entry.get(key) for entry in entries]) for key in sorted({k for e in entries for k in e})}


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
