"""What a reader takes from the report, against values worked out by hand: no flag on a reference's speedup of 1 by
definition, no MAT where the forwards are not counted, one clock for llama.cpp's tok/s, latency and TPOT, the best
method with its paired margin over the runner-up, plots whose legend and labels are whole, and a line where there is
no Engines table under load."""
import matplotlib
import matplotlib.image
import pytest

import eval.report as report
from eval.figure_table import columns
from eval.report import cell, markdown, serving_lines, write_report
from eval.summary import summarize
from sample_records import paired_run, record, run
from test_serving_figures import request

DRIFTED = {"drift": {"1": {"p1": [0.1, 0.2]}}}  # the probe moved 100%: every run of batch size 1 flagged drift


def speedup_cell(r):
    return cell(r, next(c for c in columns() if c.paths == ("speedup",)))


def test_a_reference_row_carries_no_flag_on_its_speedup_of_one():
    summary = summarize(paired_run(units=8), DRIFTED)
    baseline, spec = run(summary, "baseline"), run(summary, "speculative")
    assert [f["code"] for f in baseline["flags"]] == ["drift"]  # the flag stays in the summary and the notes
    assert speedup_cell(baseline) == "1.00"
    assert speedup_cell(spec) == "2.00 [2.00, 2.00] !"


def llama_cpp_pair(latency=0.5, server_latency=0.3, server_ttft=0.1, units=8):
    """Per prompt (4 tokens): llama_cpp_generate at `latency` s on the client's clock, the server's own times in extra;
    our baseline beside it."""
    extra = {"engine": "llama_cpp", "llama_cpp_latency_s": server_latency, "llama_cpp_ttft_s": server_ttft}
    samples = []
    for i in range(units):
        samples.append(record("baseline", i, i, tokens=4, latency=2.0))
        samples.append(record("llama_cpp_generate", i, i, tokens=4, latency=latency, prefill=None,
                              target_forwards=None, extra=extra))
    return samples


def test_a_reference_whose_forwards_are_not_counted_has_no_mat():
    summary = summarize(llama_cpp_pair(), {})
    theirs = run(summary, "llama_cpp_generate")["metrics"]
    assert theirs["block_efficiency"] is None and theirs["mean_accepted_tokens"] is None
    assert run(summary, "baseline")["metrics"]["mean_accepted_tokens"] == 1.0  # 4 tokens in 4 counted forwards


def test_llama_cpp_latency_tpot_and_tok_s_share_the_clients_clock():
    metrics = run(summarize(llama_cpp_pair(), {}), "llama_cpp_generate")["metrics"]
    assert metrics["throughput_tok_s"] == pytest.approx(4 / 0.5)  # the client's 0.5 s a batch
    assert metrics["latency_s"]["p50"] == pytest.approx(0.5)  # not the server's 0.3 s
    assert metrics["tpot_s"]["mean"] == pytest.approx(0.5 / 4)
    assert metrics["ttft_s"]["mean"] == pytest.approx(0.1)  # the server's prompt time: the client sees none apart


def three_methods(units=8, a=(1.0, 1.4), b=1.25, group=None):
    """Per prompt (4 tokens, batch size 1): baseline 2.0 s; speculative gamma 2 alternately a[0] and a[1] s;
    speculative gamma 4 at 1.45 s (the same method: never the runner-up); prompt_lookup at b s."""
    samples = []
    for i in range(units):
        samples += [record("baseline", i, i, tokens=4, latency=2.0, group=group),
                    record("speculative", i, i, tokens=4, latency=a[i % 2], group=group,
                           rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]),
                    record("speculative", i, i, tokens=4, latency=1.45, gamma=4, group=group,
                           rounds=[{"drafted": 4, "accepted": 2, "emitted": 3}]),
                    record("prompt_lookup", i, i, tokens=4, latency=b, group=group,
                           rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}])]
    return samples


def test_the_best_method_and_its_paired_margin_over_the_runner_up_by_hand():
    # speculative: 32 tokens in 4 x 1.0 + 4 x 1.4 = 9.6 s; prompt_lookup: 32 in 8 x 1.25 = 10 s; margin 10 / 9.6
    summary = summarize(three_methods(), {})
    (best,) = summary["best_method"]
    assert (best["method"], best["runner_up_method"]) == ("speculative", "prompt_lookup")
    assert best["label"] == "speculative draft=d gamma=2 constant batch=1 greedy"
    assert best["speedup"] == pytest.approx(16 / 9.6)
    assert best["margin"] == pytest.approx(10 / 9.6) and best["margin_prompts"] == 8
    low, high = best["margin_ci95"]  # resampled prompts: each is 1.25 / 1.0 or 1.25 / 1.4 alone
    assert 1.25 / 1.4 <= low < 1 < high <= 1.25 and best["verdict"] == "tied"
    text = markdown(summary)
    assert ("- batch=1 greedy, overall: best method speculative (speculative draft=d gamma=2 constant batch=1 greedy) "
            "at 1.67x") in text
    assert f"over the runner-up prompt_lookup (prompt_lookup gamma=2 batch=1 greedy): 1.042x [{low:.3f}, {high:.3f}] " \
           "paired over 8 prompt batches (tied: the interval holds 1)" in text
    # each method's best point is listed only where the method ran more than one: speculative, not prompt_lookup
    assert "- batch=1 greedy, speculative: speculative draft=d gamma=2" in text
    assert "- batch=1 greedy, prompt_lookup:" not in text


def test_a_margin_above_one_and_a_group_too_small_for_an_interval():
    # every prompt: 1.25 s against 1.0 s, so every resample gives 1.25
    samples = three_methods(a=(1.0, 1.0)) + three_methods(units=3, group="g")
    for s in samples[32:]:
        s["sample_id"] += 8
        s["batch_index"] += 8
    summary = summarize([dict(s, group=s["group"] or "f") for s in samples], {"group_by": "category"})
    by_scope = {e["group"]: e for e in summary["best_method"]}
    assert set(by_scope) == {None, "f", "g"}
    assert by_scope["f"]["margin"] == pytest.approx(1.25) and by_scope["f"]["margin_ci95"] == pytest.approx([1.25, 1.25])
    assert by_scope["f"]["verdict"] == "above"
    small = by_scope["g"]  # 3 prompts: a reading, no interval
    assert small["margin"] == pytest.approx((3 * 1.25) / (1.0 + 1.4 + 1.0)) and small["margin_ci95"] is None
    text = markdown(summary)
    assert "- batch=1 greedy, category=g: best method speculative" in text
    assert "(n=3: too few prompt batches for an interval, a reading)" in text
    assert "1.250x [1.250, 1.250] paired over 8 prompt batches (above 1)" in text


def test_a_best_method_slower_than_the_target_alone_is_not_called_best():
    # every method slower than the baseline's 2.0 s: speculative 32 tokens in 8 x 2.5 s = 0.80x, prompt_lookup 0.64x
    samples = [s for s in three_methods(a=(2.5, 2.5), b=3.125) if s["gamma"] != 4]
    text = markdown(summarize(samples, {}))
    assert "- batch=1 greedy, overall: no method above the target alone; the fastest, speculative (speculative " \
           "draft=d gamma=2 constant batch=1 greedy), reads 0.80x [0.80, 0.80]" in text
    assert "best method" not in text


def test_a_best_method_whose_interval_holds_1_is_said_tied_with_the_target_alone():
    # speculative: 32 tokens in 4 x 1.6 + 4 x 2.6 = 16.8 s against 16 s, 0.95x; a prompt alone 1.25x or 0.77x, so its
    # resampled interval holds 1; prompt_lookup 0.64x
    samples = [s for s in three_methods(a=(1.6, 2.6), b=3.125) if s["gamma"] != 4]
    summary = summarize(samples, {})
    low, high = summary["best_method"][0]["speedup_ci95"]
    assert low < 1 < high
    assert (f"- batch=1 greedy, overall: best method speculative (speculative draft=d gamma=2 constant batch=1 greedy) "
            f"at 0.95x [{low:.2f}, {high:.2f}], tied with the target alone (the interval holds 1)") in markdown(summary)


def test_plots_keep_their_legend_off_the_bars_and_every_label_in_the_image(tmp_path, monkeypatch):
    samples = three_methods(group="a") + [dict(s, group="b", sample_id=s["sample_id"] + 8,
                                               batch_index=s["batch_index"] + 8) for s in three_methods()]
    long = "a-draft-model-with-a-name-long-enough-to-outgrow-the-figure-" * 2
    samples = [dict(s, draft=long) if s["draft"] else s for s in samples]
    summary = summarize(samples, {"group_by": "category"})
    original, checked = report._save, []

    def check(plot, out_dir, name, plt):
        plot.tight_layout()
        plot.canvas.draw()
        renderer = plot.canvas.get_renderer()
        for axes in plot.axes:
            legend = axes.get_legend()
            if legend is not None:
                assert legend.get_window_extent(renderer).x0 >= axes.get_window_extent(renderer).x1, name
        tight = plot.get_tightbbox(renderer)  # inches: every label, tick and legend
        written = original(plot, out_dir, name, plt)
        height, width = matplotlib.image.imread(out_dir / name).shape[:2]
        assert width >= tight.width * 110 - 2 and height >= tight.height * 110 - 2, name
        checked.append(name)
        return written

    monkeypatch.setattr(report, "_save", check)
    write_report(tmp_path, summary, "t")
    assert {"speedup.png", "methods.png", "speedup_by_group.png"} <= set(checked)


def test_under_load_a_line_says_why_there_is_no_engines_table():
    samples = [request(method, i, concurrency=2, first=0.1, finish=finish, tokens=4, requests=8,
                       **({"extra": {"engine": "llama_cpp", "llama_cpp_ttft_s": 0.1}} if method != "baseline" else {}))
               for i in range(8) for method, finish in (("baseline", 1.0), ("llama_cpp_generate", 0.5))]
    summary = summarize(samples, {})
    assert "engines" not in summary
    text = "\n".join(serving_lines(summary))
    assert "Engines: no table under load" in text and "llama.cpp's points and ours each read against their own" in text
    assert "no Engines" not in "\n".join(serving_lines(summarize([s for s in samples if s["method"] == "baseline"], {})))


def test_the_other_engines_are_those_not_home_by_their_capability(monkeypatch):
    """The report tells the engines apart by EngineCaps.home, not by a name: with the capability moved (llama.cpp
    declared home), the line under load names ours as the other engine."""
    from decode.methods import ENGINE_CAPS, EngineCaps

    samples = [request(method, i, concurrency=2, first=0.1, finish=finish, tokens=4, requests=8,
                       **({"extra": {"engine": "llama_cpp", "llama_cpp_ttft_s": 0.1}} if method != "baseline" else {}))
               for i in range(8) for method, finish in (("baseline", 1.0), ("llama_cpp_generate", 0.5))]
    summary = summarize(samples, {})
    monkeypatch.setitem(ENGINE_CAPS, "ours", EngineCaps())
    monkeypatch.setitem(ENGINE_CAPS, "llama_cpp", EngineCaps(home=True))
    text = "\n".join(serving_lines(summary))
    assert "here ours's points" in text and "llama.cpp's points" not in text
