"""The benchmark scripts run end to end (on tiny models here): the engine bench prints every ratio, the GPU check
runs its CPU part and can fail."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers import base_config, save_tiny_pair, write_prompts

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_benchmark_prints_the_ratio_table(tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    data = write_prompts(tmp_path / "prompts.jsonl", count=4)
    config = base_config(target, draft, data, methods=["baseline", "speculative", "hf_generate", "hf_assisted"],
                         batch_size=[1, 4], speculative={"gamma": [2, 3]}, engine={"cpu_linear": "onednn_packed"})
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_bench.py"), "--config", str(path),
                             "--plain-gamma", "2", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "out" / "BENCH.md").read_text()
    assert text in result.stdout
    for label in ["our baseline / hf_generate", "our speculative / hf_assisted", "measured / predicted",
                  "batched speculative / batched baseline", "packed tok/s"]:
        assert label in text
    assert text.count("| baseline, batch") == 2 and "| speculative gamma 2, batch 4 |" in text


CPU_CHECKS = {"fp32", "bf16", "compiled-fp32", "compiled-bf16", "release"}


def _strict_json(path: Path) -> dict:
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.e2e
def test_gpu_check_runs_its_cpu_part_and_fails_on_a_bug(tmp_path, monkeypatch, capsys):
    """benchmarks/gpu_check.py on a CPU: library versions first, the CPU-possible checks pass (compiled vs eager in fp32
    equal, the bf16 ones through the guard, the release) and the CUDA ones say why they are skipped; --require fails a
    skipped check; a wrong token in the compiled step, or in the engine's greedy acceptance, fails its check."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check
    from decode.static_kv import CompiledModel

    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--compile-backend", "eager", "--json", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("device: cpu") and all(f"{name} " in first for name in gpu_check.LIBRARIES)
    data = _strict_json(out)
    assert set(data["versions"]) == {*gpu_check.LIBRARIES, "CUDA"} and data["versions"]["CUDA"] == "absent"
    rows = {row["key"]: row for row in data["checks"]}
    assert {key for key, row in rows.items() if row["status"] == "ok"} == CPU_CHECKS, rows
    assert all(row["status"] == "skipped" and "CUDA" in row["detail"] for key, row in rows.items()
               if key not in CPU_CHECKS)
    assert "1 of 4 rows ended at the EOS" in rows["compiled-fp32"]["detail"]  # a dead row in the batch

    required = tmp_path / "required.json"
    assert gpu_check.main(["--device", "cpu", "--require", "--only", "cuda-graphs,launch", "--json", str(required)]) == 1
    assert [(r["key"], r["status"]) for r in _strict_json(required)["checks"]] == [("cuda-graphs", "FAIL"),
                                                                                   ("launch", "FAIL")]

    real_run, calls = CompiledModel.run, []

    def one_wrong_token(self, buffers, input_ids, *args, compiled=True, **kwargs):
        """After the warmup, the 5th compiled step of the target: its first row's first position gets another argmax."""
        logits, hidden = real_run(self, buffers, input_ids, *args, compiled=compiled, **kwargs)
        if self.warm and compiled and self.num_layers == 2:
            calls.append(1)
            if len(calls) == 5:
                logits = logits.clone()
                logits[0, 0, (int(logits[0, 0].argmax()) + 1) % logits.shape[-1]] += 1e4
        return logits, hidden

    monkeypatch.setattr(CompiledModel, "run", one_wrong_token)
    status, detail = gpu_check.check_compiled_fp32(gpu_check.Context(torch.device("cpu"), "eager", 600))
    assert status == "FAIL" and "equal to eager" in detail, detail
    monkeypatch.undo()

    import decode.generate as generate
    real = generate.accept_greedy

    def off_by_one(draft_tokens, target_logits, draft_limit):  # accepts one draft too many where a row rejected
        accepted, token = real(draft_tokens, target_logits, draft_limit)
        extra = (accepted < draft_limit) & (accepted < draft_tokens.shape[1])
        bumped = (accepted + extra.long()).clamp(max=draft_tokens.shape[1])
        return bumped, target_logits.argmax(-1).gather(1, bumped[:, None]).squeeze(1)

    monkeypatch.setattr(generate, "accept_greedy", off_by_one)
    assert gpu_check.check_fp32(gpu_check.Context(torch.device("cpu"), "eager", 600))[0] == "FAIL"


def test_gpu_check_imports_no_optional_package():
    """The GPU machine has no pydantic (unless its wheels are carried), bitsandbytes, flash-attn or gguf: importing the
    check must not need them."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_check; "
            "print(sorted(m for m in ('pydantic', 'bitsandbytes', 'flash_attn', 'gguf', 'datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


OFFLINE_ABSENT = ("pydantic", "bitsandbytes", "pynvml", "datasets", "gguf", "flash_attn")


def _gpu_session():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_session

    return gpu_session


def test_gpu_session_plan_fits_its_total_and_every_goal_has_a_step():
    """--plan lists every step with its budget; the budgets add up to no more than 8 minutes; each goal row names a
    step whose function puts that row's figure."""
    import inspect

    gpu_session = _gpu_session()
    assert gpu_session.TOTAL_S == 480
    budgets = {step.name: step.budget_s for step in gpu_session.STEPS}
    assert sum(budgets.values()) <= gpu_session.TOTAL_S
    assert set(budgets) == set(gpu_session.STEP_FUNCTIONS) and list(budgets)[-1] == "table"
    for goal in gpu_session.GOALS:
        assert goal.step in budgets, goal
        assert f'"{goal.key}"' in inspect.getsource(gpu_session.STEP_FUNCTIONS[goal.step]), goal
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--plan"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for name, budget in budgets.items():
        assert any(line.split()[:2] == [name, f"{budget}s"] for line in lines), name
    assert any(line.split()[:2] == ["total", f"{sum(budgets.values())}s"] for line in lines)


def test_gpu_session_budgets_skip_and_interrupt(monkeypatch, tmp_path):
    """A step past its budget is interrupted and says so; one whose budget exceeds what is left of the total is
    skipped and says so; a step that raises is its own row's error and the next still runs."""
    import time

    gpu_session = _gpu_session()
    ran = []

    def sleeper(seconds):
        def step(session):
            ran.append(seconds)
            time.sleep(seconds)
            return {"slept": seconds}
        return step

    def broken(session):
        raise RuntimeError("a bug")

    functions = {name: sleeper(0.0) for name in gpu_session.STEP_FUNCTIONS}
    functions.update(env=sleeper(2.0), bandwidth=broken)
    monkeypatch.setattr(gpu_session, "STEP_FUNCTIONS", functions)
    budgets = {name: 0.2 for name in functions}
    budgets.update(capture=5.0)  # more than the 1.5 s total leaves after env's interrupted 0.2 s
    session = gpu_session.Session(gpu_session.arguments([str(tmp_path), "--dry-run"])[1])
    records = {r["step"]: r for r in gpu_session.run_steps(session, 1.5, budgets=budgets)}
    assert records["env"]["status"] == "over budget" and "budget of 0.2 s" in records["env"]["detail"]
    assert records["env"]["seconds"] < 1.0
    assert records["bandwidth"]["status"] == "error" and "a bug" in records["bandwidth"]["detail"]
    assert records["capture"]["status"] == "skipped" and "past the total" in records["capture"]["detail"]
    assert records["floor"]["status"] == "ok" and records["table"]["status"] == "ok"
    assert sum(r["seconds"] for r in records.values()) <= 1.5


def test_gpu_session_figures_worked_by_hand():
    """The busy share: kernel intervals inside two rounds [0, 10] and [20, 30] us, overlapping kernels counted once,
    a kernel between rounds not at all: (4 + 2 + 1) / 20. The replay: rounds priced at their widest draft, c = 1 s,
    v(1) = 10 s, v(5) = 20 s: (4 + 20) + (2 + 20) = 46; the baseline, (5 - 1) steps of v(1) = 40."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    gpu_session = _gpu_session()

    def event(name, start, end, device, annotation=False):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device,
                               is_user_annotation=annotation)
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [event("speculate.round", 0, 10, cpu), event("speculate.round", 20, 30, cpu),
              event("k", 1, 3, cuda), event("k", 2, 5, cuda), event("k", 8, 12, cuda), event("k", 14, 16, cuda),
              event("k", 25, 26, cuda), event("speculate.round", 20, 30, cuda, annotation=True)]
    share, rounds = gpu_session.kernel_busy_share(events)
    assert rounds == 2 and share == pytest.approx(7 / 20)
    assert gpu_session.kernel_busy_share(events[:2]) == (None, 2)  # a CPU: no device activity

    def record(drafted, tokens):
        return SimpleNamespace(rounds=[{"drafted": d} for d in drafted], new_tokens=tokens)
    v = {1: 10.0, gpu_session.GAMMA + 1: 20.0}
    assert gpu_session.replayed_s([record([4, 2], 9), record([4], 5)], 1.0, v) == 46.0
    assert gpu_session.replayed_s([record([], 5), record([], 3)], 1.0, v) == 40.0


def test_gpu_session_table_adds_captures_and_finds_the_crossover(tmp_path):
    """On CUDA the capture row adds every compiled model's capture seconds (1.0 + 2.5 + 0.5 = 4.0 s, 3 graphs, the
    longest 2.5 s); the crossover is the first batch, then concurrency, whose speedup is below 1."""
    from types import SimpleNamespace

    gpu_session = _gpu_session()
    session = gpu_session.Session(gpu_session.arguments([str(tmp_path), "--dry-run"])[1])
    session.device = torch.device("cuda", 0)
    session.compiled = [SimpleNamespace(capture_s=[1.0, 2.5]), SimpleNamespace(capture_s=[0.5])]
    session.cache.update(crossover_static={1: 1.5, 8: 1.1, 32: 0.9}, crossover_served={1: 1.2, 8: 0.8, 32: 0.7})
    gpu_session.step_table(session)
    capture, crossover = session.figures["capture_s"], session.figures["crossover"]
    assert capture["value"] == 4.0 and "3 graphs over 2 models, the longest 2.50 s" in capture["note"]
    assert crossover["where"] == "batch 32" and "concurrency 8, concurrency 32" in crossover["note"]
    rows = {row["key"]: row for row in gpu_session.goal_rows(session, [{"step": "table", "status": "ok"}])}
    assert rows["capture_s"]["status"] == "dry: pass" and rows["crossover"]["status"] == "measured"
    session.cache.update(crossover_static={1: 1.5}, crossover_served={})
    gpu_session.step_table(session)
    crossover = session.figures["crossover"]
    assert crossover["where"] is None and "paid at every point" in crossover["note"]


@pytest.mark.e2e
def test_gpu_session_dry_run_checks_the_round_counters(tmp_path):
    """The CPU dry run runs every step (nf4 skipped without CUDA, saying why) without any package a GPU machine may
    lack, checks one host read a round, the rounds' marks adding up to their wall and the capture counters, writes
    strict JSON, and prints the goal table last, with a row for every goal."""
    gpu_session = _gpu_session()
    out = tmp_path / "session"
    # run as the GPU machine has it: none of the packages it may lack importable (an attempt fails and is logged)
    blocked = tmp_path / "blocked.log"
    code = f"""
import importlib.abc, importlib.machinery, runpy, sys
class Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        open({str(blocked)!r}, "a").write(spec.name + "\\n")
        raise ImportError(spec.name + " is blocked")
    def exec_module(self, module):
        pass
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]  # one installed is found (availability checks as there), then refused
        if top in {OFFLINE_ABSENT!r} and importlib.machinery.PathFinder.find_spec(top) is not None:
            return importlib.machinery.ModuleSpec(name, Refuse())
sys.meta_path.insert(0, Blocker())
sys.argv = ["gpu_session.py", {str(out)!r}, "--dry-run"]
runpy.run_path("benchmarks/gpu_session.py", run_name="__main__")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    assert not blocked.exists(), blocked.read_text()
    records = _strict_json(out / "records.json")
    goals = json.loads((out / "goals.json").read_text(), parse_constant=lambda c: 1 / 0)
    assert records["checks_failed"] == []
    steps = {r["step"]: r for r in records["steps"]}
    assert [r["step"] for r in records["steps"]] == [s.name for s in gpu_session.STEPS]
    assert all(r["status"] == "ok" for name, r in steps.items() if name != "nf4"), steps
    assert steps["nf4"]["status"] == "skipped" and "CUDA" in steps["nf4"]["detail"]
    rounds = steps["rounds"]["figures"]
    assert set(rounds["reads_per_round"]) == {1} and rounds["rounds_profiled"] == len(rounds["reads_per_round"])
    assert rounds["busy_share"] is None and rounds["fake_synchronizes"] >= 1
    assert {which: (f["mode"], f["captures"]) for which, f in steps["capture"]["figures"].items()} == {
        "target": ("cudagraphs", 0), "draft": ("cudagraphs", 0)}
    assert [row["key"] for row in goals] == [goal.key for goal in gpu_session.GOALS]
    rows = {row["key"]: row for row in goals}
    assert rows["reads"]["value"] == 1 and rows["reads"]["status"] == "dry: pass"
    assert rows["energy_b1"]["status"] == "not measured" and "energy counter" in rows["energy_b1"]["note"]
    assert rows["busy"]["status"] == "not measured" and "no CUDA kernels" in rows["busy"]["note"]
    for key in ("spec_b1", "spec_b8", "spec_b32", "served_c1", "served_c32", "eagle3_b1", "replay", "hf_baseline",
                "hf_assisted", "floor"):
        assert rows[key]["value"] is not None and rows[key]["value"] > 0, rows[key]
    table = (out / "goals.md").read_text().strip()
    assert result.stdout.rstrip().endswith(table) and table.count("\n") == len(goals) + 1


def test_gpu_session_dry_run_fails_a_second_read_in_a_round(monkeypatch, tmp_path):
    """A round that reads the device twice fails the dry run's counter check."""
    import decode.generate as engine

    gpu_session = _gpu_session()
    real = engine._speculative_round

    def reads_twice(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0].tolist()
        return out
    monkeypatch.setattr(engine, "_speculative_round", reads_twice)
    session = gpu_session.Session(gpu_session.arguments([str(tmp_path), "--dry-run"])[1])
    figures = gpu_session.step_rounds(session)
    assert set(figures["reads_per_round"]) == {2}
    assert any("host reads a round [2" in check for check in session.checks), session.checks
