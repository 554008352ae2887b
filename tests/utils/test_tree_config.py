"""speculative.tree and tree_top_k (utils/config.py): each way of writing a tree, the labels they become, and each
refusal as one line with exit code 2."""
import pytest
import yaml

from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, write_prompts
from utils.config import ConfigError, apply_override, validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


def trees(value, **extra):
    return validate({**VALID, **extra, "speculative": {"tree": value}}).speculative.tree


def test_defaults_are_a_chain_and_four_children():
    speculative = validate(VALID).speculative
    assert speculative.tree == [None] and speculative.tree_top_k == 4


@pytest.mark.parametrize("value, labels", [
    (None, [None]),
    ("auto", ["auto"]),
    ({"dynamic": 24}, ["dynamic-24"]),
    ([3, 2, 1, 1], ["3-2-1-1"]),  # a list of integers is one branching list
    ([3], ["3"]),
    ([[3]], ["3"]),
    ([None, [3, 2, 1, 1], {"dynamic": 24}, "auto"], [None, "3-2-1-1", "dynamic-24", "auto"]),
    (["dynamic-24", "2-2", None], ["dynamic-24", "2-2", None]),  # the labels config.yaml keeps
])
def test_each_way_of_writing_a_tree(value, labels):
    assert trees(value) == labels


def test_the_saved_config_reads_back_as_the_same_trees():
    # config.yaml holds the model dump; --resume validates it again
    config = validate({**VALID, "speculative": {"tree": [None, [2, 2], {"dynamic": 8}, "auto"]}})
    dumped = config.model_dump(mode="json")
    assert dumped["speculative"]["tree"] == [None, "2-2", "dynamic-8", "auto"]
    assert validate(yaml.safe_load(yaml.safe_dump(dumped))).model_dump(mode="json") == dumped


def test_set_writes_a_tree():
    raw = {**VALID}
    apply_override(raw, "speculative.tree=[3,2,1,1]")
    apply_override(raw, "speculative.tree_top_k=8")
    speculative = validate(raw).speculative
    assert speculative.tree == ["3-2-1-1"] and speculative.tree_top_k == 8


@pytest.mark.parametrize("value, fragment", [
    ([], "tree list is empty"),
    ([None, None], 'tree list [null, null] repeats a tree'),
    ([[2, 2], "2-2"], 'repeats a tree'),
    ([None, 3], "write each branching list in brackets"),
    (3, "expected null, a branching list"),
    ("bushy", "expected null (a chain)"),
    ([3, 0], "one integer >= 1 per depth"),
    ({"dynamic": 0}, "node budget must be an integer in 1..256"),
    ({"budget": 8}, "{dynamic: N}"),
    ([16, 16], "at most 256"),
])
def test_bad_trees_name_the_key(value, fragment):
    with pytest.raises(ConfigError, match="speculative.tree") as error:
        trees(value)
    assert fragment in str(error.value)


@pytest.mark.parametrize("top_k", [0, 17])
def test_tree_top_k_range(top_k):
    with pytest.raises(ConfigError, match="speculative.tree_top_k"):
        validate({**VALID, "speculative": {"tree_top_k": top_k}})


def test_a_tree_needs_a_method_that_takes_it_on_either_engine():
    assert trees("auto", methods=["baseline", "speculative"]) == ["auto"]
    # auto prices a drafter's forward: prompt lookup would run no point, so it is refused, not dropped
    with pytest.raises(ConfigError, match="prompt_lookup takes static and dynamic trees only"):
        trees("auto", methods=["baseline", "prompt_lookup"])
    assert trees([None, "auto"], methods=["baseline", "prompt_lookup"]) == [None, "auto"]
    with pytest.raises(ConfigError, match="applies to speculative or prompt_lookup or suffix or eagle3 or medusa only"):
        trees("auto", methods=["baseline", "hf_assisted"])
    assert trees([None, [2, 2]], engine={"compile": True}) == [None, "2-2"]
    # a list of chains only names no tree
    assert trees(None, engine={"compile": True}) == [None]
    assert trees([None], methods=["baseline"]) == [None]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree-config")
    target, draft = save_tiny_pair(root)
    return base_config(target, draft, write_prompts(root / "prompts.jsonl"))


@pytest.mark.parametrize("speculative, extra, fragment", [
    ({"tree": [None, [2, 2], "2-2"]}, {}, "speculative.tree"),
    ({"tree": {"dynamic": 8}}, {"methods": ["baseline"]}, "applies to speculative or prompt_lookup or suffix or eagle3 or medusa only"),
])
def test_launch_refuses_with_one_line(tiny, tmp_path, speculative, extra, fragment):
    config = {**tiny, **extra, "speculative": {**tiny["speculative"], **speculative}}
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    assert_one_clean_line(run_launch(["--config", file, "--output-dir", tmp_path / "out"]), fragment)
    assert not (tmp_path / "out").exists()


def test_hybrid_past_gamma_is_refused_compiled_and_taken_eager():
    hybrid = {**VALID, "methods": ["baseline", "hybrid"]}
    assert validate({**hybrid, "speculative": {"gamma": [4], "hybrid_max_draft": 16}}).speculative.hybrid_max_draft == 16
    with pytest.raises(ConfigError, match="hybrid_max_draft: 16 drafts past gamma, and engine.compile"):
        validate({**hybrid, "speculative": {"gamma": [4], "hybrid_max_draft": 16}, "engine": {"compile": True}})
    validate({**hybrid, "speculative": {"gamma": [4], "hybrid_max_draft": 4}, "engine": {"compile": True}})
