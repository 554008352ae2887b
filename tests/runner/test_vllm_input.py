"""What the vLLM engine refuses before anything runs: one line, exit 2. None of these needs vLLM installed."""
import subprocess
import sys

import pytest
import yaml

from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, write_prompts
from utils.config import ConfigError, validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl"}}


@pytest.mark.parametrize("patch, fragment", [
    ({"methods": ["vllm_generate", "vllm_eagle"]}, "vllm_eagle needs a draft of kind eagle"),
    ({"methods": ["vllm_generate", "vllm_draft"], "cluster": {"backend": "ray"}}, "not on a Ray cluster"),
    ({"methods": ["vllm_draft"], "repeats": "auto"}, "without vllm_generate"),
    ({"vllm": {"pairing": "sometimes"}}, "vllm.pairing"),
])
def test_vllm_config_errors_name_the_key(patch, fragment):
    with pytest.raises(ConfigError, match=fragment):
        validate({**VALID, **patch})


def test_draft_kinds_split_the_draft_axis():
    from eval.records import Comparison
    from runner.plan import points_of

    config = validate({**VALID, "draft": [{"model": "d"}, {"model": "h", "kind": "eagle3"}],
                       "methods": ["baseline", "speculative", "vllm_generate", "vllm_draft", "vllm_eagle"]})
    drafts = {p.method: sorted({q.draft for q in points_of(config, Comparison(batch_size=1)) if q.method == p.method})
              for p in points_of(config, Comparison(batch_size=1))}
    assert drafts["speculative"] == ["d"] and drafts["vllm_draft"] == ["d"] and drafts["vllm_eagle"] == ["h"]
    assert {p.method for p in points_of(config, Comparison(batch_size=1), engine="ours")} == {"baseline", "speculative"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-input")
    target, draft = save_tiny_pair(root)
    return root, target, draft, write_prompts(root / "prompts.jsonl")


@pytest.mark.parametrize("vllm, model, fragment", [
    ({"python": "/no/such/python"}, None, "vllm.python: /no/such/python is not an executable file"),
    ({"python": sys.executable}, None, "cannot import vllm"),
    ({}, "synthetic:llama-tiny", "vLLM cannot load it"),
])
def test_a_vllm_run_that_cannot_start_is_one_line(tiny, tmp_path, vllm, model, fragment):
    root, target, draft, data = tiny
    if vllm.get("python") == sys.executable and subprocess.run([sys.executable, "-c", "import vllm"],
                                                               capture_output=True, cwd="/").returncode == 0:
        pytest.skip("vllm imports in this environment")  # (tests/vllm/ would shadow it in this process)
    config = base_config(target, draft, data, methods=["baseline", "vllm_generate", "vllm_draft"], vllm=vllm,
                         batch_size=[1], speculative={"gamma": [2]})
    if model:
        config["target"] = {"model": model}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", path, "--output-dir", tmp_path / "out"])
    assert_one_clean_line(result, fragment)


def test_a_ctrl_c_during_a_workers_shutdown_is_deferred_not_lost():
    import os
    import signal

    from utils import hold_signals, release_signals

    # Python's own Ctrl-C handler, as in launch.py: not whatever an earlier test in this process left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        outer = hold_signals()
        os.kill(os.getpid(), signal.SIGINT)  # while every engine is being stopped
        inner = hold_signals()
        os.kill(os.getpid(), signal.SIGINT)  # while one worker is being closed
        release_signals(inner)  # still inside the outer shutdown: nothing raised yet
        with pytest.raises(KeyboardInterrupt):
            release_signals(outer)
    finally:
        signal.signal(signal.SIGINT, previous)


def _executor(config):
    """A VllmExecutor over a config, with a session of two prompts and a checked vLLM (none runs)."""
    from types import SimpleNamespace

    from runner.engines.vllm.engine import VllmExecutor

    prompts = [SimpleNamespace(token_ids=[5, 6, 7]), SimpleNamespace(token_ids=[5, 6])]
    session = SimpleNamespace(prompt_set=SimpleNamespace(prompts=prompts))
    models = {"target": "/models/t", **{d.name: f"/models/{d.name}" for d in config.draft}}
    return VllmExecutor(config, session, {"python": sys.executable, "vllm": "0", "models": models}, "/tmp")


def test_the_vllm_drafts_revision_and_quantization_reach_its_speculative_config():
    from eval.records import Comparison
    from runner.plan import points_of

    config = validate({**VALID, "draft": [{"model": "d", "revision": "abc123", "quantization": "4bit"},
                                          {"model": "e"}],
                       "methods": ["vllm_generate", "vllm_draft"], "speculative": {"gamma": [3]}})
    executor = _executor(config)
    by_draft = {p.draft: executor.engine_kwargs(p) for p in points_of(config, Comparison(batch_size=1)) if p.method == "vllm_draft"}
    assert by_draft["d"]["speculative_config"] == {"method": "draft_model", "model": "/models/d",
                                                   "num_speculative_tokens": 3, "revision": "abc123",
                                                   "quantization": "bitsandbytes"}
    assert by_draft["e"]["speculative_config"] == {"method": "draft_model", "model": "/models/e",
                                                   "num_speculative_tokens": 3}
    reference = next(p for p in points_of(config, Comparison(batch_size=1)) if p.method == "vllm_generate")
    assert "speculative_config" not in executor.engine_kwargs(reference)


def test_a_vllm_draft_in_another_dtype_than_the_engine_is_refused():
    from runner.engines.vllm.engine import draft_dtype_problem

    config = validate({**VALID, "target": {"model": "t", "dtype": "bfloat16"}, "draft": {"model": "d", "dtype": "float32"},
                       "device": "cpu", "methods": ["vllm_generate", "vllm_draft"]})
    assert "draft.dtype: float32" in draft_dtype_problem(config) and "bfloat16" in draft_dtype_problem(config)
    same = validate({**VALID, "target": {"model": "t", "dtype": "bfloat16"}, "draft": {"model": "d", "dtype": "bfloat16"},
                     "methods": ["vllm_generate", "vllm_draft"]})
    ours = validate({**VALID, "target": {"model": "t", "dtype": "bfloat16"}, "draft": {"model": "d", "dtype": "float32"},
                     "methods": ["baseline", "speculative", "vllm_generate"]})  # vLLM loads no draft
    assert draft_dtype_problem(same) is None and draft_dtype_problem(ours) is None



def test_vllm_resolves_auto_as_our_engine_does_for_a_torchao_int4_target():
    """torchao-int4 computes in bfloat16, so auto is bfloat16 for our target; vLLM's dtype follows it (float32
    before, on a CPU)."""
    from runner.engines.vllm.engine import engine_dtype

    int4 = validate({**VALID, "target": {"model": "t", "quantization": "torchao-int4"}, "device": "cpu",
                     "methods": ["vllm_generate"]})
    plain = validate({**VALID, "target": {"model": "t"}, "device": "cpu", "methods": ["vllm_generate"]})
    assert engine_dtype(int4) == "bfloat16" and engine_dtype(plain) == "float32"


def test_vllm_pairing_is_decided_when_vllm_runs_not_while_our_models_hold_memory(monkeypatch):
    """pairing auto weighs the free memory: read when run() starts (after the sweep released our models), not when
    the executor is built beside them."""
    import runner.engines.process as process
    import runner.engines.vllm.engine as vllm_engine

    config = validate({**VALID, "methods": ["vllm_generate", "vllm_draft"], "vllm": {"pairing": "auto"}})
    free = {"bytes": 0}  # our models loaded: nothing free
    monkeypatch.setattr(process, "free_memory", lambda device: free["bytes"])
    monkeypatch.setattr(vllm_engine, "resident_bytes", lambda path, dtype: 2**20)
    executor = _executor(config)
    assert executor.pairing is None
    free["bytes"] = 2**40  # released: all of it
    list(executor.run([], set()))
    assert executor.pairing == "batch"


@pytest.mark.parametrize("generation", [{}, {"do_sample": True, "temperature": [0.7]}])
def test_a_vllm_engine_is_named_by_its_point_axes_alone(generation):
    from runner.plan import comparisons, points_of

    config = validate({**VALID, "methods": ["vllm_generate", "vllm_draft"], "speculative": {"gamma": [3]},
                       "generation": generation})
    executor = _executor(config)
    names = [executor.engine_of(p).name for p in points_of(config, comparisons(config)[0])]
    assert names == ["vllm_generate", "vllm_draft draft=d gamma=3"]  # no batch, load or temperature in it


def test_the_vllm_worker_runs_where_this_package_cannot_shadow_vllm(tmp_path, monkeypatch):
    """vLLM inspects models in `python -m vllm....` subprocesses, which put their cwd first on sys.path: the worker's
    cwd must hold no folder named vllm (runner/engines does: on a cold ~/.cache/vllm every engine failed to start)."""
    import subprocess
    from pathlib import Path

    from runner.engines.vllm import engine

    seen = {}

    class Fake:
        def __init__(self, args, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(subprocess, "Popen", Fake)
    engine.VllmProcess("python3", tmp_path / "worker.log", "w")
    assert not (Path(seen["cwd"]) / "vllm").exists()
