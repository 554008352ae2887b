"""Bad input: one line on stderr naming what is wrong, exit code 2, no traceback, before any model loads."""
import json
from pathlib import Path

import pytest
import yaml

from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, write_prompts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    target, draft = save_tiny_pair(root)
    other_target, _ = save_tiny_pair(root, arch="gpt2")
    return root, target, draft, write_prompts(root / "prompts.jsonl"), other_target


def good(tiny) -> dict:
    root, target, draft, data, _ = tiny
    return base_config(target, draft, data)


def edit(config: dict, path: str, value) -> dict:
    node = config
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[key]
    if value is DELETE:
        del node[keys[-1]]
    elif isinstance(value, dict) and isinstance(node.get(keys[-1]), dict):
        node[keys[-1]].update(value)
    else:
        node[keys[-1]] = value
    return config


DELETE = object()

# (case id, edit path, value, the key the message must name)
CASES = [
    ("unknown-top-key", "generaton", {}, "generaton"),
    ("unknown-nested-key", "target.dtpye", "float32", "target.dtpye"),
    ("gamma-zero", "speculative.gamma", [0, 2], "speculative.gamma"),
    ("gamma-empty", "speculative.gamma", [], "speculative.gamma"),
    ("gamma-duplicated", "speculative.gamma", [2, 2], "speculative.gamma"),
    ("gamma-string", "speculative.gamma", "four", "speculative.gamma"),
    ("batch-zero", "batch_size", 0, "batch_size"),
    ("batch-duplicated", "batch_size", [1, 1], "batch_size"),
    ("temperature-negative", "generation.temperature", -0.5, "generation.temperature"),
    ("top-p-above-one", "generation.top_p", 1.5, "generation.top_p"),
    ("top-p-zero", "generation.top_p", 0, "generation.top_p"),
    ("top-k-zero", "generation.top_k", 0, "generation.top_k"),
    ("max-new-tokens-zero", "generation.max_new_tokens", 0, "generation.max_new_tokens"),
    ("max-new-tokens-text", "generation.max_new_tokens", "many", "generation.max_new_tokens"),
    ("num-samples-zero", "dataset.num_samples", 0, "dataset.num_samples"),
    ("bad-dtype", "target.dtype", "float8", "target.dtype"),
    ("bad-quantization", "draft.quantization", "3bit", "draft.quantization"),
    ("bad-device", "device", "tpu", "device"),
    ("cuda-absent", "device", "cuda:0", "device"),
    ("bad-method", "methods", ["baseline", "lookahead"], "methods"),
    ("missing-target", "target", DELETE, "target"),
    ("missing-model-path", "target.model", "/nonexistent/model-folder", "target.model"),
    ("missing-dataset-file", "dataset.path", "/nonexistent/data.jsonl", "dataset.path"),
    ("unknown-data-format", "dataset.path", "__DATA_TXT__", "dataset.path"),
    ("missing-prompt-field", "dataset.prompt_field", "question", "dataset.prompt_field"),
    ("no-prompts-left", "dataset", {"max_prompt_tokens": 1, "prompt_overflow": "skip"}, "dataset"),
    ("flash-attn-absent", "target.attn_implementation", "flash_attention_2", "target.attn_implementation"),
    ("vocab-mismatch", "draft.model", "__OTHER_TOKENIZER__", "draft.model"),
    ("hub-id-offline", "draft.model", "nobody/no-such-model-xyz", "draft.model"),
    ("warmup-negative", "warmup", -1, "warmup"),
    ("repeats-zero", "repeats", 0, "repeats"),
    ("bad-name", "name", "my run/1", "name"),
    ("method-misspelt", "methods", ["baseline", "prompt_lookpu"], "did you mean 'prompt_lookup'"),
    ("method-needs-draft", "draft", DELETE, "needs a draft model"),
    ("early-exit-without-layer", "methods", ["baseline", "early_exit"], "speculative.exit_layer"),
    ("schedule-unknown", "speculative.schedule", ["constant", "adaptive"], "speculative.schedule"),
    ("option-unknown", "speculative.suffix_depth", 4, "is not known; did you mean 'suffix_max_depth'?"),
    ("option-mistyped", "speculative.suffix_min_prob", "high", "speculative.suffix_min_prob"),
    ("temperature-zero-alone", "generation", {"do_sample": True, "temperature": 0}, "do_sample: false"),
    ("repeats-text", "repeats", "many", "repeats"),
    ("group-by-missing-field", "dataset", {"group_by": "category"}, "dataset.group_by"),
    ("cluster-backend-unknown", "cluster", {"backend": "slurm"}, "cluster.backend"),
    ("tree-of-a-billion-nodes", "speculative.tree", [1000, 1000, 1000], "at most 256"),  # counted, never built
    ("tree-label-past-the-cap", "speculative.tree", "20-20", "at most 256"),
    ("tree-not-integers", "speculative.tree", [2.5, 1], "one integer >= 1 per depth"),
    ("load-concurrency-zero", "load", {"concurrency": [0, 2]}, "load.concurrency"),
    ("load-rate-negative", "load", {"request_rate": [-1.0]}, "load.request_rate"),
    ("load-rate-zero", "load", {"concurrency": 2, "request_rate": 0}, "load.request_rate"),
    ("load-arrival-unknown", "load", {"concurrency": 2, "arrival": "bursty"}, "load.arrival"),
    ("load-with-hf", "__LOAD_HF__", None, "hf_generate runs fixed batches only"),
    ("load-slo-unknown-key", "load", {"concurrency": 2, "slo": {"ttft": 1.0}}, "load.slo.ttft"),
    ("load-slo-not-positive", "load", {"concurrency": 2, "slo": {"tpot_ms": 0}}, "load.slo.tpot_ms"),
    ("load-without-a-load", "load", {"requests": 4}, "concurrency"),
    ("load-requests-bool", "load", {"concurrency": 2, "requests": True}, "load.requests must be an integer"),
    ("load-requests-float", "load", {"concurrency": 2, "requests": 2.0}, "load.requests must be an integer"),
    ("load-requests-huge", "load", {"concurrency": 2, "requests": 100_000_000}, "at most 10000"),
    ("load-requests-absurd", "load", {"concurrency": 2, "requests": 10**12}, "at most 10000"),
    ("load-rate-1e-300", "load", {"request_rate": 1.0e-300, "requests": 6}, "may span at most 86400 s (24 h"),
    ("load-rate-1e-6", "load", {"concurrency": 2, "request_rate": 1.0e-6, "requests": 6}, "over 6000000 s"),
    ("load-rate-1e-300-per-prompt", "__LOAD_PER_PROMPT__", {"request_rate": 1.0e-300},
     "6 requests (one per prompt of the dataset"),  # known once the dataset is read
    ("load-rate-uncapped", "load", {"request_rate": 5.0, "requests": 5000}, "give load.concurrency <= 1024"),
    ("load-concurrency-huge", "load", {"concurrency": 5000, "requests": 5000}, "at most 1024"),
    ("load-think-huge", "load", {"concurrency": 1, "think_s": 1.0e300}, "load.think_s"),
    ("overlap-uncompiled", "engine", {"overlap": True}, "engine.overlap"),
    ("turns-bool", "dataset.turns", True, "turns must be a whole number >= 1 or 'all'"),
    ("turns-float", "dataset.turns", 2.0, "turns must be a whole number >= 1 or 'all'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_config(tiny, tmp_path, case):
    name, path, value, fragment = case
    root, *_, other_target = tiny
    if value == "__DATA_TXT__":
        value = str(tmp_path / "data.txt")
        Path(value).write_text("hello\n")
    if value == "__OTHER_TOKENIZER__":
        value = str(other_target)
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        from helpers import WORDS
        swapped = WORDS[:3] + WORDS[3:][::-1]  # the same words under other ids: a different tokenizer
        backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(swapped)}, unk_token="w0"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                unk_token="w0").save_pretrained(other_target)
    if path == "__LOAD_HF__":
        config = {**good(tiny), "load": {"concurrency": [1, 2]}, "methods": ["baseline", "hf_generate"]}
    elif path == "__LOAD_PER_PROMPT__":
        config = {**{k: v for k, v in good(tiny).items() if k != "batch_size"}, "load": value}
    else:
        config = edit(good(tiny), path, value)
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", file, "--output-dir", tmp_path / "out"])
    assert_one_clean_line(result, fragment)
    if name not in ("vocab-mismatch", "hub-id-offline", "missing-prompt-field", "no-prompts-left",
                    "group-by-missing-field", "load-rate-1e-300-per-prompt"):
        assert not (tmp_path / "out" / "env.json").exists(), "refused only after starting the run"
    elif (tmp_path / "out" / "progress.json").exists():  # refused once the folder was made: it says so
        assert json.loads((tmp_path / "out" / "progress.json").read_text())["status"] == "refused"


def test_auto_tree_with_prompt_lookup_alone_is_refused(tiny, tmp_path):
    """auto is the tree of a drafter with a forward to price: prompt lookup would get no point, and the run would silently hold the
    baseline alone."""
    config = edit(edit(good(tiny), "methods", ["baseline", "prompt_lookup"]), "speculative.tree", "auto")
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    assert_one_clean_line(run_launch(["--config", file]), "prompt_lookup takes static and dynamic trees only")


@pytest.mark.parametrize("text, fragment", [
    ("target: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "mapping"),
    ("", "empty"),
    ("just a string", "mapping"),
])
def test_config_file_that_is_not_a_yaml_mapping(tmp_path, text, fragment):
    file = tmp_path / "config.yaml"
    file.write_text(text)
    assert_one_clean_line(run_launch(["--config", file]), fragment)


@pytest.mark.parametrize("args, fragment", [
    (["--config", "/nonexistent.yaml"], "does not exist"),
    ([], "--config"),
    (["--config", "X", "--bogus"], "unrecognized"),
    (["--resume", "X", "--output-dir", "Y"], "drop --output-dir"),
])
def test_bad_command_line(args, fragment):
    assert_one_clean_line(run_launch(args), fragment)


@pytest.mark.parametrize("assignment, fragment", [
    ("speculative.gamma", "KEY=VALUE"),
    ("speculative.gamma.deep=1", "not a mapping"),
    ("speculative.gama=3", "did you mean 'gamma'"),
    ("generation.top_p=[unclosed", "not valid YAML"),
    ("draft[3].kind=medusa", "'draft' is not a list, cannot index it"),  # a single draft is draft[0]
    ("draft[].kind=medusa", "malformed key 'draft[]'"),
    ("dataset.turns=many", "turns must be a whole number >= 1 or 'all', got 'many'"),
    ("newkey[1]=4", "'newkey' is not set in the config, so it has no item 1"),
    ("draft[0][0].kind=x", "'draft[0]' is not a list, cannot index it"),
    ("speculative.suffix_max_depth=0", "speculative.suffix_max_depth"),
    ("speculative.suffix_min_prob=true", "speculative.suffix_min_prob"),
])
def test_bad_set(tiny, tmp_path, assignment, fragment):
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(good(tiny)))
    assert_one_clean_line(run_launch(["--config", file, "--set", assignment]), fragment)


def test_hybrid_without_a_draft_model(tiny, tmp_path):
    config = good(tiny)
    config["methods"] = ["baseline", "hybrid"]
    del config["draft"]
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", file, "--output-dir", tmp_path / "out"])
    assert_one_clean_line(result, "method hybrid needs a draft")


def test_set_reaches_a_list_item_and_the_suffix_options(tiny, tmp_path):
    """--set draft[0].kind (and draft.0.kind) edits the item, where it was a key '' that was not known; suffix's options,
    documented and read by the method, are settable and reach it, typed (RunContext.options)."""
    from decode.methods.suffix import Options
    from utils.config import load_config

    file = tmp_path / "config.yaml"
    config = good(tiny)
    config["draft"] = [config["draft"], {"model": config["draft"]["model"], "label": "second"}]
    file.write_text(yaml.safe_dump(config))
    config["methods"] = ["baseline", "suffix", "hybrid"]
    file.write_text(yaml.safe_dump(config))
    loaded, raw = load_config(file, ["draft[1].label=other", "draft.0.label=first", "speculative.gamma[0]=5",
                                     "speculative.suffix_max_depth=3", "speculative.suffix_min_prob=0.25",
                                     "speculative.suffix_cache_tokens=100"])
    assert [d["label"] for d in raw["draft"]] == ["first", "other"] and raw["speculative"]["gamma"][0] == 5
    with pytest.raises(Exception, match=r"'draft' has 2 item\(s\), so draft\[2\] does not exist"):
        load_config(file, ["draft[2].label=x"])
    assert loaded.method_options["suffix"] == Options(suffix_max_depth=3, suffix_min_prob=0.25, suffix_cache_tokens=100)
    hybrid = loaded.method_options["hybrid"]  # hybrid's suffix source reads them too
    assert (hybrid.suffix_max_depth, hybrid.suffix_min_prob, hybrid.suffix_cache_tokens) == (3, 0.25, 100)
