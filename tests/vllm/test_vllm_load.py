"""vLLM under load (config load:) against the real CPU build, on the tiny Llama pair: runner/engines/vllm/engine.py's executor
serves each load point's requests through runner/engines/vllm/worker.py's serve job.

Skipped unless SPECULATE_VLLM_PYTHON names an interpreter that imports vllm (.ci/vllm-env DIR builds one). One
executor serves the module: three engines (vllm_generate, vllm_draft, vllm_ngram), each started once and kept for
both load points (batch pairing; max_num_seqs the largest concurrency).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers import VLLM_PYTHON, WORD_PROMPTS, needs_vllm

PYTHON = VLLM_PYTHON
pytestmark = needs_vllm()

EOS = 2
PROMPTS = WORD_PROMPTS  # 9 requests cycle over them
REQUESTS, CONCURRENCY, MAX_NEW = 9, [1, 3], 16
METHODS = ["vllm_generate", "vllm_draft", "vllm_ngram"]


class Session:
    """What VllmExecutor reads of runner/session.py's Session: the prompts, a unit's requests and arrival schedule
    (runner/load.py, as Session.prompts_of and load_of), the tokenizer and the stop tokens."""

    def __init__(self, config, tokenizer):
        from utils.data import Prompt, PromptSet

        self.config, self.tokenizer, self.eos = config, tokenizer, (EOS,)
        self.prompt_set = PromptSet([Prompt(i, "", ids) for i, ids in enumerate(PROMPTS)])

    def batches(self, batch_size):
        from runner.plan import batches_of

        return batches_of(self.prompt_set.prompts, batch_size)

    def prompts_of(self, unit):
        from runner.load import requests_of

        return requests_of(self.prompt_set.prompts, self.config.load.requests)

    def load_of(self, unit):
        from decode.arrivals import Load
        from runner.load import schedule_of

        return Load(schedule_of(self.config, unit, len(self.prompt_set.prompts)), unit.concurrency)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The executor's records of both load points, and a hand-made schedule served on vllm_generate's engine first."""
    from helpers import save_vllm_pair, word_tokenizer

    from runner.plan import comparisons, points_of, units_of
    from runner.engines.vllm.engine import VllmExecutor, model_dirs
    from utils.config import validate

    root = tmp_path_factory.mktemp("vllm-load")
    target, draft = save_vllm_pair(root)
    config = validate({
        "name": "vllm-load", "device": "cpu", "seed": 0,
        "target": {"model": str(target)}, "draft": [{"model": str(draft), "label": "d"}],
        "dataset": {"path": str(root / "unused.jsonl")},
        "generation": {"max_new_tokens": MAX_NEW}, "speculative": {"gamma": [2], "ngram_max": 2},
        "warmup": 1, "methods": METHODS, "load": {"concurrency": CONCURRENCY, "requests": REQUESTS},
        "vllm": {"python": PYTHON, "pairing": "batch", "enforce_eager": True, "kv_cache_memory_bytes": 64 * 2**20},
    })
    executor = VllmExecutor(config, Session(config, word_tokenizer()),
                            {"python": PYTHON, "vllm": "?", "models": model_dirs(config)}, root)
    units = [u for c in comparisons(config, REQUESTS) for u in units_of(c, len(PROMPTS), 0)]
    try:
        # two slots; requests 0-2 arrive at once (2 waits for a slot), 3 arrives after a gap
        reference = next(p for p in points_of(config, units[0].comparison) if p.method == "vllm_generate")
        engine = executor.start(reference)
        assert engine.failed is None, engine.failed
        job = executor._job(executor.session.prompt_set.prompts[:4], None, MAX_NEW, 0,
                            SimpleNamespace(arrivals=[0.0, 0.0, 0.0, 1.5], concurrency=2))
        hand = executor.generate(engine, job)
        # one slot; request 1 is request 0's next turn, 0.3 s after its last token: request 2 (at 0) goes before it
        job = executor._job(executor.session.prompt_set.prompts[:3], None, MAX_NEW, 0,
                            SimpleNamespace(arrivals=[0.0, 0.0, 0.0], concurrency=1, follows=[None, 0, None],
                                            think_s=0.3))
        turns = executor.generate(engine, job)
        results = list(executor.run(units, set()))
    finally:
        executor.close()
    rows = [r for _, result in results for r in result.rows]
    failures = [f for _, result in results for f in result.failures]
    return SimpleNamespace(config=config, executor=executor, rows=rows, failures=failures, hand=hand, turns=turns,
                           probes=[result for _, result in results if result.drift_probe_s is not None], target=target,
                           starts=(root / "vllm-worker.log").read_text().count("worker for "))


def _requests(served, method: str, concurrency: int) -> list[dict]:
    rows = [r for r in served.rows if r["method"] == method and r["concurrency"] == concurrency]
    assert len(rows) == REQUESTS, (method, concurrency, len(rows))
    return rows  # in request order


def test_one_engine_per_method_serves_every_load_point(served):
    assert not served.failures, served.failures
    assert len(served.executor.engines) == len(METHODS)
    assert served.starts == len(METHODS)  # each started once, not once per load point
    assert all(e.kwargs["max_num_seqs"] == max(CONCURRENCY) for e in served.executor.engines.values())
    # drift probes on a fixed batch of the first C requests, at each engine's start and end, per load point
    assert len(served.probes) == 2 * len(METHODS) * len(CONCURRENCY)


@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_greedy_speculation_under_load_equals_vllm_generate(served, concurrency):
    reference = _requests(served, "vllm_generate", concurrency)
    assert [r["sample_id"] for r in reference] == [i % len(PROMPTS) for i in range(REQUESTS)]  # request i: prompt i
    for method in METHODS[1:]:
        rows = _requests(served, method, concurrency)
        for index, (row, base) in enumerate(zip(rows, reference)):
            assert row["output_ids"] == base["output_ids"], f"{method} request {index} at concurrency {concurrency}"
            assert row["stop_reason"] == base["stop_reason"]
            assert 1 + sum(r["emitted"] for r in row["rounds"]) == row["new_tokens"]  # rounds read under load too
    drafted = [r for row in _requests(served, "vllm_draft", concurrency) for r in row["rounds"]]
    assert sum(r["accepted"] for r in drafted) > 0  # the draft is the target's first layer: it agrees now and then


@pytest.mark.parametrize("concurrency", CONCURRENCY)
def test_served_requests_times_are_consistent(served, concurrency):
    for method in METHODS:
        rows = _requests(served, method, concurrency)
        for row in rows:
            assert row["batch_rows"] == REQUESTS and row["request_rate"] is None and row["batch_size"] == concurrency
            assert row["arrival_s"] == 0.0  # all at once
            assert row["arrival_s"] <= row["admitted_s"] <= row["first_token_s"] <= row["finish_s"]
            times = [t for t, _ in row["emits"]]
            assert times == sorted(times) and times[0] == row["first_token_s"] and times[-1] == row["finish_s"]
            assert sum(n for _, n in row["emits"]) == row["new_tokens"] and all(n >= 1 for _, n in row["emits"])
            assert row["prefill_s"] == row["first_token_s"] - row["arrival_s"]
            assert row["latency_s"] == row["finish_s"] - row["arrival_s"]
        # at most C in flight: each admission finds fewer than C admitted and unfinished
        for row in rows:
            flying = [o for o in rows if o is not row and o["admitted_s"] <= row["admitted_s"] < o["finish_s"]]
            assert len(flying) < concurrency
        if concurrency == 1:  # a closed loop of one: request k starts once request k - 1 finished
            for before, after in zip(rows, rows[1:]):
                assert after["admitted_s"] >= before["finish_s"]
        else:  # request C waited for a slot: its TTFT includes that wait
            assert rows[concurrency]["admitted_s"] >= min(r["finish_s"] for r in rows[:concurrency])


def test_a_request_that_finds_every_slot_busy_waits(served):
    assert served.hand["ok"], served.hand
    rows = served.hand["rows"]
    assert [r["arrival_s"] for r in rows] == [0.0, 0.0, 0.0, 1.5]
    assert rows[2]["admitted_s"] >= min(rows[0]["finish_s"], rows[1]["finish_s"])
    assert rows[3]["admitted_s"] >= 1.5  # it arrived later: not admitted before its time
    for row in rows:
        assert row["arrival_s"] <= row["admitted_s"] <= row["first_token_s"] <= row["finish_s"]
        assert sum(n for _, n in row["emits"]) == row["new_tokens"]


def test_vllm_generate_under_load_equals_our_baseline(served):
    """vLLM's reference and our engine's baseline agree token for token on the same prompts (fp32, greedy)."""
    import torch
    from transformers import AutoModelForCausalLM

    from decode.generate import generate_baseline
    from decode.settings import Generation

    model = AutoModelForCausalLM.from_pretrained(served.target, torch_dtype=torch.float32).eval()
    generation = Generation(max_new_tokens=MAX_NEW, eos_token_ids=(EOS,))
    with torch.inference_mode():
        ours = [generate_baseline(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                                  generation)[0].output_ids for ids in PROMPTS]
    for concurrency in CONCURRENCY:
        for index, row in enumerate(_requests(served, "vllm_generate", concurrency)):
            assert row["output_ids"] == ours[index % len(PROMPTS)], f"request {index} at concurrency {concurrency}"


def test_a_conversations_next_turn_arrives_after_its_previous_answer(served):
    assert served.turns["ok"], served.turns
    first, follower, other = served.turns["rows"]
    assert follower["arrival_s"] == pytest.approx(first["finish_s"] + 0.3)
    assert first["finish_s"] <= other["admitted_s"] < follower["arrival_s"] <= follower["admitted_s"]
    assert follower["admitted_s"] >= other["finish_s"]
