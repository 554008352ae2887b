"""llama.cpp as a third engine: its rounds from the server's counters, its server's arguments, bad input, and whole
runs through launch.py, against a stand-in server (tests/llama_cpp/fake_server.py: no build needed) and, where
SPECULATE_LLAMA_SERVER names a built llama-server (.ci/llama-cpp-env DIR), the real one on SmolLM2-135M's GGUF."""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import assert_one_clean_line, run_launch, write_prompts
from runner.engines.llama_cpp.engine import rounds_of
from runner.engines.llama_cpp.worker import server_command

REAL_SERVER = os.environ.get("SPECULATE_LLAMA_SERVER", "")


def test_rounds_from_the_counters_by_hand():
    # (tokens_predicted, draft_n, draft_n_accepted) per chunk: the prefill's token; a step that drafted 4 and accepted
    # 2 (3 tokens); a plain step; a step that drafted 4, accepted 1, whose first token's chunk was not sent (the count
    # jumps by 2); a plain step
    counts = [[1, 0, 0], [2, 4, 2], [3, 4, 2], [4, 4, 2], [5, 4, 2], [7, 8, 3], [8, 8, 3]]
    plain = {"drafted": 0, "accepted": 0, "emitted": 1}
    assert rounds_of(counts) == [{"drafted": 4, "accepted": 2, "emitted": 3}, plain,
                                 {"drafted": 4, "accepted": 1, "emitted": 2}, plain]
    # the stop cut the last step after 2 of its 4 tokens
    assert rounds_of([[1, 0, 0], [2, 5, 3], [3, 5, 3]]) == [{"drafted": 5, "accepted": 3, "emitted": 2}]
    for broken in ([[0, 0, 0]], [[1, 0, 0], [2, 4, 2], [3, 3, 2]], [[1, 0, 0], [0, 0, 0]], [[1, 0, 0], [1, 4, 2]], []):
        assert rounds_of(broken) is None


# the stand-in's 12 tokens at gamma 4: the prefill's (1), rounds of 3 tokens drafting 4 and accepting 2 (2-4, 5-7,
# 8-10) and a last of 2 accepting 1 (11-12); positions 1 (the prefill's), 4 (round 1's last), 5 (round 2's first),
# 7 and 8 (round 2's last and round 3's first) withheld, as tokens that end inside a UTF-8 character are
WITHHELD = "1,4,5,7,8"
TRUE_ROUNDS = [{"drafted": 4, "accepted": 2, "emitted": 3}] * 3 + [{"drafted": 4, "accepted": 1, "emitted": 2}]


def test_rounds_where_tokens_are_withheld_mid_round_and_first():
    # the chunks of tokens 2, 3, 6, 9, 10, 11, 12 and the final one: each jump in tokens_predicted finishes the open
    # round before the next starts; no plain step, and the first token's missing chunk loses no round
    counts = [[2, 4, 2], [3, 4, 2], [6, 8, 4], [9, 12, 6], [10, 12, 6], [11, 16, 7], [12, 16, 7], [12, 16, 7]]
    assert rounds_of(counts) == TRUE_ROUNDS
    # with the prefill's chunk sent, the same: 3 of round 2's tokens are not round 2's alone
    assert rounds_of([[1, 0, 0]] + counts) == TRUE_ROUNDS
    # a jump past the new round's accepted + 1 with counts that then stay: the rest are plain steps
    plain = {"drafted": 0, "accepted": 0, "emitted": 1}
    assert rounds_of([[1, 0, 0], [2, 4, 1], [6, 4, 1]]) == [{"drafted": 4, "accepted": 1, "emitted": 2}, plain, plain,
                                                            plain]


def test_the_server_arguments_of_each_method():
    base = {"server": "S", "model": "T.gguf", "slots": 4, "ctx": 800, "threads": 2}
    plain = server_command({**base, "spec_type": None}, 9000)
    assert plain[:3] == ["S", "-m", "T.gguf"] and "-md" not in plain and "--spec-type" not in plain
    assert plain[plain.index("--host") + 1] == "127.0.0.1" and plain[plain.index("-np") + 1] == "4"
    draft = server_command({**base, "spec_type": "draft-simple", "draft": "D.gguf", "n_max": 4, "n_min": 1,
                            "p_min": 0.0}, 9000)
    pairs = dict(zip(draft, draft[1:]))
    assert (pairs["-md"], pairs["--spec-type"], pairs["--spec-draft-n-max"], pairs["--spec-draft-n-min"],
            pairs["--spec-draft-p-min"]) == ("D.gguf", "draft-simple", "4", "1", "0.0")
    ngram = server_command({**base, "spec_type": "ngram-simple", "n_max": 6, "ngram_n": 3}, 9000)
    pairs = dict(zip(ngram, ngram[1:]))
    assert (pairs["--spec-type"], pairs["--spec-ngram-simple-size-n"], pairs["--spec-ngram-simple-size-m"]) == \
        ("ngram-simple", "3", "6")


def _fake_server(root: Path) -> Path:
    script = root / "llama-server"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name('fake_server.py')} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _config(root: Path, server: str, methods: list[str], **extra) -> Path:
    config = {"name": "llama", "device": "cpu", "seed": 0,
              "target": {"model": "smollm2-135m-instruct"}, "draft": {"model": "smollm2-135m-instruct"},
              "dataset": {"path": str(write_prompts(root / "prompts.jsonl", 3)), "prompt_field": "text",
                          "chat_template": False},
              "generation": {"max_new_tokens": 12}, "speculative": {"gamma": [4]}, "batch_size": [1],
              "warmup": 1, "methods": methods, "llama_cpp": {"server": server}, **extra}
    path = root / "llama.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _runs(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"] + (summary.get("serving") or {}).get("runs", [])
    return {(r["method"], r["batch_size"] if r.get("concurrency") is None else None, r.get("concurrency")): r
            for r in runs}


def test_a_run_against_the_stand_in_server(tmp_path):
    """Fixed batches of 1 and 2, and served at concurrency 2: the fake drafts 4 a step and accepts 2 (1 in the last
    step of 2 tokens): 12 tokens = the prefill's, 3 steps of 3 and one of 2, so acceptance 7 / 16 and 4 rounds."""
    server = _fake_server(tmp_path)
    methods = ["llama_cpp_generate", "llama_cpp_draft", "llama_cpp_ngram"]
    out = tmp_path / "out"
    result = run_launch(["--config", _config(tmp_path, str(server), methods, batch_size=[1, 2]), "--out", out])
    assert result.returncode == 0, result.stderr[-3000:]
    runs = _runs(out)
    for method in ("llama_cpp_draft", "llama_cpp_ngram"):
        metrics = runs[(method, 1, None)]["metrics"]
        assert metrics["acceptance_rate"] == pytest.approx(7 / 16)
        assert metrics["exact_match"] == 1.0  # the same tokens (and the same ones not sent) as llama_cpp_generate's
        assert metrics["block_efficiency"] == pytest.approx(12 / 5)  # 12 tokens over the prefill and 4 steps
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    draft = next(r for r in records if r["method"] == "llama_cpp_draft")
    assert draft["new_tokens"] == 12 and len(draft["output_ids"]) == 11  # the 9th token's chunk was not sent
    assert draft["extra"]["llama_cpp_ids_lost"] == 1 and draft["extra"]["llama_cpp_ttft_s"] == pytest.approx(0.005)
    assert draft["extra"]["back_to_back"] is True  # batch pairing (auto: the GGUF files fit)
    progress = json.loads((out / "progress.json").read_text())
    assert progress["engine_info"]["llama_cpp"]["version"] == "1 (fake)"

    served = tmp_path / "served"
    config = _config(tmp_path, str(server), methods, load={"concurrency": [2], "requests": 3})
    result = run_launch(["--config", config, "--out", served])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _runs(served)[("llama_cpp_draft", None, 2)]["metrics"]
    assert metrics["acceptance_pooled"] == pytest.approx(7 / 16) and metrics["exact_match"] == 1.0
    assert metrics["mean_accepted_tokens_pooled"] == pytest.approx(11 / 4)  # 11 tokens over 4 rounds a request


def test_a_run_whose_server_withholds_tokens_keeps_its_rounds(tmp_path):
    server = _fake_server(tmp_path)
    out = tmp_path / "out"
    result = run_launch(["--config", _config(tmp_path, str(server), ["llama_cpp_generate", "llama_cpp_draft"]),
                         "--out", out], env_extra={"FAKE_LLAMA_WITHHOLD": WITHHELD})
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    drafts = [r for r in records if r["method"] == "llama_cpp_draft"]
    assert len(drafts) == 3 and all(r["rounds"] == TRUE_ROUNDS for r in drafts)
    assert all(len(r["output_ids"]) == 7 and r["extra"]["llama_cpp_ids_lost"] == 5 for r in drafts)
    metrics = _runs(out)[("llama_cpp_draft", 1, None)]["metrics"]
    assert metrics["acceptance_rate"] == pytest.approx(7 / 16)  # every record's rounds counted
    assert metrics["block_efficiency"] == pytest.approx(12 / 5)  # the prefill and 4 rounds, no invented plain step


@pytest.mark.parametrize("case", ["no-server", "not-gguf", "cuda"])
def test_bad_input_is_one_line(tmp_path, case):
    server = str(_fake_server(tmp_path)) if case != "no-server" else str(tmp_path / "missing" / "llama-server")
    extra = {"target": {"model": "synthetic:llama-tiny"}} if case == "not-gguf" else \
        {"device": "cuda:0"} if case == "cuda" else {}
    config = _config(tmp_path, server, ["llama_cpp_generate", "llama_cpp_ngram"], **extra)
    fragment = {"no-server": "llama_cpp.server", "not-gguf": "is not a GGUF file", "cuda": "llama_cpp"}[case]
    assert_one_clean_line(run_launch(["--config", config, "--out", tmp_path / "out"]), fragment)


def test_a_resumed_run_counts_what_was_done_and_releases_no_models(tmp_path):
    """A run of llama.cpp's points alone holds none of our engine's models, so no note says they were released or
    loaded again; resumed after the reference's server block (engine pairing), its progress counts that block's
    batches as done and ends at 6/6."""
    methods = ["llama_cpp_generate", "llama_cpp_ngram"]
    config = _config(tmp_path, str(_fake_server(tmp_path)), methods, llama_cpp={"server": str(_fake_server(tmp_path)),
                                                                                  "pairing": "engine"})
    out = tmp_path / "out"
    result = run_launch(["--config", config, "--out", out])
    assert result.returncode == 0, result.stderr[-3000:]
    notes = json.loads((out / "progress.json").read_text())["notes"]
    assert not [n for n in notes if "our engine's models" in n], notes
    samples = out / "samples.jsonl"
    kept = [line for line in samples.read_text().splitlines() if json.loads(line)["method"] == "llama_cpp_generate"]
    samples.write_text("\n".join(kept) + "\n")  # as if interrupted after the reference's block
    result = run_launch(["--resume", out])
    assert result.returncode == 0, result.stderr[-3000:]
    counts = re.findall(r"\] (\d+)/(\d+) llama_cpp", result.stderr)
    assert counts and counts[-1] == ("6", "6") and len(counts) == 3, result.stderr[-3000:]


@pytest.mark.parametrize("case", ["exits", "hangs", "not-llama-server"])
def test_a_server_that_does_not_start_is_one_line(tmp_path, case):
    """A binary that passes --version and then exits or hangs at its start, or that is not llama-server at all:
    one line naming it and exit 2, before anything runs (the docs' promise for a broken server)."""
    server = "/bin/true" if case == "not-llama-server" else str(_fake_server(tmp_path))
    extra = {"llama_cpp": {"server": server, "start_timeout_s": 2}} if case == "hangs" else {}
    config = _config(tmp_path, server, ["llama_cpp_generate", "llama_cpp_ngram"], **extra)
    result = run_launch(["--config", config, "--out", tmp_path / "out"],
                        env_extra={"FAKE_LLAMA_START": {"exits": "exit", "hangs": "hang"}.get(case, "")})
    fragment = {"exits": "exited while starting (exit code 1); its last line: fake: error loading model",
                "hangs": "did not answer /health within 2 s",
                "not-llama-server": "/bin/true is not llama.cpp's llama-server"}[case]
    assert_one_clean_line(result, fragment)


def test_a_server_killed_mid_run_is_said_so(tmp_path):
    """A server that dies in a timed batch (its warmup and probes ran): each point on it fails with the server's
    death, its exit code and its last line, not with what the worker's next job found."""
    config = _config(tmp_path, str(_fake_server(tmp_path)), ["llama_cpp_generate", "llama_cpp_ngram"])
    result = run_launch(["--config", config, "--out", tmp_path / "out"], env_extra={"FAKE_LLAMA_DIE_AT": "12"})
    assert result.returncode == 3, result.stderr[-3000:]
    failures = json.loads((tmp_path / "out" / "progress.json").read_text())["failures"]
    assert {f["method"] for f in failures} == {"llama_cpp_generate", "llama_cpp_ngram"}
    for failure in failures:
        assert "llama-server died (exit code 3); its last line: fake: GGML_ASSERT(n_tokens <= n_batch) failed" \
            in failure["error"], failure["error"]
    assert "no engine" not in result.stderr


def test_a_killed_run_leaves_no_worker_or_server(tmp_path):
    """launch.py SIGKILLed while a server streams (and its SIGTERM waits for the stream, as llama-server's does): the
    worker (PR_SET_PDEATHSIG, else its parent watch) shuts its server down, SIGKILL after SERVER_STOP_S, and the
    server dies with the worker: both gone within seconds."""
    mark = tmp_path / "streaming"
    config = _config(tmp_path, str(_fake_server(tmp_path)), ["llama_cpp_generate"],
                     generation={"max_new_tokens": 30})
    env = dict(os.environ, HF_HUB_OFFLINE="1", FAKE_LLAMA_SLOW_AT="30", FAKE_LLAMA_MARK=str(mark))
    run = subprocess.Popen([sys.executable, str(Path(__file__).parents[2] / "launch.py"), "--config", str(config),
                            "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=env)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), "no stream started"
        server, worker = map(int, mark.read_text().split()[:2])
        run.send_signal(signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and (_running(server) or _running(worker)):
            time.sleep(0.2)
        assert not _running(server) and not _running(worker), "the server or its worker outlived the run"
    finally:
        run.kill()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie is dead, waiting for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_server_blocks_say_they_are_not_back_to_back_and_probe_drift_across_blocks(tmp_path):
    """Engine pairing, 2 repeats of 3 points: the blocks' order rotates (Williams rows [0, 1, 2] then [1, 2, 0], so
    the reference runs first, then last), every record says it was not paired back to back and which block it ran in,
    and the drift probe's readings of the two servers without a draft model (the reference's, n-gram's) are one
    series: 2 servers x 2 repeats x (start, end)."""
    methods = ["llama_cpp_generate", "llama_cpp_draft", "llama_cpp_ngram"]
    server = str(_fake_server(tmp_path))
    out = tmp_path / "out"
    result = run_launch(["--config", _config(tmp_path, server, methods, repeats=2,
                                             llama_cpp={"server": server, "pairing": "engine"}), "--out", out])
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    blocks = {(r["method"], r["repeat"]): r["extra"]["block"] for r in records}
    assert blocks == {("llama_cpp_generate", 0): 0, ("llama_cpp_draft", 0): 1, ("llama_cpp_ngram", 0): 2,
                      ("llama_cpp_generate", 1): 2, ("llama_cpp_draft", 1): 0, ("llama_cpp_ngram", 1): 1}
    assert all(r["extra"]["back_to_back"] is False and r["extra"]["pairing"] == "engine" for r in records)
    started = {(r["method"], r["repeat"]): r["extra"]["block_started_unix_s"] for r in records}
    assert started[("llama_cpp_generate", 0)] < started[("llama_cpp_draft", 0)] < started[("llama_cpp_ngram", 0)]
    progress = json.loads((out / "progress.json").read_text())
    drift = progress["drift"]["1"]
    assert {progress["processes"][k]["engine"] for k in drift} == {"llama_cpp"}  # the engine, as data
    pooled = [v for k, v in drift.items() if k.endswith("llama_cpp servers without a draft model")]
    assert len(pooled) == 1 and len(pooled[0]) == 8, drift
    assert [len(v) for k, v in drift.items() if "llama_cpp servers with draft" in k] == [4], drift


def test_a_draft_minimum_above_gamma_is_refused(tmp_path):
    """--spec-draft-n-min above --spec-draft-n-max makes llama.cpp drop every draft: refused, not clamped unseen."""
    config = _config(tmp_path, str(_fake_server(tmp_path)), ["llama_cpp_generate", "llama_cpp_draft"],
                     speculative={"gamma": [2, 4], "llama_cpp_draft_min": 3})
    assert_one_clean_line(run_launch(["--config", config, "--out", tmp_path / "out"]),
                          "speculative.llama_cpp_draft_min: 3 is above gamma 2")


@pytest.mark.parametrize("crash", ["SIGILL", "SIGSEGV"])
def test_a_server_whose_repacking_crashes_at_its_start_names_the_fix(tmp_path, crash):
    """A build whose repacking kernels this CPU cannot run (AMX in a VM) dies at its start, of SIGILL or, b11434 on
    an AMX Xeon VM, of SIGSEGV: one line with the fix named, before anything runs, and llama_cpp.repack: false (-nr)
    runs the points."""
    server = str(_fake_server(tmp_path))
    config = _config(tmp_path, server, ["llama_cpp_generate"])
    result = run_launch(["--config", config, "--out", tmp_path / "out"], env_extra={"FAKE_LLAMA_CRASH": crash})
    assert_one_clean_line(result, f"died while starting (killed by {crash})")
    assert "llama_cpp.repack: false" in result.stderr
    result = run_launch(["--config", config, "--out", tmp_path / "again", "--set", "llama_cpp.repack=false"],
                        env_extra={"FAKE_LLAMA_CRASH": crash})
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(not REAL_SERVER, reason="llama.cpp is not built: .ci/llama-cpp-env DIR builds it, then "
                                            "SPECULATE_LLAMA_SERVER=DIR/bin/llama-server")
def test_the_real_server_on_smollm2(tmp_path):
    """llama.cpp's own server, its GGUF re-quantized to f32 (our engine's weights): every point runs, its rounds add up
    to its tokens, and its exactness against its own baseline and ours is counted (not asserted: kernels differ)."""
    methods = ["baseline", "speculative", "llama_cpp_generate", "llama_cpp_draft", "llama_cpp_ngram"]
    out = tmp_path / "out"
    config = _config(tmp_path, REAL_SERVER, methods, llama_cpp={"server": REAL_SERVER, "weights": "f32"},
                     generation={"max_new_tokens": 16})
    result = run_launch(["--config", config, "--out", out], timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    ours = {r["sample_id"]: r["output_ids"] for r in records if r["method"] == "baseline"}
    for record in (r for r in records if r["method"] == "llama_cpp_draft"):
        assert sum(r["emitted"] for r in record["rounds"]) + 1 == record["new_tokens"]
        assert all(r["drafted"] <= 4 and r["accepted"] <= r["drafted"] for r in record["rounds"])
        assert len(ours[record["sample_id"]]) == 16
    runs = _runs(out)
    assert 0.0 <= runs[("llama_cpp_draft", 1, None)]["metrics"]["exact_match"] <= 1.0
    assert runs[("llama_cpp_draft", 1, None)]["metrics"]["acceptance_rate"] > 0


def test_the_exported_synthetic_rates_are_flags_that_start_a_server():
    """b11434 starts with --spec-synth-rates only with speculation on (--spec-type and a draft model: the user adds
    -md); every round drafts K, as the rates assume, and the file reads back."""
    from runner.engines.llama_cpp.deploy import export, parse

    flags = export([0.8, 0.5, 0.25]).split()
    pairs = dict(zip(flags, flags[1:]))
    assert (pairs["--spec-type"], pairs["--spec-draft-n-max"], pairs["--spec-draft-n-min"],
            pairs["--spec-draft-p-min"], pairs["--spec-synth-rates"]) == ("draft-simple", "3", "3", "0", "0.8,0.5,0.25")
    assert parse(" ".join(flags), "f") == [0.8, 0.5, 0.25]
