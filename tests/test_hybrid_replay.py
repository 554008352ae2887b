"""benchmarks/hybrid_replay.py on a tiny run: the free sources' rounds replayed exactly as the run recorded them, every
method, variant and the bound priced, and a folder it cannot read refused in one line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import base_config, run_launch, save_vllm_pair, write_prompts

ROOT = Path(__file__).resolve().parents[1]


def _replay(*args):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hybrid_replay.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_the_replay_repeats_a_runs_free_source_rounds_and_prices_every_method(tmp_path):
    target, draft = save_vllm_pair(tmp_path)  # a draft that agrees with the target now and then: the probe has both
    data = write_prompts(tmp_path / "prompts.jsonl", count=4)
    config = base_config(target, draft, data, methods=["baseline", "speculative", "prompt_lookup", "suffix", "hybrid"],
                         batch_size=[1], speculative={"gamma": [3], "hybrid_max_draft": 5},
                         generation={"max_new_tokens": 16})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    launched = run_launch(["--config", path, "--output-dir", run], timeout=400)
    assert launched.returncode == 0, launched.stderr[-3000:]
    out = tmp_path / "replay.json"
    result = _replay(run, "--variant", 'nostop={"confidence": null}', "--bound", "--json", out)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(out.read_text())
    # lookup and suffix have no model in the loop: their replay is the run's rounds, one for one
    assert figures["rounds_as_recorded"]["prompt_lookup"] == 1.0
    assert figures["rounds_as_recorded"]["suffix"] == 1.0
    assert set(figures["speedup"]) == {"speculative", "prompt_lookup", "suffix", "hybrid", "nostop", "bound",
                                       "bound, free known", "bound, draft known"}
    overall = {name: cells["overall"] for name, cells in figures["speedup"].items()}
    assert overall["prompt_lookup"]["measured"] is not None and overall["bound"]["measured"] is None
    # every round's draft first token is scored, by the gate's b_1 and by the draft's own top probability alike
    firsts = figures["first_tokens"]
    assert firsts["draft"]["rounds"] == firsts["draft_top"]["rounds"] > 0
    assert firsts["draft"]["right"] == firsts["draft_top"]["right"]
    assert "| prompt_lookup |" in result.stdout

    # the probe of the target's state: fitted and scored on the same run's positions, every signal scored
    probe = tmp_path / "probe.json"
    probed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "acceptance_probe.py"), "--train", str(run),
                             "--test", str(run), "--json", str(probe)], capture_output=True, text=True, timeout=300)
    assert probed.returncode == 0, probed.stderr[-3000:]
    scored = json.loads(probe.read_text())
    outputs = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    baseline = {r["sample_id"]: r["new_tokens"] for r in outputs if r["method"] == "baseline"}
    after_first = sum(n - 1 for n in baseline.values())  # every output position after the first: a round may start there
    assert scored["train_positions"] == scored["test_positions"] == after_first
    assert set(scored["auc"]) == {"probe: hidden", "probe: hidden + token", "the target's top probability",
                                  "the draft's top probability (after its forward)"}

    (run / "progress.json").unlink()
    refused = _replay(run)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "no progress.json" in refused.stderr and "Traceback" not in refused.stderr


def test_the_replays_first_token_auc_by_hand():
    """auc: right first tokens scored 0.9 and 0.5, wrong ones 0.2 and 0.5: of the 4 pairs 3 ranked right and 1 tied,
    (3 + 0.5) / 4 = 0.875; with no wrong token, none."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hybrid_replay import auc

    assert auc([(0.9, True), (0.2, False), (0.5, True), (0.5, False)]) == pytest.approx(0.875)
    assert auc([(0.9, True), (0.5, True)]) is None
