"""Greedy speculative decoding returns the target's own tokens, row by row."""
import pytest
import torch

from decode import (Clock, DraftModelDrafter, Drafter, Generation, Proposal, Sampling, generate_baseline,
                    generate_speculative)
from tiny_models import VOCAB, ragged_batch, tiny_model

ARCHS = ["llama", "gpt2", "qwen2"]


def run_pair(arch, lengths, gamma, max_new_tokens=24, eos=(), draft=None, target=None, seed=0):
    target = target or tiny_model(arch, seed=1, layers=3)
    draft = draft or tiny_model(arch, seed=2, layers=1)
    ids, mask = ragged_batch(lengths, seed=seed)
    generation = Generation(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos))
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma)
    return base, spec


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("lengths", [[7], [5, 11, 1, 8, 3]], ids=["batch1", "ragged5"])
def test_greedy_speculative_equals_baseline(arch, gamma, lengths):
    base, spec = run_pair(arch, lengths, gamma)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"row {row} diverged"
        assert s.new_tokens == 24
        assert sum(r["emitted"] for r in s.rounds) + 1 == s.new_tokens  # + the prefill's token
        assert s.target_forwards == len(s.rounds) + 1


def test_batched_rows_equal_single_prompt_runs():
    """Left padding, masked rollback and dropped rows do not change a row's tokens."""
    lengths = [4, 9, 2, 6]
    target, draft = tiny_model("llama", seed=1, layers=3), tiny_model("llama", seed=2, layers=1)
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens=20)
    with torch.inference_mode():
        batched = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
        for row, length in enumerate(lengths):
            prompt = ids[row:row + 1, -length:]
            single = generate_baseline(target, prompt, torch.ones_like(prompt), generation)
            assert batched[row].output_ids == single[0].output_ids, f"row {row}"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_draft_equal_to_target_accepts_everything(arch):
    target = tiny_model(arch, seed=1, layers=2)
    gamma, max_new = 4, 23
    base, spec = run_pair(arch, [6, 3, 9], gamma, max_new_tokens=max_new, draft=target, target=target)
    for b, s in zip(base, spec):
        assert s.output_ids == b.output_ids
        for r in s.rounds[:-1]:
            assert r["accepted"] == r["drafted"] == gamma
            assert r["emitted"] == gamma + 1
        assert sum(r["accepted"] for r in s.rounds) == sum(r["drafted"] for r in s.rounds)


def test_a_draft_window_prefills_the_prompts_last_tokens_and_stays_exact():
    # the target as its own draft: with the whole prompt every draft is accepted; with a window of 3 tokens the draft
    # continues the prompts' last 3 tokens instead, exactly as a draft given only those tokens does, and the target
    # still decides every token
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([6, 2, 9])
    with torch.inference_mode():
        windowed = DraftModelDrafter(target, VOCAB, Sampling(), context=3)
        windowed.start(ids, mask)
        assert windowed.state.mask.shape[1] == 3  # the widest row's window, not the prompts' 9 columns
        alone = DraftModelDrafter(target, VOCAB, Sampling())
        alone.start(ids[:, -3:], mask[:, -3:])  # left padded: each row's last 3 tokens (the 2-token row: 2)
        last = torch.tensor([5, 6, 7])
        assert torch.equal(windowed.propose(last, 4).tokens, alone.propose(last, 4).tokens)
        generation = Generation(max_new_tokens=20)
        base = generate_baseline(target, ids, mask, generation)
        whole = generate_speculative(target, DraftModelDrafter(target, VOCAB, Sampling()), ids, mask, generation, 4)
        spec = generate_speculative(target, DraftModelDrafter(target, VOCAB, Sampling(), context=3), ids, mask,
                                    generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base] == [s.output_ids for s in whole]
    accepted = lambda records: sum(r["accepted"] for s in records for r in s.rounds)  # noqa: E731
    drafted = lambda records: sum(r["drafted"] for s in records for r in s.rounds)  # noqa: E731
    assert accepted(whole) == drafted(whole)
    assert accepted(spec) < drafted(spec)  # the window changed what the draft proposed


def test_gamma_larger_than_budget_is_clipped():
    base, spec = run_pair("llama", [5, 2], gamma=8, max_new_tokens=5)
    for b, s in zip(base, spec):
        assert s.output_ids == b.output_ids and s.new_tokens == 5
        assert all(r["drafted"] <= 3 for r in s.rounds)  # 5 tokens: 1 from prefill, then at most 4 a round


def test_one_token_prompt_and_max_new_tokens_one():
    base, spec = run_pair("qwen2", [1, 1], gamma=3, max_new_tokens=1)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert all(s.new_tokens == 1 and s.rounds == [] for s in spec)
    base, spec = run_pair("qwen2", [1], gamma=3, max_new_tokens=12)
    assert spec[0].output_ids == base[0].output_ids


def test_eos_accepted_from_draft_cuts_the_row():
    target = tiny_model("llama", seed=1, layers=2)
    lengths = [6, 3, 9, 4]
    # pick as EOS a token the target produces mid-sequence in some row, so that with draft == target
    # it is proposed by the draft and accepted inside a run
    base_full, _ = run_pair("llama", lengths, 4, max_new_tokens=20, draft=target, target=target)
    eos = base_full[0].output_ids[5]
    base, spec = run_pair("llama", lengths, 4, max_new_tokens=20, eos=[eos], draft=target, target=target)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert spec[0].output_ids[-1] == eos and spec[0].stop_reason == "eos"
    assert spec[0].new_tokens <= 6
    assert any(s.new_tokens < 20 for s in spec)
    for s in spec:
        assert s.output_ids.count(eos) <= 1


def test_drafts_past_an_eos_are_not_counted_as_accepted():
    """draft == target accepts every draft; with EOS the 3rd draft of row 0's first round (output index 3: index 0 is
    the prefill's token), the round emits 3 tokens, all drafts: drafted 4, accepted 3 (not 4), emitted 3."""
    target = tiny_model("llama", seed=1, layers=2)
    base_full, _ = run_pair("llama", [6], 4, max_new_tokens=20, draft=target, target=target)
    eos = base_full[0].output_ids[3]
    assert eos not in base_full[0].output_ids[:3], "the test needs an EOS that first appears at index 3"
    base, spec = run_pair("llama", [6], 4, max_new_tokens=20, eos=[eos], draft=target, target=target)
    assert spec[0].output_ids == base[0].output_ids == base_full[0].output_ids[:4]
    assert [(r["drafted"], r["accepted"], r["emitted"]) for r in spec[0].rounds] == [(4, 3, 3)]


def test_padded_draft_vocab_is_restricted_to_common():
    target = tiny_model("llama", seed=1, layers=2, vocab_size=VOCAB)
    draft = tiny_model("llama", seed=2, layers=1, vocab_size=VOCAB - 16)  # fewer output rows
    ids, mask = ragged_batch([5, 8], vocab_size=VOCAB - 16)
    generation = Generation(max_new_tokens=16)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]


class ScriptedDrafter(Drafter):
    """Drafts, per round and row, a scripted number of the target's own next tokens (read from a baseline run),
    one of them made wrong where the script says: each row's drafted and accepted lengths are known in advance."""

    def __init__(self, outputs: list[list[int]], script):
        self.outputs = outputs  # each row's baseline tokens
        self.script = script  # (round, row) -> (length, wrong_at or None)
        self.commits = []  # (rows, drafted_host, accepted_host) as the engine reported them

    def start(self, prompt_ids, prompt_mask, host=None):
        self.rows = list(range(prompt_ids.shape[0]))  # original row of each local row
        self.known = [0] * len(self.rows)  # baseline tokens each row has committed
        self.round = 0

    def propose(self, last_tokens, max_tokens, row_limits=None):
        drafts = []
        for local, (row, token) in enumerate(zip(self.rows, last_tokens.tolist())):
            assert token == self.outputs[row][self.known[local]], "the engine handed over a wrong last token"
            self.known[local] += 1
            length, wrong_at = self.script(self.round, row)
            start = self.known[local]
            draft = self.outputs[row][start: start + min(length, max_tokens, row_limits[local])]
            if wrong_at is not None and wrong_at < len(draft):
                draft[wrong_at] = (draft[wrong_at] + 1) % VOCAB
            drafts.append(draft)
        self.round += 1
        tokens = torch.zeros(len(drafts), max(len(d) for d in drafts), dtype=torch.long)  # [B, G]
        for local, draft in enumerate(drafts):
            tokens[local, :len(draft)] = torch.tensor(draft, dtype=torch.long)
        return Proposal(tokens, None, torch.tensor([len(d) for d in drafts]))

    def commit(self, accepted_len, accepted_len_host, drafted_host):
        self.commits.append((list(self.rows), list(drafted_host), list(accepted_len_host)))
        self.known = [k + a for k, a in zip(self.known, accepted_len_host)]

    def select_rows(self, rows):
        kept = rows.tolist()
        self.rows = [self.rows[r] for r in kept]
        self.known = [self.known[r] for r in kept]


LENGTHS = [[4, 1, 0], [2, 3, 4], [0, 0, 0], [3, 0, 2], [1, 4, 4]]  # round 2: no row drafts, a plain target step


def script(round_index: int, row: int):
    wrong_at = (round_index + row) % 4 if (round_index + row) % 3 == 0 else None
    return LENGTHS[round_index % len(LENGTHS)][row], wrong_at


def expected_rounds(rows: int, gamma: int, max_new_tokens: int) -> list[list[dict]]:
    """Each row's rounds, worked out from the script: drafted = the scripted length clipped to the budget,
    accepted = the drafts before the wrong one, emitted = accepted + 1."""
    new_tokens, rounds = [1] * rows, [[] for _ in range(rows)]
    round_index = 0
    while any(n < max_new_tokens for n in new_tokens):
        for row in range(rows):
            if new_tokens[row] == max_new_tokens:
                continue
            length, wrong_at = script(round_index, row)
            drafted = min(length, gamma, max_new_tokens - new_tokens[row] - 1)
            accepted = drafted if wrong_at is None else min(wrong_at, drafted)
            rounds[row].append({"drafted": drafted, "accepted": accepted, "emitted": accepted + 1})
            new_tokens[row] += accepted + 1
        round_index += 1
    return rounds


def test_variable_draft_lengths_are_recorded_per_row():
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([5, 9, 2])
    gamma, max_new = 4, 17
    generation = Generation(max_new_tokens=max_new)
    widths = []
    target.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                     with_kwargs=True)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        widths.clear()
        drafter = ScriptedDrafter([b.output_ids for b in base], script)
        spec = generate_speculative(target, drafter, ids, mask, generation, gamma)
    expected = expected_rounds(3, gamma, max_new)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert [s.rounds for s in spec] == expected
    assert all(s.target_forwards == 1 + len(s.rounds) and s.draft_forwards == 0 for s in spec)
    # the engine told the drafter each row's verified length; the target's forward was as wide as the widest
    # row's draft plus one: one token alone in a round where no row drafted
    reported = {}
    for rows, drafted, accepted in drafter.commits:
        for row, d, a in zip(rows, drafted, accepted):
            reported.setdefault(row, []).append({"drafted": d, "accepted": a})
    assert reported == {row: [{"drafted": r["drafted"], "accepted": r["accepted"]} for r in rounds]
                        for row, rounds in enumerate(expected)}
    by_round = [[rounds[i]["drafted"] for rounds in expected if i < len(rounds)]
                for i in range(max(map(len, expected)))]
    assert widths[1:] == [max(drafted) + 1 for drafted in by_round]
    assert 1 in widths[1:]


def test_clock_syncs_each_cuda_device_once():
    """A model split by a device map spans several GPUs: the clock syncs every CUDA device the models use, each
    once, and skips the CPU (no device is touched here: only the list the clock will synchronise)."""
    clock = Clock("cuda:1", extra_devices=("cpu", "cuda:0", "cuda:1", torch.device("cuda:0")))
    assert clock.cuda_devices == [torch.device("cuda:1"), torch.device("cuda:0")]
    assert Clock("cpu").cuda_devices == [] and Clock("cpu").now() > 0
