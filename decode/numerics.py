"""Probes of a model's numerics on the engine's own cache path (decode/kv.py).

- `position_bias_probe`: does a row's output depend on where its slots sit in the cache? Architectures
  that build their position bias from slot indices rather than from position ids or the mask (MPT's
  ALiBi) see left padding and rollback holes as distance, an O(1) logit error in ragged batches.
- `numerics_probe`: how far the engine's batched paths drift from the plain ones by rounding alone.
- `ragged_batch_problem`: the reason to refuse batch > 1 for a model, or None.
"""
from __future__ import annotations

import torch

from decode.kv import KVState
from decode.static_kv import new_state

PAD_SLOTS = 48  # left padding of the short row: long enough that a slot-index bias is O(1)
HOLE_SLOTS = 8  # rollback holes left inside the short row
# a slot-position bias must exceed rounding by this factor (and a floor relative to the logits' scale)
BIAS_OVER_DRIFT = 100.0
BIAS_OVER_ROW = 10.0  # ... and the unpadded row's error in the same batch by this one
BIAS_OVER_SCALE = 1e-2


def _probe_ids(model, length: int, seed: int) -> torch.Tensor:
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    return torch.randint(3, max(4, min(vocab, 1000)), (1, length), generator=generator).to(device)  # [1, S]


def _alone(model, ids: torch.Tensor, continuation: torch.Tensor, stepwise: bool = False) -> torch.Tensor:
    """fp32 logits [1, C, V] of continuation [1, C] after prompt ids [1, P], with no padding and no holes: in one
    forward, or one token at a time (stepwise: at batch 1 that is the M = 1 kernel path a batch-1 baseline decodes on)."""
    state = new_state(model)
    state.forward(model, ids, last_only=True)
    if not stepwise:
        return state.forward(model, continuation)
    return torch.cat([state.forward(model, continuation[:, i:i + 1]) for i in range(continuation.shape[1])], dim=1)


@torch.inference_mode()
def position_bias_probe(model, pad_slots: int = PAD_SLOTS, hole_slots: int = HOLE_SLOTS) -> float:
    """Max |logit difference| on real positions between a ragged two-row batch and each row alone."""
    return max(position_bias_rows(model, pad_slots, hole_slots))


@torch.inference_mode()
def position_bias_rows(model, pad_slots: int = PAD_SLOTS, hole_slots: int = HOLE_SLOTS) -> tuple[float, float]:
    """(the unpadded row's, the padded row's) max |logit difference| between a ragged two-row batch and each row alone.

    Row 0 is long, with no padding and no holes; row 1 is short, left padded by pad_slots, and then carries
    hole_slots rollback holes (tokens fed and rolled back through KVState, as a rejected draft is). Both rows then
    feed the same continuation. Slot-independent models agree up to rounding; a slot-index position bias does not,
    in row 1 only. Row 0 ran through the same kernels in the same batch: its difference is the batch's rounding
    (on a GPU in bf16, kernels of another batch size round otherwise; none of it is position).
    """
    long_ids, short_ids = _probe_ids(model, pad_slots + 6, 11), _probe_ids(model, 6, 12)
    continuation = _probe_ids(model, 4, 13)  # [1, C]
    width = long_ids.shape[1]
    ids = torch.cat([long_ids, torch.cat([long_ids.new_zeros(1, width - short_ids.shape[1]), short_ids], 1)])  # [2, P]
    mask = torch.ones_like(ids)
    mask[1, : width - short_ids.shape[1]] = 0
    state = KVState()
    state.forward(model, ids, mask, last_only=True)
    rejected = _probe_ids(model, hole_slots, 14).expand(2, -1)
    state.forward(model, rejected)
    state.keep_prefix_of_last(hole_slots, torch.tensor([hole_slots, 0], device=ids.device), hole_slots)
    together = state.forward(model, continuation.expand(2, -1))  # [2, C, V]
    rows = [_alone(model, torch.cat([long_ids, rejected[:1]], 1), continuation), _alone(model, short_ids, continuation)]
    unpadded, padded = (float((together[row] - alone[0]).abs().max()) for row, alone in enumerate(rows))
    return unpadded, padded


@torch.inference_mode()
def numerics_probe(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, widths: tuple[int, ...] = (5,),
                   single_steps: bool = False) -> dict:
    """Rounding drift of the engine's paths on the given left-padded prompts [B, P], through the state the engine
    keeps for this model (decode/static_kv.py new_state: the compiled step and its static cache where engine.compile
    attached one, so the probe reads the kernels the run uses; one state alive at a time, so it reuses the run's
    buffers and graphs).

    verify_vs_stepwise_max_logit_diff: one M-token forward after a prefill (a verification of M - 1 drafts) vs the
    same tokens fed one by one, the max over the verify widths M given (each in verify_vs_stepwise_by_width: a
    kernel can take another path at another M). batched_vs_single_max_logit_diff: each row's logits in the ragged
    batch vs the row forwarded alone (prompt and the same tokens, at the widest M). single_steps (quantized kernels,
    whose M = 1 path is its own, e.g. bitsandbytes 4-bit's gemv): also single_stepwise_max_logit_diff, the batch's
    widest verification vs each row alone fed one token at a time (what a batch-1 baseline computes).
    """
    widths = sorted(set(widths))
    tokens = _probe_ids(model, widths[-1], 21).expand(prompt_ids.shape[0], -1).to(prompt_ids.device)  # [B, T]
    stepwise = new_state(model)
    stepwise.forward(model, prompt_ids, prompt_mask, last_only=True)
    stepped = torch.cat([stepwise.forward(model, tokens[:, i:i + 1]) for i in range(widths[-1])], dim=1)  # [B, T, V]
    del stepwise  # its static buffers free for the next state
    by_width = {}
    for width in widths:
        verify = new_state(model)
        verify.forward(model, prompt_ids, prompt_mask, last_only=True)
        verified = verify.forward(model, tokens[:, :width])  # [B, M, V]
        del verify
        by_width[str(width)] = float((verified - stepped[:, :width]).abs().max())
    batched_diff, single_diff = 0.0, 0.0
    for row in range(prompt_ids.shape[0]):
        real = prompt_ids[row:row + 1, prompt_mask[row].bool()]
        alone = _alone(model, real, tokens[row:row + 1])
        batched_diff = max(batched_diff, float((verified[row] - alone[0]).abs().max()))
        if single_steps:
            single = _alone(model, real, tokens[row:row + 1], stepwise=True)
            single_diff = max(single_diff, float((verified[row] - single[0]).abs().max()))
    result = {"verify_vs_stepwise_max_logit_diff": float(torch.tensor(list(by_width.values())).max()),  # NaN stays
              "verify_vs_stepwise_by_width": by_width,
              "batched_vs_single_max_logit_diff": batched_diff, "tokens": widths[-1]}
    if single_steps:
        result["single_stepwise_max_logit_diff"] = single_diff
    return result


@torch.inference_mode()
def ragged_batch_problem(model) -> str | None:
    """A one-line reason to refuse batch > 1 for this model, or None.

    A slot-position bias is told from rounding by comparing the padded row's error with the rounding of the
    same model: the drift of its verify-vs-stepwise forwards, and the error of the unpadded row of the same batch
    (the batch's own kernels); and with the scale of its logits.
    """
    unpadded, bias = position_bias_rows(model)
    ids = _probe_ids(model, 12, 31)
    drift = numerics_probe(model, ids, torch.ones_like(ids))
    rounding = max(drift["verify_vs_stepwise_max_logit_diff"], unpadded)
    scale = float(_alone(model, ids[:, :-1], ids[:, -1:]).std())
    bound = max(BIAS_OVER_DRIFT * drift["verify_vs_stepwise_max_logit_diff"], BIAS_OVER_ROW * unpadded,
                BIAS_OVER_SCALE * scale)
    if bias > bound:
        arch = type(model).__name__
        return (f"{arch} builds its position bias from cache slots, not positions: a row in a ragged batch "
                f"gets other logits than alone (max diff {bias:.3g}, above the {bound:.2g} that rounding of "
                f"{rounding:.2g} could explain); use batch_size 1")
    return None
