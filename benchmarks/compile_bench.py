"""The compiled engine mode against the eager one, on the same weights, in one process, prompt by prompt.

    python benchmarks/compile_bench.py [--config configs/default.yaml] [--prompts 4] [--gamma 4] [--set KEY=VALUE ...]

Loads the config's target and draft once (fp32 nn.Linear), gives each a compiled twin over the same weights
(decode/static_kv.py), compiles on the first prompt (timed), then runs the baseline and speculative decoding on
each prompt eagerly and compiled, alternating which goes first. Last, it packs the linears (oneDNN, the eager
default on a CPU: `engine.cpu_linear: auto`) and runs the eager engine again. Prints tok/s, speedups, whether
every output equals the eager baseline's, and per model the graphs compiled (and recompiled after warmup) and, on
CUDA, the CUDA graphs recorded (and recorded after warmup) and skipped.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs/default.yaml"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()

    import torch

    from decode import Clock, DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
    from decode.static_kv import CompiledModel, attach
    from runner.plan import left_pad
    from runner.session import eos_ids
    from utils.config import load_config
    from utils.cpu_linear import pack_linears
    from utils.data import load_prompts
    from utils.models import load_model

    config, _ = load_config(Path(args.config), args.overrides + [f"dataset.num_samples={args.prompts}"])
    device = torch.device(config.device)
    target, draft = load_model(config.target, device, "target"), load_model(config.draft[0], device, "draft")
    prompts = load_prompts(config.dataset, target.tokenizer).prompts[: args.prompts]
    generation = Generation(config.generation.max_new_tokens, Sampling(), eos_ids(target.tokenizer, target.model))
    longest = max(len(p.token_ids) for p in prompts)
    max_length = -(-(longest + generation.max_new_tokens + args.gamma + 2) // 64) * 64  # as the runner sizes it

    def twin(model, widths):
        other = copy.copy(model)  # the same modules and weights
        attach(other, CompiledModel(other, widths, max_length, (1,)))
        return other

    # the widths each model uses (decode/compile_plan.py compile_widths): the target 1 and gamma + 1, the draft 1 and 2
    models = {"eager": (target.model, draft.model),
              "compiled": (twin(target.model, (1, args.gamma + 1)), twin(draft.model, (1, 2)))}
    clock = Clock(device)

    def one(variant, method, prompt):
        t, d = models[variant]
        ids, mask = left_pad([prompt.token_ids], target.tokenizer.pad_token_id, device)
        start = time.perf_counter()
        with torch.inference_mode():
            if method == "baseline":
                record = generate_baseline(t, ids, mask, generation, clock=clock)[0]
            else:
                drafter = DraftModelDrafter(d, target.vocab_size, Sampling())
                record = generate_speculative(t, drafter, ids, mask, generation, args.gamma, clock=clock)[0]
        return record.output_ids, time.perf_counter() - start

    compile_s = {}
    for variant in models:  # warmup: the compiled twins compile every width here
        start = time.perf_counter()
        for method in ("baseline", "speculative"):
            one(variant, method, prompts[0])
        compile_s[variant] = time.perf_counter() - start
    for model in models["compiled"]:
        model._speculate_compiled.warm = True

    results = {(v, m): [] for v in ("eager", "compiled", "eager, packed") for m in ("baseline", "speculative")}
    for index, prompt in enumerate(prompts):
        order = ("eager", "compiled") if index % 2 == 0 else ("compiled", "eager")
        for variant in order:
            for method in ("baseline", "speculative"):
                results[(variant, method)].append(one(variant, method, prompt))
        print(f"prompt {index + 1}/{len(prompts)} done", file=sys.stderr)
    packed = {m: pack_linears(m) for m in models["eager"]}
    one("eager", "baseline", prompts[0])  # the packed kernels' first call
    models["eager, packed"] = models.pop("eager")
    for prompt in prompts:
        for method in ("baseline", "speculative"):
            results[("eager, packed", method)].append(one("eager, packed", method, prompt))

    reference = [tokens for tokens, _ in results[("eager", "baseline")]]

    def rate(key):
        runs = results[key]
        return sum(len(tokens) for tokens, _ in runs) / sum(seconds for _, seconds in runs)

    print(f"\n{config.target.model} <- {config.draft[0].model}, {config.device}, {len(prompts)} prompts, "
          f"{generation.max_new_tokens} new tokens, gamma {args.gamma}, batch 1, greedy "
          f"(packed linears: {sum(packed.values())})\n")
    print("| engine | baseline tok/s | speculative tok/s | speculative / baseline | outputs equal to eager baseline |")
    print("|---|---|---|---|---|")
    for variant in ("eager", "compiled", "eager, packed"):
        equal = all([tokens for tokens, _ in results[(variant, m)]] == reference for m in ("baseline", "speculative"))
        base, spec = rate((variant, "baseline")), rate((variant, "speculative"))
        print(f"| {variant} | {base:.2f} | {spec:.2f} | {spec / base:.2f} | {'yes' if equal else 'NO'} |")
    print(f"\ncompiled / eager tok/s: baseline {rate(('compiled', 'baseline')) / rate(('eager', 'baseline')):.2f}, "
          f"speculative {rate(('compiled', 'speculative')) / rate(('eager', 'speculative')):.2f}")
    print(f"compiled / eager packed tok/s: baseline "
          f"{rate(('compiled', 'baseline')) / rate(('eager, packed', 'baseline')):.2f}, speculative "
          f"{rate(('compiled', 'speculative')) / rate(('eager, packed', 'speculative')):.2f}")
    print(f"first prompt (compiles): eager {compile_s['eager']:.0f} s, compiled {compile_s['compiled']:.0f} s")
    for role, model in zip(("target", "draft"), models["compiled"]):
        print(f"{role}: {model._speculate_compiled.summary()}")


if __name__ == "__main__":
    main()
