"""A serving run's vLLM points without vLLM (runner/engines/vllm/engine.py): what the executor sends for a load point and the
records it makes of the answer, from hand-made answers. None of these needs vLLM installed."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from utils import UserError
from utils.config import validate

VALID = {"target": {"model": "t"}, "draft": [{"model": "d", "label": "d"}], "dataset": {"path": "x.jsonl"},
         "methods": ["vllm_generate", "vllm_draft"], "speculative": {"gamma": [2]}, "generation": {"max_new_tokens": 8}}
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def _executor(config):
    """A VllmExecutor over a config and a session of three prompts whose load points have a hand-made schedule."""
    from decode.arrivals import Load
    from runner.load import requests_of
    from runner.engines.vllm.engine import VllmExecutor

    prompts = [SimpleNamespace(token_ids=ids, sample_id=i, group=None, reference=None) for i, ids in enumerate(PROMPTS)]
    session = SimpleNamespace(
        prompt_set=SimpleNamespace(prompts=prompts), eos=(2,), tokenizer=SimpleNamespace(decode=lambda ids, **_: "x"),
        batches=lambda size: [prompts[i:i + size] for i in range(0, len(prompts), size)],
        prompts_of=lambda unit: requests_of(prompts, config.load.requests),
        load_of=lambda unit: Load([0.0, 0.5, 0.5, 3.0][:config.load.requests], unit.concurrency))
    models = {"target": "/models/t", **{d.name: f"/models/{d.name}" for d in config.draft}}
    return VllmExecutor(config, session, {"python": sys.executable, "vllm": "0", "models": models}, "/tmp")


def _units(config):
    from runner.plan import comparisons, points_of, units_of

    units = [u for c in comparisons(config, config.load.requests) for u in units_of(c, len(PROMPTS), 0)]
    return units, {u: {p.method: p for p in points_of(config, u.comparison)} for u in units}


def _serving(**load):
    return validate({**VALID, "load": {"concurrency": [1, 2], "requests": 4, **load}})


def test_every_engine_takes_the_largest_concurrency_as_max_num_seqs():
    from eval.records import Comparison
    from runner.plan import points_of

    config = _serving()
    executor = _executor(config)
    kwargs = [executor.engine_kwargs(p) for u in _units(config)[0] for p in points_of(config, u.comparison)]
    assert {k["max_num_seqs"] for k in kwargs} == {2}
    uncapped = _serving(concurrency=None, request_rate=[1.0])  # no cap: every request may be in flight
    assert _executor(uncapped).engine_kwargs(points_of(uncapped, _units(uncapped)[0][0].comparison)[0])[
        "max_num_seqs"] == 4
    fixed = validate(VALID)
    assert "max_num_seqs" not in _executor(fixed).engine_kwargs(points_of(fixed, Comparison(batch_size=1))[0])


def test_a_max_num_seqs_below_the_concurrency_is_refused():
    with pytest.raises(UserError, match=r"max_num_seqs: 1 is below the largest load.concurrency \(2\)"):
        _executor(validate({**VALID, "load": {"concurrency": [1, 2], "requests": 4},
                            "vllm": {"engine_args": {"max_num_seqs": 1}}}))
    _executor(validate({**VALID, "vllm": {"engine_args": {"max_num_seqs": 1}}}))  # a fixed batch: vLLM queues


def _answer():
    """A serve answer for 4 requests (arrivals 0, 0.5, 0.5, 3.0; concurrency 2), worked out by hand."""
    def row(arrival, admitted, first, emits, spec=None):
        steps = [n for _, n in emits]
        return {"output_ids": list(range(3, 3 + sum(steps))), "new_tokens": sum(steps), "steps": steps,
                "stop_reason": "length", "finish_reason": "length", "ttft_s": 0.1, "latency_s": 0.2, "decode_s": 0.1,
                "spec": spec, "arrival_s": arrival, "admitted_s": admitted, "first_token_s": first,
                "finish_s": emits[-1][0], "emits": emits}
    return {"ok": True, "wall_s": 4.0, "counters": None, "rows": [
        row(0.0, 0.0, 0.25, [[0.25, 1], [0.5, 3], [1.25, 2]],
            {"per_step_accepted": [2, 1], "per_step_drafted": [2, 2]}),
        row(0.5, 0.5, 0.75, [[0.75, 1], [1.0, 1]], {"per_step_accepted": [0], "per_step_drafted": [2]}),
        row(0.5, 1.25, 1.5, [[1.5, 1], [2.0, 3]], {"per_step_accepted": [2], "per_step_drafted": [2]}),
        row(3.0, 3.0, 3.25, [[3.25, 1], [4.0, 2]], {"per_step_accepted": [1], "per_step_drafted": [2]}),
    ]}


def test_a_load_point_is_one_serve_job_and_its_records_carry_the_serving_fields(monkeypatch):
    config = _serving()
    executor = _executor(config)
    units, points = _units(config)
    unit = units[1]  # concurrency 2
    sent = []
    monkeypatch.setattr(executor, "generate", lambda engine, job: sent.append(job) or _answer())
    rows = executor.run_batch(executor.engine_of(points[unit]["vllm_draft"]), points[unit]["vllm_draft"], unit)
    (job,) = sent
    assert job["op"] == "serve" and job["concurrency"] == 2 and job["arrivals"] == [0.0, 0.5, 0.5, 3.0]
    assert job["prompts"] == [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]  # request 3 cycles to prompt 0
    assert [r["sample_id"] for r in rows] == [0, 1, 2, 0] and [r["request"] for r in rows] == [0, 1, 2, 3]
    first, _, waited, _ = rows
    assert first["concurrency"] == 2 and first["batch_size"] == 2 and first["request_rate"] is None
    assert all(r["batch_rows"] == 4 for r in rows)
    # request 0: arrived 0, first token 0.25, finished 1.25; request 2 arrived 0.5, waited until 1.25 for a slot
    assert (first["prefill_s"], first["latency_s"], first["target_s"]) == (0.25, 1.25, 1.25)
    assert (waited["prefill_s"], waited["latency_s"], waited["target_s"]) == (1.0, 1.5, 0.75)
    assert waited["admitted_s"] == 1.25 and waited["emits"] == [[1.5, 1], [2.0, 3]]
    assert first["rounds"] == [{"drafted": 2, "accepted": 2, "emitted": 3}, {"drafted": 2, "accepted": 1, "emitted": 2}]
    assert first["target_forwards"] == 3
    result = SimpleNamespace(rows=[], failures=[], rates={})
    executor._run(points[unit]["vllm_draft"], unit, result)
    assert result.rates[points[unit]["vllm_draft"].label] == 15 / 4.0  # 15 tokens, the last finish at 4.0 s


def test_the_warmup_and_the_drift_probe_run_the_first_c_requests_as_a_fixed_batch(monkeypatch):
    config = _serving()
    executor = _executor(config)
    units, points = _units(config)
    unit = units[1]
    sent = []
    monkeypatch.setattr(executor, "generate", lambda engine, job: sent.append(job) or {"ok": True, "wall_s": 0.1})
    engine = executor.engine_of(points[unit]["vllm_generate"])
    executor.warm_up(engine, points[unit]["vllm_generate"], unit)
    list(executor.drift_probe(engine, points[unit]["vllm_generate"], unit))
    assert sent and all(j["op"] == "generate" and j["prompts"] == PROMPTS[:2] for j in sent)


def test_a_request_without_its_times_or_a_dead_engine_writes_no_records(monkeypatch):
    from runner.engines.vllm.engine import VllmDead

    config = _serving()
    executor = _executor(config)
    units, points = _units(config)
    answer = _answer()
    answer["rows"][3]["first_token_s"] = None
    monkeypatch.setattr(executor, "generate", lambda engine, job: answer)
    point = points[units[0]]["vllm_generate"]
    assert "first_token_s" in executor.run_batch(executor.engine_of(point), point, units[0])
    monkeypatch.undo()

    class Dead:  # the worker died in the middle of the load point
        def ask(self, job, timeout):
            raise VllmDead("the vLLM worker exited (code -9) during serve")

        def alive(self):
            return False

        def close(self, force=False):
            pass

    point = points[units[0]]["vllm_draft"]
    executor.engine_of(point).process = Dead()
    first = SimpleNamespace(rows=[], failures=[], rates={})
    executor._run(point, units[0], first)
    later = SimpleNamespace(rows=[], failures=[], rates={})
    executor._run(points[units[1]]["vllm_draft"], units[1], later)  # the next load point, on the same engine
    for result in (first, later):
        assert result.rows == [] and len(result.failures) == 1
        assert "exited (code -9) during serve" in result.failures[0]["error"]


@pytest.mark.parametrize("pairing", ["engine", "batch"])
def test_each_engine_starts_once_for_every_load_point(monkeypatch, pairing):
    """With either pairing, one engine per method serves both load points (faked engines: what runs where)."""
    config = validate({**VALID, "load": {"concurrency": [1, 2], "requests": 4}, "vllm": {"pairing": pairing}})
    executor = _executor(config)
    units, _ = _units(config)
    log = []

    class Up:
        def __init__(self, name):
            self.name = name

        def alive(self):
            return True

        def close(self, force=False):
            log.append(("stop", self.name))

    def start(point, sharing=1):
        engine = executor.engine_of(point)
        if engine.process is None:
            log.append(("start", engine.name))
            engine.process = Up(engine.name)
        return engine

    def generate(engine, job):
        if job["op"] == "serve":
            log.append(("serve", engine.name, job["concurrency"]))
            return _answer()
        return {"ok": True, "wall_s": 0.1}

    monkeypatch.setattr(executor, "start", start)
    monkeypatch.setattr(executor, "generate", generate)
    results = list(executor.run(units, set()))
    starts = [e[1] for e in log if e[0] == "start"]
    assert sorted(starts) == ["vllm_draft draft=d gamma=2", "vllm_generate"]
    served = [e[1:] for e in log if e[0] == "serve"]
    assert sorted(served) == sorted((name, c) for name in starts for c in (1, 2))
    if pairing == "engine":  # one engine at a time: its load points, then it is stopped before the next starts
        first = starts[0]
        assert log.index(("stop", first)) < log.index(("start", starts[1]))
        assert [s for s in served if s[0] == first] == served[:2]
    assert sum(len(r.rows) for _, r in results) == 4 * 4 and not any(r.failures for _, r in results)
