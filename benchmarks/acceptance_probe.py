"""Can the draft model's next acceptance be read before the draft runs? A probe on the target's own state, which the
engine could hand hybrid's gate for free, against the signals the gate has and the one it cannot have.

    python benchmarks/acceptance_probe.py --train RUN_DIR [RUN_DIR ...] --test RUN_DIR [RUN_DIR ...] [--json OUT.json]

Why: replayed, hybrid's gate knowing each round's draft outcome gains 8-12% (benchmarks/hybrid_replay.py --bound),
and its estimate of the draft's first token, from the row's and its group's record, ranks right above wrong no
better than chance (AUC 0.55). The draft's own top probability ranks them well, but it exists once the draft's
forward has been paid for. What the gate could read before: the target's hidden state at the position that produced
the round's last token (the hidden-state tap the heads use, decode/hidden.py) and that token.

How: each run's requests (the replay's reading: greedy batch-1 runs of our engine, the baseline's outputs) are fed
teacher-forced through the target and the draft. At every output position t (the round's first draft position when
a round starts there): y = whether the draft's argmax at t is the target's (the greedy acceptance of its first
token); features: the target's final hidden state at t - 2 (the forward that produced token t - 1) and, beside it,
token t - 1's input embedding. A logistic probe (standardized features, L2 penalty `--l2`) fits the --train runs'
positions and ranks the --test runs' (AUC: the chance a right position scores above a wrong one; 0.5 is chance), beside the
target's top probability at t - 2 (free as well) and the draft's own at t - 1 (not free: after its forward).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hybrid_replay import ReplayError, auc, load_run  # noqa: E402


def positions(run: Path) -> dict:
    """Every output position of the run's distinct prompts: hidden [N, H], embedding [N, H], y [N], the target's and
    the draft's top probabilities [N]."""
    from utils.models import load_model

    config, _, requests, _, _ = load_run(run)
    target = load_model(config.target, torch.device("cpu"), "target")
    embed = target.model.get_input_embeddings()
    hidden, embedding, y, target_top, draft_top, seen = [], [], [], [], [], set()
    with torch.inference_mode():
        for request in requests:
            if tuple(request["prompt"]) in seen:
                continue
            seen.add(tuple(request["prompt"]))
            full = request["prompt"] + request["output"]
            out = target.model(torch.tensor([full]), output_hidden_states=True)
            states, logits = out.hidden_states[-1][0].float(), out.logits[0].float()
            argmax, top = logits.argmax(-1).tolist(), torch.softmax(logits, -1).amax(-1)
            vectors = embed(torch.tensor(full)).float()
            for at in range(len(request["prompt"]) + 1, len(full)):
                hidden.append(states[at - 2])
                embedding.append(vectors[at - 1])
                y.append(request["argmax"][at - 1] == argmax[at - 1])
                target_top.append(float(top[at - 2]))
                draft_top.append(request["top"][at - 1])
    if not y:
        raise ReplayError(f"{run}: no output positions to probe")
    return {"hidden": torch.stack(hidden).numpy(), "embedding": torch.stack(embedding).numpy(), "y": np.array(y),
            "target_top": np.array(target_top), "draft_top": np.array(draft_top)}


def fit_probe(x: np.ndarray, y: np.ndarray, l2: float):
    """A logistic regression (L-BFGS, features standardized on x): the probability function it learnt."""
    mean, scale = x.mean(0), x.std(0) + 1e-4
    inputs = torch.tensor((x - mean) / scale, dtype=torch.float32)
    labels = torch.tensor(y, dtype=torch.float32)
    torch.manual_seed(0)
    model = torch.nn.Linear(inputs.shape[1], 1)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def loss():
        optimizer.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(model(inputs)[:, 0], labels) + \
            l2 * (model.weight ** 2).sum()
        value.backward()
        return value
    with torch.enable_grad():
        optimizer.step(loss)

    def predict(z: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(model(torch.tensor((z - mean) / scale, dtype=torch.float32))[:, 0]).numpy()
    return predict


def probe(train: list[Path], test: list[Path], l2: float) -> dict:
    def joined(runs):
        parts = [positions(run) for run in runs]
        return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    fitted, checked = joined(train), joined(test)
    if fitted["y"].all() or not fitted["y"].any():
        raise ReplayError("the --train runs' draft is right everywhere or nowhere: nothing to fit")
    out = {"train_positions": int(len(fitted["y"])), "test_positions": int(len(checked["y"])),
           "test_right": float(checked["y"].mean()), "auc": {}}
    for name, features in {"probe: hidden": ("hidden",), "probe: hidden + token": ("hidden", "embedding")}.items():
        predict = fit_probe(np.concatenate([fitted[f] for f in features], 1), fitted["y"], l2)
        out["auc"][name] = auc(list(zip(predict(np.concatenate([checked[f] for f in features], 1)), checked["y"])))
    out["auc"]["the target's top probability"] = auc(list(zip(checked["target_top"], checked["y"])))
    out["auc"]["the draft's top probability (after its forward)"] = auc(list(zip(checked["draft_top"], checked["y"])))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=Path, nargs="+", required=True, help="report folders the probe fits")
    parser.add_argument("--test", type=Path, nargs="+", required=True, help="report folders it is scored on")
    parser.add_argument("--l2", type=float, default=0.01, help="the probe's L2 penalty (default 0.01)")
    parser.add_argument("--json", type=Path, help="also write the figures here (strict JSON)")
    args = parser.parse_args(argv)
    try:
        for run in (*args.train, *args.test):
            for needed in ("config.yaml", "samples.jsonl"):
                if not (run / needed).is_file():
                    raise ReplayError(f"{run}: no {needed}; give a report folder of a run of our engine")
        result = probe(args.train, args.test, args.l2)
    except ReplayError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{result['train_positions']} positions fitted, {result['test_positions']} scored (the draft right at "
          f"{result['test_right']:.2f} of them); AUC of each signal for the draft's next token being the target's:")
    for name, value in result["auc"].items():
        print(f"  {name}: " + ("-" if value is None else f"{value:.2f}"))
    if args.json is not None:
        from utils.io import write_json
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
