"""Wall time of one sweep on 1 vs 2 local Ray workers, side by side, with one process for reference.

    python benchmarks/cluster_bench.py [--prompts 12] [--tokens 24] [--out DIR]

A tiny random Llama pair built from a config (nothing to download), a gamma x batch-size sweep, each
worker 1 CPU and 1 torch thread. The single-process run gets 1 thread too, so the three differ only in
how the units are spread. Ray's start-up (the cluster, each worker importing torch and loading the
models) is inside the measured wall time: it is what a user waits for.
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
sys.path.insert(0, str(ROOT / "tests"))


def setup(root: Path, prompts: int, tokens: int) -> Path:
    import yaml

    from helpers import base_config, write_prompts
    from tiny_models import tiny_model
    from helpers import word_tokenizer, WORDS

    paths = []
    for name, seed, layers in [("target", 1, 8), ("draft", 2, 1)]:
        folder = root / name
        if not folder.exists():
            tiny_model("llama", seed=seed, layers=layers, hidden=256, vocab_size=len(WORDS)).save_pretrained(folder)
            word_tokenizer().save_pretrained(folder)
        paths.append(folder)
    data = write_prompts(root / "prompts.jsonl", count=prompts)
    config = base_config(paths[0], paths[1], data, batch_size=[1, 2], speculative={"gamma": [2, 4]},
                         generation={"max_new_tokens": tokens}, engine={"cpu_linear": "default"})
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def timed(config: Path, out: Path, extra: list[str]) -> float:
    env = {**os.environ, "SPECULATE_WORKER_THREADS": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(config), "--output-dir", str(out),
                             *extra], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{out}: exit {result.returncode}\n{result.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--out", default=str(ROOT / "results" / f"cluster-bench-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = setup(out / "models", args.prompts, args.tokens)
    ray = ["--set", "cluster.backend=ray", "--set", "cluster.num_cpus=1"]
    walls = {
        "one process (1 thread)": timed(config, out / "single", []),
        "Ray, 1 worker": timed(config, out / "ray1", ray + ["--set", "cluster.num_workers=1"]),
        "Ray, 2 workers": timed(config, out / "ray2", ray + ["--set", "cluster.num_workers=2"]),
    }
    records = {name: sum(1 for _ in open(out / folder / "samples.jsonl"))
               for name, folder in zip(walls, ["single", "ray1", "ray2"])}
    lines = [f"{os.cpu_count()} CPUs; {args.prompts} prompts, {args.tokens} new tokens, gamma 2/4, batch 1/2",
             "", "| run | wall s | records | vs Ray 1 worker |", "|---|---|---|---|"]
    for name, wall in walls.items():
        lines.append(f"| {name} | {wall:.1f} | {records[name]} | {walls['Ray, 1 worker'] / wall:.2f}x |")
    text = "\n".join(lines) + "\n"
    (out / "CLUSTER.md").write_text(text)
    print(text)
    print(json.dumps({k: round(v, 2) for k, v in walls.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
