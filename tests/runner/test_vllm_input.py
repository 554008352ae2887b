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
    from runner.plan import points_of

    config = validate({**VALID, "draft": [{"model": "d"}, {"model": "h", "kind": "eagle3"}],
                       "methods": ["baseline", "speculative", "vllm_generate", "vllm_draft", "vllm_eagle"]})
    drafts = {p.method: sorted({q.draft for q in points_of(config, 1, None) if q.method == p.method})
              for p in points_of(config, 1, None)}
    assert drafts["speculative"] == ["d"] and drafts["vllm_draft"] == ["d"] and drafts["vllm_eagle"] == ["h"]
    assert {p.method for p in points_of(config, 1, None, engine="ours")} == {"baseline", "speculative"}


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

    from runner.vllm_engine import _hold_signals, _release_signals

    # Python's own Ctrl-C handler, as in launch.py: not whatever an earlier test in this process left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        outer = _hold_signals()
        os.kill(os.getpid(), signal.SIGINT)  # while every engine is being stopped
        inner = _hold_signals()
        os.kill(os.getpid(), signal.SIGINT)  # while one worker is being closed
        _release_signals(inner)  # still inside the outer shutdown: nothing raised yet
        with pytest.raises(KeyboardInterrupt):
            _release_signals(outer)
    finally:
        signal.signal(signal.SIGINT, previous)
