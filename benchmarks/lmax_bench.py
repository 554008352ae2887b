"""The compiled step's time against the static cache's length L_max, with and without the K/V copy of grouped-query
attention, in one process.

    python benchmarks/lmax_bench.py [--lengths 256,1024,4096] [--layers 4] [--batch 1] [--backend eager|inductor]

A random Llama with Qwen2.5-0.5B's attention (hidden 896, 14 query heads, 2 K/V heads of 64) and a small vocabulary
(so that attention, not the LM head, is what L_max can change), fp32 on the CPU. For each L_max, a 1-token compiled
step (decode/static_kv.py) on top of a 32-token prompt, timed per step (median of --steps, after a warmup), rolled
back each time so the cache holds the same tokens: as the compiled mode attends (gqa_sdpa_attention: K and V of 2
heads) and through transformers' own sdpa path (K and V repeated to 14 heads, a copy per layer per step), one step
of each in turn. A row for each L_max; the last columns say how each grows from the shortest L_max. What remains
of the growth without the copy is attention itself: sdpa reads all L_max columns, masked or not.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="256,1024,4096", help="L_max values, comma separated")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default="eager", choices=["eager", "inductor"],
                        help="dynamo's graphs run op by op (eager, seconds to compile) or inductor's code (minutes)")
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from decode.static_kv import CompiledModel, StaticKVState

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=896, intermediate_size=4864, num_hidden_layers=args.layers,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, max_position_embeddings=8192,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    lengths = [int(x) for x in args.lengths.split(",")]
    prompt = torch.randint(3, config.vocab_size, (args.batch, 32))
    token = prompt[:, -1:].contiguous()

    def step_ms(max_length: int) -> tuple[float, float]:
        """(ms as the compiled mode attends, ms with K/V repeated): the two steps alternate, so that the machine's
        drift touches both alike."""
        states = []
        for gqa in (True, False):
            compiled = CompiledModel(model, (1,), max_length, (args.batch,), backend=args.backend)
            if not gqa:
                compiled.gqa_configs = []  # transformers' sdpa path: repeat_kv to every query head
            states.append(StaticKVState(compiled))
        rows = torch.zeros(args.batch, dtype=torch.long)
        times = ([], [])
        with torch.inference_mode():
            for state in states:
                state.forward(model, prompt, torch.ones_like(prompt), last_only=True)
            for index in range(args.steps + 3):  # the first compiles, two more warm
                for state, kept in zip(states, times):
                    start = time.perf_counter()
                    state.forward(model, token)
                    elapsed = time.perf_counter() - start
                    state.keep_prefix_of_last(1, rows, 0)
                    if index >= 3:
                        kept.append(elapsed)
        return tuple(1000 * sorted(t)[len(t) // 2] for t in times)

    table = {length: step_ms(length) for length in lengths}
    print(f"\n1-token compiled step, Llama {args.layers} layers, hidden 896, 14 query / 2 K/V heads of 64, batch "
          f"{args.batch}, fp32, CPU ({torch.get_num_threads()} threads), backend {args.backend}; median of "
          f"{args.steps} steps\n")
    print("| L_max | ms, K/V heads as they are (compiled mode) | ms, K/V repeated (transformers' sdpa) | "
          f"growth from L_max {lengths[0]}: as they are | repeated |")
    print("|---|---|---|---|---|")
    first = table[lengths[0]]
    for length, (gqa, repeated) in table.items():
        print(f"| {length} | {gqa:.2f} | {repeated:.2f} | {gqa / first[0]:.2f}x | {repeated / first[1]:.2f}x |")


if __name__ == "__main__":
    main()
