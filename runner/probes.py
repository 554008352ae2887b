"""Measurements of the machine rather than of a method: the environment, the cost ratios c and v of
Leviathan's model, the drift probe, and the numerics probe of each model."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from pathlib import Path

import torch

from decode.kv import KVState
from decode.static_kv import new_state
from eval.records import CostProbe


# This OS process, as the records name it: a resumed run or a restarted Ray worker is another process, and the
# report says which pairs of batches two processes measured (not back to back)
PROCESS = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns() // 1_000_000 % 10 ** 10}"


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
        "ray": version("ray"), "device": str(device), "device_name": device_name(device), "cuda": torch.version.cuda,
        "git_commit": commit,
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # the CPU model: a run on an EPYC and one on a Xeon are different machines
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _prefilled(model, ids, mask) -> KVState:
    state = new_state(model)  # engine.compile: the compiled step's static state, whose cost is the one to measure
    state.forward(model, ids, mask, last_only=True)
    return state


def _timed_forward(state: KVState, model, tokens: torch.Tensor, clock) -> float:
    """One forward of tokens [B, W] on top of the prompt's cache, then back to the prompt's cache."""
    width = tokens.shape[1]
    start = clock.now()
    state.forward(model, tokens)
    elapsed = clock.now() - start
    state.keep_prefix_of_last(width, torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device), 0)
    return elapsed


def measure_costs(target, drafts: dict, ids, mask, widths: list[int], clock, reps: int = 7,
                  draft_prefill: bool = False) -> CostProbe:
    """c = t(1-token draft forward) / t(1-token target forward) per draft; v_k = t((k+1)-token target forward)
    / t(1-token target forward) for each draft length k = width - 1, at this batch's cache length.

    The forwards are interleaved, one of each per repetition (after one untimed pass), so that drift of the
    machine touches every ratio alike; each time is the median over the repetitions, and the repetitions
    are kept (reps_s) so the report can say when they disagree. draft_prefill: also fit each draft's prefill
    cost (draft_prefill_cost; only the cost_model schedule reads it).
    """
    states = {"target": _prefilled(target, ids, mask)}
    models = {"target": target}
    for label, model in drafts.items():
        states[f"draft:{label}"] = _prefilled(model, ids, mask)
        models[f"draft:{label}"] = model
    probes = [(f"draft:{label}", 1) for label in drafts] + [("target", w) for w in sorted({1, *widths})]
    times: dict[tuple, list[float]] = {probe: [] for probe in probes}
    for rep in range(reps + 1):
        for name, width in probes:
            tokens = ids[:, -1:].expand(-1, width).contiguous()
            elapsed = _timed_forward(states[name], models[name], tokens, clock)
            if rep:
                times[(name, width)].append(elapsed)
    median = {key: sorted(values)[len(values) // 2] for key, values in times.items()}
    target_one = median[("target", 1)]
    return CostProbe(
        c_by_draft={label: median[(f"draft:{label}", 1)] / target_one for label in drafts},
        v={w - 1: median[("target", w)] / target_one for w in sorted(set(widths)) if w > 1},
        target_forward_s=target_one,
        target_reps_s={width: values for (name, width), values in times.items() if name == "target"},
        draft_reps_s={name.removeprefix("draft:"): values for (name, _), values in times.items() if name != "target"},
        draft_prefill={label: draft_prefill_cost(model, ids, mask, clock, target_one)
                       for label, model in drafts.items()} if draft_prefill else {},
    )


def draft_prefill_cost(model, ids, mask, clock, target_one: float, reps: int = 3) -> dict:
    """The draft's prefill in target steps (1-token target forwards at this batch size), as a line in the
    prompt width P: fixed + per_token * P, fitted through prefills at P and 2P (the prompt twice), medians of
    `reps`. What the cost_model schedule weighs against what drafting can save (a long prompt, few new tokens:
    the draft's prefill may cost more than speculation saves)."""
    def timed(width_ids, width_mask) -> float:
        times = []
        for _ in range(reps):
            start = clock.now()
            _prefilled(model, width_ids, width_mask)
            times.append(clock.now() - start)
        return sorted(times)[len(times) // 2] / target_one

    width = ids.shape[1]
    once = timed(ids, mask)
    twice = timed(torch.cat([ids, ids], dim=1), torch.cat([mask, mask], dim=1))
    per_token = max(twice - once, 0.0) / width
    return {"fixed": max(once - per_token * width, 0.0), "per_token": per_token, "width": width}


def drift_probe(target, ids, mask, clock, reps: int = 3) -> float:
    """Median time of a 1-token target forward at this batch's cache: identical work each time it is
    measured, so a change means the machine changed speed, not the method."""
    state = _prefilled(target, ids, mask)
    tokens = ids[:, -1:].contiguous()
    times = [_timed_forward(state, target, tokens, clock) for _ in range(reps + 1)][1:]
    return sorted(times)[len(times) // 2]
