"""The config (utils/config.py: defaults, errors naming the key, --set, the flat mapping), the data (utils/data.py:
GSM8K answers, the prompt column, the chat template) and the offline model parts (utils/offline_models.py)."""
import hashlib
from pathlib import Path

import pytest

from utils.config import ConfigError, apply_override, from_flat, validate
from utils.config import DatasetConfig
from utils.data import DataError, apply_chat_template, extract_gsm8k_answer, prompt_field
from utils.offline_models import OfflineModelError, join_and_verify

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


def test_defaults_and_sweeps():
    config = validate({**VALID, "speculative": {"gamma": 3}, "batch_size": [1, 4]})
    assert config.speculative.gamma == [3] and config.batch_size == [1, 4]
    assert config.methods == ["baseline", "speculative"] and config.generation.do_sample is False


@pytest.mark.parametrize("patch, fragment", [
    ({"generaton": {}}, "did you mean 'generation'"),
    ({"speculative": {"gamma": []}}, "speculative.gamma"),
    ({"speculative": {"gamma": [2, 2]}}, "repeats a value"),
    ({"generation": {"top_p": 0}}, "generation.top_p"),
    ({"device": "gpu"}, "device"),
])
def test_bad_values_name_the_key(patch, fragment):
    with pytest.raises(ConfigError, match=fragment):
        validate({**VALID, **patch})


def test_override_paths():
    raw = {"speculative": {"gamma": 1}}
    apply_override(raw, "speculative.gamma=[2,4]")
    apply_override(raw, "generation.temperature=0.5")
    assert raw == {"speculative": {"gamma": [2, 4]}, "generation": {"temperature": 0.5}}
    with pytest.raises(ConfigError, match="not a mapping"):
        apply_override(raw, "speculative.gamma.x=1")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_override(raw, "speculative.gamma")


def test_flat_mapping():
    mapped = from_flat({"draft_model": "d", "target_model": "t", "k": 4, "max_new_tokens": 32, "max_length": 256,
                        "num_samples": 10, "dataset": {"path": "openai/gsm8k", "name": "main"}, "quantized": True,
                        "summary_file_name": "s.json", "batch_size": 2, "device": "cpu"})
    config = validate(mapped)
    assert config.speculative.gamma == [4] and config.dataset.preset == "gsm8k"
    assert config.target.quantization == config.draft[0].quantization == "4bit"
    assert config.dataset.max_prompt_tokens == 224 and config.report.summary_file_name == "s.json"


@pytest.mark.parametrize("text, answer", [
    ("so she has 18 dollars.\n#### 18", "18"), ("#### 1,234", "1234"), ("The answer is 42.", "42"),
    ("costs $3.50 then 7.0", "7"), ("no number", None), ("#### -5", "-5"),
])
def test_gsm8k_answer_extraction(text, answer):
    assert extract_gsm8k_answer(text) == answer


def test_gsm8k_reference_rows_from_shared_data():
    path = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k_test.jsonl"  # beside the repository
    if not path.exists():
        pytest.skip("../shared/data is absent (a clone outside this workplace)")
    import json
    rows = [json.loads(line) for line in path.open()][:50]
    assert all(extract_gsm8k_answer(r["answer"]) not in (None, "") for r in rows)
    assert extract_gsm8k_answer(rows[0]["answer"]) == "18"


def test_offline_join_refuses_a_corrupted_chunk(tmp_path):
    parts = []
    for i in range(3):
        part = tmp_path / f"part{i}.bin"
        part.write_bytes(bytes([i]) * 1000)
        parts.append(part)
    good = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    join_and_verify(parts, good, tmp_path / "ok.gguf", progress=False)
    assert (tmp_path / "ok.gguf").stat().st_size == 3000
    parts[1].write_bytes(bytes([9]) * 1000)  # corrupted
    with pytest.raises(OfflineModelError, match="sha256"):
        join_and_verify(parts, good, tmp_path / "bad.gguf", progress=False)
    assert not (tmp_path / "bad.gguf").exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("fields, expected", [
    (["prompt", "id"], "prompt"), (["id", "question", "answer"], "question"), (["turns", "category"], "turns"),
])
def test_prompt_column_guessed_when_exactly_one_fits(fields, expected):
    assert prompt_field(DatasetConfig(path="x.jsonl"), fields) == (expected, True)


@pytest.mark.parametrize("fields, fragment", [(["prompt", "question"], "several fit"), (["body", "id"], "none of")])
def test_prompt_column_refused_when_none_or_several_fit(fields, fragment):
    with pytest.raises(DataError, match=fragment):
        prompt_field(DatasetConfig(path="x.jsonl"), fields)


def test_given_prompt_field_is_used_as_is():
    assert prompt_field(DatasetConfig(path="x.jsonl", prompt_field="body"), ["body", "prompt"]) == ("body", False)


def test_enable_thinking_reaches_the_chat_template():
    from helpers import word_tokenizer

    tokenizer = word_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                               "{% if enable_thinking is defined and enable_thinking is false %} nothink{% endif %}")
    off = DatasetConfig(path="x.jsonl", prompt_field="p", enable_thinking=False)
    default = DatasetConfig(path="x.jsonl", prompt_field="p")
    assert apply_chat_template(tokenizer, "w3", off).endswith(" nothink")
    assert not apply_chat_template(tokenizer, "w3", default).endswith(" nothink")


def test_a_config_without_draft_runs_methods_that_need_none():
    config = validate({"target": {"model": "t"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"},
                       "methods": ["baseline", "prompt_lookup"]})
    assert config.draft == []


def test_an_option_of_a_method_not_run_is_kept_and_each_method_gets_its_own():
    """A config keeps its options while --set changes the methods: ngram_max with no lookup method passes unused;
    with one, that method (and only a method that reads it) gets it, typed."""
    config = validate({**VALID, "speculative": {"gamma": [2], "ngram_max": 5}})
    assert config.methods == ["baseline", "speculative"] and config.speculative.ngram_max == 5
    config = validate({**VALID, "methods": ["baseline", "prompt_lookup"], "speculative": {"gamma": [2], "ngram_max": 5}})
    assert config.method_options["prompt_lookup"].ngram_max == 5 and "baseline" not in config.method_options
