"""Save a config's synthetic target and draft as model folders (weights, config, tokenizer), so that they load as
any local model does: quantized by bitsandbytes, say, which a synthetic: model is not.

    python benchmarks/save_synthetic.py CONFIG.yaml DIR      # -> DIR/target, DIR/draft

Used for the 4-bit transfer check of configs/transfer-synthetic.yaml (docs/gpu.md; draw=cpu, so the folders hold
the weights a CPU run of the config ran)."""
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils.synthetic_models import build_model  # noqa: E402


def main(config_path: str, out: str) -> None:
    config = yaml.safe_load(Path(config_path).read_text())
    for role in ("target", "draft"):
        spec = config[role]["model"]
        if not spec.startswith("synthetic:"):
            sys.exit(f"error: {config_path}: {role}.model is {spec!r}, not a synthetic: model; nothing to save")
        model, tokenizer = build_model(spec, torch.float32, "sdpa")
        model.save_pretrained(Path(out) / role)
        tokenizer.save_pretrained(Path(out) / role)
        print(f"{role}: {spec} -> {Path(out) / role}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/save_synthetic.py CONFIG.yaml DIR")
    main(*sys.argv[1:])
