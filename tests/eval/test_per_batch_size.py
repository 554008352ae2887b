"""recommend.json's per_batch_size (eval/deploy.py): where the choice differs by batch size, vLLM's
num_speculative_tokens_per_batch_size and TensorRT-LLM's draft_len_schedule, by hand."""
from eval.deploy import per_batch_size
from eval.recommend import settings_of


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
