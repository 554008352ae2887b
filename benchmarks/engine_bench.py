"""Benchmark of the tool: ratios measured side by side in one process.

    python benchmarks/engine_bench.py [--config benchmarks/engine.yaml] [--set KEY=VALUE ...] [--out DIR]

Runs the config with the best engine (every method: ours and transformers' peers), then our baseline and
speculative decoding again on plain nn.Linear, and prints the target ratios of issue 4 with the engine's gain.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = [  # (label, target)
    ("our baseline / hf_generate tok/s, batch 1", 1.0),
    ("our speculative / hf_assisted tok/s, batch 1, same gamma, identical outputs", 1.2),
    ("measured / predicted speedup, best gamma, batch 1", 0.9),
    ("batched speculative / batched baseline tok/s, batch 4", 1.3),
]


def run(config_path: Path, overrides: list[str], out_dir: Path) -> dict:
    from rich.console import Console

    from runner import Experiment
    from utils.config import load_config

    config, raw = load_config(config_path, overrides)
    code = Experiment(config, raw, out_dir, Console(stderr=True, width=150)).run()
    if code != 0:
        raise SystemExit(f"benchmark run in {out_dir} ended with exit code {code}")
    return json.loads((out_dir / "summary.json").read_text())


def metrics(summary: dict, method: str, batch_size: int, gamma=None) -> dict:
    for r in summary["runs"]:
        if (r["method"] == method and r["batch_size"] == batch_size and r["gamma"] == gamma and r["status"] == "ok"
                and r.get("group") is None):
            return r["metrics"]
    return {}


def best_gamma(summary: dict, batch_size: int) -> int | None:
    spec = [r for r in summary["runs"] if r["method"] == "speculative" and r["batch_size"] == batch_size
            and r["status"] == "ok" and r.get("group") is None]
    return max(spec, key=lambda r: r["metrics"]["throughput_tok_s"])["gamma"] if spec else None


def ratios(best: dict, plain: dict) -> tuple[list[tuple], list[tuple]]:
    g1, g4 = best_gamma(best, 1), best_gamma(best, 4)
    spec1, assisted1 = metrics(best, "speculative", 1, g1), metrics(best, "hf_assisted", 1, g1)
    identical = spec1.get("exact_match") == 1.0 and assisted1.get("exact_match") == 1.0
    rows = [
        (TARGETS[0], metrics(best, "baseline", 1)["throughput_tok_s"] / metrics(best, "hf_generate", 1)["throughput_tok_s"], ""),
        (TARGETS[1], spec1["throughput_tok_s"] / assisted1["throughput_tok_s"],
         f"gamma {g1}; outputs {'identical' if identical else 'DIFFER'} (exact match ours {spec1.get('exact_match')}, "
         f"hf {assisted1.get('exact_match')})"),
        (TARGETS[2], spec1.get("efficiency", float("nan")),
         f"gamma {g1}: measured {spec1['speedup']:.3f}x, predicted {spec1.get('predicted_speedup', float('nan')):.3f}x "
         f"(alpha {spec1['alpha']:.3f}, c {spec1.get('draft_cost_ratio_c', float('nan')):.3f}, "
         f"v {spec1.get('verify_cost_ratio_v', float('nan')):.3f}); decode phase alone: "
         f"{spec1.get('decode_speedup', float('nan')):.3f}x = {spec1.get('decode_efficiency', float('nan')):.3f} of predicted"),
        (TARGETS[3], metrics(best, "speculative", 4, g4)["speedup"],
         f"gamma {g4}; decode-only speedup {metrics(best, 'speculative', 4, g4).get('decode_speedup', float('nan')):.3f}; "
         f"prefill (target + draft) is {metrics(best, 'speculative', 4, g4).get('prefill_share', float('nan')):.0%} of "
         f"its latency, {metrics(best, 'baseline', 4).get('prefill_share', float('nan')):.0%} of the baseline's"),
    ]
    gains = []
    for method, batch_size in [("baseline", 1), ("speculative", 1), ("baseline", 4), ("speculative", 4)]:
        gamma = plain_gamma(plain) if method == "speculative" else None
        fast, slow = metrics(best, method, batch_size, gamma), metrics(plain, method, batch_size, gamma)
        if fast and slow:
            gains.append((f"{method}{f' gamma {gamma}' if gamma else ''}, batch {batch_size}", fast["throughput_tok_s"],
                          slow["throughput_tok_s"], fast.get("verify_cost_ratio_v"), slow.get("verify_cost_ratio_v")))
    return rows, gains


def plain_gamma(plain: dict) -> int | None:
    gammas = sorted({r["gamma"] for r in plain["runs"] if r["method"] == "speculative"})
    return gammas[0] if gammas else None


def table(rows, gains, machine: str, command: str) -> str:
    lines = [f"Machine: {machine}", f"Command: `{command}`", "",
             "| ratio | measured | target | met | detail |", "|---|---|---|---|---|"]
    for (label, target), value, note in rows:
        lines.append(f"| {label} | {value:.3f} | >= {target} | {'yes' if value >= target else 'no'} | {note} |")
    lines += ["", "Engine: oneDNN prepacked linear vs nn.Linear, same run", "",
              "| method | packed tok/s | nn.Linear tok/s | gain | v packed | v nn.Linear |", "|---|---|---|---|---|---|"]
    for label, fast, slow, v_fast, v_slow in gains:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        lines.append(f"| {label} | {fast:.2f} | {slow:.2f} | {fast / slow:.2f}x | {fmt(v_fast)} | {fmt(v_slow)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "benchmarks" / "engine.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--plain-gamma", type=int, default=6, help="gamma for the nn.Linear comparison run")
    parser.add_argument("--out", default=str(ROOT / "results" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"))
    parser.add_argument("--from", dest="existing", help="recompute the table from an earlier benchmark folder")
    args = parser.parse_args()
    import platform

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.existing:  # every figure is derived from the raw records: rebuild them with the current code
        from eval.__main__ import rebuild

        out = Path(args.existing)
        best, plain = rebuild(out / "onednn_packed"), rebuild(out / "nn_linear")
    else:
        out = Path(args.out)
        best = run(Path(args.config), args.overrides, out / "onednn_packed")
        plain = run(Path(args.config), args.overrides + ["engine.cpu_linear=default", "methods=[baseline,speculative]",
                                                        f"speculative.gamma=[{args.plain_gamma}]"], out / "nn_linear")
    rows, gains = ratios(best, plain)
    machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    command = "python benchmarks/engine_bench.py " + " ".join(a for a in sys.argv[1:])
    text = table(rows, gains, machine, command.strip())
    (out / "BENCH.md").write_text(text)
    print(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
