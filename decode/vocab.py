"""Draft and target must speak the same tokenizer."""
from __future__ import annotations


class VocabMismatch(ValueError):
    pass


def check_vocab_compatible(target_tokenizer, draft_tokenizer, target_vocab_size: int, draft_vocab_size: int) -> int:
    """Refuse a draft whose tokenizer differs from the target's; return the common vocabulary size.

    The target must have an output row for every tokenizer id: it decides every token. The draft may
    have fewer rows (gemma-3-4b-it: 262208 rows, its tokenizer holds `<image_soft_token>` = 262144; the
    270m draft has 262144 rows): ids it lacks get q = 0 from the drafter and are clamped as its input, so
    the target's distribution is untouched. Embedding matrices may also be padded past the tokenizer
    (Qwen2.5 0.5B: 151936 rows, 7B: 152064). Ids the draft can produce must mean the same thing in both
    tokenizers, so the two vocabularies are compared on the ids below the draft's row count.
    """
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    largest_id = max(target_vocab.values())
    if largest_id >= target_vocab_size:
        raise VocabMismatch(
            f"tokenizer has token id {largest_id} but the target model has only {target_vocab_size} output rows; "
            "the model and tokenizer do not belong together")
    target_shared = {t: i for t, i in target_vocab.items() if i < draft_vocab_size}
    draft_shared = {t: i for t, i in draft_vocab.items() if i < draft_vocab_size}
    if target_shared != draft_shared:
        only_target = sorted(set(target_shared) - set(draft_shared))[:3]
        only_draft = sorted(set(draft_shared) - set(target_shared))[:3]
        moved = [t for t in target_shared if t in draft_shared and target_shared[t] != draft_shared[t]][:3]
        raise VocabMismatch(
            f"draft and target tokenizers differ on the ids below the draft's {draft_vocab_size} rows "
            f"(target {len(target_shared)} tokens, draft {len(draft_shared)}; only in target: {only_target}, "
            f"only in draft: {only_draft}, different ids: {moved}); pick a draft model from the same family as the target")
    if not draft_shared:
        raise VocabMismatch(f"the draft model has {draft_vocab_size} output rows: no token id it can produce")
    return min(target_vocab_size, draft_vocab_size)
