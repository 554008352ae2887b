"""The checks only a GPU can settle, in one command, on whatever device is there; one table.

    python benchmarks/gpu_check.py [--device cuda:0] [--json FILE]

Each check builds random models from a config (no weights to download: the device may have no network) and runs
the engine as a run does. On a CPU only the CPU-possible checks run (CI runs them); the others print "skipped" and
why. A check that fails prints FAIL and the script exits 1.

- greedy exact, fp32: speculative == baseline, token for token, ragged batch of 4 with rollback holes.
- greedy exact, bf16 (guard): mismatches in bf16 are allowed only where the exactness guard explains them (the
  baseline's top-2 gap at the first differing token within reach of the numerics probe's drift, eval/flags.py).
- greedy exact, 4-bit (guard): the same through bitsandbytes 4-bit (CUDA with bitsandbytes).
- flash_attention_2 vs sdpa: the same prompts with holes through both: outputs, guard, and ms per verification.
- compiled vs eager: engine.compile's step against the eager engine: outputs, graphs, recompiles after warmup, tok/s.
- timing sync: the engine's clock waits for queued kernels (a reading covers a matmul chain's CUDA-event time).
- memory per device: peak allocated and reserved on each device a run used.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from decode import Clock, DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative  # noqa: E402
from decode.probes import numerics_probe  # noqa: E402
from decode.static_kv import CompiledModel, attach  # noqa: E402
from eval.figures import exact_match  # noqa: E402
from eval.flags import rounding_explains  # noqa: E402

VOCAB = 512


def random_llama(layers: int, hidden: int, seed: int, dtype=torch.float32, attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=max(4, hidden // 64), num_key_value_heads=max(2, hidden // 256),
                         max_position_embeddings=1024, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, attn_implementation=attn)
    return LlamaForCausalLM(config).to(dtype).eval()


def prompts(device, lengths=(7, 19, 3, 12), seed=0):
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids.to(device), mask.to(device)


def pair_run(target, draft, ids, mask, new_tokens=32, gamma=4):
    generation = Generation(max_new_tokens=new_tokens)
    clock = Clock(ids.device)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation, clock=clock)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma,
                                    clock=clock)
    return base, spec


def guarded(target, ids, mask, base, spec, gamma=4) -> tuple[str, str]:
    """The exactness guard on a pair of runs: every mismatch must be one the drift explains."""
    with torch.inference_mode():
        drift_probe = numerics_probe(target, ids, mask, widths=(gamma + 1,))
    drift = max(drift_probe["verify_vs_stepwise_max_logit_diff"], drift_probe["batched_vs_single_max_logit_diff"])
    # the report's own comparison (eval/figures.py): first mismatch and the baseline's gap there
    mismatches = exact_match([{"sample_id": i, "output_ids": s.output_ids} for i, s in enumerate(spec)],
                             [{"sample_id": i, "output_ids": b.output_ids, "top2_gaps": b.top2_gaps}
                              for i, b in enumerate(base)])["mismatches"]
    unexplained = [m for m in mismatches if not rounding_explains(m, drift)]
    detail = f"{len(base) - len(mismatches)}/{len(base)} rows equal, drift {drift:.2g}"
    if mismatches:
        detail += f", {len(mismatches) - len(unexplained)} of {len(mismatches)} mismatches explained by rounding"
    return ("FAIL" if unexplained else "ok"), detail


def check_fp32(device):
    target, draft = random_llama(4, 256, 1).to(device), random_llama(1, 256, 2).to(device)
    ids, mask = prompts(device)
    base, spec = pair_run(target, draft, ids, mask)
    equal = sum(b.output_ids == s.output_ids for b, s in zip(base, spec))
    return ("ok" if equal == len(base) else "FAIL"), f"{equal}/{len(base)} rows equal"


def check_bf16(device):
    target = random_llama(4, 256, 1, torch.bfloat16).to(device)
    draft = random_llama(1, 256, 2, torch.bfloat16).to(device)
    ids, mask = prompts(device)
    base, spec = pair_run(target, draft, ids, mask)
    return guarded(target, ids, mask, base, spec)


def check_4bit(device):
    import importlib.util
    import tempfile

    if device.type != "cuda" or importlib.util.find_spec("bitsandbytes") is None:
        return "skipped", "needs CUDA and bitsandbytes"
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    with tempfile.TemporaryDirectory() as folder:
        random_llama(4, 256, 1).save_pretrained(folder)
        target = AutoModelForCausalLM.from_pretrained(folder, quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16), device_map={"": device}).eval()
    draft = random_llama(1, 256, 2, torch.bfloat16).to(device)
    ids, mask = prompts(device)
    base, spec = pair_run(target, draft, ids, mask)
    return guarded(target, ids, mask, base, spec)


def check_flash_attention(device):
    from utils.models import flash_attention_problem

    problem = flash_attention_problem(device, torch.bfloat16) if device.type == "cuda" else "needs CUDA"
    if problem:
        return "skipped", problem
    sdpa = random_llama(4, 256, 1, torch.bfloat16).to(device)
    flash = copy.deepcopy(sdpa)
    flash.set_attn_implementation("flash_attention_2")
    draft = random_llama(1, 256, 2, torch.bfloat16).to(device)
    ids, mask = prompts(device)
    base, _ = pair_run(sdpa, draft, ids, mask)
    _, spec = pair_run(flash, draft, ids, mask)
    status, detail = guarded(sdpa, ids, mask, base, spec)
    times = {}
    for name, model in (("sdpa", sdpa), ("flash_attention_2", flash)):
        times[name] = timed_verification(model, ids, mask)
    return status, detail + "; ms per 5-token verification: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items())


def timed_verification(model, ids, mask, reps=10) -> float:
    from decode.kv import KVState

    clock = Clock(ids.device)
    with torch.inference_mode():
        state = KVState()
        state.forward(model, ids, mask, last_only=True)
        tokens = ids[:, -5:].contiguous()
        times = []
        for _ in range(reps + 1):
            start = clock.now()
            state.forward(model, tokens)
            times.append(clock.now() - start)
            state.keep_prefix_of_last(5, torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device), 0)
    return 1000 * sorted(times[1:])[reps // 2]


def check_compiled(device, backend="inductor"):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, draft = random_llama(4, 256, 1, dtype).to(device), random_llama(1, 256, 2, dtype).to(device)
    ids, mask = prompts(device)
    gamma, new_tokens = 4, 32
    twins = []
    for model in (target, draft):
        twin = copy.copy(model)
        attach(twin, CompiledModel(twin, (1, gamma + 1), ids.shape[1] + new_tokens + gamma + 2, (ids.shape[0],),
                                   backend=backend))
        twins.append(twin)
    pair_run(*twins, ids, mask, new_tokens, gamma)  # compiles
    for twin in twins:
        twin._speculate_compiled.warm = True
    rates = {}
    outputs = {}
    for name, (t, d) in (("eager", (target, draft)), ("compiled", twins)):
        start = time.perf_counter()
        base, spec = pair_run(t, d, ids, mask, new_tokens, gamma)
        outputs[name] = [r.output_ids for r in base + spec]
        rates[name] = sum(r.new_tokens for r in base + spec) / (time.perf_counter() - start)
    summary = twins[0]._speculate_compiled.summary()
    recompiles = sum(t._speculate_compiled.recompiles_after_warmup for t in twins)
    equal = outputs["compiled"] == outputs["eager"]
    detail = (f"outputs {'equal' if equal else 'DIFFER'}, target graphs {summary['graphs']} ({summary['mode']}), "
              f"recompiles after warmup {recompiles}, tok/s compiled / eager {rates['compiled'] / rates['eager']:.2f}")
    # in bf16 a compiled kernel may round otherwise than eager: there the guard judges, not equality
    ok = recompiles == 0 and (equal or dtype != torch.float32)
    return ("ok" if ok else "FAIL"), detail


def check_timing_sync(device):
    if device.type != "cuda":
        return "skipped", "needs CUDA (a CPU clock reading has nothing queued)"
    a = torch.randn(4096, 4096, device=device)
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    clock = Clock(device)
    torch.cuda.synchronize(device)
    start = clock.now()
    start_event.record()
    for _ in range(50):
        a = (a @ a).clamp_(-1, 1)
    end_event.record()
    elapsed_ms = 1000 * (clock.now() - start)
    kernels_ms = start_event.elapsed_time(end_event)
    ok = elapsed_ms >= 0.95 * kernels_ms
    return ("ok" if ok else "FAIL"), f"clock {elapsed_ms:.1f} ms, CUDA events {kernels_ms:.1f} ms"


def check_memory(device):
    if device.type != "cuda":
        return "skipped", "needs CUDA"
    return "ok", ", ".join(f"cuda:{i} peak allocated {torch.cuda.max_memory_allocated(i) / 2**20:.0f} MiB, reserved "
                           f"{torch.cuda.max_memory_reserved(i) / 2**20:.0f} MiB" for i in range(torch.cuda.device_count()))


CHECKS = [("greedy exact, fp32", check_fp32), ("greedy exact, bf16 (guard)", check_bf16),
          ("greedy exact, 4-bit (guard)", check_4bit), ("flash_attention_2 vs sdpa", check_flash_attention),
          ("compiled vs eager", check_compiled), ("timing sync", check_timing_sync),
          ("memory per device", check_memory)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile-backend", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--json", help="also write the table here as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = []
    for label, check in CHECKS:
        start = time.perf_counter()
        try:
            status, detail = check(device, args.compile_backend) if check is check_compiled else check(device)
        except Exception as error:  # a check that crashes is a failed check, and the others still run
            status, detail = "FAIL", f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
        rows.append({"check": label, "status": status, "detail": detail, "seconds": round(time.perf_counter() - start, 1)})
    print(f"device: {device} ({name}), torch {torch.__version__}\n")
    print("| check | status | detail | s |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['check']} | {row['status']} | {row['detail']} | {row['seconds']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "name": name, "checks": rows}, indent=1))
    return 1 if any(row["status"] == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
