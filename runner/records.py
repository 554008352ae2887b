"""What a unit of work brings back, whichever engine ran it: its records (samples.jsonl lines, record_of), its
failures and its drift readings (UnitResult). Our engine (runner/session.py) and the engines in their own process
(runner/engines/process.py) make theirs here."""
from __future__ import annotations

from dataclasses import dataclass, field

from eval.records import CostProbe, Point, SampleRecord
from runner.plan import Unit
from runner.probes import PROCESS


@dataclass
class UnitResult:
    rows: list[dict] = field(default_factory=list)  # records of every point that finished this batch
    failures: list[dict] = field(default_factory=list)  # {point axes, status, error}
    rates: dict = field(default_factory=dict)  # point label -> tok/s on this batch
    drift_probe_s: float | None = None  # the drift probe's reading as the unit starts
    drift_after_s: list[float] = field(default_factory=list)  # a serving unit's: again after each point it ran
    costs: CostProbe | None = None  # the comparison's measured costs (sent with every unit; kept once per process)
    fewer_rows: dict = field(default_factory=dict)  # a load point's costs at fewer rows: rows -> CostProbe
    notes: list[str] = field(default_factory=list)
    worker: str | None = None
    process: str = PROCESS
    probe_process: str | None = None  # drift_probe_s measured elsewhere than `process` (another engine's): keyed by this
    probe_name: str | None = None  # ... and named so in the report
    probe_engine: str | None = None  # ... the engine it probes (progress.json processes[probe_process].engine)

    @property
    def drift_readings(self) -> list[float]:
        """Every drift probe reading of the unit, in order."""
        return ([] if self.drift_probe_s is None else [self.drift_probe_s]) + list(self.drift_after_s)


def record_of(point: Point, unit: Unit, prompt, record, tokenizer, preset: str, per_round: bool, batch_rows: int,
              peak: int | None = None, worker: str | None = None, **measured) -> dict:
    """One samples.jsonl line (eval/records.py SampleRecord) from a decode RowRecord-like `record` (output_ids,
    stop_reason, new_tokens, latency_s, prefill_s, forwards and times, rounds, top2_gaps, a served request's times);
    `measured` overrides what an engine measures otherwise (another engine: no forward counts)."""
    prefill = record.prefill_s
    fields = dict(
        point=point, sample_id=prompt.sample_id, repeat=unit.repeat, batch_index=unit.batch_index,
        batch_rows=batch_rows, group=prompt.group, conversation=getattr(prompt, "conversation", None),
        turn=getattr(prompt, "turn", None),
        prompt_tokens=len(prompt.token_ids), preset=preset,
        reference=prompt.reference, output_ids=record.output_ids,
        output_text=tokenizer.decode(record.output_ids, skip_special_tokens=True), new_tokens=record.new_tokens,
        stop_reason=record.stop_reason, latency_s=record.latency_s,
        prefill_s=None if prefill is None or prefill != prefill else prefill,
        target_forwards=record.target_forwards, draft_forwards=record.draft_forwards, target_s=record.target_s,
        draft_s=record.draft_s, draft_prefill_s=record.draft_prefill_s,
        rounds=record.rounds if per_round else None, peak_memory_bytes=peak,
        top2_gaps=[float(f"{gap:.4g}") for gap in getattr(record, "top2_gaps", None) or []] or None,
        worker=worker, process=PROCESS, **serving_fields(record))
    return SampleRecord(**{**fields, **measured}).to_json()


def serving_fields(record) -> dict:
    """A served request's times (decode/arrivals.py): arrival, admission, first and last token, its emissions."""
    if getattr(record, "arrival_s", None) is None:
        return {}
    return {"arrival_s": record.arrival_s, "admitted_s": record.admitted_s, "first_token_s": record.first_token_s,
            "finish_s": record.finish_s, "emits": [list(e) for e in record.emits]}


def failure(point: Point, status: str, error: str) -> dict:
    return {**point.values(), "status": status, "error": error}
