"""The repository's import graph: no module is in an import cycle (function-level imports included), decode/ imports
nothing above it, eval/ does not import the runner and takes from decode/ only the method registry, the tree labels, the
serving queue and the models' names in cost files, and utils/ takes
from decode/ only the method registry and the tree labels (utils/__init__.py says why). And engines are plugins: no
module outside an engine's package (runner/engines/NAME/) and its method files names the engine."""
import ast
import re
import subprocess
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
            assert {t for t in above if t.startswith("decode")} <= {"decode", "decode.methods", "decode.tree_layout",
                                                                   "decode.arrivals", "decode.names",
                                                                   "decode.k_model"}, \
                f"{module} imports {sorted(above)}: eval/ reads the method registry, tree labels, the serving queue " \
                "(the replay admits as the engine does), the models' names in cost files and the one model of a round " \
                "(the runtime's K is the recommendation's), nothing else of decode/"
        if top == "utils":
            allowed = {"decode", "decode.methods", "decode.tree_layout"}
            assert {t for t in above if t.startswith("decode")} <= allowed, f"{module} imports {sorted(above)}"
            assert not {t for t in above if t.startswith(("runner", "eval"))}, f"{module} imports {sorted(above)}"


def test_an_engine_declaration_is_data():
    """runner/engines/<name>/declaration.py is loaded by its path from decode/methods (the registry, which eval and
    utils read): it imports decode/methods and the standard library only (never torch, pydantic or runner/), and its
    settings file, loaded the same way, nothing of the repository."""
    import sys

    edges = graph()
    declarations = [m for m in edges if m.startswith("runner.engines.") and m.endswith(".declaration")]
    assert {"runner.engines.vllm.declaration", "runner.engines.llama_cpp.declaration"} <= set(declarations)
    for module in declarations:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert all(t == "decode" or t.startswith("decode.methods") for t in edges[module]), \
            f"{module} imports {sorted(edges[module])}"
        tops = {n.split(".")[0] for node in ast.walk(ast.parse(path.read_text()))
                for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                          [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])}
        assert tops <= set(sys.stdlib_module_names) | {"decode"}, f"{module} imports {sorted(tops)}"
        settings = path.with_name("settings.py")
        if settings.exists():
            assert not edges[module.removesuffix("declaration") + "settings"], f"{settings} imports the repository"


def test_every_engine_our_own_too_declares_its_methods():
    """One registry style: the registry is the engines' declarations' METHODS, found by listing the engine folders,
    our engine's (runner/engines/ours/declaration.py) first as the home engine's, in the order each lists them."""
    import sys

    sys.path.insert(0, str(ROOT))
    from decode.methods import DECLARATIONS, HOME_ENGINE, REGISTRY

    assert next(iter(DECLARATIONS)) == HOME_ENGINE
    assert list(REGISTRY) == [spec.name for d in DECLARATIONS.values() for spec in d.METHODS]
    assert list(REGISTRY)[:2] == ["baseline", "speculative"]  # the report's order: the reference first
    assert {s.name for s in DECLARATIONS[HOME_ENGINE].METHODS} == {n for n, s in REGISTRY.items() if s.engine == HOME_ENGINE}


def test_test_files_have_unique_names():
    """pytest imports test files by their basename (rootdir-relative packages are not used): two test_x.py in two
    folders make a collection error."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(names) == sorted(set(names)), sorted({n for n in names if names.count(n) > 1})


# Where "vllm" may appear outside runner/engines/vllm/: a file -> (how many lines, why).
# Each is a citation of vLLM as prior art, not a dependency on the engine.
VLLM_CITED = {
    "decode/drafters/prompt_lookup.py": (2, "the lookup matches vLLM's ngram proposer's choice of occurrence"),
    "eval/figure_table.py": (6, "MAT is what vLLM and SGLang call acceptance length; ITL, percentiles, pooled "
                                "acceptance and the request's clock (its concurrency slot) follow vLLM's benchmark "
                                "definitions"),
    "eval/served_figures.py": (4, "the same definitions, where the serving figures compute them"),
    "runner/load.py": (3, "arrivals are drawn and rescaled as vLLM's bench serve does"),
    "utils/config_doc.py": (2, "the load section says whose arrivals and timing it follows"),
    "utils/config.py": (1, "load.burstiness is vLLM's bench serve's"),
}


def _python_files() -> list[str]:
    """Every .py file of the repository that git tracks or would track (ignored folders, e.g. environments, left out)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted(p for p in set(listed) if (ROOT / p).is_file())


def test_only_the_engine_package_names_its_engine():
    """runner/engines/vllm/ (its declaration, methods and deploy target included) alone names
    vLLM (tests, benchmarks and docs aside); the experiment, eval, utils and the rest go through the engine registry
    and the method specs."""
    mine = re.compile(r"^(runner/engines/vllm/|tests/|benchmarks/|"
                      r"docs/)")
    found: dict[str, list[str]] = {}
    for path in _python_files():
        if mine.match(path):
            continue
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            if "vllm" in line.lower():
                found.setdefault(path, []).append(f"{path}:{number}: {line.strip()[:100]}")
    assert "runner/experiment.py" in _python_files()  # the listing found the repository
    wrong = [hit for path, hits in found.items() if len(hits) > VLLM_CITED.get(path, (0,))[0] for hit in hits]
    assert not wrong, "vllm named outside its engine package:\n" + "\n".join(wrong)


# Where the literal "ours" may appear outside runner/engines/ours/ and decode/methods/: a file -> (how many, why).
OURS_KEPT = {
    "eval/summary.py": (2, "the engine comparison's keys theirs / ours: summary.json's format, not the engine's name"),
    "eval/report.py": (1, "the engine comparison's table reads that key"),
}


def _string_literals(path: str, value: str) -> list[int]:
    """The lines of `path` with a string constant equal to `value` (an f-string's parts and docstrings aside)."""
    tree = ast.parse((ROOT / path).read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == value]


def test_only_the_home_engine_names_itself():
    """Everything else asks an engine's capabilities (decode.methods ENGINE_CAPS, Engine.caps) or names the home
    engine through the registry (HOME_ENGINE): runner/engines/ours/ and the method files alone spell "ours" (tests,
    benchmarks and docs aside)."""
    mine = re.compile(r"^(runner/engines/ours/|decode/methods/|tests/|benchmarks/|docs/)")
    found = {path: _string_literals(path, "ours") for path in _python_files() if not mine.match(path)}
    assert "eval/summary.py" in found  # the listing found the repository
    wrong = [f"{path}:{line}" for path, lines in found.items() if len(lines) > OURS_KEPT.get(path, (0,))[0]
             for line in lines]
    assert not wrong, 'the engine "ours" named outside its package (ask its capabilities):\n' + "\n".join(wrong)


# files that compare a string that is also a method's name, and why that string is not the method there
NAME_CITED = {
    "decode/head_models.py": (5, "eagle3 is a head kind of this module (KINDS) and the speculators format's model "
                                 "type, a draft's kind, not the method"),
}


def _method_comparisons(path: str, names: set[str]) -> list[str]:
    """Each `x == "name"`, `!= "name"`, `"name" in x`, `x in ("a", "name")` of `path`, name a method's."""
    def named(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)} & names
        return set()

    hits = []
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            found = set().union(*(named(side) for side in [node.left, *node.comparators]))
            if found:
                hits.append(f"{path}:{node.lineno}: {', '.join(sorted(found))}: {ast.unparse(node)[:100]}")
    return hits


def test_no_method_is_asked_by_its_name_outside_its_own_file():
    """What a caller needs of a method is a capability of its MethodSpec (decode/methods/base.py): options, schedules,
    draft_cap, head_kinds, ...; a method's name is compared with in its own file only (tests, benchmarks and docs
    aside), so a new method is its file and a registry line."""
    import sys

    sys.path.insert(0, str(ROOT))
    from decode.methods import REGISTRY

    own = {}  # method -> the file that declares its spec
    for spec in REGISTRY.values():
        module = sys.modules[(spec.run or spec.engine_config).__module__]
        own[spec.name] = Path(module.__file__).resolve().relative_to(ROOT).as_posix()
    skip = re.compile(r"^(tests/|benchmarks/|docs/)")
    wrong = []
    for path in _python_files():
        if skip.match(path):
            continue
        hits = [hit for hit in _method_comparisons(path, set(REGISTRY))
                if not all(own[name] == path for name in hit.split(": ")[1].split(", "))]
        if len(hits) > NAME_CITED.get(path, (0,))[0]:
            wrong += hits
    assert "runner/probes.py" in _python_files() and len(own) == len(REGISTRY)
    assert not wrong, "a method asked by its name outside its own file:\n" + "\n".join(wrong)


def test_no_method_name_is_a_dictionary_key_in_eval():
    """eval/ keys nothing by a method's name: what it needs of a method is its spec's, and a serving target declares
    the method it deploys as its counterpart (eval/deploy/sglang.py ALGORITHMS), as an engine's methods do."""
    import sys

    sys.path.insert(0, str(ROOT))
    from decode.methods import REGISTRY

    wrong = [f"{path}:{node.lineno}: {key.value}" for path in _python_files() if path.startswith("eval/")
             for node in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(node, ast.Dict)
             for key in node.keys if isinstance(key, ast.Constant) and key.value in REGISTRY]
    assert not wrong, "a method's name as a dictionary key in eval/:\n" + "\n".join(wrong)


def test_the_name_check_sees_each_form_of_comparison(tmp_path):
    """The check is no stub: each form of comparison with a method's name is found, other strings are not."""
    path = tmp_path / "forms.py"
    path.write_text('a == "hybrid"\nb != "suffix"\n"eagle3" in methods\nm in ("medusa", "x")\nm not in ["baseline"]\n'
                    'c == "hybrid_max_draft"\nd = "hybrid"\n')
    hits = _method_comparisons(str(path), {"hybrid", "suffix", "eagle3", "medusa", "baseline"})
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3", "4", "5"]
