"""The checks only a GPU can settle, in one command of at most ~10 minutes, on whatever device is there; one table.

    python benchmarks/gpu_check.py [--device cuda:0] [--require] [--json FILE] [--only KEY,...] [--budget-s S]

Library versions first, then each check's row as it finishes. A check that fails prints FAIL and the script exits 1;
--require counts a skipped check as failed (on the GPU machine nothing may be skipped). Every model is random, built
from a config (the device may have no network). Nothing optional is imported before a check needs it: pydantic (the
run's config), bitsandbytes, flash-attn; a check whose package is absent says so. On a CPU the checks a CPU can run
run (CI runs them: tests/test_benchmark_script.py), the others are skipped and say why.

Rows (key: what it checks):
- fp32, bf16: greedy exact, eager: speculative == baseline token for token (fp32), or every mismatch explained by the
  exactness guard (bf16: the baseline's top-2 gap at the first differing token within reach of the numerics drift).
- compiled-fp32: engine.compile's step against the eager engine in fp32, TF32 off: outputs EQUAL (baseline and
  speculative), at batch 1, batch 4 with a row ending early at an EOS, and a short last batch (3 rows on a capacity
  of 4: a dead row); no graph compiled after the warmup.
- cuda-graphs: in that run (CUDA, inductor's cudagraph_or_error on: a skipped CUDA graph is an error), no CUDA graph
  recorded after the warmup.
- compiled-bf16: the same in bf16, through the guard: the drift is the compiled step's own (its numerics probe) and
  the compiled-vs-eager logit difference.
- 4bit: bitsandbytes 4-bit through the runner's own loader (utils/models.py: nf4, double quant, bf16 compute) at batch 1
  and 4, through the guard with the M = 1 kernel probed.
- cupti: a 1B target's eager 1-token forward timed before and after the busy-time probe (runner/probes.py): the
  profiler must not leave later launches slower.
- busy-1b: eager vs compiled ms per 1-token forward and GPU busy share on a 1B synthetic pair (runner/probes.py
  measure_costs): eager flagged host_bound (eval/flags.py), compiled busy >= 0.8 for target and draft.
- release: the runner's release_models (runner/session.py) leaves the device's free memory within 1 GiB of its value
  before the models loaded (CUDA); on a CPU, that the models are freed.
- launch: launch.py end to end on a GPU config with engine.compile, real and synthetic acceptance points: every point
  ok, no graph compiled or captured inside a timed batch.
- flash-attn: flash_attention_2 vs sdpa, holes in the batch: outputs through the guard, ms per verification.
- timing-sync: the engine's clock waits for queued kernels.
- memory: peak allocated and reserved per device.
"""
from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from decode import Clock, DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative  # noqa: E402
from decode.kv import KVState  # noqa: E402
from decode.numerics import numerics_probe  # noqa: E402
from decode.static_kv import CompiledModel, attach, compiled_of  # noqa: E402
from eval.flags import numerics_drift, rounding_explains  # noqa: E402
from utils.versions import installed_versions  # noqa: E402

VOCAB = 512
GAMMA, NEW_TOKENS = 4, 24
BUSY_COMPILED_MIN = 0.8  # the compiled step's GPU busy share: CUDA graphs launch a forward at once
CUPTI_SLOWDOWN = 1.10  # after / before the busy-time probe, same forward: more is the profiler's leftover
RELEASE_SLACK = 2**30  # free device memory after release_models within this of its value before the models loaded
PYDANTIC_MISSING = "needs pydantic, absent here (the run's config): install the GPU wheels (README, GPU section)"
LIBRARIES = ("torch", "transformers", "accelerate", "bitsandbytes", "flash-attn", "pydantic", "gguf")
RECORDINGS = {"count": 0}  # CUDA graphs recorded by inductor's cudagraph trees, this process


# -- models and runs -------------------------------------------------------------------------------------------------
def random_llama(layers: int, hidden: int, seed: int, dtype=torch.float32, attn: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=max(4, hidden // 64), num_key_value_heads=max(2, hidden // 256),
                         max_position_embeddings=1024, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, attn_implementation=attn)
    return LlamaForCausalLM(config).to(dtype).eval()


def synthetic(spec: str, dtype, device):
    """A synthetic: model (utils/synthetic_models.py) on the device, built there where the builder can."""
    from utils.synthetic_models import build_model

    try:
        model, _ = build_model(spec, dtype, "sdpa", device=device)
    except TypeError:  # a builder that builds on the host only
        model, _ = build_model(spec, dtype, "sdpa")
    return model.to(device).eval().requires_grad_(False)


def prompts(device, lengths=(7, 19, 3, 12), seed=0, vocab=VOCAB):
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, vocab, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids.to(device), mask.to(device)


def rows(ids, mask, which):
    """The given rows of a left-padded batch, without the padding columns none of them needs."""
    ids, mask = ids[list(which)], mask[list(which)]
    first = int(mask.any(dim=0).nonzero()[0])
    return ids[:, first:].contiguous(), mask[:, first:].contiguous()


def pair_run(target, draft, ids, mask, generation=None, gamma=GAMMA):
    generation = generation or Generation(max_new_tokens=NEW_TOKENS)
    clock = Clock(ids.device)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation, clock=clock)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma,
                                    clock=clock)
    return base, spec


def mismatches(reference, candidate) -> list[dict]:
    """Rows whose tokens differ: where each starts and the reference's top-2 gap there (None: in length only)."""
    found = []
    for row, (ref, out) in enumerate(zip(reference, candidate)):
        if ref.output_ids == out.output_ids:
            continue
        first = next((i for i, (a, b) in enumerate(zip(ref.output_ids, out.output_ids)) if a != b),
                     min(len(ref.output_ids), len(out.output_ids)))
        gaps = ref.top2_gaps or []
        found.append({"sample_id": row, "first_mismatch": first,
                      "baseline_gap": gaps[first] if first < min(len(gaps), len(out.output_ids)) else None})
    return found


def guard(pairs: dict, drift: float | None) -> tuple[str, str]:
    """The exactness guard over named (reference, candidate) record lists: FAIL where a mismatch is not one the
    drift explains (eval/flags.py rounding_explains)."""
    parts, failed = [], False
    for name, (reference, candidate) in pairs.items():
        found = mismatches(reference, candidate)
        unexplained = [m for m in found if not rounding_explains(m, drift)]
        failed |= bool(unexplained)
        part = f"{name} {len(reference) - len(found)}/{len(reference)} equal"
        if found:
            part += f" ({len(found) - len(unexplained)} of {len(found)} mismatches within the drift's reach)"
        parts.append(part)
    shown = "no drift measured" if drift is None else f"drift {drift:.2g}"
    return ("FAIL" if failed else "ok"), f"{'; '.join(parts)}; {shown}"


def probe_drift(model, ids, mask, widths=(GAMMA + 1,), single_steps=False) -> float | None:
    with torch.inference_mode():
        return numerics_drift(numerics_probe(model, ids, mask, widths, single_steps=single_steps))


# -- checks ----------------------------------------------------------------------------------------------------------
class Context:
    """What the checks share: the device, the compile backend, the time budget, and models one check leaves to the
    next (the 1B pair: the cupti, busy-1b and release checks)."""

    def __init__(self, device: torch.device, backend: str, budget_s: float):
        self.device, self.backend = device, backend
        self.deadline = time.monotonic() + budget_s
        self.cache: dict = {}

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def check_fp32(ctx):
    device = ctx.device
    target, draft = random_llama(4, 256, 1).to(device), random_llama(1, 256, 2).to(device)
    ids, mask = prompts(device)
    base, spec = pair_run(target, draft, ids, mask)
    equal = sum(b.output_ids == s.output_ids for b, s in zip(base, spec))
    return ("ok" if equal == len(base) else "FAIL"), f"{equal}/{len(base)} rows equal"


def check_bf16(ctx):
    device = ctx.device
    target = random_llama(4, 256, 1, torch.bfloat16).to(device)
    draft = random_llama(1, 256, 2, torch.bfloat16).to(device)
    ids, mask = prompts(device)
    base, spec = pair_run(target, draft, ids, mask)
    return guard({"speculative vs baseline": (base, spec)}, probe_drift(target, ids, mask))


def strict_fp32() -> None:
    """fp32 as fp32: no TF32 in matmuls or convolutions (an Ampere+ GPU rounds to 10 mantissa bits otherwise)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def count_recordings() -> bool:
    """Count the CUDA graphs inductor's cudagraph trees record (RECORDINGS); False where this torch has no hook."""
    try:
        from torch._inductor import cudagraph_trees
    except ImportError:
        return False
    manager = getattr(cudagraph_trees, "CUDAGraphTreeManager", None)
    real = getattr(manager, "record_function", None)
    if real is None:
        return False
    if not getattr(real, "counted", False):
        def counted(self, *args, **kwargs):
            RECORDINGS["count"] += 1
            return real(self, *args, **kwargs)

        counted.counted = True
        manager.record_function = counted
    return True


def compiled_twin(model, max_length: int, backend: str, batch_sizes=(1, 4)):
    """The model's weights with engine.compile's step attached (decode/static_kv.py), as the runner builds it."""
    twin = copy.copy(model)
    attach(twin, CompiledModel(twin, (1, GAMMA + 1), max_length, batch_sizes, backend=backend))
    return twin


def compiled_runs(ctx, dtype) -> dict:
    """Eager and compiled runs of one random pair at batch 1, batch 4 with a row ending early (an EOS that row emits),
    and a short last batch (3 rows on a capacity of 4), after a warmup as the runner's (each batch once, then
    precompile); what the compiled runs compiled and recorded after it."""
    device = ctx.device
    target, draft = random_llama(2, 256, 1, dtype).to(device), random_llama(1, 256, 2, dtype).to(device)
    ids, mask = prompts(device)
    free, _ = pair_run(target, draft, ids, mask)
    eos = free[0].output_ids[3]  # row 0 ends at its 4th token at the latest: its slot is a dead row after that
    generation = Generation(NEW_TOKENS, Sampling(), (eos,))
    batches = {"batch 1": rows(ids, mask, [0]), "batch 4": (ids, mask), "batch 3 on capacity 4": rows(ids, mask, [1, 2, 3])}
    twins = [compiled_twin(m, ids.shape[1] + NEW_TOKENS + GAMMA + 2, ctx.backend) for m in (target, draft)]
    for batch_ids, batch_mask in batches.values():  # the warmup: compiles (and on CUDA, records)
        pair_run(*twins, batch_ids, batch_mask, generation)
    with torch.inference_mode():
        for twin in twins:
            compiled_of(twin).precompile(ids, mask)
            compiled_of(twin).warm = True
    recorded = RECORDINGS["count"]
    runs = {}
    for name, (batch_ids, batch_mask) in batches.items():
        runs[name] = {"eager": pair_run(target, draft, batch_ids, batch_mask, generation),
                      "compiled": pair_run(*twins, batch_ids, batch_mask, generation), "ids": batch_ids,
                      "mask": batch_mask}
    summaries = [compiled_of(twin).summary() for twin in twins]
    return {"runs": runs, "target": target, "twin": twins[0], "eos": eos,
            "recompiles": sum(s.get("recompiles_after_warmup", 0) for s in summaries),
            "recordings": RECORDINGS["count"] - recorded,
            "recordings_after_warmup": sum(s.get("recordings_after_warmup", 0) for s in summaries),
            "skips": sum(s.get("skips", 0) for s in summaries), "graphs": summaries[0].get("graphs"),
            "mode": summaries[0].get("mode")}


def check_compiled_fp32(ctx):
    strict_fp32()
    result = compiled_runs(ctx, torch.float32)
    ctx.cache["compiled_fp32"] = result
    parts, equal_all = [], True
    for name, run in result["runs"].items():
        (eager_base, eager_spec), (base, spec) = run["eager"], run["compiled"]
        equal = [e.output_ids == c.output_ids for e, c in zip(eager_base + eager_spec, base + spec)]
        exact = [b.output_ids == s.output_ids for b, s in zip(base, spec)]
        equal_all &= all(equal) and all(exact)
        parts.append(f"{name}: {sum(equal)}/{len(equal)} equal to eager, {sum(exact)}/{len(exact)} speculative = baseline")
    ended = sum(r.stop_reason == "eos" for r in result["runs"]["batch 4"]["eager"][0])
    detail = (f"{'; '.join(parts)}; {ended} of 4 rows ended at the EOS; target graphs {result['graphs']} "
              f"({result['mode']}), recompiles after warmup {result['recompiles']}")
    return ("ok" if equal_all and result["recompiles"] == 0 else "FAIL"), detail


def check_cuda_graphs(ctx):
    if not ctx.cuda:
        return "skipped", "needs CUDA (inductor's CUDA graphs)"
    result = ctx.cache.get("compiled_fp32")
    if result is None:
        return "FAIL", "the compiled-fp32 check did not finish: nothing to read"
    if result["mode"] != "reduce-overhead":
        return "FAIL", f"the compiled step ran in mode {result['mode']}, not reduce-overhead: no CUDA graphs"
    after = max(result["recordings"], result["recordings_after_warmup"])
    detail = (f"CUDA graphs recorded after the warmup: {after} (inductor's recordings counted: "
              f"{'yes' if ctx.cache.get('counting') else 'no'}), skips {result['skips']}, cudagraph_or_error "
              f"{'on' if ctx.cache.get('or_error') else 'absent in this torch'}")
    return ("ok" if after == 0 and result["skips"] == 0 else "FAIL"), detail


def path_drift(model, twin, ids, mask, width=GAMMA + 1) -> float:
    """max |logit diff| of the compiled step against the eager forward: the same prefill and width tokens after it."""
    from decode.static_kv import StaticKVState

    tokens = ids[:, -1:].expand(-1, width).contiguous()
    with torch.inference_mode():
        eager, compiled = KVState(), StaticKVState(compiled_of(twin))
        eager.forward(model, ids, mask, last_only=True)
        compiled.forward(twin, ids, mask, last_only=True)
        return float((eager.forward(model, tokens) - compiled.forward(twin, tokens)).abs().max())


def check_compiled_bf16(ctx):
    result = compiled_runs(ctx, torch.bfloat16)
    statuses, parts = [], []
    for name, run in result["runs"].items():
        (eager_base, eager_spec), (base, spec) = run["eager"], run["compiled"]
        drift = probe_drift(result["twin"], run["ids"], run["mask"]) + \
            path_drift(result["target"], result["twin"], run["ids"], run["mask"])
        # each judged where the eager baseline's gaps are known; a compiled speculative token can be off by both
        # paths' rounding at once (compiled vs eager, and verification vs one token at a time): their sum
        status, detail = guard({"compiled vs eager baseline": (eager_base, base),
                                "compiled speculative vs eager baseline": (eager_base, spec),
                                "compiled speculative vs compiled baseline": (base, spec)}, drift)
        statuses.append(status)
        parts.append(f"{name}: {detail}")
    ok = "FAIL" not in statuses and result["recompiles"] == 0
    return ("ok" if ok else "FAIL"), " | ".join(parts) + f" | recompiles after warmup {result['recompiles']}"


def quantization_of(model) -> dict:
    config = getattr(model.config, "quantization_config", None)
    return config.to_dict() if hasattr(config, "to_dict") else dict(config or {})


def check_4bit(ctx):
    if not ctx.cuda or importlib.util.find_spec("bitsandbytes") is None:
        return "skipped", "needs CUDA and bitsandbytes"
    if importlib.util.find_spec("pydantic") is None:
        return "skipped", PYDANTIC_MISSING
    from utils.config import ModelConfig
    from utils.models import load_model
    from utils.synthetic_models import build_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        random_llama(4, 256, 1).save_pretrained(folder)
        build_tokenizer(VOCAB).save_pretrained(folder)
        loaded = load_model(ModelConfig(model=folder, dtype="bfloat16", quantization="4bit", attn_implementation="sdpa"),
                            ctx.device, "target")
    quant = quantization_of(loaded.model)
    as_runs = (quant.get("bnb_4bit_quant_type") == "nf4" and quant.get("bnb_4bit_use_double_quant") is True
               and "bfloat16" in str(quant.get("bnb_4bit_compute_dtype")))
    draft = random_llama(1, 256, 2, torch.bfloat16).to(ctx.device)
    ids, mask = prompts(ctx.device)
    statuses, parts = [], []
    for name, (batch_ids, batch_mask) in {"batch 1": rows(ids, mask, [1]), "batch 4": (ids, mask)}.items():
        base, spec = pair_run(loaded.model, draft, batch_ids, batch_mask)
        status, detail = guard({name: (base, spec)}, probe_drift(loaded.model, batch_ids, batch_mask, single_steps=True))
        statuses.append(status)
        parts.append(detail)
    kind = (f"{quant.get('bnb_4bit_quant_type')}, double quant {quant.get('bnb_4bit_use_double_quant')}, compute "
            f"{quant.get('bnb_4bit_compute_dtype')}")
    ok = as_runs and "FAIL" not in statuses
    return ("ok" if ok else "FAIL"), f"loaded as {kind}{'' if as_runs else ' (NOT as runs load it)'}; " + "; ".join(parts)


def pair_1b(ctx) -> dict:
    """The 1B synthetic target and an 8-layer draft cut from it (bf16, sdpa), and the device's free memory before
    they loaded (the release check's reference). An 8-layer draft, so that c is large enough for host_bound's rule."""
    if "pair_1b" not in ctx.cache:
        gc.collect()
        torch.cuda.empty_cache()
        free_before, _ = torch.cuda.mem_get_info(ctx.device)
        target = synthetic("synthetic:llama-1b", torch.bfloat16, ctx.device)
        draft = synthetic("synthetic:llama-1b?layers=8", torch.bfloat16, ctx.device)
        ids, mask = prompts(ctx.device, lengths=(128,), vocab=32000)
        ctx.cache["pair_1b"] = {"target": target, "draft": draft, "ids": ids, "mask": mask, "free_before": free_before,
                                "compiled": False}
    return ctx.cache["pair_1b"]


def check_cupti(ctx):
    if not ctx.cuda:
        return "skipped", "needs CUDA (the busy-time probe profiles CUDA kernels)"
    from runner.probes import _busy_forward_s, _timed_forward

    pair = pair_1b(ctx)
    target, ids, mask = pair["target"], pair["ids"], pair["mask"]
    clock = Clock(ctx.device)
    tokens = ids[:, -1:].contiguous()
    with torch.inference_mode():
        state = KVState()
        state.forward(target, ids, mask, last_only=True)

        def median_ms(reps=31):
            times = sorted(_timed_forward(state, target, tokens, clock) for _ in range(reps))
            return 1000 * times[reps // 2]

        median_ms(5)  # warm
        first, before = median_ms(), median_ms()
        busy = _busy_forward_s(state, target, tokens, clock, 3)
        after = median_ms()
    ratio = after / before
    detail = (f"eager 1-token forward {before:.2f} ms before the probe ({first:.2f} ms a block earlier), {after:.2f} ms "
              f"after: x{ratio:.2f}; busy {'none seen' if busy is None else f'{1000 * busy:.2f} ms'}; TEARDOWN_CUPTI="
              f"{os.environ.get('TEARDOWN_CUPTI')}")
    return ("ok" if ratio <= CUPTI_SLOWDOWN and busy is not None else "FAIL"), detail


def costs_figures(costs) -> dict:
    c = costs.c_for("d")
    return {"draft_cost_ratio_c": c, "weight_bytes_ratio": costs.draft_weight_bytes["d"] / costs.target_weight_bytes,
            "draft_busy_share": costs.busy_share_for("d"), "target_busy_share": costs.busy_share_for(None),
            "target_ms": 1000 * costs.target_forward_s, "draft_ms": 1000 * c * costs.target_forward_s}


def check_busy(ctx):
    if not ctx.cuda:
        return "skipped", "needs CUDA (GPU busy time)"
    from eval.flags import host_bound
    from runner.probes import measure_costs

    pair = pair_1b(ctx)
    target, draft, ids, mask = pair["target"], pair["draft"], pair["ids"], pair["mask"]
    clock = Clock(ctx.device)
    widths = [GAMMA + 1]
    with torch.inference_mode():
        eager = costs_figures(measure_costs(target, {"d": draft}, ids, mask, widths, clock))
        for model in (target, draft):
            attach(model, CompiledModel(model, (1, GAMMA + 1), ids.shape[1] + 64, (1,), backend=ctx.backend))
        pair["compiled"] = True
        for model in (target, draft):  # compile, then a second call of each graph (CUDA graphs record on it)
            for _ in range(2):
                compiled_of(model).precompile(ids, mask)
            compiled_of(model).warm = True
        compiled = costs_figures(measure_costs(target, {"d": draft}, ids, mask, widths, clock))
    flagged = bool(host_bound(eager))
    busy = [compiled["target_busy_share"], compiled["draft_busy_share"]]
    busy_ok = all(b is not None and b >= BUSY_COMPILED_MIN for b in busy)

    def shown(figures):
        shares = "/".join("none" if figures[k] is None else f"{figures[k]:.0%}"
                          for k in ("target_busy_share", "draft_busy_share"))
        return (f"target {figures['target_ms']:.2f} ms, draft {figures['draft_ms']:.2f} ms, c "
                f"{figures['draft_cost_ratio_c']:.2f}, busy target/draft {shares}")

    detail = (f"eager: {shown(eager)}, host_bound {'flagged' if flagged else 'NOT flagged'}; compiled: {shown(compiled)} "
              f"(expected >= {BUSY_COMPILED_MIN:.0%}); bytes ratio {eager['weight_bytes_ratio']:.2f}")
    return ("ok" if flagged and busy_ok else "FAIL"), detail


def check_release(ctx):
    if importlib.util.find_spec("pydantic") is None:
        return "skipped", PYDANTIC_MISSING
    from runner.session import Session

    pair = ctx.cache.pop("pair_1b", None)
    if ctx.cuda and pair is None:
        pair = pair_1b(ctx)
        ctx.cache.pop("pair_1b")
    elif pair is None:
        pair = {"target": random_llama(2, 256, 1), "draft": random_llama(1, 256, 2), "compiled": False}
    config = SimpleNamespace(engine=SimpleNamespace(compile=pair["compiled"]))
    session = Session(config, ctx.device)
    session.target = SimpleNamespace(model=pair.pop("target"))
    session.drafts = {"d": SimpleNamespace(model=pair.pop("draft"))}
    alive = [weakref.ref(session.target.model), weakref.ref(session.drafts["d"].model)]
    session.release_models()
    gc.collect()
    kept = sum(ref() is not None for ref in alive)
    if not ctx.cuda:
        return ("ok" if not kept else "FAIL"), f"{2 - kept} of 2 models freed (memory: CUDA only)"
    free_after, total = torch.cuda.mem_get_info(ctx.device)
    short = pair["free_before"] - free_after
    detail = (f"free device memory {pair['free_before'] / 2**30:.2f} GiB before the pair loaded, {free_after / 2**30:.2f} "
              f"GiB after release_models (compiled: {pair['compiled']}); {2 - kept} of 2 models freed")
    return ("ok" if short <= RELEASE_SLACK and not kept else "FAIL"), detail


def launch_config(device: torch.device) -> dict:
    """A GPU run of the compiled engine with real and synthetic acceptance points (speculative.synthetic_acceptance:
    null is the real acceptance), on a 4-layer slice of the 1B synthetic target and a 1-layer draft."""
    return {"name": "gpu-check-launch", "device": str(device), "seed": 0,
            "target": {"model": "synthetic:llama-1b?layers=4", "dtype": "bfloat16", "attn_implementation": "sdpa"},
            "draft": {"model": "synthetic:llama-1b?layers=1", "dtype": "bfloat16", "attn_implementation": "sdpa"},
            "dataset": {"path": str(ROOT / "configs" / "data" / "mt_bench_question.jsonl"), "preset": "mt_bench",
                        "chat_template": False, "num_samples": 8, "max_prompt_tokens": 64},
            "generation": {"max_new_tokens": 32}, "speculative": {"gamma": [3], "synthetic_acceptance": [None, 0.6, 0.9]},
            "batch_size": [1, 4], "methods": ["baseline", "speculative"], "engine": {"compile": True},
            "warmup": 1, "repeats": 1}


def after_warmup(tree) -> int:
    """The sum of every recompiles_after_warmup / recordings_after_warmup a JSON tree holds, wherever it holds them."""
    if isinstance(tree, dict):
        return sum(int(v or 0) if k in ("recompiles_after_warmup", "recordings_after_warmup") and
                   isinstance(v, (int, float)) else after_warmup(v) for k, v in tree.items())
    if isinstance(tree, list):
        return sum(after_warmup(v) for v in tree)
    return 0


def check_launch(ctx):
    if not ctx.cuda:
        return "skipped", "needs CUDA (tests/test_launch_e2e.py and test_shipped_configs.py run launch.py on a CPU)"
    if importlib.util.find_spec("pydantic") is None:
        return "skipped", PYDANTIC_MISSING
    import yaml

    left = ctx.deadline - time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "launch.yaml", Path(folder) / "out"
        path.write_text(yaml.safe_dump(launch_config(ctx.device)))
        try:
            result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir",
                                     str(out)], capture_output=True, text=True, timeout=max(60, left), cwd=ROOT)
        except subprocess.TimeoutExpired:
            return "FAIL", f"launch.py did not finish within {max(60, left):.0f} s"
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return "FAIL", f"launch.py exited {result.returncode}: {last[:300]}"
        summary = json.loads((out / "summary.json").read_text())
        progress = json.loads((out / "progress.json").read_text()) if (out / "progress.json").exists() else {}
    runs = [r for r in summary["runs"] if r.get("group") is None]
    spec = [r for r in runs if r["method"] == "speculative"]
    alphas = sorted({r.get("synthetic_acceptance") for r in spec}, key=lambda a: -1 if a is None else a)
    bad = [f"{r['label']}: {r['status']}" for r in runs if r["status"] != "ok"]
    notes = summary.get("notes", []) + progress.get("notes", [])
    timed = [n for n in notes if "inside a timed batch" in n]
    late = after_warmup(summary) + after_warmup(progress)
    bugs = [r["label"] for r in spec if any(f["code"] == "possible_bug" for f in r.get("flags", []))]
    shown = ", ".join(f"{r['label']} alpha " + ("none" if r["metrics"].get("alpha") is None else
                                                 f"{r['metrics']['alpha']:.2f}") for r in spec if r["batch_size"] == 4)
    detail = (f"{len(runs)} points, synthetic_acceptance {alphas}; failed: {bad or 'none'}; graphs compiled or "
              f"captured in a timed batch: {len(timed)} notes, {late} after warmup; possible_bug {bugs or 'none'}; "
              f"{shown}")
    ok = not bad and not timed and not late and not bugs and None in alphas and len(alphas) == 3
    return ("ok" if ok else "FAIL"), detail


def check_flash_attention(ctx):
    device = ctx.device
    from utils.models import flash_attention_problem

    problem = flash_attention_problem(device, torch.bfloat16) if ctx.cuda else "needs CUDA"
    if problem:
        return "skipped", problem
    sdpa = random_llama(4, 256, 1, torch.bfloat16).to(device)
    flash = copy.deepcopy(sdpa)
    flash.set_attn_implementation("flash_attention_2")
    draft = random_llama(1, 256, 2, torch.bfloat16).to(device)
    ids, mask = prompts(device)
    base, _ = pair_run(sdpa, draft, ids, mask)
    _, spec = pair_run(flash, draft, ids, mask)
    status, detail = guard({"flash speculative vs sdpa baseline": (base, spec)}, probe_drift(sdpa, ids, mask))
    times = {name: timed_verification(model, ids, mask) for name, model in (("sdpa", sdpa), ("flash_attention_2", flash))}
    return status, detail + "; ms per 5-token verification: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items())


def timed_verification(model, ids, mask, reps=10) -> float:
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


def check_timing_sync(ctx):
    if not ctx.cuda:
        return "skipped", "needs CUDA (a CPU clock reading has nothing queued)"
    device = ctx.device
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


def check_memory(ctx):
    if not ctx.cuda:
        return "skipped", "needs CUDA"
    return "ok", ", ".join(f"cuda:{i} peak allocated {torch.cuda.max_memory_allocated(i) / 2**20:.0f} MiB, reserved "
                           f"{torch.cuda.max_memory_reserved(i) / 2**20:.0f} MiB" for i in range(torch.cuda.device_count()))


CHECKS = [
    ("fp32", "greedy exact, fp32 eager", check_fp32),
    ("bf16", "greedy exact, bf16 eager (guard)", check_bf16),
    ("timing-sync", "timing sync", check_timing_sync),
    ("compiled-fp32", "compiled vs eager, fp32 strict (TF32 off)", check_compiled_fp32),
    ("cuda-graphs", "CUDA graphs: none recorded after warmup", check_cuda_graphs),
    ("compiled-bf16", "compiled vs eager, bf16 (guard)", check_compiled_bf16),
    ("4bit", "4-bit through the runner's loader (guard)", check_4bit),
    ("cupti", "eager forward before / after the busy probe", check_cupti),
    ("busy-1b", "eager vs compiled, 1B pair: ms and GPU busy", check_busy),
    ("release", "memory back after release_models", check_release),
    ("launch", "launch.py, compiled, synthetic + real acceptance", check_launch),
    ("flash-attn", "flash_attention_2 vs sdpa", check_flash_attention),
    ("memory", "memory per device", check_memory),
]


def run_check(check, ctx, require: bool) -> tuple[str, str]:
    if time.monotonic() > ctx.deadline:
        status, detail = "skipped", "the time budget (--budget-s) was spent before it started"
    else:
        try:
            status, detail = check(ctx)
        except Exception as error:  # a check that crashes is a failed check, and the others still run
            status, detail = "FAIL", f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    if status == "skipped" and require:
        status, detail = "FAIL", f"skipped under --require: {detail}"
    return status, detail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile-backend", default="inductor", choices=["inductor", "eager"],
                        help="eager: dynamo's graphs without code generation (CI on a CPU)")
    parser.add_argument("--require", action="store_true", help="a skipped check fails")
    parser.add_argument("--only", help="comma-separated check keys: " + ", ".join(key for key, _, _ in CHECKS))
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="checks that would start after this many seconds are skipped (default 540)")
    parser.add_argument("--json", help="also write the table here as JSON")
    args = parser.parse_args(argv)
    keys = {key for key, _, _ in CHECKS}
    only = set(args.only.split(",")) if args.only else keys
    if only - keys:
        print(f"--only: unknown check {sorted(only - keys)[0]!r}; choose from {', '.join(sorted(keys))}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    found = installed_versions(LIBRARIES)
    print(f"device: {device} ({name}); " + ", ".join(f"{k} {v}" for k, v in found.items()), flush=True)
    ctx = Context(device, args.compile_backend, args.budget_s)
    strict_fp32()  # every fp32 check: no TF32
    if ctx.cuda:  # a CUDA graph the compiled step cannot take is an error, not a silent eager fallback
        import torch._inductor.config as inductor_config

        if hasattr(inductor_config.triton, "cudagraph_or_error"):
            inductor_config.triton.cudagraph_or_error = True
            ctx.cache["or_error"] = True
        ctx.cache["counting"] = count_recordings()
    print("\n| check | status | detail | s |\n|---|---|---|---|", flush=True)
    rows_done = []
    for key, label, check in CHECKS:
        if key not in only:
            continue
        start = time.perf_counter()
        status, detail = run_check(check, ctx, args.require)
        row = {"key": key, "check": label, "status": status, "detail": detail,
               "seconds": round(time.perf_counter() - start, 1)}
        rows_done.append(row)
        print(f"| {label} | {status} | {detail} | {row['seconds']} |", flush=True)
    if args.json:
        data = {"device": str(device), "name": name, "versions": found, "require": args.require, "checks": rows_done}
        Path(args.json).write_text(json.dumps(data, indent=1, allow_nan=False))
    return 1 if any(row["status"] == "FAIL" for row in rows_done) else 0


if __name__ == "__main__":
    sys.exit(main())
