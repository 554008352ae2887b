"""Inputs that ran silently wrong or failed late: refused at validation (exit 2, one line), or noted."""
import math

import pytest
import torch
import yaml

from helpers import assert_one_clean_line, base_config, run_launch, save_tiny_pair, word_tokenizer, write_prompts
from utils.config import ClusterConfig, ConfigError, DatasetConfig, validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixes")
    target, draft = save_tiny_pair(root)  # the target has 3 layers
    return root, target, draft, write_prompts(root / "prompts.jsonl", count=8)


# ---- generation.temperature ---------------------------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [0.5, math.nan], [0.5, math.inf]])
def test_a_temperature_that_is_not_a_finite_number_is_refused(value):
    with pytest.raises(ConfigError, match=r"config key 'generation.temperature': .*finite"):
        validate({**VALID, "generation": {"do_sample": True, "temperature": value}})


def test_several_temperatures_with_do_sample_false_are_refused():
    with pytest.raises(ConfigError, match=r"config key 'generation.temperature': .*do_sample: false decodes "
                                          r"greedily.*set do_sample: true"):
        validate({**VALID, "generation": {"temperature": [0.5, 0.8]}})


def test_one_temperature_with_do_sample_false_is_still_greedy():
    config = validate({**VALID, "generation": {"do_sample": False, "temperature": 0.7}})
    assert config.generation.temperatures() == [None]
    config = validate({**VALID, "generation": {"do_sample": True, "temperature": [0.5, 0.8]}})
    assert config.generation.temperatures() == [0.5, 0.8]


# ---- seed ---------------------------------------------------------------------------------------

SEED_MAX = 18446687634135  # (2**64 - 1 - 2**40) // 1_000_003


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1, 2 ** 64, 2 ** 70])
def test_a_seed_outside_the_range_is_refused(seed):
    with pytest.raises(ConfigError, match=rf"config key 'seed': .*0 to {SEED_MAX}"):
        validate({**VALID, "seed": seed})


def test_the_largest_seed_gives_derived_seeds_torch_accepts():
    assert validate({**VALID, "seed": SEED_MAX}).seed == SEED_MAX
    # runner/session.py derives seed * 1_000_003 + batch_index * 101 + repeat: a million batches, a thousand repeats
    torch.manual_seed(SEED_MAX)
    torch.Generator().manual_seed(SEED_MAX * 1_000_003 + 10 ** 6 * 101 + 1000)


# ---- speculative.exit_layer ---------------------------------------------------------------------

def early_exit(target, exit_layer) -> dict:
    return {**VALID, "target": {"model": str(target)}, "methods": ["baseline", "early_exit"],
            "speculative": {"exit_layer": exit_layer}}


@pytest.mark.parametrize("exit_layer", [3, [1, 4]])
def test_an_exit_layer_at_or_beyond_the_targets_depth_is_refused(tiny, exit_layer):
    _, target, _, _ = tiny
    with pytest.raises(ConfigError, match=r"config key 'speculative.exit_layer': \d must be below the target's "
                                          r"3 layers.*use 1 to 2"):
        validate(early_exit(target, exit_layer))


def test_exit_layers_inside_the_target_are_accepted(tiny):
    _, target, _, _ = tiny
    assert validate(early_exit(target, [1, 2])).speculative.exit_layer == [1, 2]
    unused = {**early_exit(target, [9]), "methods": ["baseline", "speculative"]}  # no method drafts with it
    assert validate(unused).exit_layers == []


def test_gpt2_depth_is_read_from_n_layer(tmp_path):
    target, _ = save_tiny_pair(tmp_path, arch="gpt2")
    with pytest.raises(ConfigError, match="3 layers"):
        validate(early_exit(target, 3))


def test_a_synthetic_targets_depth_is_known_without_building_it():
    with pytest.raises(ConfigError, match="4 layers"):  # llama-tiny has 4 layers
        validate(early_exit("synthetic:llama-tiny", 4))
    with pytest.raises(ConfigError, match="2 layers"):
        validate(early_exit("synthetic:llama-tiny?layers=2", 2))


def test_a_loaded_targets_config_is_checked_too(tiny):
    from transformers import AutoConfig

    from utils.models import check_exit_layers

    _, target, _, _ = tiny
    config = validate(early_exit("some-org/not-cached-here", [2, 3]))  # depth unknown before loading
    with pytest.raises(ConfigError, match="3 must be below the target's 3 layers"):
        check_exit_layers(config, AutoConfig.from_pretrained(target))


# ---- hf_prompt_lookup and ngram_min -------------------------------------------------------------

def test_hf_prompt_lookup_with_ngram_min_above_one_is_refused():
    with pytest.raises(ConfigError, match=r"config: speculative.ngram_min: 2 cannot apply to hf_prompt_lookup"):
        validate({**VALID, "methods": ["baseline", "prompt_lookup", "hf_prompt_lookup"],
                  "speculative": {"ngram_min": 2, "ngram_max": 3}})
    config = validate({**VALID, "methods": ["baseline", "prompt_lookup"], "speculative": {"ngram_min": 2}})
    assert config.speculative.ngram_min == 2
    config = validate({**VALID, "methods": ["baseline", "hf_prompt_lookup"], "speculative": {"ngram_min": 1}})
    assert config.methods == ["baseline", "hf_prompt_lookup"]


# ---- cluster: a local Ray cluster's size --------------------------------------------------------

@pytest.mark.parametrize("cluster, cpus_here, gpus_here, resources, workers", [
    # no num_workers: every CPU here, then as many workers as fit
    ({"num_cpus": 1}, 2, 0, (2, 0), 2),
    ({"num_cpus": 2}, 5, 0, (5, 0), 2),
    ({"num_cpus": 4}, 2, 0, (4, 0), 1),  # one worker bigger than the machine still starts
    ({"num_cpus": 1, "num_gpus": 1}, 16, 2, (16, 2), 2),
    ({"num_cpus": 1, "num_gpus": 0.5}, 16, 1, (16, 1), 2),
    # num_workers given: exactly what they take
    ({"num_workers": 3, "num_cpus": 1.5}, 2, 0, (5, 0), 3),
    ({"num_workers": 2, "num_cpus": 1, "num_gpus": 0.5}, 8, 4, (2, 1), 2),
])
def test_a_local_ray_cluster_fits_as_many_workers_as_the_machine(cluster, cpus_here, gpus_here, resources, workers):
    from runner.cluster import local_ray_resources, workers_that_fit

    cluster = ClusterConfig(backend="ray", **cluster)
    assert local_ray_resources(cluster, cpus_here, gpus_here) == resources
    cpus, gpus = resources
    assert workers_that_fit({"CPU": float(cpus), "GPU": float(gpus)}, cluster) == workers


# ---- dataset.num_samples above the rows ---------------------------------------------------------

@pytest.mark.parametrize("num_samples, notes, count", [
    (50, ["dataset: num_samples 50 asked for, the file has 8 rows: 8 prompts run"], 8),
    (8, [], 8),
    (5, [], 5),
    (None, [], 8),
])
def test_num_samples_above_the_rows_is_noted(tiny, num_samples, notes, count):
    from utils.data import load_prompts

    _, _, _, data = tiny
    prompts = load_prompts(DatasetConfig(path=str(data), prompt_field="text", chat_template=False,
                                         num_samples=num_samples), word_tokenizer())
    assert len(prompts.prompts) == count
    assert prompts.notes == notes


# ---- empty prompts: skipped and counted, never silently -----------------------------------------

def _rows_with_empty_prompts(path, texts):
    import json

    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_empty_and_whitespace_prompts_are_counted(tmp_path):
    from utils.data import load_prompts

    data = _rows_with_empty_prompts(tmp_path / "rows.jsonl", ["w3 w4 w5", "", " \t\n ", "w6 w7"])
    prompts = load_prompts(DatasetConfig(path=str(data), prompt_field="text", chat_template=False), word_tokenizer())
    assert [p.sample_id for p in prompts.prompts] == [0, 3]
    assert (prompts.skipped_empty, prompts.skipped_too_long, prompts.truncated) == (2, 0, 0)


@pytest.mark.e2e
def test_the_report_says_how_many_prompts_were_skipped_as_empty(tiny, tmp_path):
    import json

    _, target, draft, _ = tiny
    data = _rows_with_empty_prompts(tmp_path / "rows.jsonl", ["w3 w4 w5", "", " \t\n ", "w6 w7"])
    config = base_config(target, draft, data, batch_size=[1], methods=["baseline"], warmup=0,
                         generation={"max_new_tokens": 2})
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    result = run_launch(["--config", file, "--output-dir", tmp_path / "out"])
    assert result.returncode == 0, result.stderr[-2000:]
    prompts = json.loads((tmp_path / "out" / "summary.json").read_text())["prompts"]
    assert (prompts["count"], prompts["skipped_empty"]) == (2, 2)
    assert "0 truncated, 0 skipped as too long, 2 skipped as empty" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.e2e
def test_a_file_of_empty_prompts_is_refused_in_one_line(tiny, tmp_path):
    _, target, draft, _ = tiny
    data = _rows_with_empty_prompts(tmp_path / "rows.jsonl", ["", "  ", "\n"])
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(base_config(target, draft, data, batch_size=[1])))
    result = run_launch(["--config", file, "--output-dir", tmp_path / "out"])
    assert_one_clean_line(result, "3 of 3 rows have an empty or whitespace-only 'text'")
    assert "dataset.prompt_field" in result.stderr


# ---- the same through launch.py: exit 2, one line, before any measurement -----------------------

@pytest.mark.e2e
@pytest.mark.parametrize("name, edit, fragment", [
    ("temperature-nan", "generation:\n  max_new_tokens: 4\n  temperature: .nan\n", "generation.temperature"),
    ("temperatures-greedy", "generation: {max_new_tokens: 4, temperature: [0.5, 0.8]}\n", "do_sample: true"),
    ("seed-above-64-bits", "seed: 18446744073709551616\n", "config key 'seed'"),
    ("exit-layer-too-deep", "methods: [baseline, early_exit]\nspeculative: {exit_layer: [3]}\n",
     "speculative.exit_layer"),
])
def test_launch_refuses(tiny, tmp_path, name, edit, fragment):
    _, target, draft, data = tiny
    config = base_config(target, draft, data, batch_size=[1])
    for key in ("seed", "generation", "speculative"):
        config.pop(key)
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config) + edit)
    result = run_launch(["--config", file, "--output-dir", tmp_path / "out"])
    assert_one_clean_line(result, fragment)
    assert not (tmp_path / "out" / "env.json").exists(), "refused only after starting the run"
