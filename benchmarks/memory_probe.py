"""Host memory of the offline pair as the runner loads it: after loading, after oneDNN packing, and after
releasing the memory-mapped weight files (what the runner now does), in one process.

    python benchmarks/memory_probe.py [--before]

Measured on the 2-core, 24 GiB CPU box (fp32 weights of the pair: 8.97 GiB): peak RSS 13.79 GiB (1.54x) when
packing kept every weight's file pages resident until the file closed; 10.01 GiB (1.12x) since pack_linears
gives back each weight's pages as soon as it is packed (utils/memory.py drop_file_pages).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from utils.config import ModelConfig
    from utils.cpu_linear import pack_linears
    from utils.memory import PeakSampler, host_memory, mapped_files
    from utils.models import load_model, release_file_mappings

    gib = 1024 ** 3
    sampler = PeakSampler().start()
    models = [load_model(ModelConfig(model=name), torch.device("cpu"), role) for name, role in
              [("qwen2.5-coder-1.5b-instruct", "target"), ("qwen2.5-coder-0.5b-instruct", "draft")]]
    weight_bytes = sum(p.numel() * p.element_size() for m in models for p in m.model.parameters())

    def line(stage: str) -> str:
        m = host_memory()
        return (f"| {stage} | {m['rss_bytes'] / gib:.2f} | {m['anon_bytes'] / gib:.2f} | {m['file_bytes'] / gib:.2f} | "
                f"{len(mapped_files())} | {(sampler.peak_anon_bytes or 0) / gib:.2f} |")

    release = "--before" not in sys.argv  # --before: what the runner did until the fix (packing only)
    rows = ["| stage | RSS GiB | anonymous GiB | file-backed GiB | safetensors mapped | peak anonymous GiB so far |",
            "|---|---|---|---|---|---|", line("loaded")]
    for m, role in zip(models, ("target", "draft")):  # the runner's order (runner/session.py)
        pack_linears(m.model, 4)
        rows.append(line(f"{role} packed"))
        if release:
            release_file_mappings(m.model)
            rows.append(line(f"{role}'s file released"))
    report = sampler.stop()
    print("before the fix (packing only)" if not release else "after the fix (packing, then the file released)")
    print(f"fp32 weights: {weight_bytes / gib:.2f} GiB; peak RSS {report['peak_rss_bytes'] / gib:.2f} GiB, "
          f"peak anonymous {report['peak_anon_bytes'] / gib:.2f} GiB "
          f"({report['peak_anon_bytes'] / weight_bytes:.2f}x the weights)\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
