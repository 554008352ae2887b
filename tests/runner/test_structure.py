"""The runner's modules import one another without a cycle (function-level imports included): the executors
(runner/experiment.py LocalExecutor, runner/cluster.py RayExecutor, runner/vllm_engine.py VllmExecutor) yield
finished units and never call back into the experiment."""
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


def test_no_import_cycle_among_the_runner_modules():
    graph = {p.stem: _imports(p) for p in RUNNER.glob("*.py") if p.stem != "__init__"}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for child in graph.get(node, ()):
            assert state.get(child) != 1, f"import cycle: {' -> '.join(path + [child])}"
            if child not in state:
                visit(child, path + [child])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert "experiment" not in graph["session"] | graph["cluster"] | graph["vllm_engine"]


def test_every_executor_is_a_producer():
    from runner.cluster import RayExecutor
    from runner.experiment import LocalExecutor
    from runner.vllm_engine import VllmExecutor

    import inspect

    for executor in (LocalExecutor, RayExecutor, VllmExecutor):
        assert inspect.isgeneratorfunction(executor.run), executor
        assert "experiment" not in inspect.signature(executor.__init__).parameters
