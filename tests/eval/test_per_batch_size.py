"""recommend.json's per_batch_size (eval/deploy/): where the choice differs by batch size, vLLM's
num_speculative_tokens_per_batch_size and TensorRT-LLM's draft_len_schedule, by hand; vLLM's table read by vLLM's own
config code where SPECULATE_VLLM_PYTHON names its CPU build (skipped otherwise)."""
import json
import os
import subprocess

from eval.deploy import per_batch_size
from eval.recommend import settings_of
from helpers import VLLM_PYTHON, needs_vllm


def chain(k, speedup):
    return {"candidate": f"speculative draft=d gamma={k}", "method": "speculative", "gamma": k, "draft": "d",
            "speedup": speedup, "axes": {"method": "speculative", "draft": "d", "gamma": k}}


OFF = {"candidate": "off", "method": None, "gamma": None, "draft": None, "speedup": 1.0}


def load(name, best, context=None):
    candidates = [chain(4, 1.5 if best == 4 else 0.9), chain(2, 1.3 if best == 2 else 0.8), OFF]
    return {"load": name, "context": context, "candidates": candidates,
            "best": "off" if best == 0 else f"speculative draft=d gamma={best}"}


CONFIG = {"draft": [{"model": "org/d", "label": "d"}]}


def test_k_by_batch_size_in_the_engines_forms():
    """K 4 at batch 1 and 2, K 2 at 4, off at 8: vLLM's inclusive ranges from 1, equal neighbours merged, [[1, 3, 4],
    [4, 7, 2], [8, 8, 0]] (above 8 it holds 0), num_speculative_tokens the largest K; TensorRT-LLM's largest batch size
    of each K, off above the last: {3: 4, 7: 2}."""
    results = [load("batch=1", 4), load("batch=2", 4), load("batch=4", 2), load("batch=8", 0)]
    table = per_batch_size(results, settings_of(results, CONFIG))
    forms = table["as measured"]
    assert forms["batch_sizes"] == [[1, 4], [2, 4], [4, 2], [8, 0]]
    ranges = forms["vllm"]["num_speculative_tokens_per_batch_size"]
    assert ranges == [[1, 3, 4], [4, 7, 2], [8, 8, 0]]
    assert forms["vllm"]["num_speculative_tokens"] == 4 and forms["vllm"]["model"] == "org/d"
    # what vLLM's schedule validation asks: from 1, each range lo <= hi, sorted without overlap, K >= 0 and at most
    # num_speculative_tokens
    assert ranges[0][0] == 1 and all(lo <= hi for lo, hi, _ in ranges)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])) and all(0 <= k <= 4 for _, _, k in ranges)
    assert forms["tensorrt_llm"] == {"max_draft_len": 4, "draft_len_schedule": {"3": 4, "7": 2}}
    assert any("above 8 rows" in n for n in forms["notes"])


def test_sglang_takes_tiers_for_eagle3_and_one_k_a_server_for_a_draft_model():
    """SGLang 0.5.23 (adaptive_spec_params.py): --speculative-adaptive with a file of tiers keyed by their least batch
    size, one candidate a tier holding its K, --speculative-num-steps among them (the largest); EAGLE and EAGLE3 only.
    K 4 at batch 1 and 2, K 2 at 4, off at 8: tiers {"1": [4], "4": [2], "8": [0]}. A draft model (STANDALONE): no
    table, a note."""
    def eagle(name, best):
        row = load(name, best)
        for c in row["candidates"][:2]:
            c.update(method="eagle3", draft="h", candidate=c["candidate"].replace("speculative draft=d", "eagle3 draft=h"))
            c["axes"].update(method="eagle3", draft="h")
        row["best"] = row["best"].replace("speculative draft=d", "eagle3 draft=h")
        return row

    heads = {"draft": [{"model": "/heads/e3", "kind": "eagle3", "label": "h"}]}
    results = [eagle("batch=1", 4), eagle("batch=2", 4), eagle("batch=4", 2), eagle("batch=8", 0)]
    forms = per_batch_size(results, settings_of(results, heads))["as measured"]
    flags = forms["sglang"]
    assert flags[flags.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert flags[flags.index("--speculative-num-steps") + 1] == "4"
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "5"
    assert flags[-3:] == ["--speculative-adaptive", "--speculative-adaptive-config", "sglang-adaptive.json"]
    tiers = next(n for n in forms["notes"] if n.startswith("sglang-adaptive.json"))
    assert '{"1": {"candidate_steps": [4]}, "4": {"candidate_steps": [2]}, "8": {"candidate_steps": [0]}}' in tiers

    chains = [load("batch=1", 4), load("batch=2", 4), load("batch=4", 2), load("batch=8", 0)]
    forms = per_batch_size(chains, settings_of(chains, CONFIG))["as measured"]
    assert forms["sglang"] is None and any("not STANDALONE: one K a server" in n for n in forms["notes"])


def test_no_table_where_k_does_not_differ_or_a_load_is_no_constant_chain():
    same = [load("batch=1", 2), load("batch=4", 2)]
    assert per_batch_size(same, settings_of(same, CONFIG)) == {}
    tree = [load("batch=1", 4), load("batch=4", 2)]
    tree[0]["candidates"][0]["axes"]["tree"] = "2-2"
    assert per_batch_size(tree, settings_of(tree, CONFIG)) == {}


def test_one_table_a_context():
    results = [load("conc=1", 4, 512), load("conc=4", 0, 512), load("conc=1", 2, 4096), load("conc=4", 2, 4096)]
    table = per_batch_size(results, settings_of(results, CONFIG))
    assert list(table) == ["512"] and table["512"]["vllm"]["num_speculative_tokens_per_batch_size"] == [
        [1, 3, 4], [4, 4, 0]]
    assert table["512"]["tensorrt_llm"]["draft_len_schedule"] == {"3": 4}



def test_static_batches_and_concurrencies_are_tables_of_their_own():
    """batch=4 off and conc=4 at K 4 (the largest): keyed by the bare number the two overwrote each other, and the
    widest K's settings were looked up at batch=4 (off), which crashed SGLang's form. Each kind its own table."""
    results = [load("batch=1", 2), load("batch=4", 0), load("conc=1", 2), load("conc=4", 4)]
    table = per_batch_size(results, settings_of(results, CONFIG))
    assert list(table) == ["as measured, static batch", "as measured, concurrency"]
    static, served = table["as measured, static batch"], table["as measured, concurrency"]
    assert static["batch_sizes"] == [[1, 2], [4, 0]] and served["batch_sizes"] == [[1, 2], [4, 4]]
    assert static["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 4, 0]]
    assert served["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 4, 4]]
    assert served["vllm"]["num_speculative_tokens"] == 4 and static["vllm"]["num_speculative_tokens"] == 2
    # TensorRT-LLM's schedule starts at max_draft_len (it refuses another): K rising with the rows has none
    assert served["tensorrt_llm"] is None and any("no draft_len_schedule" in n for n in served["notes"])
    assert static["tensorrt_llm"] == {"max_draft_len": 2, "draft_len_schedule": {"3": 2}}


# vLLM's own reading: SpeculativeConfig (the pydantic config --speculative-config becomes) and the dense batch size -> K
# lookup its scheduler runs on, whose validation (validate_and_normalize_dynamic_sd_schedule) refuses a table that does
# not start at 1, overlaps or has a K below 0
VLLM_READS = """
import json, sys
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
emitted, target = json.loads(sys.argv[1]), sys.argv[2]
spec = SpeculativeConfig(**emitted, target_model_config=ModelConfig(model=target),
                         target_parallel_config=ParallelConfig())
lookup = build_dynamic_sd_schedule_lookup(spec.num_speculative_tokens_per_batch_size, 10, spec.num_speculative_tokens)
print(json.dumps({"dynamic": spec.uses_dynamic_speculative_decoding(), "k": spec.num_speculative_tokens,
                  "by_batch_size": lookup[1:]}))
"""


@needs_vllm()
def test_vllms_own_config_reads_the_emitted_table(tmp_path):
    """The emitted speculative_config, constructed as vLLM's SpeculativeConfig on a tiny pair and expanded by its
    scheduler's lookup up to 10 rows: K 4 at 1-3 rows, 2 at 4-7, 0 at 8 and above (the last range held)."""
    from helpers import save_vllm_pair

    target, draft = save_vllm_pair(tmp_path)
    results = [load("batch=1", 4), load("batch=2", 4), load("batch=4", 2), load("batch=8", 0)]
    emitted = per_batch_size(results, settings_of(results, {"draft": [{"model": str(draft), "label": "d"}]}))
    done = subprocess.run([VLLM_PYTHON, "-c", VLLM_READS, json.dumps(emitted["as measured"]["vllm"]), str(target)],
                          capture_output=True, text=True, timeout=600, cwd="/",
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read == {"dynamic": True, "k": 4, "by_batch_size": [4, 4, 4, 2, 2, 2, 2, 0, 0, 0]}
