"""End to end: speculative sampling draws from the target's distribution, not the draft's."""
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts, sampling_pair


@pytest.mark.parametrize("sampling", [Sampling(True, 1.0), Sampling(True, 0.7, top_p=0.9)], ids=["t1.0", "t0.7-top_p0.9"])
def test_speculative_sampling_matches_target_distribution(sampling):
    target, draft = sampling_pair()
    rows = 20_000
    ids = PROMPT.expand(rows, -1).contiguous()
    mask = torch.ones_like(ids)
    generation = Generation(max_new_tokens=4, sampling=sampling)  # tokens 2..4 come from one round of 2 drafts
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        spec = generate_speculative(target, DraftModelDrafter(draft, V, sampling, generator), ids, mask,
                                    generation, gamma=2, generator=generator)
        draft_alone = generate_baseline(draft, ids, mask, generation, generator)
    assert all(r.rounds[0]["drafted"] == 2 for r in spec)
    acceptance = sum(r.rounds[0]["accepted"] for r in spec) / (2 * rows)
    assert 0.05 < acceptance < 0.95, "draft and target should disagree sometimes for the test to bite"
    expected = exact_joint_of_tokens_2_and_3(target, sampling)
    statistic, critical = chi_square(joint_counts(spec), expected)
    assert statistic < critical, f"speculative sampling is off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"
    # the same test does reject the draft's own distribution: it has the power to catch a wrong kernel
    statistic_draft, _ = chi_square(joint_counts(draft_alone), expected)
    assert statistic_draft > 3 * critical
