"""Compile seconds against depth, whole step against one decoder layer (engine.compile_scope), with inductor.

    python benchmarks/compile_depth.py [--layers 2 36] [--hidden 64] [--scopes whole regional] [--backend inductor]

A narrow Qwen3 shape (transformers' Qwen3Config: Qwen3's layer, 4 query and 2 K/V heads of 16, random weights,
fp32) at each depth, a compiled step (decode/static_kv.py CompiledModel) of width 1 at batch 1 over a static cache of
64 columns. Each case runs in a fresh process with inductor's caches off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), so
no case reuses another's code. compile s: the first compiled step's seconds less a later step's (what the compile
added); the table ends with each scope's ratio of its deepest to its shallowest case. On a shared machine the seconds
are rough; the ratio is the result.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one_case(layers: int, hidden: int, scope: str, backend: str) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from decode.static_kv import CompiledModel, StaticKVState, attach

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=1024, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    model = Qwen3ForCausalLM(config).float().eval()
    compiled = CompiledModel(model, (1,), 64, (1,), backend=backend, scope=scope)
    attach(model, compiled)
    ids = torch.randint(3, 1024, (1, 8))
    seconds = []
    with torch.inference_mode():
        state = StaticKVState(compiled)
        state.forward(model, ids, torch.ones_like(ids), last_only=True)  # the eager prefill
        for token in range(3):
            began = time.perf_counter()
            state.forward(model, torch.tensor([[5 + token]]))
            seconds.append(time.perf_counter() - began)
    return {"layers": layers, "scope": scope, "first_s": seconds[0], "step_s": min(seconds[1:]),
            "compile_s": seconds[0] - min(seconds[1:]), "graphs": compiled.compiles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 36])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--scopes", nargs="+", default=["whole", "regional"], choices=["whole", "regional"])
    parser.add_argument("--backend", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--case", nargs=2, metavar=("LAYERS", "SCOPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(int(args.case[0]), args.hidden, args.case[1], args.backend)))
        return

    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    rows = []
    for scope in args.scopes:
        for layers in args.layers:
            out = subprocess.run([sys.executable, __file__, "--case", str(layers), scope, "--hidden", str(args.hidden),
                                  "--backend", args.backend], env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            row = rows[-1]
            print(f"| {scope} | {layers} | {row['compile_s']:.1f} | {row['step_s'] * 1e3:.1f} | {row['graphs']} |",
                  flush=True)
    print(f"\n(| scope | layers | compile s | step ms | graphs |, backend {args.backend}, hidden {args.hidden})")
    for scope in args.scopes:
        cases = sorted((r for r in rows if r["scope"] == scope), key=lambda r: r["layers"])
        if len(cases) > 1:
            print(f"{scope}: {cases[-1]['layers']} layers / {cases[0]['layers']} layers = "
                  f"{cases[-1]['compile_s'] / cases[0]['compile_s']:.2f}x compile seconds")


if __name__ == "__main__":
    main()
