"""The engines (runner/engines: ours, whose executors are runner/engines/ours LocalExecutor and runner/cluster.py
RayExecutor, and vLLM's) implement one contract, yield finished units and never call back into the experiment."""
import ast
import inspect
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


def test_no_engine_imports_the_experiment():
    """Import cycles anywhere in the repository: tests/test_import_graph.py."""
    for path in [RUNNER / "session.py", RUNNER / "cluster.py", *(RUNNER / "engines").rglob("*.py")]:
        assert "experiment" not in _imports(path), path


def test_every_engine_keeps_the_contract():
    from runner.cluster import RayExecutor
    from runner.engines import ENGINES, HOME, Engine
    from runner.engines.ours import LocalExecutor

    assert list(ENGINES)[0] == HOME == "ours" and "vllm" in ENGINES
    for name, engine in ENGINES.items():
        assert issubclass(engine, Engine) and engine.name == name and not inspect.isabstract(engine), name
        assert inspect.isgeneratorfunction(engine.run), name
    for executor in (LocalExecutor, RayExecutor):
        assert inspect.isgeneratorfunction(executor.run), executor
        assert "experiment" not in inspect.signature(executor.__init__).parameters
