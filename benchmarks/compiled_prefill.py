"""The compiled mode's eager prefill, timed alone and beside the target as a round runs them (docs/gpu.md).

    python benchmarks/compiled_prefill.py --out FILE.json [--device cuda:0] [--target SPEC] [--draft SPEC]

On an H100 (2026-11-27) a compiled run's draft prefill took 48-84 ms after its first batches (5-10 ms before, 7 ms
in the profile) while the target's stayed at 7-10 ms, and the draft's steps went from ~1 ms to 1.3-2.0 ms. This
separates the candidate causes, each printed per repetition: the prefill alone with the state released each time
("alone"); with the earlier states kept alive, so that each takes a new buffer set (new static addresses: new
recordings under CUDA graphs, counted in the summaries) ("kept"); and the engine's order, target prefill, draft
prefill, a chain of 4 draft steps, 3 target steps of 5 tokens ("engine"); with the Python collector's collections
and their time inside each repetition; then where one prefill's time goes (torch.profiler, CPU and CUDA tables).
Synthetic shapes (utils/synthetic_models.py): no weights needed. bf16 on CUDA, fp32 on a CPU.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from decode.static_kv import CompiledModel, attach, new_state  # noqa: E402
from utils.synthetic_models import build_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--target", default="synthetic:qwen3-4b?layers=6")
    parser.add_argument("--draft", default="synthetic:qwen3-0.6b?layers=4")
    parser.add_argument("--prompt", type=int, default=356, help="prompt tokens (GSM8K's first, byte-level)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    collections: list[tuple[int, float]] = []
    started = {}

    def on_collection(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            collections.append((info["generation"], time.perf_counter() - started["t"]))

    gc.callbacks.append(on_collection)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    result: dict = {"device": str(device), "target": args.target, "draft": args.draft, "prompt": args.prompt}
    with torch.inference_mode():
        target, _ = build_model(args.target, dtype, "sdpa", device)
        draft, _ = build_model(args.draft, dtype, "sdpa", device)
        max_length = 64 * ((args.prompt + 128) // 64 + 1)
        compiled_target = CompiledModel(target, (1, 5), max_length, (1, 4))
        compiled_draft = CompiledModel(draft, (1, 2), max_length, (1, 4))
        attach(target, compiled_target)
        attach(draft, compiled_draft)
        ids = torch.randint(0, 1000, (4, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
        mask = torch.ones_like(ids)
        start = time.perf_counter()
        compiled_target.precompile(ids, mask)
        compiled_draft.precompile(ids, mask)
        sync()
        result["compile_s"] = round(time.perf_counter() - start, 2)
        compiled_target.warm = compiled_draft.warm = True

        def prefill(model, width):
            state = new_state(model)
            sync()
            start = time.perf_counter()
            state.forward(model, ids[:1, :width], mask[:1, :width], last_only=True)
            sync()
            return state, (time.perf_counter() - start) * 1e3

        def steps(model, state, n, width=1):
            tokens = ids[:1, -width:]
            sync()
            start = time.perf_counter()
            for _ in range(n):
                tokens = state.forward(model, tokens)[:, -width:].argmax(-1)
            sync()
            return (time.perf_counter() - start) * 1e3 / n

        columns = {"alone": ["draft prefill ms", "draft step ms", "collections", "collections ms"],
                   "kept": ["draft prefill ms", "draft step ms", "collections", "collections ms"],
                   "engine": ["target prefill ms", "draft prefill ms", "draft step ms", "target 5-token step ms",
                              "collections", "collections ms"]}
        for name, repetitions in (("alone", 10), ("kept", 4), ("engine", 10)):
            rows, kept = [], []
            for i in range(repetitions):
                width = args.prompt - 20 * (i % 4)
                collections.clear()
                if name == "engine":
                    target_state, target_ms = prefill(target, width)
                    state, draft_ms = prefill(draft, width)
                    row = [target_ms, draft_ms, steps(draft, state, 4), steps(target, target_state, 3, width=5)]
                    kept = [target_state, state]
                else:
                    state, draft_ms = prefill(draft, width)
                    row = [draft_ms, steps(draft, state, 4)]
                    kept = kept + [state] if name == "kept" else []
                rows.append([round(x, 3) for x in row] + [len(collections),
                                                          round(sum(s for _, s in collections) * 1e3, 2)])
            result[name] = {"columns": columns[name], "rows": rows}
            print(name, columns[name], *rows, sep="\n  ", flush=True)
        result["draft_summary"], result["target_summary"] = compiled_draft.summary(), compiled_target.summary()
        print("draft", result["draft_summary"], "\ntarget", result["target_summary"], flush=True)
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        state = new_state(draft)
        sync()
        with profile(activities=activities) as prof:
            state.forward(draft, ids[:1], mask[:1], last_only=True)
            sync()
        for key, sort in (("profile_cpu", "cpu_time_total"),
                          ("profile_device", "cuda_time_total" if device.type == "cuda" else "self_cpu_time_total")):
            result[key] = prof.key_averages().table(sort_by=sort, row_limit=15)
            print(result[key], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
