"""The cost probes at the prompts' lengths (runner/probes.py context_bins, at_cache): c and v timed at the cache each
length bin of a comparison's prompts decodes at, and a run of prompts of two lengths reading each group's own."""
import json

import pytest
import torch
import yaml
from rich.console import Console

from helpers import base_config, save_tiny_pair
from runner.probes import at_cache, context_bins
from utils.config import validate


@pytest.mark.parametrize("lengths, tokens, expected", [
    # alike (90 < 2 x 50): one cache, the median prompt's
    ([50, 60, 90], 5, [65]),
    # two bins: 60-70 (median 63) and 740-800 (median 750); the median prompt (70, the lower middle) is in the first
    ([800, 60, 740, 63, 750, 70], 32, [95, 782]),
    # six bins at a factor 2, so a factor 4: [10, 25] [60, 130] [300, 700]; the median prompt 60 in the second
    ([10, 25, 60, 130, 300, 700], 0, [60, 10, 300]),
    ([], 3, []),
])
def test_the_caches_of_each_length_bin_by_hand(lengths, tokens, expected):
    assert context_bins(lengths, tokens) == expected


def test_a_batch_cut_or_grown_to_a_cache():
    ids, mask = torch.tensor([[0, 0, 5, 6, 7]]), torch.tensor([[0, 0, 1, 1, 1]])
    short_ids, short_mask = at_cache(ids, mask, 3)
    assert short_ids.tolist() == [[5, 6, 7]] and short_mask.tolist() == [[1, 1, 1]]
    long_ids, long_mask = at_cache(ids, mask, 7)
    assert long_ids.tolist() == [[0, 0, 5, 6, 7, 7, 7]] and long_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1]]


def test_a_run_of_short_and_long_prompts_probes_each_and_each_group_reads_its_own(tmp_path):
    """4 prompts of 3 words (3 tokens) in category short, 4 of 30 in long; 8 new tokens: the probes time the
    caches 3 + 4 = 7 and 30 + 4 = 34 (the median prompt, the lower middle, is a short one), and each
    group's c and v are those of the cache nearest its rows' (prompt + half the new tokens: at most 7 and 34)."""
    from eval.records import CostProbe
    from runner.experiment import Experiment

    target, draft = save_tiny_pair(tmp_path)
    data = tmp_path / "prompts.jsonl"
    with open(data, "w") as handle:
        for i in range(8):
            words = 3 if i % 2 == 0 else 30
            text = " ".join(f"w{(i * 7 + j) % 90 + 3}" for j in range(words))
            handle.write(json.dumps({"text": text, "category": "short" if words == 3 else "long"}) + "\n")
    raw = base_config(target, draft, data, batch_size=[1], speculative={"gamma": [2]},
                      generation={"max_new_tokens": 8}, report={"plots": False})
    raw["dataset"]["group_by"] = "category"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert Experiment(validate(raw), raw, out, Console(quiet=True)).run() == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["prompt_tokens"] for s in samples}) == [3, 30]
    (probe,) = json.loads((out / "progress.json").read_text())["costs"]["1"].values()
    probe = CostProbe.from_json(probe)
    assert probe.context_tokens == 7 and list(probe.by_context) == [34]
    assert probe.by_context[34].context_tokens == 34 and probe.by_context[34].prefills == []
    assert probe.prefills  # timed once, with the first
    summary = json.loads((out / "summary.json").read_text())
    spec = {r["group"]: r for r in summary["runs"] if r["method"] == "speculative"}
    # overall the rows decode at a mean cache of at least (3 + 30) / 2 = 16.5: nearer 34 than 7 (16.5 / 7 > 34 / 16.5)
    assert {g: r["cost_context"]["probed"] for g, r in spec.items()} == {None: 34, "short": 7, "long": 34}
    (label,) = probe.c_by_draft
    assert spec["long"]["metrics"]["draft_cost_ratio_c"] == pytest.approx(probe.by_context[34].c_by_draft[label])
    assert spec["short"]["metrics"]["draft_cost_ratio_c"] == pytest.approx(probe.c_by_draft[label])
    assert not [n for n in summary["notes"] if "c and v were probed at a cache" in n]
