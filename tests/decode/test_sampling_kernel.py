"""The accept/resample step outputs exactly p, including the awkward supports."""
import pytest
import torch

from decode.sampling import (acceptance_probability, accept_sampled, logits_to_probs, residual_distribution)

V = 7


def exact_output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(out = x) of one step, from the kernel's own formulas: drafted x accepted, or a rejection then residual."""
    accept = acceptance_probability(p, q)  # per token x: P(accept | drafted x)
    accepted_mass = q * accept
    return accepted_mass + (1 - accepted_mass.sum()) * residual_distribution(p, q)


def pairs():
    g = torch.Generator().manual_seed(0)
    rand = lambda: torch.softmax(torch.randn(V, generator=g) * 2, -1)
    p, q = rand(), rand()
    q_zero = q.clone(); q_zero[[1, 4]] = 0; q_zero /= q_zero.sum()  # q has zeros where p has mass
    p_zero = p.clone(); p_zero[[0, 5]] = 0; p_zero /= p_zero.sum()  # p has zeros where q has mass
    lp, lq = torch.randn(V, generator=g) * 2, torch.randn(V, generator=g) * 2
    return {
        "random": (p, q),
        "q_zero_where_p_not": (p, q_zero),
        "p_zero_where_q_not": (p_zero, q),
        "disjoint_support": (torch.tensor([.5, .5, 0, 0, 0, 0, 0]), torch.tensor([0, 0, .2, .8, 0, 0, 0])),
        "top_k_pair": (logits_to_probs(lp, top_k=3), logits_to_probs(lq, top_k=3)),
        "top_p_pair": (logits_to_probs(lp, 0.7, top_p=0.8), logits_to_probs(lq, 0.7, top_p=0.8)),
        "identical": (p, p.clone()),
        "one_hot_draft": (p, torch.nn.functional.one_hot(torch.tensor(2), V).float()),
    }


@pytest.mark.parametrize("name", list(pairs()))
def test_one_step_distribution_is_exactly_p(name):
    p, q = pairs()[name]
    out = exact_output_distribution(p.double(), q.double())
    assert torch.allclose(out, p.double(), atol=1e-6), (out, p)


@pytest.mark.parametrize("name", ["random", "q_zero_where_p_not", "p_zero_where_q_not", "top_p_pair"])
def test_kernel_draws_match_p(name):
    """The kernel itself (not only its formulas): many rows, one draft each, first output token ~ p."""
    p, q = pairs()[name]
    rows = 200_000
    g = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(q, rows, replacement=True, generator=g)[:, None]  # [B, 1] drawn from q
    target_probs = p.expand(rows, 2, V)  # position 1 (the bonus) is p too
    accepted_len, next_token = accept_sampled(drafts, q.expand(rows, 1, V), target_probs,
                                              torch.ones(rows, dtype=torch.long), g)
    first = torch.where(accepted_len == 1, drafts[:, 0], next_token)
    empirical = torch.bincount(first, minlength=V).double() / rows
    assert (empirical - p.double()).abs().max() < 0.005
    # accepted rows then draw the bonus from p as well
    bonus = torch.bincount(next_token[accepted_len == 1], minlength=V).double()
    if bonus.sum() > 10_000:
        assert (bonus / bonus.sum() - p.double()).abs().max() < 0.01


def test_acceptance_rate_matches_overlap():
    """Under speculative sampling P(accept) = sum_x min(p, q) (Leviathan's alpha)."""
    p, q = pairs()["random"]
    rows = 200_000
    g = torch.Generator().manual_seed(2)
    drafts = torch.multinomial(q, rows, replacement=True, generator=g)[:, None]
    accepted_len, _ = accept_sampled(drafts, q.expand(rows, 1, V), p.expand(rows, 2, V),
                                     torch.ones(rows, dtype=torch.long), g)
    assert abs(accepted_len.double().mean().item() - torch.minimum(p, q).sum().item()) < 0.005


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), top_p=0.75)
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0, 0]))
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), top_k=3)
    assert probs[3] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
