"""python -m eval.recommend and what reads its recommend.json (#82): each bad input one line naming the file, flag or
key and the fix, exit 2; the settings each engine can load; the warnings an incomplete or far-off reading gets."""
import json
from types import SimpleNamespace

import pytest

from helpers import assert_one_clean_line
from test_recommend import folder, profile, row, run

from eval import recommend as rec


def one_line(code, capsys, fragment):
    assert_one_clean_line(SimpleNamespace(returncode=code, stderr=capsys.readouterr().err), fragment)


# ---- acceptance files (item 16) --------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, fragment", [
    # true is no count (read as 1 before)
    ({"synthetic_acceptance_rates": [0.5], "num_speculative_tokens": True}, "num_speculative_tokens is true, not a count"),
    # vLLM refuses synthetic rates with its standard rejection sampler
    ({"rejection_sample_method": "standard", "synthetic_acceptance_rates": [0.5]},
     'rejection_sample_method is "standard" beside synthetic_acceptance_rates'),
    # rates 0.8, 0.8 x 0.5 = 0.4: acceptance_length 2.2, not 3.5
    ({"acceptance_rates": [0.8, 0.5], "acceptance_length": 3.5}, "acceptance_length is 3.5 but its acceptance_rates "
                                                                 "give 2.2"),
    ({"synthetic_acceptance_rates": [0.5], "acceptance_rates": [0.5]}, "has both synthetic_acceptance_rates"),
    ([0.8, 0.6], "is a JSON list; give vLLM's synthetic form"),
])
def test_an_acceptance_file_that_reads_two_ways_is_refused(tmp_path, capsys, data, fragment):
    (tmp_path / "a.json").write_text(json.dumps(data))
    profile().save(tmp_path / "p.json")
    one_line(rec.main(["--acceptance", str(tmp_path / "a.json"), "--costs", str(tmp_path / "p.json")]), capsys, fragment)


def test_an_acceptance_length_that_agrees_is_read():
    from eval import acceptance_io
    assert acceptance_io.parse({"acceptance_rates": [0.8, 0.5], "acceptance_length": 2.2,
                                "num_speculative_tokens": 2}) == ([0.8, 0.4], "specdec_bench")
