"""The repository's import graph: no module is in an import cycle (function-level imports included), decode/ imports
nothing above it, eval/ does not import the runner and takes from decode/ only the method registry and the tree labels, and utils/ takes
from decode/ only the method registry and the tree labels (utils/__init__.py says why)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decode", "eval", "runner", "utils")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The repository modules `path` imports: `from a.b import c` names a.b.c where that is a module, else a.b."""
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and
                   getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}  # annotations: never run
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n for n in names if n in modules}
    return found


def graph() -> dict[str, set[str]]:
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")] + [ROOT / "launch.py"]
    modules = {_module(p): p for p in files}
    edges = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    for name, targets in edges.items():  # importing a.b.c runs a/__init__ and a/b/__init__ first (outside a's own modules)
        parents = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        edges[name] = targets | {p for p in parents if p in modules and p != name and not name.startswith(p + ".")}
    return edges


def test_no_module_is_in_an_import_cycle():
    edges = graph()
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for child in sorted(edges.get(node, ())):
            assert state.get(child) != 1, f"import cycle: {' -> '.join(path + [child])}"
            if child not in state:
                visit(child, path + [child])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_layers():
    edges = graph()
    for module, targets in edges.items():
        top = module.split(".")[0]
        above = {t for t in targets if t.split(".")[0] != top}
        if top == "decode":
            assert not above, f"{module} imports {sorted(above)}: decode/ imports nothing above it"
        if top == "eval":
            assert not {t for t in above if t.startswith("runner")}, f"{module} imports {sorted(above)}"
            assert {t for t in above if t.startswith("decode")} <= {"decode", "decode.methods", "decode.tree_layout"}, \
                f"{module} imports {sorted(above)}: eval/ reads the method registry and tree labels, nothing else of decode/"
        if top == "utils":
            allowed = {"decode", "decode.methods", "decode.tree_layout"}
            assert {t for t in above if t.startswith("decode")} <= allowed, f"{module} imports {sorted(above)}"
            assert not {t for t in above if t.startswith(("runner", "eval"))}, f"{module} imports {sorted(above)}"


def test_test_files_have_unique_names():
    """pytest imports test files by their basename (rootdir-relative packages are not used): two test_x.py in two
    folders make a collection error."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(names) == sorted(set(names)), sorted({n for n in names if names.count(n) > 1})
