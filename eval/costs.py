"""A cost profile (#33): what one step of the engine costs, in seconds, as a function of what the step does, for
the target and each draft model on one device, dtype, engine and compile mode. The replay (eval/replay.py) prices a
schedule with it.

A profile is a list of measured points, each the median of timed repetitions:

- step: a decode step of a model over `rows` rows feeding `width` tokens each on a cache of `kv` tokens: the
  target's 1-token baseline step (width 1), its verification of a chain (width gamma + 1) or of a tree (nodes + 1),
  a draft model's 1-token draft step and its 2-token one (a round's first after a full accept: the last draft, never
  fed, and the last token); each timed as the engine runs it (runner/probes.py: the token's choice, the
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

from decode.k_model import between, line
from decode.methods import HOME_ENGINE
from decode.names import TARGET, draft_model, label_of
from utils import UserError

FORMAT = "speculate-cost-profile"
VERSION = 1


class ProfileError(UserError, ValueError):
    """A file that is not a cost profile this version reads: one line saying what is wrong (bad input: exit 2)."""


LONGEST_S = 24 * 3600.0  # a step or prefill timed at more than a day is no measurement of one (1e300 s priced 15x)
AGAIN = "profile the device again (python -m runner.profile), or mend that value"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_time(x, key: str, where: str, fix: str = AGAIN) -> None:
    """A time of the profile: a finite number of seconds above 0 (and at most LONGEST_S); a bool or a string is none."""
    if not (_number(x) and math.isfinite(x) and 0 < x <= LONGEST_S):
        raise ProfileError(f"{where}: {key} is {x!r}, not a time: every time is a finite number of seconds above 0 "
                           f"(at most {LONGEST_S:.0f}); {fix}")


def check_count(x, key: str, where: str, least: int = 1, fix: str = AGAIN) -> None:
    """Rows, tokens, a width or a cache length: an integer of at least `least` (1.7 rows is not a batch)."""
    if not (isinstance(x, int) and not isinstance(x, bool) and x >= least):
        raise ProfileError(f"{where}: {key} is {x!r}, not an integer >= {least}; {fix}")


def check_point(p, key: str, where: str, counts: tuple[str, ...], fix: str = AGAIN) -> None:
    """One point of the profile ({model, counts..., s, reps_s}), each value as the profile holds it: refused in one
    line naming its key."""
    if not isinstance(p, dict):
        raise ProfileError(f"{where}: {key} is {p!r}, not a point (an object); {fix}")
    for name in ("model", *counts, "s"):
        if name not in p:
            raise ProfileError(f"{where}: {key} has no {name}; {fix}")
    if not (isinstance(p["model"], str) and (p["model"] == TARGET or label_of(p["model"]) is not None)):
        raise ProfileError(f"{where}: {key}.model is {p['model']!r}, neither {TARGET!r} nor 'draft:<label>'; {fix}")
    for name in counts:
        check_count(p[name], f"{key}.{name}", where, 0 if name == "kv" else 1, fix)
    check_time(p["s"], f"{key}.s", where, fix)
    reps = p.get("reps_s")
    if reps is not None and not isinstance(reps, list):
        raise ProfileError(f"{where}: {key}.reps_s is {reps!r}, not a list of times; {fix}")
    for index, x in enumerate(reps or []):
        check_time(x, f"{key}.reps_s[{index}]", where, fix)


STEP_COUNTS, PREFILL_COUNTS = ("rows", "width", "kv"), ("rows", "tokens")


@dataclass
class Profile:
    meta: dict = field(default_factory=dict)  # device, device_name, dtype, engine, compile, torch, models, ...
    steps: list[dict] = field(default_factory=list)  # {model, rows, width, kv, s, reps_s}
    prefills: list[dict] = field(default_factory=list)  # {model, rows, tokens, s, reps_s}

    # ---- the costs -------------------------------------------------------------------------------------------

    def step_s(self, model: str, rows: int, width: int, kv: float | None = None,
               beyond: set | None = None) -> float | None:
        """Seconds of one step of `model` over `rows` rows of `width` tokens at a cache of `kv` tokens; None outside
        the measured rows or widths. beyond: kv is added to it where a cache line that prices the step was
        extrapolated past its profiled caches (_along), so that the prediction can say so."""
        table = self._tables().get(model, {})

        def at_rows(r: int) -> float | None:
            by_width = {w: _along(kvs, kv) for w, kvs in table[r].items()}
            return between(by_width, width)

        known = {r: s for r, s in ((r, at_rows(r)) for r in table) if s is not None}
        s = between(known, rows)
        if s is not None and beyond is not None and kv is not None:
            if any(_outside(table[r][w], kv) for r in _neighbours(known, rows) for w in _neighbours(table[r], width)):
                beyond.add(kv)
        return s

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
        rows x tokens (prefill_line); None without a point."""
        line = self.prefill_line(model)
        return None if line is None else max(line[0] + line[1] * rows * tokens, 0.0)

    def prefill_line(self, model: str) -> tuple[float, float] | None:
        """(intercept s, slope s per row-token) of the least-squares line through the model's prefill points in
        rows x tokens, the slope at least 0 (through the origin where the points have one width); None without a
        point. The slope is what one more token fed to a forward costs a row (the recommended schedule's price of a
        catch-up, decode/drafters/schedules.py)."""
        points = [(p["rows"] * p["tokens"], p["s"]) for p in self.prefills if p["model"] == model]
        if not points:
            return None
        xs = {x for x, _ in points}
        if len(xs) == 1:
            return 0.0, statistics.median(s for _, s in points) / next(iter(xs))
        mean_x = statistics.fmean(x for x, _ in points)
        mean_s = statistics.fmean(s for _, s in points)
        slope = max(0.0, sum((x - mean_x) * (s - mean_s) for x, s in points)
                    / sum((x - mean_x) ** 2 for x, _ in points))
        return mean_s - slope * mean_x, slope

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

    def caches(self) -> list[int]:
        """The cache lengths the profile's steps were timed at."""
        return sorted({int(p["kv"]) for p in self.steps})

    def drafts(self) -> list[str]:
        return sorted({label_of(p["model"]) for p in self.steps if label_of(p["model"]) is not None})

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
        parts = {}
        for part, counts in (("steps", STEP_COUNTS), ("prefills", PREFILL_COUNTS)):
            points = data.get(part) or []
            if not isinstance(points, list):
                raise ProfileError(f"{where}: {part} is not a list of points; {AGAIN}")
            for index, p in enumerate(points):
                check_point(p, f"{part}[{index}]", where, counts)
            parts[part] = [{"model": p["model"], **{name: p[name] for name in counts}, "s": float(p["s"]),
                            "reps_s": [float(x) for x in p.get("reps_s") or []]} for p in points]
        if not isinstance(data.get("meta") or {}, dict):
            raise ProfileError(f"{where}: its meta is not an object; profile the device again")
        return cls(meta=dict(data.get("meta") or {}), **parts)

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
    for width, by_label in ((1, probe.draft_reps_s), (2, probe.draft_catch_up_reps_s)):
        steps += [step_point(draft_model(label), rows, width, kv, reps) for label, reps in sorted(by_label.items())
                  if reps]
    prefills = [dict(p) for p in getattr(probe, "prefills", None) or []]
    return steps, prefills


def _along(kvs: list[tuple[float, float]], kv: float | None) -> float:
    """The step's seconds at cache `kv` from its (kv, seconds) points: linear between the nearest two; beyond them,
    the line through the nearest two with its slope at least 0 (a longer cache costs more attention, linearly, never
    less: a probe that timed a longer cache cheaper is noise, not a trend to 0 s), never below the cheapest point, as
    the prefill's line (prefill_s); the median without kv or with one point."""
    distinct = sorted({k for k, _ in kvs})
    if kv is None or len(distinct) == 1:
        return statistics.median(s for _, s in kvs)
    return line({k: statistics.median(s for kk, s in kvs if kk == k) for k in distinct}, kv)


def _outside(kvs: list[tuple[float, float]], kv: float) -> bool:
    """Whether _along prices `kv` beyond its line's profiled caches (with one cache there is no line: a step costs
    the same at every cache)."""
    distinct = {k for k, _ in kvs}
    return len(distinct) > 1 and not min(distinct) <= kv <= max(distinct)


def _neighbours(keys, x) -> list:
    """The keys `between` prices x from: x itself, or the nearest below and above."""
    if x in keys:
        return [x]
    return [k for k in (max((k for k in keys if k < x), default=None), min((k for k in keys if k > x), default=None))
            if k is not None]


def run_costs(progress: dict, env: dict, config: dict | None, where: str = "progress.json") -> Profile:
    """A run's profile: the points its probes measured (progress.json's costs: each batch size's, every process's),
    with its machine (env.json) and its models, dtype and compile mode (config.yaml). As strict as a profile's file:
    a probe's time that is no time is refused in one line naming its key (ProfileError)."""
    from eval.records import OLD_COST_KEYS, CostProbe, per_process

    fix = "mend or delete that probe (the replay then lacks its batch size), or rerun the point"
    costs = progress.get("costs") or {}
    if not isinstance(costs, dict) or not all(isinstance(k, str) and k.isdigit() and int(k) > 0 for k in costs):
        shown = list(costs)[:5] if isinstance(costs, dict) else costs
        raise ProfileError(f"{where}: costs is not keyed by batch size ({shown!r}); {fix}")
    steps, prefills = [], []
    for size, entry in sorted(costs.items(), key=lambda kv: int(kv[0])):
        if entry is not None and not isinstance(entry, dict):
            raise ProfileError(f"{where}: costs.{size} is {entry!r}, not its processes' probes; {fix}")
        for process, row in per_process(entry, OLD_COST_KEYS).items():
            key = f"costs.{size}" + (f".{process}" if process in (entry or {}) else "")
            try:
                probe = CostProbe.from_json(row)
            except (AttributeError, TypeError, ValueError) as error:
                raise ProfileError(f"{where}: {key} is not a cost probe ({error}); {fix}") from None
            if probe is not None:
                check_probe(probe, key, where, fix)
                more_steps, more_prefills = from_probe(probe, int(size))
                steps += more_steps
                prefills += more_prefills
                for cache, other in sorted(probe.by_context.items()):  # the same steps at other caches: kv points
                    check_probe(other, f"{key}.by_context.{cache}", where, fix)
                    steps += from_probe(other, int(size))[0]
    config = config or {}
    target = config.get("target") or {}
    meta = {k: env.get(k) for k in ("device", "device_name", "torch", "transformers", "cpu_count", "git_commit")}
    meta.update(source="the run's probes", engine=HOME_ENGINE, dtype=target.get("dtype"),
                quantization=target.get("quantization"), compile=(config.get("engine") or {}).get("compile"),
                target_model=target.get("model"),
                draft_labels=sorted({label_of(p["model"]) for p in steps if p["model"] != TARGET}))
    return Profile(meta=meta, steps=steps, prefills=prefills)


def check_probe(probe, key: str, where: str, fix: str) -> None:
    """A run's cost probe (eval/records.py CostProbe) held to a profile's rules: its repetitions times, its cache
    length an integer >= 0, its prefills points."""
    named = [(f"target_reps_s.{w}", reps) for w, reps in probe.target_reps_s.items()]
    named += [(f"draft_reps_s.{label}", reps) for label, reps in probe.draft_reps_s.items()]
    named += [(f"draft_catch_up_reps_s.{label}", reps) for label, reps in probe.draft_catch_up_reps_s.items()]
    for name, reps in named:
        if not isinstance(reps, list):
            raise ProfileError(f"{where}: {key}.{name} is {reps!r}, not a list of times; {fix}")
        for index, x in enumerate(reps):
            check_time(x, f"{key}.{name}[{index}]", where, fix)
    if probe.context_tokens is not None:
        check_count(probe.context_tokens, f"{key}.context_tokens", where, 0, fix)
    for index, p in enumerate(probe.prefills):
        check_point(p, f"{key}.prefills[{index}]", where, PREFILL_COUNTS, fix)


def read_progress(folder: Path) -> dict:
    """A report folder's progress.json ({} where it has none); one that is not a JSON object: UserError."""
    return _read_object(Path(folder) / "progress.json", "JSON", "restore it, or delete it to rebuild from "
                        "samples.jsonl alone (without the probes' costs, the failures and the plan)")


def read_config(folder: Path) -> dict:
    """A report folder's config.yaml as saved ({} where it has none); one that is not a YAML mapping: UserError."""
    return _read_object(Path(folder) / "config.yaml", "YAML", "mend it, or restore the config the run was "
                        "launched with")


def _read_object(path: Path, kind: str, fix: str) -> dict:
    import yaml

    if not path.exists():
        return {}
    try:
        text = path.read_text()
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:  # ValueError: JSONDecodeError, UnicodeDecodeError
        mark = getattr(error, "problem_mark", None)  # YAML's: its problem and where, not its whole excerpt
        detail = f"{error.problem} at line {mark.line + 1}" if mark is not None and getattr(error, "problem", None) \
            else " ".join(str(error).split())[:200]
        raise UserError(f"{path} is not readable as {kind} ({detail}); {fix}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a {type(data).__name__}, not a {kind} object of keys; {fix}")
    return data


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
