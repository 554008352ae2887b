"""A chi-square goodness-of-fit check with no SciPy, and the exact distribution that sampled tokens are checked
against: the joint of the 2nd and 3rd new tokens of a small-vocabulary target, enumerated."""
from __future__ import annotations

import math

import torch

from decode import Sampling
from decode.sampling import logits_to_probs
from tiny_models import tiny_model

V = 12  # the vocabulary of the models whose joint is enumerated: V^3 continuations
PROMPT = torch.tensor([[3, 7, 5, 9]])


def sampling_pair():
    """The target and draft of the sampling tests, over V: a 2-layer target and a 1-layer draft of another seed, whose
    distributions differ enough that a draft sample passed through unchecked is off the target's."""
    return (tiny_model("llama", seed=1, vocab_size=V, layers=2, hidden=32, init_range=0.3),
            tiny_model("llama", seed=7, vocab_size=V, layers=1, hidden=32, init_range=0.3))


def joint_counts(records) -> torch.Tensor:
    """How often each (2nd, 3rd) new token pair was sampled, [V * V]: what exact_joint_of_tokens_2_and_3 predicts."""
    pairs = torch.tensor([r.output_ids[1] * V + r.output_ids[2] for r in records])
    return torch.bincount(pairs, minlength=V * V)


def chi_square(observed_counts: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0):
    """Returns (statistic, 99.9% critical value); bins expected below min_expected are pooled."""
    total = observed_counts.sum().item()
    expected = expected_probs.double() * total
    small = expected < min_expected
    observed = observed_counts.double()
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    statistic = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    dof = int(keep.sum().item()) - 1
    z = 3.09  # one-sided 99.9%; Wilson-Hilferty approximation of the chi-square quantile
    critical = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return statistic, critical


def exact_joint_of_tokens_2_and_3(model, sampling: Sampling, prompt: torch.Tensor = PROMPT) -> torch.Tensor:
    """P(t2, t3) = sum_t1 P(t1) P(t2 | t1) P(t3 | t1, t2) under the warped target, [V * V]; prompt [1, P]."""
    with torch.inference_mode():
        p1 = logits_to_probs(model(prompt).logits[0, -1], sampling.temperature, sampling.top_k, sampling.top_p)
        t1 = torch.arange(V)[:, None]
        seq1 = torch.cat([prompt.expand(V, -1), t1], 1)
        p2 = logits_to_probs(model(seq1).logits[:, -1], sampling.temperature, sampling.top_k, sampling.top_p)
        seq2 = torch.cat([seq1.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)
        p3 = logits_to_probs(model(seq2).logits[:, -1], sampling.temperature, sampling.top_k,
                             sampling.top_p).view(V, V, V)
    joint = p1[:, None, None].double() * p2[:, :, None].double() * p3.double()  # [t1, t2, t3]
    return joint.sum(0).flatten()
