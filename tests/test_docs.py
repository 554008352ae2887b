"""The documentation holds: docs/config.md is the schema's current rendering, every relative link in README.md and
docs/*.md reaches a file (and a heading, where it names one), the config example validates, and the README stays a
front door."""
import re
import typing
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field

from utils import config_doc
from utils.config import Config, Strict, validate

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_config_reference_is_current():
    assert config_doc.DOC.read_text() == config_doc.render(), \
        f"docs/config.md is stale (utils/config.py changed): run `{config_doc.COMMAND}` and commit docs/config.md"


def _section_of(annotation):
    """The pydantic model a field holds: itself, in a list, or beside null (load: LoadConfig | None)."""
    for option in (annotation, *typing.get_args(annotation)):
        option = typing.get_args(option)[0] if typing.get_origin(option) is list else option
        if isinstance(option, type) and issubclass(option, BaseModel):
            return option
    return None


def test_config_reference_has_every_key():
    text = config_doc.render()

    def keys(model, prefix):
        for name, field in model.model_fields.items():
            yield prefix + name
            sub = _section_of(field.annotation)
            if sub is not None:
                yield from keys(sub, "*." if name in ("target", "draft") else f"{prefix}{name}.")

    every = list(keys(Config, ""))
    assert {"load.concurrency", "load.request_rate", "load.slo.ttft_s", "load.slo.tpot_ms"} <= set(every)
    missing = [key for key in every if f"| `{key}` |" not in text]
    assert not missing, f"keys without a row in docs/config.md: {missing}"


def test_rows_say_type_constraints_default_and_choices():
    class Toy(Strict):
        width: int = Field(3, ge=1, le=8, description="nodes | per depth")
        mode: Literal["auto", True, False] = "auto"
        rate: float | None = Field(None, gt=0, allow_inf_nan=False)
        path: str = Field(description="where")

    lines, nested = config_doc.rows(Toy, "toy.")
    assert lines == ["| `toy.width` | int (≥ 1, ≤ 8) | `3` | nodes \\| per depth |",
                     "| `toy.mode` | one of `auto`, `true`, `false` | `auto` |  |",
                     "| `toy.rate` | float or null (> 0, finite) | `null` |  |",
                     "| `toy.path` | str | required | where |"]
    assert nested == []


def test_one_value_or_a_list():
    lines, _ = config_doc.rows(Config, "")
    assert "| `batch_size` | int, or a list | `[1]` |" in "\n".join(lines)  # a before-validator wraps one value
    assert "| `methods` | list of str |" in "\n".join(lines)  # methods takes a list only


def test_config_example_validates():
    text = (ROOT / "docs" / "config.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    config = validate(yaml.safe_load(example))
    assert config.speculative.gamma == [2, 4, 8] and [d.label for d in config.draft] == ["q0.6b", "q1.7b"]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page, and its explicit <a id> ones."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.replace("`", "").strip().lower()).replace(" ", "-") for h in headings}
    return slugs | set(re.findall(r'<a id="([^"]+)"', text))


def test_relative_links_reach_a_file_and_heading():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; keep it under 260 and move reference into docs/"


def test_the_bad_input_page_names_real_tests_and_every_config_case():
    """docs/bad-input.md: every test a row names exists (its file, its function, its case id), and every malformed
    config of tests/test_bad_input.py is on the page."""
    page = (ROOT / "docs" / "bad-input.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[(.+?)\])?`", page)
    assert len(named) > 80
    for file, test, case in named:
        source = (ROOT / file).read_text()
        assert f"def {test}(" in source, f"docs/bad-input.md names {file}::{test}, which does not exist"
        if case:
            assert case in source, f"{file}::{test}[{case}]: no such case"
    from test_bad_input import CASES

    for case in CASES:
        assert f"::test_malformed_config[{case[0]}]`" in page, f"docs/bad-input.md lacks the config case {case[0]}"
