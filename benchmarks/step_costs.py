"""What the cost probes time against what a run executes, on a config's own models and prompts.

    python benchmarks/step_costs.py --config configs/default.yaml [--prompts 2] [--reps 5] [--records DIR]

Per prompt, interleaved repetitions (medians, in ms) of each model's forward alone (1 token; the target's of gamma + 1
tokens) and of the steps as the run executes them (runner/probes.py, the functions the cost probes time: the
baseline's step with its argmax, top-2 gap and host read; a draft step; a verification with its acceptance, host read
and rollback), the first as ratios to the target's 1-token forward, the second to the baseline step, at the prompt's
cache and `--further` tokens on.
With --records DIR (a finished run's folder) it also prints the per-step times its records imply: the baseline's
decode time per token, the draft's time per draft forward and the target's per verification round, as ratios
beside the c and v its probe measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def implied_costs(records_dir: Path) -> None:
    """Per speculative point: the run's own draft forward and verification round in baseline steps."""
    rows = [json.loads(line) for line in (records_dir / "samples.jsonl").read_text().splitlines() if line.strip()]
    progress = json.loads((records_dir / "progress.json").read_text())
    for key, by_process in progress.get("costs", {}).items():
        for process, costs in by_process.items():
            print(f"probe {key} {process}: c {costs.get('c_by_draft')} v {costs.get('v')} "
                  f"target 1-token forward {1e3 * costs.get('target_forward_s', 0):.1f} ms")
    points = defaultdict(list)
    for r in rows:
        points[(r["method"], r.get("gamma"))].append(r)
    base = points.pop(("baseline", None))
    step = sum(r["latency_s"] - r["prefill_s"] for r in base) / sum(r["new_tokens"] - 1 for r in base)
    print(f"baseline: {1e3 * step:.1f} ms per decode step ({sum(r['new_tokens'] - 1 for r in base)} steps)")
    for (method, gamma), rs in sorted(points.items(), key=str):
        rounds = sum(len(r["rounds"] or []) for r in rs)
        if not rounds:
            continue
        draft_forwards = sum(r["draft_forwards"] - 1 for r in rs)  # less each row's draft prefill
        draft_s = sum(r["draft_s"] - r["draft_prefill_s"] for r in rs)
        verify_s = sum(r["target_s"] - r["prefill_s"] for r in rs)
        print(f"{method} gamma={gamma}: {rounds} rounds, {draft_forwards} draft forwards; "
              f"draft forward {1e3 * draft_s / draft_forwards:.1f} ms (c_run {draft_s / draft_forwards / step:.3f}), "
              f"verification round {1e3 * verify_s / rounds:.1f} ms (v_run {verify_s / rounds / step:.3f})")


def live(config_path: str, overrides: list[str], prompts: int, reps: int, further: int) -> None:
    import torch

    from decode.drafters.draft_model import DraftModelDrafter
    from runner.probes import (_prefilled, _timed_draft_step, _timed_forward, _timed_target_step, _timed_verification,
                               decoding_context)
    from runner.session import Session
    from utils.config import load_config
    from utils.models import resolve_device

    config, _ = load_config(config_path, overrides)
    session = Session(config, resolve_device(config.device))
    session.load()
    clock, target = session.clock, session.target.model
    label, draft = next(iter(session.context.drafts.items()))
    sampling = session.generation(None).sampling
    gammas = config.speculative.gamma
    with torch.inference_mode():
        for batch in session.batches(1)[:prompts]:
            prompt_ids, prompt_mask = session.batch_tensors(batch)
            for extra in (0, further):
                ids, mask = decoding_context(prompt_ids, prompt_mask, extra)
                token = ids[:, -1]
                target_state, draft_state = _prefilled(target, ids, mask), _prefilled(draft, ids, mask)
                drafter = DraftModelDrafter(draft, session.target.vocab_size, sampling)
                drafter.start(ids, mask)
                steps = {
                    "forward alone: target, 1 token": lambda: _timed_forward(target_state, target, token[:, None], clock),
                    "baseline step as run": lambda: _timed_target_step(target_state, target, token, clock, sampling),
                    "forward alone: draft, 1 token": lambda: _timed_forward(draft_state, draft, token[:, None], clock),
                    "draft step as run": lambda: _timed_draft_step(drafter, token, clock),
                    **{f"forward alone: target, {g + 1} tokens": (lambda g=g: _timed_forward(
                        target_state, target, token[:, None].expand(-1, g + 1).contiguous(), clock)) for g in gammas},
                    **{f"verification as run, gamma {g}": (lambda g=g: _timed_verification(
                        target_state, target, token, g, clock, sampling)) for g in gammas},
                }
                times = defaultdict(list)
                for rep in range(reps + 1):
                    for name, step in steps.items():
                        elapsed = step()
                        if rep:
                            times[name].append(elapsed)
                medians = {name: statistics.median(values) for name, values in times.items()}
                print(f"prompt {batch[0].sample_id}: cache {ids.shape[1]} tokens ({extra} after the prompt), draft {label}")
                for name, values in times.items():
                    unit = medians["baseline step as run" if "as run" in name else "forward alone: target, 1 token"]
                    print(f"  {name:36s} {1e3 * medians[name]:8.1f} ms  {medians[name] / unit:6.3f} x its unit  "
                          f"(min {1e3 * min(values):.1f}, max {1e3 * max(values):.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--further", type=int, default=32, help="also time at the prompt's cache + this many tokens")
    parser.add_argument("--records", type=Path, help="a finished run's folder: the per-step times its records imply")
    parser.add_argument("--no-live", action="store_true", help="only read --records")
    args = parser.parse_args()
    if args.records:
        implied_costs(args.records)
    if not args.no_live:
        live(args.config, args.overrides, args.prompts, args.reps, args.further)


if __name__ == "__main__":
    main()
