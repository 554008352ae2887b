"""The progress line's tok/s: what the report will say of the point."""
import io

from rich.console import Console

from runner.display import Display


def line_of(rows) -> str:
    out = io.StringIO()
    Display(Console(file=out, force_terminal=False, width=200), total=1).point_done("p", rows, "here")
    return out.getvalue()


def test_a_load_points_rate_is_over_its_span():
    # two requests of 32 tokens, arriving at 0 s and 12 s, each 8 s long: 64 tokens over the span to the last finish
    # (20 s) is 3.20 tok/s, as the report's output tok/s; over the slowest request (8 s) it would read 8.00
    rows = [{"new_tokens": 32, "latency_s": 8.0, "arrival_s": 0.0, "finish_s": 8.0},
            {"new_tokens": 32, "latency_s": 8.0, "arrival_s": 12.0, "finish_s": 20.0}]
    assert "3.20 tok/s so far" in line_of(rows)


def test_a_static_batchs_rate_is_over_its_longest_row():
    # a batch of two rows, 32 and 16 tokens, the longer 4 s: 48 / 4 = 12.00 tok/s
    rows = [{"new_tokens": 32, "latency_s": 4.0}, {"new_tokens": 16, "latency_s": 2.5}]
    assert "12.00 tok/s so far" in line_of(rows)
