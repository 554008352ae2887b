"""A cost profile (#33): what one step of the engine costs, in seconds, as a function of what the step does, for
the target and each draft model on one device, dtype, engine and compile mode. The replay (eval/replay.py) prices a
schedule with it.

A profile is a list of measured points, each the median of timed repetitions:

- step: a decode step of a model over `rows` rows feeding `width` tokens each on a cache of `kv` tokens: the
  target's 1-token baseline step (width 1), its verification of a chain (width gamma + 1) or of a tree (nodes + 1),
  a draft model's 1-token draft step; each timed as the engine runs it (runner/probes.py: the token's choice, the
  acceptance and the host read included).
- prefill: a model's forward over a batch of `rows` prompts `tokens` wide (padded), as a request group's admission
  runs it.

Between measured points a step is linear in the rows, the width and the cache's length (runner/probes.py measures
at least two of each where the replay needs them); outside the measured rows or widths it is unknown (None: the
prediction says what is missing rather than guess). A prefill is a line in rows x tokens, fitted through its points.

Written as strict, versioned JSON (FORMAT, VERSION) by `python -m runner.profile` (a model pair on a device, no
benchmark) and by every run of our engine (costs.json in the report folder: the points its probes measured).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from eval.stats import between

FORMAT = "speculate-cost-profile"
VERSION = 1
TARGET = "target"


def draft_model(label: str) -> str:
    return f"draft:{label}"


class ProfileError(ValueError):
    """A file that is not a cost profile this version reads: one line saying what is wrong."""


@dataclass
class Profile:
    meta: dict = field(default_factory=dict)  # device, device_name, dtype, engine, compile, torch, models, ...
    steps: list[dict] = field(default_factory=list)  # {model, rows, width, kv, s, reps_s}
    prefills: list[dict] = field(default_factory=list)  # {model, rows, tokens, s, reps_s}

    # ---- the costs -------------------------------------------------------------------------------------------

    def step_s(self, model: str, rows: int, width: int, kv: float | None = None) -> float | None:
        """Seconds of one step of `model` over `rows` rows of `width` tokens at a cache of `kv` tokens; None outside
        the measured rows or widths."""
        table = self._tables().get(model, {})

        def at_rows(r: int) -> float | None:
            by_width = {w: _along(kvs, kv) for w, kvs in table[r].items()}
            return between(by_width, width)

        known = {r: at_rows(r) for r in table}
        return between({r: s for r, s in known.items() if s is not None}, rows)

    def _tables(self) -> dict:
        """model -> rows -> width -> its (kv, seconds) points, sorted; built once (a profile is not changed after it
        is made)."""
        if getattr(self, "_table", None) is None or self._table[0] != len(self.steps):
            table: dict = {}
            for p in self.steps:
                table.setdefault(p["model"], {}).setdefault(int(p["rows"]), {}).setdefault(
                    int(p["width"]), []).append((float(p["kv"]), p["s"]))
            for by_rows in table.values():
                for by_width in by_rows.values():
                    for kvs in by_width.values():
                        kvs.sort()
            self._table = (len(self.steps), table)
        return self._table[1]

    def prefill_s(self, model: str, rows: int, tokens: int) -> float | None:
        """Seconds of a prefill of `rows` prompts `tokens` wide: the line through the model's prefill points in
        rows x tokens (through the origin with one point); None without a point."""
        points = [(p["rows"] * p["tokens"], p["s"]) for p in self.prefills if p["model"] == model]
        if not points:
            return None
        xs = {x for x, _ in points}
        if len(xs) == 1:
            x0 = next(iter(xs))
            return statistics.median(s for _, s in points) * rows * tokens / x0
        mean_x = statistics.fmean(x for x, _ in points)
        mean_s = statistics.fmean(s for _, s in points)
        slope = (sum((x - mean_x) * (s - mean_s) for x, s in points)
                 / sum((x - mean_x) ** 2 for x, _ in points))
        slope = max(slope, 0.0)
        return max(mean_s + slope * (rows * tokens - mean_x), 0.0)

    def resampled(self, rng) -> "Profile":
        """One draw of the profile's own timing noise: each point's median over its repetitions, recomputed on the
        repetitions drawn with replacement (rng: a random.Random); a point with fewer than two repetitions keeps its
        time. The replay's interval prices each of its resamples with one (eval/replay.py).

        The steps of one probe (the same rows and cache) were timed interleaved, repetition r of each one after
        another (runner/probes.py measure_costs; the 1-token target step first and last, its 2r and 2r + 1), so a
        drift of the machine moves them together and cancels in their ratios: they are drawn together, the same
        repetitions for every step of the probe. Prefills, timed apart, are drawn alone."""
        def median_of(reps: list, drawn: list[int] | None) -> float:
            if drawn is None or len(reps) not in (len(drawn), 2 * len(drawn)):
                return statistics.median(rng.choices(reps, k=len(reps)))
            pairs = len(reps) // len(drawn)
            return statistics.median(reps[pairs * j + k] for j in drawn for k in range(pairs))

        probes: dict[tuple, list[int]] = {}
        for i, p in enumerate(self.steps):
            probes.setdefault((p["rows"], p["kv"]), []).append(i)
        steps = list(self.steps)
        for members in probes.values():
            counts = [len(self.steps[i].get("reps_s") or []) for i in members]
            n = min((c for c in counts if c > 1), default=0)  # the probe's repetitions (its 1-token step has 2n)
            drawn = [rng.randrange(n) for _ in range(n)] if n else None
            for i, count in zip(members, counts):
                if count > 1:
                    steps[i] = dict(self.steps[i], s=median_of(self.steps[i]["reps_s"], drawn))
        prefills = [dict(p, s=median_of(p["reps_s"], None)) if len(p.get("reps_s") or []) > 1 else p
                    for p in self.prefills]
        return Profile(meta=self.meta, steps=steps, prefills=prefills)

    def rows_measured(self, model: str = TARGET) -> list[int]:
        return sorted({int(p["rows"]) for p in self.steps if p["model"] == model})

    def widths_measured(self, model: str = TARGET) -> list[int]:
        return sorted({int(p["width"]) for p in self.steps if p["model"] == model})

    def drafts(self) -> list[str]:
        return sorted({p["model"].removeprefix("draft:") for p in self.steps if p["model"].startswith("draft:")})

    # ---- the file --------------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "meta": self.meta, "steps": self.steps,
                "prefills": self.prefills}

    @classmethod
    def from_json(cls, data, where: str = "the cost profile") -> "Profile":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ProfileError(f"{where} is not a cost profile (no \"format\": \"{FORMAT}\"); write one with "
                               "python -m runner.profile --config CONFIG.yaml")
        if data.get("version") != VERSION:
            raise ProfileError(f"{where} is a version {data.get('version')} cost profile; this speculate reads "
                               f"version {VERSION}: profile the device again with python -m runner.profile")
        try:
            steps = [{"model": str(p["model"]), "rows": int(p["rows"]), "width": int(p["width"]),
                      "kv": int(p["kv"]), "s": float(p["s"]), "reps_s": list(p.get("reps_s") or [])}
                     for p in data.get("steps") or []]
            prefills = [{"model": str(p["model"]), "rows": int(p["rows"]), "tokens": int(p["tokens"]),
                         "s": float(p["s"]), "reps_s": list(p.get("reps_s") or [])}
                        for p in data.get("prefills") or []]
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ProfileError(f"{where}: a point is malformed ({error!r}); profile the device again") from error
        bad = [p for p in steps + prefills if not (math.isfinite(p["s"]) and p["s"] >= 0 and p["rows"] >= 1
                                                   and p.get("kv", 0) >= 0 and p.get("width", 1) >= 1)]
        if bad:
            raise ProfileError(f"{where}: a point has a time that is not a finite number of seconds >= 0, or rows, "
                               f"width or cache out of range ({bad[0]}); profile the device again")
        if not isinstance(data.get("meta") or {}, dict):
            raise ProfileError(f"{where}: its meta is not an object; profile the device again")
        return cls(meta=dict(data.get("meta") or {}), steps=steps, prefills=prefills)

    @classmethod
    def load(cls, path) -> "Profile":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as error:
            raise ProfileError(f"{path}: no such cost profile") from error
        except (OSError, json.JSONDecodeError) as error:
            raise ProfileError(f"{path}: not readable as JSON ({error})") from error
        return cls.from_json(data, str(path))

    def save(self, path) -> None:
        from utils.io import write_json
        write_json(Path(path), self.to_json())


def step_point(model: str, rows: int, width: int, kv: int, reps_s: list[float]) -> dict:
    return {"model": model, "rows": int(rows), "width": int(width), "kv": int(kv),
            "s": statistics.median(reps_s), "reps_s": [float(x) for x in reps_s]}


def prefill_point(model: str, rows: int, tokens: int, reps_s: list[float]) -> dict:
    return {"model": model, "rows": int(rows), "tokens": int(tokens), "s": statistics.median(reps_s),
            "reps_s": [float(x) for x in reps_s]}


def from_probe(probe, rows: int) -> tuple[list[dict], list[dict]]:
    """A run's cost probe at one batch size (eval/records.py CostProbe: repetitions in seconds per width and per
    draft, at its context) as profile points: its steps, and its prefills where it timed them."""
    kv = probe.context_tokens or 0
    steps = [step_point(TARGET, rows, width, kv, reps) for width, reps in sorted(probe.target_reps_s.items()) if reps]
    steps += [step_point(draft_model(label), rows, 1, kv, reps) for label, reps in sorted(probe.draft_reps_s.items())
              if reps]
    prefills = [dict(p) for p in getattr(probe, "prefills", None) or []]
    return steps, prefills


def _along(kvs: list[tuple[float, float]], kv: float | None) -> float:
    """The step's seconds at cache `kv` from its (kv, seconds) points: linear through the nearest two (beyond
    them too: a longer cache costs more attention, linearly), the median without kv or with one point."""
    distinct = sorted({k for k, _ in kvs})
    if kv is None or len(distinct) == 1:
        return statistics.median(s for _, s in kvs)
    at = {k: statistics.median(s for kk, s in kvs if kk == k) for k in distinct}
    below = [k for k in distinct if k <= kv]
    above = [k for k in distinct if k >= kv]
    if below and above:
        lo, hi = below[-1], above[0]
    elif below:
        lo, hi = distinct[-2], distinct[-1]
    else:
        lo, hi = distinct[0], distinct[1]
    if lo == hi:
        return at[lo]
    return max(at[lo] + (at[hi] - at[lo]) * (kv - lo) / (hi - lo), 0.0)



def run_costs(progress: dict, env: dict, config: dict | None) -> Profile:
    """A run's profile: the points its probes measured (progress.json's costs: each batch size's, every process's),
    with its machine (env.json) and its models, dtype and compile mode (config.yaml)."""
    from eval.records import OLD_COST_KEYS, CostProbe, per_process

    steps, prefills = [], []
    for size, entry in sorted((progress.get("costs") or {}).items(), key=lambda kv: int(kv[0])):
        for row in per_process(entry, OLD_COST_KEYS).values():
            probe = CostProbe.from_json(row)
            if probe is not None:
                more_steps, more_prefills = from_probe(probe, int(size))
                steps += more_steps
                prefills += more_prefills
    config = config or {}
    target = config.get("target") or {}
    meta = {k: env.get(k) for k in ("device", "device_name", "torch", "transformers", "cpu_count", "git_commit")}
    meta.update(source="the run's probes", engine="ours", dtype=target.get("dtype"),
                quantization=target.get("quantization"), compile=(config.get("engine") or {}).get("compile"),
                target_model=target.get("model"),
                draft_labels=sorted({p["model"].removeprefix("draft:") for p in steps if p["model"] != TARGET}))
    return Profile(meta=meta, steps=steps, prefills=prefills)


def read_env(folder: Path) -> dict:
    try:
        return json.loads((Path(folder) / "env.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_run_costs(folder: Path, progress: dict, config: dict | None) -> None:
    """costs.json in a report folder: the run's profile, where its probes measured any step."""
    profile = run_costs(progress, read_env(folder), config)
    if profile.steps:
        profile.save(Path(folder) / "costs.json")
