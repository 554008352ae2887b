"""The executors (runner/experiment.py LocalExecutor, runner/cluster.py RayExecutor, runner/vllm_engine.py
VllmExecutor) yield finished units and never call back into the experiment."""
import ast
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "runner"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("runner."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("runner.")}
    return found


def test_no_executor_imports_the_experiment():
    """Import cycles anywhere in the repository: tests/test_import_graph.py."""
    for module in ("session", "cluster", "vllm_engine"):
        assert "experiment" not in _imports(RUNNER / f"{module}.py"), module


def test_every_executor_is_a_producer():
    from runner.cluster import RayExecutor
    from runner.experiment import LocalExecutor
    from runner.vllm_engine import VllmExecutor

    import inspect

    for executor in (LocalExecutor, RayExecutor, VllmExecutor):
        assert inspect.isgeneratorfunction(executor.run), executor
        assert "experiment" not in inspect.signature(executor.__init__).parameters
