"""suffix and hybrid: the suffix trie's counts and scores by hand, greedy output equal to the target's (architectures,
ragged batches, EOS), the target's distribution under sampling (chi-square), acceptance per source by hand."""
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.hybrid import HybridDrafter, LengthRecord, StartRecord, StepPrices, plan_row
from decode.drafters.suffix import SuffixCache, SuffixDrafter, SuffixTrie, remember_outputs
from eval.sources import acceptance_by_source
from stats import V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts, sampling_pair
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model

CHEAP = (0.02, {k: 1.0 for k in range(1, 9)})  # c, v: a tree of a free source and the draft wins whenever both exist
DEAR = (0.6, {k: 1.0 + 0.25 * k for k in range(1, 9)})  # the draft seldom pays: free sources or plain steps


def test_suffix_trie_counts_and_scores_by_hand():
    trie = SuffixTrie(depth=3)
    trie.extend([1, 2, 3, 1, 2, 4, 1, 2, 3])
    # 9 positions; "1 2" starts at 0, 3, 6; "1 2 3" at 0 and 6, "1 2 4" at 3; "2 3" at 1 and 7, "2 3 1" at 1 only
    # (the one at 7 has no third token), "3 1 2" at 2
    assert trie.root.count == 9
    assert trie.find([1]).count == 3 and trie.find([1, 2]).count == 3
    assert trie.find([1, 2, 3]).count == 2 and trie.find([1, 2, 4]).count == 1
    assert trie.find([2, 3, 1]).count == 1 and trie.find([1, 2, 3, 1]) is None  # depth 3
    whole = SuffixTrie(depth=3)
    whole.add([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert all(whole.find(p).count == trie.find(p).count for p in ([1], [2, 3], [1, 2, 4], [3, 1, 2]))
    # context "... 1 2": m = 1, node "2": children 3 (2 occurrences) and 4 (1): 3 with 2/3; under "2 3": 1 (1 of 1),
    # 2/3 * 1; depth 3 allows 2 tokens: [3, 1], score 4/3. m = 2, node "1 2": 3 with 2/3, one token: score 2/3
    tokens, probs, match = trie.speculate([5, 1, 2], max_depth=4, max_tokens=4, min_prob=0.0)
    assert (tokens, match) == ([3, 1], 1) and probs == pytest.approx([2 / 3, 2 / 3])
    # under a threshold of 0.7 nothing is confident enough at m = 1 or m = 2
    assert trie.speculate([5, 1, 2], max_depth=4, max_tokens=4, min_prob=0.7)[0] == []
    # a tree of 2 nodes from the longest match ("1 2"): 3 (2/3), then 4 (1/3)
    tokens, parents, probs = trie.speculate_tree([5, 1, 2], max_depth=4, budget=2, max_tokens=1, min_prob=0.0)
    assert (tokens, parents) == ([3, 4], [-1, -1]) and probs == pytest.approx([2 / 3, 1 / 3])


def test_suffix_cache_is_bounded_and_forgets_a_repeated_prompt():
    cache = SuffixCache(depth=3, max_tokens=5)
    cache.remember((1,), [7, 8, 9])
    cache.remember((2,), [7, 8, 6])
    # 6 tokens > 5: the oldest output (7 8 9) is taken out: only 7 8 6 is left
    assert cache.tokens == 3 and cache.trie.find([7, 8]).count == 1 and cache.trie.find([8, 9]) is None
    cache.forget((2,))
    assert cache.tokens == 0 and cache.trie.root.count == 0 and not cache.trie.root.children


def _hybrid(draft, costs, sampling=Sampling(), generator=None, cache=None, merge=True, vocab=VOCAB, gamma=4,
            confidence=None):
    c, v = costs
    return HybridDrafter(DraftModelDrafter(draft, vocab, sampling, generator), vocab, gamma, c, v, cache=cache,
                         merge=merge, confidence=confidence)


def _repetitive(lengths, seed):
    """Ragged prompts whose second half repeats the first, so lookup and suffix find matches."""
    ids, mask = ragged_batch(lengths, seed=seed)
    for row, length in enumerate(lengths):
        half = length // 2
        if half:
            ids[row, -half:] = ids[row, -2 * half:-half].clone()
    return ids, mask


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("lengths", [[9], [6, 13, 3]], ids=["batch1", "ragged3"])
def test_greedy_suffix_and_hybrid_equal_the_target(arch, lengths):
    target = tiny_model(arch, seed=1, layers=2)
    draft = noisy_copy(target, 0.3)
    ids, mask = _repetitive(lengths, seed=len(lengths))
    generation = Generation(max_new_tokens=24, eos_token_ids=(5,))
    cache = SuffixCache(depth=12)
    with torch.inference_mode():
        base = [r.output_ids for r in generate_baseline(target, ids, mask, generation)]
        for budget in (None, 6):  # a chain, a tree; the second batch drafts from the first one's outputs as well
            records = generate_speculative(target, SuffixDrafter(cache, depth=12, budget=budget), ids, mask,
                                           generation, 4)
            assert [r.output_ids for r in records] == base
            remember_outputs(cache, ids[1:], mask[1:], records[1:])  # other prompts' outputs only
        sources = set()
        for costs in (CHEAP, DEAR):
            records = generate_speculative(target, _hybrid(draft, costs, cache=cache), ids, mask, generation, 4)
            assert [r.output_ids for r in records] == base
            for r in records:
                for rd in r.rounds:
                    sources.add(tuple(sorted(rd.get("sources", {}))))  # none: a last round of one token left
                    assert sum(a for _, a in rd.get("sources", {}).values()) == rd["accepted"]
        assert ("draft",) in sources and any(len(s) == 2 for s in sources), sources  # chains and merged trees ran


def test_plan_row_prefers_a_confident_free_match_and_the_draft_elsewhere():
    v = {k: 1.0 + 0.1 * k for k in range(1, 9)}.get
    prices = StepPrices(0.3, v, {"fixed": 0.0, "per_token": 0.1})  # the draft feeding w tokens: max(0.3, 0.1 w)
    sure, unsure = [0.95] * 4, [0.1] * 4
    # lookup's 4 tokens at 0.95 beat any draft at c = 0.3: the draft does not run
    assert plan_row({"lookup": sure, "suffix": unsure, "draft": [0.6] * 4}, {"lookup": 4, "suffix": 2}, 4,
                    prices)[:3] == ("lookup", 4, 0)
    # no free match: the draft's 0.9 makes k = 4 worth it: (1 + .9 + .81 + .729 + .656) / (4 * .3 + 1.4) = 1.573 > 1
    assert plan_row({"lookup": sure, "suffix": sure, "draft": [0.9] * 4}, {}, 4, prices)[:3] == (None, 0, 4)
    # the same after a catch-up: its first forward feeds 8 tokens, 0.8 (0.5 more than a step): 4.095 / (0.8 + 0.9 +
    # 1.4) = 1.32, still k = 4; 33 tokens, 3.3 (3.0 more): 4.095 / 5.6 = 0.73 at k = 4, 1.9 / 4.4 = 0.43 at k = 1: a
    # plain step
    chain = plan_row({"lookup": sure, "suffix": sure, "draft": [0.9] * 4}, {}, 4, prices, fed=8)
    assert chain[:3] == (None, 0, 4) and chain[3] == pytest.approx(4.0951 / 3.1, abs=1e-4)
    assert plan_row({"lookup": sure, "suffix": sure, "draft": [0.9] * 4}, {}, 4, prices, fed=33)[:3] \
        == (None, 0, 0)
    # nothing promising: a plain step
    assert plan_row({"lookup": unsure, "suffix": unsure, "draft": [0.1] * 4}, {"lookup": 3}, 4, prices)[:3] == \
        (None, 0, 0)


@pytest.mark.parametrize("which", ["suffix", "hybrid-tree", "hybrid-chains", "hybrid-confident"])
def test_sampling_matches_target_distribution(which):
    sampling = Sampling(True, 1.0)
    target, draft = sampling_pair()
    prompt = torch.tensor([[3, 7, 5, 9, 3, 7, 4, 9, 3]])  # repeats: lookup and suffix match after most first tokens
    rows = 12_000
    ids = prompt.expand(rows, -1).contiguous()
    mask = torch.ones_like(ids)
    generation = Generation(max_new_tokens=4, sampling=sampling)  # tokens 2 and 3 come from the first round
    generator = torch.Generator().manual_seed(0)
    if which == "suffix":
        drafter = SuffixDrafter(None, min_prob=0.0, depth=8)
    else:
        # CHEAP costs: with merge, a tree of both wherever a free source matches; without, per row the free source
        # where its match is 2 tokens long, the draft where it is shorter: rows of both kinds in one chain round
        # hybrid-confident: every draft branch ends after its first token (no top probability reaches 1.0), beside
        # free branches of two: trees whose branches stop at different depths
        drafter = _hybrid(draft, CHEAP, sampling, generator, merge=which != "hybrid-chains", vocab=V,
                          confidence=1.0 if which == "hybrid-confident" else None)
    with torch.inference_mode():
        spec = generate_speculative(target, drafter, ids, mask, generation, gamma=2, generator=generator)
    first = [r.rounds[0] for r in spec]
    assert sum(rd["accepted"] for rd in first) / max(1, sum(rd["drafted"] for rd in first)) < 0.95
    if which != "suffix":
        kinds = {tuple(sorted(rd["sources"])) for rd in first}
        assert ("draft",) in kinds and (any(len(k) == 2 for k in kinds) if which != "hybrid-chains" else
                                        any(k and "draft" not in k for k in kinds)), kinds
        if which == "hybrid-confident":
            assert {rd["sources"]["draft"][0] for rd in first if "draft" in rd["sources"]} == {1}
            assert any(rd["sources"].get("lookup", rd["sources"].get("suffix", [0]))[0] == 2 for rd in first)
    statistic, critical = chi_square(joint_counts(spec), exact_joint_of_tokens_2_and_3(target, sampling, prompt))
    assert statistic < critical, f"{which} is off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"


def test_acceptance_by_source_by_hand():
    rounds = [
        {"drafted": 4, "accepted": 3, "emitted": 4, "sources": {"lookup": [4, 3]}},
        {"drafted": 6, "accepted": 2, "emitted": 3, "sources": {"suffix": [3, 0], "draft": [3, 2]}},
        {"drafted": 2, "accepted": 0, "emitted": 1, "sources": {"draft": [2, 0]}},
        {"drafted": 0, "accepted": 0, "emitted": 1, "sources": {}},
        {"drafted": 5, "accepted": 5, "emitted": 6, "sources": {"lookup": [5, 5]}},
    ]
    table = acceptance_by_source(rounds)
    # lookup: (3 + 5) / (4 + 5) = 8/9 in 2 rounds; suffix 0/3 in 1; draft (2 + 0) / (3 + 2) = 2/5 in 2
    assert table["lookup"] == {"drafted": 9, "accepted": 8, "acceptance": pytest.approx(8 / 9), "rounds": 2}
    assert table["suffix"] == {"drafted": 3, "accepted": 0, "acceptance": 0.0, "rounds": 1}
    assert table["draft"] == {"drafted": 5, "accepted": 2, "acceptance": pytest.approx(0.4), "rounds": 2}
    assert acceptance_by_source([{"drafted": 2, "accepted": 1, "emitted": 2}]) is None


def test_hybrid_draft_cache_catches_up_on_rounds_it_skipped():
    """The draft model equal to the target: wherever the draft alone drafted, every token is accepted, also after
    rounds in which a free source drafted or a plain step ran and the draft model did not (its cache caught up on
    their tokens). The draft's pooled prior says it is never accepted, so it runs on probes and where its own rows'
    evidence has overcome that."""
    from decode.drafters.schedules import PointEvidence

    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([10, 4, 14], seed=5)
    generation = Generation(max_new_tokens=40)
    doubtful = PointEvidence(4)
    for _ in range(40):
        doubtful.counts.add(4, 0)
    c, v = DEAR
    drafter = HybridDrafter(DraftModelDrafter(target, VOCAB, Sampling()), VOCAB, 4, c, v, pools={"draft": doubtful})
    with torch.inference_mode():
        records = generate_speculative(target, drafter, ids, mask, generation, 4)
    draft_alone = [rd["sources"]["draft"] for r in records for rd in r.rounds if set(rd.get("sources", {})) == {"draft"}]
    skipped = sum("draft" not in rd.get("sources", {}) for r in records for rd in r.rounds)
    assert draft_alone and skipped, "both kinds of round must occur for the test to bite"
    assert all(accepted == drafted for drafted, accepted in draft_alone)


def test_served_suffix_drafts_from_a_request_that_finished_before_it_was_admitted():
    """Request 1's prompt is request 0's prompt plus the first 3 tokens of its answer, so greedy, its answer goes on
    as request 0's did. Served one at a time, request 0's output joins the point's cache as it finishes and request 1
    drafts its continuation from it; in one static batch (rows never draft from each other) it cannot. Requests that
    cycle through one prompt: its output joins only when the last of them has finished, so none drafts from its own
    prompt's answer (the second drafts exactly as the first did)."""
    from types import SimpleNamespace

    from decode.methods.suffix import Options, run
    from decode.arrivals import Load
    from runner.plan import left_pad

    target = tiny_model("llama", seed=2, layers=2)
    generation = Generation(max_new_tokens=16)
    first = [5, 17, 9, 33, 12, 40]
    with torch.inference_mode():
        answer = generate_baseline(target, torch.tensor([first]), torch.ones(1, len(first), dtype=torch.long),
                                   generation)[0].output_ids

    def served(prompts, load):
        ids, mask = left_pad(prompts, 0, "cpu")
        ctx = SimpleNamespace(target=target, clock=None, load=load, warming_up=False, memory={},
                              options={"suffix": Options(suffix_max_depth=4)})
        point = SimpleNamespace(method="suffix", gamma=4, key=("suffix",), tree=None)
        with torch.inference_mode():
            records = run(ctx, point, ids, mask, generation, None)
        return records, ctx.memory[("suffix_cache", point.key)][1]  # (repeat, cache)

    def accepted(record):
        return sum(r["accepted"] for r in record.rounds)

    prompts = [first, first + answer[:3]]
    one_by_one, cache = served(prompts, Load([0.0, 0.0], 1))
    together, _ = served(prompts, None)
    assert one_by_one[1].output_ids[:len(answer) - 3] == answer[3:]
    # request 0's rest (12 tokens after request 1's first) drafted from the cache and accepted, until it runs out
    assert accepted(one_by_one[1]) >= 8 and accepted(together[1]) <= accepted(one_by_one[1]) - 6
    assert all(r["accepted"] == r["drafted"] for r in one_by_one[1].rounds[:2])
    assert sorted(len(k) for k in cache.outputs) == [len(first), len(first) + 3]
    again, cache = served([first, first], Load([0.0, 0.0], 1))
    assert [r.rounds for r in again] == [again[0].rounds, again[0].rounds]
    assert cache.outputs == {tuple(first): answer}


def test_a_repeat_drafts_as_the_first_did_not_from_its_conversations_later_turns():
    """An edit loop in miniature: turn 2's prompt is turn 1's plus the first 3 tokens of its answer, so greedy, turn
    2's answer goes on as turn 1's did (a later turn re-emits the code). Repeat 0 runs turn 1, then turn 2, each a
    batch of the point; repeat 1 runs turn 1 again. Repeat 0's turn 2 answer must not be in the point's cache then
    (turn 1 would copy its own answer from it): a repeat starts an empty cache, and drafts, accepts and forwards as
    repeat 0 did; within a repeat a later batch still draws on an earlier one."""
    from types import SimpleNamespace

    from decode.methods.suffix import Options, run
    from runner.plan import left_pad

    target = tiny_model("llama", seed=2, layers=2)
    generation = Generation(max_new_tokens=16)
    first = [5, 17, 9, 33, 12, 40]
    with torch.inference_mode():
        answer = generate_baseline(target, torch.tensor([first]), torch.ones(1, len(first), dtype=torch.long),
                                   generation)[0].output_ids
    ctx = SimpleNamespace(target=target, clock=None, load=None, warming_up=False, memory={},
                          options={"suffix": Options(suffix_max_depth=4)}, repeat=0)
    point = SimpleNamespace(method="suffix", gamma=4, key=("suffix",), tree=None)

    def turn(prompt, repeat):
        ctx.repeat = repeat
        ids, mask = left_pad([prompt], 0, "cpu")
        with torch.inference_mode():
            return run(ctx, point, ids, mask, generation, None)[0]

    def accepted(record):
        return sum(r["accepted"] for r in record.rounds)

    before = turn(first, 0)
    second = turn(first + answer[:3], 0)
    assert second.output_ids[:len(answer) - 3] == answer[3:] and accepted(second) >= 8  # from turn 1's, in the cache
    again = turn(first, 1)
    assert (again.rounds, again.target_forwards) == (before.rounds, before.target_forwards)
    assert accepted(again) == accepted(before) <= 2


def test_hybrid_gates_each_free_candidate_by_the_evidence_of_its_strength_and_drafts_past_gamma():
    """Worked by hand. Pooled evidence: lookup's 3-gram matches accepted 95 of 100 at every position, its 1-gram
    matches 20 of 100, the draft model's tokens 80 of 100 (b_1 = 96/102 = 0.941, then 0.950; 0.206, then 0.200; 0.794,
    then 0.800); c = 0.4, v(k) = 1 + 0.05 k, a cap of 12 tokens (gamma 4). Row 0's lookup candidate is a 3-gram match
    of 12 tokens: lookup alone, all 12, E = 1 + 0.941 + 0.941 x 0.950 + ... = 9.651 for v(12) = 1.6, 6.032 tokens per
    cost, past gamma. Row 1's is a 1-gram match: its
    record (1.2 / 1.05 = 1.14) loses to the draft's k = 2 (2.44 / 1.9 = 1.28; k = 1: 1.24, k = 3: 1.26) and to the
    tree of both (2.48 / 1.95 = 1.27): the draft alone, the lookup kept out."""
    from decode.drafters.hybrid import stratum

    assert [stratum("lookup", n) for n in (1, 2, 3, 5)] == ["lookup:n1", "lookup:n2", "lookup:n3+", "lookup:n3+"]
    assert [stratum("suffix", p) for p in (0.2, 0.5, 0.95)] == ["suffix:p<.5", "suffix:p<.9", "suffix:p>=.9"]
    target = tiny_model("llama", seed=1, layers=2)
    pools = {}
    hybrid = HybridDrafter(DraftModelDrafter(noisy_copy(target, 0.1), VOCAB, Sampling()), VOCAB, 12, 0.4,
                           {k: 1 + 0.05 * k for k in range(1, 26)}, pools=pools)
    for key, accepted in (("lookup:n3+", 95), ("lookup:n1", 20), ("draft", 80)):
        pools[key].counts.tested = [0.0] + [100.0] * 12
        pools[key].counts.accepted = [0.0] + [float(accepted)] * 12
    ids, mask = ragged_batch([5, 5], seed=0)
    with torch.inference_mode():
        hybrid.start(ids, mask)
    hybrid.candidates = [{"lookup": list(range(3, 15)), "suffix": []}, {"lookup": list(range(3, 15)), "suffix": []}]
    hybrid.keys = [{"lookup": "lookup:n3+", "suffix": "suffix:p<.5"}, {"lookup": "lookup:n1", "suffix": "suffix:p<.5"}]
    plans = hybrid._plans([12, 12])
    assert plans[0][:3] == ("lookup", 12, 0) and plans[0][3] == pytest.approx(6.032, abs=0.001)
    assert plans[1][:3] == (None, 0, 2) and plans[1][3] == pytest.approx(1.28, abs=0.01)


def test_hybrid_judges_a_lookup_candidate_the_suffix_source_contests_by_the_contested_record():
    """Worked by hand. Pooled evidence: uncontested 1-gram lookup matches accepted 80 of 100 at every position,
    contested ones (the suffix source proposes another first token) 5 of 100, the draft model's tokens 50 of 100, the
    suffix's weak candidates none of 100; c = 0.4, v(k) = 1 + 0.05 k, gamma 4. Both rows' lookup candidate is the same
    4-token 1-gram match. Row 0's suffix candidate starts with the same token: b = 81/102 = 0.794, then 0.800, so
    E(4) = 1 + 0.794 + 0.635 + 0.508 + 0.407 = 3.344 for v(4) = 1.2: 2.787 tokens per cost, lookup alone (the draft's
    best, k = 1: 1.5 / 1.45 = 1.034; the tree of lookup's 4 and the draft's 1: 3.447 / 1.65 = 2.089). Row 1's starts
    with another token: b = 6/102 = 0.059, lookup's k = 1 gives 1.059 / 1.05 = 1.008, under the draft's 1.034 (and the
    tree's 1.529 / 1.5 = 1.019): the draft alone, the contested lookup kept out."""
    from decode.drafters.hybrid import candidate_keys

    lookup = [3, 4, 5, 6]
    agreed, contested = candidate_keys(lookup, 1, [3, 9], [0.2, 0.2]), candidate_keys(lookup, 1, [8, 9], [0.2, 0.2])
    assert agreed == {"lookup": "lookup:n1", "suffix": "suffix:p<.5"}
    assert contested == {"lookup": "lookup:n1:contested", "suffix": "suffix:p<.5:contested"}
    assert candidate_keys(lookup, 3, [], [])["lookup"] == "lookup:n3+"  # nothing proposed against it
    assert candidate_keys([], 0, [8, 9], [0.95, 0.9])["suffix"] == "suffix:p>=.9"
    target = tiny_model("llama", seed=1, layers=2)
    pools = {}
    hybrid = HybridDrafter(DraftModelDrafter(noisy_copy(target, 0.1), VOCAB, Sampling()), VOCAB, 4, 0.4,
                           {k: 1 + 0.05 * k for k in range(1, 9)}, pools=pools)
    for key, accepted in (("lookup:n1", 80), ("lookup:n1:contested", 5), ("draft", 50), ("suffix:p<.5", 0),
                          ("suffix:p<.5:contested", 0)):
        pools[key].counts.tested = [0.0] + [100.0] * 4
        pools[key].counts.accepted = [0.0] + [float(accepted)] * 4
    ids, mask = ragged_batch([5, 5], seed=0)
    with torch.inference_mode():
        hybrid.start(ids, mask)
    hybrid.candidates = [{"lookup": lookup, "suffix": [3, 9]}, {"lookup": lookup, "suffix": [8, 9]}]
    hybrid.keys = [agreed, contested]
    plans = hybrid._plans([4, 4])
    assert plans[0][:3] == ("lookup", 4, 0) and plans[0][3] == pytest.approx(2.787, abs=0.001)
    assert plans[1][:3] == (None, 0, 1) and plans[1][3] == pytest.approx(1.034, abs=0.001)


def test_hybrid_drafts_past_gamma_where_its_record_holds_and_stays_exact():
    """The cache holds the answer to the prompt's first part (a finished request's output); the prompt goes on with
    its first 3 tokens, so greedy, the target's continuation is that answer's rest. The suffix candidate (one earlier
    continuation: probability 1) keeps being accepted, and with a cap of 12 (gamma 4) hybrid drafts past 4."""
    target = tiny_model("llama", seed=2, layers=2)
    generation = Generation(max_new_tokens=40)
    first = [5, 17, 9, 33, 12, 40]
    one = torch.ones(1, len(first), dtype=torch.long)
    with torch.inference_mode():
        answer = generate_baseline(target, torch.tensor([first]), one, generation)[0].output_ids
        ids = torch.tensor([first + answer[:3]])
        mask = torch.ones_like(ids)
        base = generate_baseline(target, ids, mask, generation)[0].output_ids
        cache = SuffixCache(depth=8 + 12)
        cache.remember(tuple(first), answer)
        records = generate_speculative(target, _hybrid(noisy_copy(target, 0.3), DEAR, cache=cache, gamma=12), ids,
                                       mask, generation, 12)
    assert records[0].output_ids == base
    assert max(rd["drafted"] for rd in records[0].rounds) > 4


def test_hybrid_pools_its_prior_per_category():
    """Worked by hand. Lookup's 3-gram matches were accepted 95 of 100 times at every position in the extraction
    rows seen so far and 20 of 100 in the reasoning rows; the point's pool holds both (115 of 200), the draft model's
    80 of 100 (the point's only). c = 0.4, v(k) = 1 + 0.05 k, a cap of 12 (gamma 4), prior weight 2. A category's
    prior is its counts shrunk toward the point's: b_1 = (95 + 2 x 116/202) / 102 = 0.943 for extraction, (20 + 2 x
    116/202) / 102 = 0.207 for reasoning (the point's 116/202 = 0.574). A new extraction row with a 12-token 3-gram
    match drafts it all; a new reasoning row with the same match leaves it and drafts 2 tokens with the model
    (as with the 20% record in the test above). Pooled per point (0.574), both rows draft 4 lookup tokens: too few for
    the one, wasted on the other."""
    from decode.drafters.schedules import PointEvidence

    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([5, 5], seed=0)
    prompts = [tuple(t for t, m in zip(r, k) if m) for r, k in zip(ids.tolist(), mask.tolist())]
    category = {prompts[0]: "extraction", prompts[1]: "reasoning"}

    def counts(tested, accepted):
        evidence = PointEvidence(12)
        evidence.counts.tested = [0.0] + [float(tested)] * 12
        evidence.counts.accepted = [0.0] + [float(accepted)] * 12
        return evidence

    def plans(group_of):
        pools = {"lookup:n3+": counts(200, 115), "draft": counts(100, 80)}
        groups = {"extraction": {"lookup:n3+": counts(100, 95)}, "reasoning": {"lookup:n3+": counts(100, 20)}}
        hybrid = HybridDrafter(DraftModelDrafter(noisy_copy(target, 0.1), VOCAB, Sampling()), VOCAB, 12, 0.4,
                               {k: 1 + 0.05 * k for k in range(1, 26)}, pools=pools, group_pools=groups,
                               group_of=group_of)
        with torch.inference_mode():
            hybrid.start(ids, mask)
        hybrid.candidates = [{"lookup": list(range(3, 15)), "suffix": []}] * 2
        hybrid.keys = [{"lookup": "lookup:n3+", "suffix": "suffix:p<.5"}] * 2
        estimator = hybrid.estimators["lookup:n3+"]
        first = [estimator.acceptance(row)[0] for row in range(2)]
        return hybrid._plans([12, 12]), first

    by_category, first = plans(lambda prompt: category[tuple(prompt)])
    assert first == [pytest.approx((95 + 2 * 116 / 202) / 102), pytest.approx((20 + 2 * 116 / 202) / 102)]
    assert by_category[0][:3] == ("lookup", 12, 0) and by_category[1][:3] == (None, 0, 2)
    per_point, first = plans(None)
    assert first == [pytest.approx(116 / 202)] * 2 and per_point[0][:3] == per_point[1][:3] == ("lookup", 4, 0)


def test_hybrid_probes_one_draft_token_deeper_so_one_early_rejection_does_not_pin_it_to_one():
    """Worked by hand. The point's pool has tested the draft model's first token 100 times (90 accepted) and its
    second once (rejected): b_1 = (90 + 2 x 0.5) / 102 = 0.892, b_2 = (0 + 2 x 0.892) / 3 = 0.595, and past that
    as likely as the one before. c = 0.4, v(k) = 1 + 0.05 k: k = 1 gives 1.892 / 1.45 = 1.305, k = 2 2.423 / 1.9 =
    1.275, k = 3 2.739 / 2.35 = 1.165, so a row drafts one token, and position 2 is never scored again. Every
    PROBE_EVERY (8) rounds below the cap the row drafts one more. Then, with the draft model equal to the target
    (every token accepted), the probes' evidence lifts b_2 and the row's drafts grow past 2: without the probe it
    drafted one token a round for good (the held-out sql prompts' hybrid, 1.96 tokens a draft round where the draft
    model alone drafted 3.9 and had 2.9 accepted)."""
    from decode.drafters.schedules import PointEvidence

    def pool():
        evidence = PointEvidence(4)
        evidence.counts.tested = [0.0, 100.0, 1.0, 0.0, 0.0]
        evidence.counts.accepted = [0.0, 90.0, 0.0, 0.0, 0.0]
        return {"draft": evidence}

    target = tiny_model("llama", seed=1, layers=2)
    costs = {k: 1 + 0.05 * k for k in range(1, 10)}
    ids, mask = ragged_batch([5], seed=0)
    hybrid = HybridDrafter(DraftModelDrafter(target, VOCAB, Sampling()), VOCAB, 4, 0.4, costs, pools=pool())
    with torch.inference_mode():
        hybrid.start(ids, mask)
    hybrid.candidates = [{"lookup": [], "suffix": []}]
    hybrid.keys = [{"lookup": "lookup:n1", "suffix": "suffix:p<.5"}]
    plans = [hybrid._plans([4])[0] for _ in range(9)]
    assert plans[0][3] == pytest.approx(1.8922 / 1.45, abs=1e-3)
    assert [plan[:3] for plan in plans] == [(None, 0, 1)] * 7 + [(None, 0, 2), (None, 0, 1)]

    generation = Generation(max_new_tokens=48)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)[0].output_ids
        hybrid = HybridDrafter(DraftModelDrafter(target, VOCAB, Sampling()), VOCAB, 4, 0.4, costs, pools=pool(),
                               merge=False)  # the draft's length alone (a tree's draft branch is sized otherwise)
        records = generate_speculative(target, hybrid, ids, mask, generation, 4)
    drafts = [rd["sources"]["draft"] for rd in records[0].rounds if "draft" in rd.get("sources", {})]
    assert records[0].output_ids == base
    assert drafts[0] == [1, 1] and max(drafted for drafted, _ in drafts) > 2


def test_a_probe_pays_its_catch_up_only_where_the_tokens_left_repay_it_by_hand():
    """A probe (PROBE_EVERY rounds without the draft model) feeds the draft the tokens committed since it last ran;
    it runs only where the row's expected saving over its remaining tokens exceeds that feed's price. Worked by hand:
    the draft's pool as in the probe test above (b_1 = 0.892, b_2 = b_3 = b_4 = 0.595), c = 0.4, v(k) = 1 + 0.05 k, no
    free candidate. Caught up, k = 1 is the best round: 1.892 / 1.45 = 1.305 tokens a step, 0.766 steps a token
    against a plain step's 1.0: the draft saves 0.234 a token. The row's catch-up feeds 99 pending tokens and its last
    one, on the prefill line 0.4 + 0.01 x 100 = 1.4, 1.0 more than a step: with it, k = 1 reads 1.892 / 2.45 = 0.77,
    k = 2 2.423 / 2.9 = 0.84, k = 3 2.739 / 3.35 = 0.82, k = 4 2.927 / 3.8 = 0.77, all under a plain step's 1. The
    probe drafts its best, k = 2, where 0.234 x the tokens left exceeds 1.0: 44 left (10.3) probe; 3 left (0.70) do
    not, where every probe once ran whatever it cost (the held-out rag and summary prompts: 1,104 catch-up tokens fed
    for 48 drafted)."""
    from decode.drafters.schedules import PointEvidence

    def plan(generated):
        evidence = PointEvidence(4)
        evidence.counts.tested = [0.0, 100.0, 1.0, 0.0, 0.0]
        evidence.counts.accepted = [0.0, 90.0, 0.0, 0.0, 0.0]
        drafter = HybridDrafter(DraftModelDrafter(tiny_model("llama", seed=1, layers=1), VOCAB, Sampling()), VOCAB, 4,
                                0.4, {k: 1 + 0.05 * k for k in range(1, 10)}, pools={"draft": evidence},
                                prefill_cost={"fixed": 0.4, "per_token": 0.01}, budget=64)
        ids, mask = ragged_batch([5], seed=0)
        with torch.inference_mode():
            drafter.start(ids, mask)
        drafter.draft.state = object()  # as after its deferred prefill: the cache exists
        drafter.draft.pending = [[7] * 99]
        drafter.since_draft, drafter.generated = [HybridDrafter.PROBE_EVERY - 1], [generated]
        drafter.candidates = [{"lookup": [], "suffix": []}]
        drafter.keys = [{"lookup": "lookup:n1", "suffix": "suffix:p<.5"}]
        return drafter._plans([4])[0], drafter

    probed, drafter = plan(20)
    assert drafter.starts[0].per_token() == pytest.approx((1.0, 1.45 / 1.8922), abs=1e-4)
    assert drafter.prices.feed(100) == pytest.approx(1.0)
    assert probed[:3] == (None, 0, 2) and probed[3] == pytest.approx(2.4233 / 2.9, abs=1e-3)
    assert plan(61)[0][:3] == (None, 0, 0)


def test_hybrids_draft_branch_ends_after_the_step_whose_confidence_falls_under_the_threshold():
    """speculative.confidence in hybrid (_Wanted.keep_drafting, ConfidenceSchedule's rule): a row's draft branch ends
    after the step whose top probability falls under the threshold, that step's token kept. At 1.0 no step reaches it
    and every branch is one token; at 0.0 every step does and the rounds are those of no threshold, whose branches run
    longer. The output is the target's in all three, over a ragged batch with chains and merged trees."""
    target = tiny_model("llama", seed=1, layers=2)
    draft = noisy_copy(target, 0.3)
    ids, mask = _repetitive([6, 13, 3], seed=3)
    generation = Generation(max_new_tokens=24, eos_token_ids=(5,))
    runs = {}
    with torch.inference_mode():
        base = [r.output_ids for r in generate_baseline(target, ids, mask, generation)]
        for confidence in (None, 0.0, 1.0):
            records = generate_speculative(target, _hybrid(draft, CHEAP, confidence=confidence), ids, mask,
                                           generation, 4)
            assert [r.output_ids for r in records] == base
            runs[confidence] = [[(rd["drafted"], rd["accepted"], rd.get("sources")) for rd in r.rounds]
                                for r in records]
    branches = {key: [rd[2]["draft"][0] for rounds in run for rd in rounds if rd[2] and "draft" in rd[2]]
                for key, run in runs.items()}
    assert runs[0.0] == runs[None]
    assert branches[1.0] and set(branches[1.0]) == {1} and max(branches[None]) > 1, branches


def test_a_deferred_draft_prefill_drafts_as_the_eager_one_and_costs_nothing_until_it_drafts():
    """DraftModelDrafter.defer (hybrid's): the prompts wait in the pending tokens and the first round that drafts feeds
    them in its catch-up forward, which on an empty cache is the prefill: the same drafts, round by round, as an
    eagerly prefilled draft, over a ragged batch; before that round the draft has run no forward at all."""
    target, draft = tiny_model("llama", seed=3, layers=2), tiny_model("llama", seed=4, layers=1)
    ids, mask = ragged_batch([9, 5, 7], seed=6)
    generation = Generation(max_new_tokens=12)
    runs = []
    for defer in (False, True):
        drafter = DraftModelDrafter(draft, VOCAB, Sampling())
        drafter.defer = defer
        with torch.inference_mode():
            drafter.start(ids, mask)
            before = drafter.forwards
            records = generate_speculative(target, drafter, ids, mask, generation, 3)
        runs.append((before, [[(r["drafted"], r["accepted"]) for r in rec.rounds] for rec in records],
                     [rec.output_ids for rec in records]))
    assert runs[0][0] == 1 and runs[1][0] == 0  # eager: the prefill ran at start; deferred: nothing yet
    assert runs[1][1] == runs[0][1] and runs[1][2] == runs[0][2]


def test_the_deferred_start_pays_for_the_drafts_prefill_by_hand():
    """HybridDrafter._start_pays on a schedule worked out by hand: one row with 2 rounds whose best plans cost 0.5
    target steps a token without the draft model and 0.25 with it, budget 20, prefill 1.4 + 0.1 a token, of which the
    round's first draft step (c = 0.4) is already in its plan: feeding w tokens costs 1.0 + 0.1 w more."""
    from decode.drafters.schedules import PointEvidence

    known = PointEvidence(4)
    for _ in range(8):  # the point's draft record past MIN_POOLED_ROUNDS: the rule decides
        known.counts.add(4, 3)
    drafter = HybridDrafter(DraftModelDrafter(tiny_model("llama", seed=1, layers=1), VOCAB, Sampling()), VOCAB, 4,
                            0.4, {k: 1.0 for k in range(1, 9)}, pools={"draft": known},
                            prefill_cost={"fixed": 1.4, "per_token": 0.1}, budget=20)
    drafter.reset()
    row = StartRecord()
    row.add(0.5, 0.25)
    row.add(0.5, 0.25)
    drafting = [(None, 0, 2, 1.5)]
    drafter.starts, drafter.row_groups, drafter.draft.pending = [row], [None], [[7] * 9]

    def pays(generated, pending=9, point=None, plans=drafting):
        drafter.generated, drafter.draft.pending = [generated], [[7] * pending]
        drafter.start_pools = {} if point is None else {None: point}
        return drafter._start_pays(plans)

    # 10 tokens to feed: cost 1.4 + 0.1 x 10 - 0.4 = 2.0; saving (20 - 10) x (0.5 - 0.25) = 2.5 -> start
    assert pays(10)
    assert not pays(12)  # (20 - 12) x 0.25 = 2.0, not above 2.0
    assert not pays(10, pending=15)  # 16 tokens to feed: 2.6 > 2.5
    assert not pays(10, plans=[(None, 0, 0, 1.0)])  # no plan drafts with the model this round
    # the point's rounds (4 of them at 0.3 either way) as the prior, 4 rounds strong: free (1.0 + 4 x 0.3) / 6 =
    # 0.367, with the draft (0.5 + 1.2) / 6 = 0.283: (20 - 10) x 0.083 = 0.83 < 2.0
    point = StartRecord()
    for _ in range(4):
        point.add(0.3, 0.3)
    assert not pays(10, point=point)
    # the point's finished requests stopped at EOS after 14 tokens: a row at 10 expects (4 + 4 + 1 x 10) / 3 = 6 more,
    # not 10: 6 x 0.25 = 1.5 < 2.0
    drafter.lengths = LengthRecord()
    drafter.lengths.add(None, 14)
    drafter.lengths.add(None, 14)
    assert not pays(10)
    drafter.lengths = None
    # two rows, the second not drafting this round and 20 tokens from its end (a saving of 5.0 if fed): where its
    # prompt is no longer than the drafting row's it is fed, and counts (2.0 + 5.0 > 2.0); where it is longer it is
    # held, not prefilled, and neither counts nor widens the feed (2.0, not above 2.0; counted, 7.0 > 1.0 + 3.1)
    drafter.starts, drafter.row_groups, drafter.generated = [row, row], [None, None], [12, 0]
    two = [(None, 0, 2, 1.5), (None, 0, 0, 1.0)]
    drafter.draft.pending = [[7] * 9, [7] * 5]
    assert drafter._start_pays(two)
    drafter.draft.pending = [[7] * 9, [7] * 30]
    assert not drafter._start_pays(two)
    drafter.starts, drafter.row_groups = [row], [None]
    # a thin draft record: it starts to learn, whatever the prices
    drafter.estimators["draft"].pool.tested[1] = 3
    assert pays(12)


def test_a_rows_remaining_tokens_come_from_its_groups_finished_requests_by_hand():
    """LengthRecord.remaining: the mean of L - generated over the finished requests that ran past `generated`, the
    budget's remaining counted as one of the point's requests, the point's expectation as one of the group's."""
    record = LengthRecord()
    assert record.remaining("a", 10, 20) == 10  # nothing finished: the budget's remaining
    record.add("a", 14)  # stopped at EOS after 14 tokens
    record.add("b", 20)  # ran to the budget
    record.add("b", 20)
    # the point at 10: (4 + 10 + 10 + 1 x 10) / 4 = 8.5
    assert record.remaining(None, 10, 20) == pytest.approx(8.5)
    assert record.remaining("c", 10, 20) == pytest.approx(8.5)  # a group nothing finished in: the point's
    # group a at 10: (4 + 1 x 8.5) / 2 = 6.25
    assert record.remaining("a", 10, 20) == pytest.approx(6.25)
    # past 14, group a's request says nothing: the point's, (5 + 5 + 1 x 5) / 3 = 5
    assert record.remaining("a", 15, 20) == pytest.approx(5.0)
