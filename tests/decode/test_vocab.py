"""The vocabulary check: the target must cover the tokenizer, the draft only the ids it can produce."""
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from decode.vocab import VocabMismatch, check_vocab_compatible


def word_level(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), unk_token="<unk>")


# shaped like gemma-3: the draft's LM head (64 rows, like the 270m's 262144) ends right below
# `<image_soft_token>` (like 262144), which the target's head (80 rows, like 262208) covers
BASE = {"<unk>": 0, **{f"w{i}": i for i in range(1, 64)}}
GEMMA_LIKE = {**BASE, "<image_soft_token>": 64}


def test_gemma_shaped_pair_is_accepted():
    target, draft = word_level(GEMMA_LIKE), word_level(GEMMA_LIKE)
    assert check_vocab_compatible(target, draft, 80, 64) == 64
    # the draft's tokenizer may even lack the extra token: ids at or past its rows are never compared
    assert check_vocab_compatible(target, word_level(BASE), 80, 64) == 64
    # padded heads on both sides (Qwen2.5-like)
    assert check_vocab_compatible(target, draft, 96, 72) == 72


def test_id_past_the_target_rows_is_refused():
    with pytest.raises(VocabMismatch, match="target model has only 64 output rows"):
        check_vocab_compatible(word_level(GEMMA_LIKE), word_level(GEMMA_LIKE), 64, 80)


def test_different_tokenizers_are_refused():
    swapped = {**GEMMA_LIKE, "w5": 6, "w6": 5}
    with pytest.raises(VocabMismatch, match="tokenizers differ"):
        check_vocab_compatible(word_level(GEMMA_LIKE), word_level(swapped), 80, 64)
    renamed = {**{k: v for k, v in GEMMA_LIKE.items() if k != "w9"}, "x9": 9}
    with pytest.raises(VocabMismatch, match="tokenizers differ"):
        check_vocab_compatible(word_level(GEMMA_LIKE), word_level(renamed), 80, 64)
    # a draft id the target lacks, below the draft's rows
    with pytest.raises(VocabMismatch, match="tokenizers differ"):
        check_vocab_compatible(word_level(BASE), word_level(GEMMA_LIKE), 80, 72)


def test_a_draft_with_fewer_embedding_rows_takes_a_prompt_id_it_lacks():
    """A draft whose vocabulary ends below the target's (gemma-3 270m for 4b) is fed a prompt holding an id past its
    rows: its prefill clamps as every later feed does, and the output is still the target's own."""
    import torch

    from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
    from tests.tiny_models import VOCAB, ragged_batch, tiny_model

    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1, vocab_size=VOCAB - 16)
    ids, mask = ragged_batch([6, 9], seed=3)
    ids[:, -2] = VOCAB - 1  # an id the draft has no embedding for, in both rows' prompts
    generation = Generation(max_new_tokens=12)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
