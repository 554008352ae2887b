"""Draft and target must speak the same tokenizer."""
from __future__ import annotations


class VocabMismatch(ValueError):
    pass


def check_vocab_compatible(target_tokenizer, draft_tokenizer, target_vocab_size: int, draft_vocab_size: int) -> int:
    """Refuse a draft whose tokenizer differs from the target's; return the common vocabulary size.

    Embedding matrices may be padded past the tokenizer (Qwen2.5 0.5B: 151936 rows, 7B: 152064).
    That is fine: the drafter gives q = 0 to ids the draft cannot produce, so the target's
    distribution is untouched. Token ids themselves must mean the same thing in both.
    """
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        only_target = sorted(set(target_vocab) - set(draft_vocab))[:3]
        only_draft = sorted(set(draft_vocab) - set(target_vocab))[:3]
        moved = [t for t in target_vocab if t in draft_vocab and target_vocab[t] != draft_vocab[t]][:3]
        raise VocabMismatch(
            f"draft and target tokenizers differ (target {len(target_vocab)} tokens, draft {len(draft_vocab)}; "
            f"only in target: {only_target}, only in draft: {only_draft}, different ids: {moved}); "
            "pick a draft model from the same family as the target")
    largest_id = max(target_vocab.values())
    common = min(target_vocab_size, draft_vocab_size)
    if largest_id >= common:
        raise VocabMismatch(
            f"tokenizer has token id {largest_id} but the {'draft' if draft_vocab_size <= target_vocab_size else 'target'} "
            f"model has only {common} output rows; the model and tokenizer do not belong together")
    return common
