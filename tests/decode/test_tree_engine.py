"""Token trees (decode/tree_layout.py): verified in one target forward with a tree mask, greedy output equal to the target's
own token for token, sampled output distributed as the target's (SpecInfer's rule), and never less accepted per round
than the chain the tree contains."""
import numpy as np
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.draft_tree import DynamicTree, StaticTree
from decode.sampling import accept_greedy, accept_tree_greedy, accept_tree_sampled
from decode.tree_layout import TreeLayout, depths_and_ranks, static_parents
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts, sampling_pair
from test_sliding_window import tiny_windowed
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model

GREEDY = Sampling(False)


def tree_of(kind: str, sampling=GREEDY):
    if kind == "dynamic":
        return DynamicTree(budget=10, top_k=3, sampling=sampling)
    branching = {"3-2-1-1": [3, 2, 1, 1], "deep": [1] * 12, "wide": [2 * VOCAB], "2-2": [2, 2]}[kind]
    return StaticTree(static_parents(branching), sampling)


def run_tree(target, draft, lengths, kind, max_new_tokens=20, depth=6):
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens, GREEDY, (2,))
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        drafter = DraftModelDrafter(draft, target.config.vocab_size, GREEDY, tree=tree_of(kind))
        spec = generate_speculative(target, drafter, ids, mask, generation, depth)
    return base, spec


MODELS = {
    "llama": lambda: tiny_model("llama"),
    "qwen2": lambda: tiny_model("qwen2"),
    "gpt2": lambda: tiny_model("gpt2"),
    "mistral-window4": lambda: tiny_windowed("mistral", 4, 0),  # windows far shorter than the text and the tree
    "gemma3-window4": lambda: tiny_windowed("gemma3", 4, 0),  # a sliding layer and a global one: a dict of masks
    "llama-eager": lambda: eager(tiny_model("llama")),  # eager attention takes the mask additive, not boolean
}


def eager(model):
    model.set_attn_implementation("eager")
    return model


@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize("kind", ["3-2-1-1", "dynamic"])
def test_greedy_tree_equals_baseline(arch, kind):
    target = MODELS[arch]()
    draft = noisy_copy(target, 0.15)
    rounds = []
    for lengths in ([6], [5, 9, 1, 7]):  # batch 1 and a ragged batch of 4
        base, spec = run_tree(target, draft, lengths, kind)
        assert [r.output_ids for r in spec] == [r.output_ids for r in base]
        rounds += [r for s in spec for r in s.rounds]
    # the test bites: rounds accept a node other than the draft's first choice, reject at depth 1, accept deep
    assert any(any(rank > 0 for rank in r["ranks"]) for r in rounds)
    assert any(r["accepted"] == 0 for r in rounds) and any(r["accepted"] >= 2 for r in rounds)


@pytest.mark.parametrize("kind", ["deep", "wide"])
def test_tree_deeper_than_the_budget_or_wider_than_the_vocabulary(kind):
    target = tiny_model("llama")
    base, spec = run_tree(target, noisy_copy(target, 0.1), [5, 9, 1, 7], kind, max_new_tokens=9, depth=12)
    assert [r.output_ids for r in spec] == [r.output_ids for r in base]
    for sample in spec:
        generated = 1
        for r in sample.rounds:
            depth = max(depth_of(r["parents"]), default=0)  # 0: the row had no budget left to draft
            assert depth <= 9 - generated - 1, "a row's tree is cut at its budget: no round emits past max_new_tokens"
            if kind == "wide" and depth:
                assert r["drafted"] == VOCAB, "a rank past the draft's vocabulary is padding, not a node"
            generated += r["emitted"]


def depth_of(parents):
    return depths_and_ranks(parents)[0]


def test_round_records_by_hand():
    """A [2, 1] tree whose target follows the second child then its child: ranks [1, 0], tried [2, 1], and the
    draft cache keeps exactly the fed path node."""
    layout = TreeLayout(np.array([static_parents([2, 1])]), np.ones((1, 4), dtype=bool))
    # nodes: 0 (rank 0), 1 (rank 1) under the root; 2 under 0, 3 under 1
    assert layout.round_facts(0, [1, 3]) == ([1, 0], [2, 1])
    assert layout.round_facts(0, []) == ([], [2])
    assert layout.round_facts(0, [0]) == ([0], [2, 1])
    tokens = torch.tensor([[5, 6, 7, 8]])
    logits = torch.full((1, 5, 10), -1.0)
    logits[0, 0, 6] = logits[0, 2, 8] = logits[0, 4, 3] = 1.0  # root -> 6 (node 1), node 1 -> 8 (node 3), then 3
    accepted, token, path = accept_tree_greedy(tokens, logits, torch.as_tensor(layout.children), 2)
    assert accepted.tolist() == [2] and token.tolist() == [3] and path.tolist() == [[1, 3]]


def test_tree_structure_on_the_device_by_hand():
    """tree_ancestry (the tree masks' depths and ancestors, by pointer doubling) and DeviceTree.children, both on the
    device, against a 5-node tree worked out by hand: 0 and 1 under the root, 2 under 0, 3 under 2, 4 padding (its
    parent 1 ignored). A chain of 9 needs more than one doubling step."""
    from decode.drafters.base import DeviceTree
    from decode.kv import tree_ancestry

    parents = torch.tensor([[-1, -1, 0, 2, 1]])
    valid = torch.tensor([[True, True, True, True, False]])
    depths, ancestors = tree_ancestry(parents, valid)
    assert depths.tolist() == [[0, 0, 1, 2, 0]]
    assert [torch.nonzero(row).flatten().tolist() for row in ancestors[0]] == [[0], [1], [0, 2], [0, 2, 3], [4]]
    tree = DeviceTree(parents, valid, torch.full_like(parents, -1), max_depth=3, max_children=2)
    # verification columns: the root (0) has nodes 0 and 1 (columns 1, 2), node 0 has node 2 (3), node 2 node 3 (4)
    assert tree.children().tolist() == [[[1, 2], [3, -1], [-1, -1], [4, -1], [-1, -1], [-1, -1]]]
    assert tree.verify_parents().tolist() == [[-1, 0, 0, 1, 3, 2]]
    chain_depths, chain = tree_ancestry(torch.arange(-1, 8)[None], torch.ones(1, 9, dtype=torch.bool))
    assert chain_depths.tolist() == [list(range(9))] and chain[0].equal(torch.ones(9, 9, dtype=torch.bool).tril())


def test_dynamic_tree_ranks_on_the_device_by_hand():
    """EAGLE-2's selection, worked out by hand (top_k 2, budget 4, depth 2): the root's q = (.5, .3, .15, .05) gives
    tokens 0 and 1; under token 0 the draft's q = (.1, .2, .65, .05), under token 1 (.9, .05, .03, .02). Cumulative:
    0: .5, 1: .3, then 0's children 2: .325, 1: .1, and 1's 0: .27, 1: .015. The best 4 are 0, 1 (depth 1), 2 under
    0 and 0 under 1; a row whose length is 1 takes the depth-1 nodes and pads the rest. Both depth-1 nodes were fed,
    at draft cache columns 0 and 1."""
    q = {0: [0.1, 0.2, 0.65, 0.05], 1: [0.9, 0.05, 0.03, 0.02]}

    class Draft:
        regions = []

        def tree_forward(self, ids, region, new_round):
            self.regions.append(region.tolist())
            return torch.tensor([[q[token] for token in row] for row in ids.tolist()]).log()

    draft = Draft()
    root = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 2).log()
    proposal = DynamicTree(budget=4, top_k=2, sampling=GREEDY).draft(draft, root, [2, 1], 2)
    tree = proposal.layout
    assert draft.regions == [[[-1, -1], [-1, -1]]]
    assert proposal.tokens.tolist() == [[0, 1, 2, 0], [0, 1, 2, 1]]
    assert tree.parents.tolist() == [[-1, -1, 0, 1], [-1, -1, -1, -1]]
    assert tree.valid.tolist() == [[True] * 4, [True, True, False, False]]
    assert tree.columns.tolist() == [[0, 1, -1, -1], [0, 1, -1, -1]]
    assert (tree.max_depth, tree.max_children) == (2, 2)
    assert tree.widths == [4, 2]  # row 1 alone: its 2 depth-1 candidates
    # both rows at length 1 (the last tokens of their budgets): 2 candidates a row, verified 2 wide, not the budget's 4
    short = DynamicTree(budget=4, top_k=2, sampling=GREEDY).draft(draft, root, [1, 1], 2)
    assert short.tokens.tolist() == [[0, 1]] * 2 and short.layout.widths == [2, 2]
    assert short.layout.valid.tolist() == [[True, True]] * 2


def test_a_static_tree_records_what_each_row_alone_verifies():
    """The tree [2, 1]: nodes 0 and 1 at depth 1, 2 under 0 and 3 under 1. Rows of lengths 2, 1 and 0 share the
    round's 4 nodes (the batch's longest); alone, a row verifies the nodes within its length: 4, 2 and 0 (a plain
    step), what the replay prices (eval/replay.py round_shape)."""
    class Draft:
        input_vocab_size = target_vocab_size = 4

        def tree_forward(self, ids, region, new_round):
            return torch.zeros(*ids.shape, 4)

    root = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3).log()
    proposal = StaticTree([-1, -1, 0, 1], GREEDY).draft(Draft(), root, [2, 1, 0], [-1, -1, 0, 1])
    assert proposal.layout.widths == [4, 2, 0]
    assert proposal.layout.valid.tolist() == [[True] * 4, [True, True, False, False], [False] * 4]

def test_a_tree_containing_the_chain_never_accepts_less():
    """Hand-made logits: rows where the chain's drafts are right, wrong at depth 1 or 2, and where only a sibling
    is right. The tree [chain + a sibling at each depth] accepts at least what the chain does, row by row."""
    chain = torch.tensor([[4, 5, 6]] * 4)  # d1 d2 d3
    # tree: node 0 = d1 (rank 0), node 1 = 9 (rank 1); node 2 = d2 under 0, node 3 = 8 under 0; node 4 = d3 under 2
    parents = [-1, -1, 0, 0, 2]
    tree_tokens = torch.tensor([[4, 9, 5, 8, 6]] * 4)
    wants = [  # the target's argmax after the root, d1, d2 (and d3) per row
        [4, 5, 6, 1],  # chain right all along
        [9, 5, 6, 1],  # d1 wrong, the sibling right
        [4, 8, 6, 1],  # d2 wrong, its sibling right
        [7, 5, 6, 1],  # nothing right
    ]
    chain_logits = torch.zeros(4, 4, 10)
    tree_logits = torch.zeros(4, 6, 10)
    column_of_chain_prefix = {0: 0, 1: 1, 2: 3, 3: 5}  # the chain's prefix of length i sits at tree column ...
    for row, want in enumerate(wants):
        for i, token in enumerate(want):
            chain_logits[row, i, token] = 1.0
            tree_logits[row, column_of_chain_prefix[i], token] = 1.0
        tree_logits[row, 2, 0] = tree_logits[row, 4, 0] = 1.0  # off-chain nodes predict 0
    tree_logits[1, 2, 0], tree_logits[1, 2, 1] = 0.0, 1.0  # after the sibling 9 of row 1 the target says 1
    chain_accepted, _ = accept_greedy(chain, chain_logits, torch.full((4,), 3))
    layout = TreeLayout(np.array([parents] * 4), np.ones((4, 5), dtype=bool))
    tree_accepted, _, _ = accept_tree_greedy(tree_tokens, tree_logits, torch.as_tensor(layout.children), 3)
    assert chain_accepted.tolist() == [3, 0, 1, 0]
    assert tree_accepted.tolist() == [3, 1, 2, 0]


def first_token_counts(p, q, tokens, parents, rows=200_000, point_mass=False):
    """The next token after a one-level tree under accept_tree_sampled, over many rows at once."""
    layout = TreeLayout(np.array([parents] * rows), np.ones((rows, len(parents)), dtype=bool))
    target = p.expand(rows, len(parents) + 1, -1)
    draft = None if point_mass else q.expand(rows, len(parents), -1)
    generator = torch.Generator().manual_seed(0)
    tokens = tokens.expand(rows, -1) if tokens.shape[0] == 1 else tokens
    accepted, token, path = accept_tree_sampled(tokens, draft, target, torch.as_tensor(layout.children), 1, generator)
    first = torch.where(accepted > 0, tokens.gather(1, path.clamp(min=0))[:, 0], token)
    return torch.bincount(first, minlength=p.shape[-1])


@pytest.mark.parametrize("case", ["iid-repeats", "point-masses-repeat"])
def test_tree_sampling_rule_keeps_the_target_distribution(case):
    """SpecInfer's rule with siblings that repeat a token: drawn i.i.d. from q, or point masses (deterministic
    children) where the same token appears twice. The first emitted token is distributed as p."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])  # far from p: many rejections, residuals used
    if case == "iid-repeats":  # three siblings drawn i.i.d. from q per row: 1 often twice or three times
        tokens = torch.multinomial(q, 3 * 200_000, replacement=True, generator=torch.Generator().manual_seed(1))
        tokens = tokens.view(200_000, 3)
    else:
        tokens = torch.tensor([[1, 1, 3]])  # deterministic siblings 1, 1, 3
    counts = first_token_counts(p, q, tokens, [-1, -1, -1], point_mass=case != "iid-repeats")
    statistic, critical = chi_square(counts, p)
    assert statistic < critical, f"chi2 {statistic:.1f} > {critical:.1f}: {counts.tolist()}"
    # the test can tell another distribution: the draft's own, or the rule without the residual update
    wrong = first_token_counts(q, q * 0 + 0.2, tokens, [-1, -1, -1], point_mass=case != "iid-repeats")
    assert chi_square(wrong, p)[0] > 3 * critical  # the test can tell another distribution


@pytest.mark.parametrize("warp", [(1.0, None), (1.5, 0.9)])
@pytest.mark.parametrize("kind", ["static-iid", "dynamic-point-masses"])
def test_tree_speculative_sampling_matches_target_distribution(kind, warp):
    """End to end: tokens 2 and 3 come from one tree round (depth 2); their joint is the target's, enumerated. Also
    with a temperature and top_p, which warp q (the draws, the dynamic tree's scores) and p alike."""
    sampling = Sampling(True, warp[0], None, warp[1])
    target, draft = sampling_pair()
    rows = 12_000
    ids = PROMPT.expand(rows, -1).contiguous()
    mask = torch.ones_like(ids)
    generation = Generation(max_new_tokens=4, sampling=sampling)
    generator = torch.Generator().manual_seed(0)
    tree = StaticTree(static_parents([2, 2]), sampling) if kind == "static-iid" else DynamicTree(4, 2, sampling)
    with torch.inference_mode():
        spec = generate_speculative(target, DraftModelDrafter(draft, V, sampling, generator, tree=tree), ids, mask,
                                    generation, gamma=2, generator=generator)
    first = [r.rounds[0] for r in spec]
    assert all(max(depth_of(r["parents"])) == 2 for r in first)
    assert any(r["ranks"][:1] == [1] for r in first), "a second sibling must be accepted sometimes"
    statistic, critical = chi_square(joint_counts(spec), exact_joint_of_tokens_2_and_3(target, sampling))
    assert statistic < critical, f"tree sampling is off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"


def test_prompt_lookup_matches_make_a_trie():
    from decode.drafters.prompt_lookup import NgramIndex, trie_of

    #            0  1  2  3  4  5  6  7  8  9 10 11 12
    index = NgramIndex([5, 7, 8, 9, 5, 7, 8, 4, 5, 6, 3, 1, 5])
    # the tail 5 occurs at 0, 4, 8; each match is one token long: the earliest first
    assert index.propose_many(3, 1, 3, matches=3) == [[7, 8, 9], [7, 8, 4], [6, 3, 1]]
    assert index.propose_many(3, 1, 3, matches=1) == [index.propose(3, 1, 3)]
    tokens, parents = trie_of([[7, 8, 9], [7, 8, 4], [6, 3, 1]], budget=6)
    # breadth first: 7, 6 | 8, 3 | 9, 4 (the budget cuts the third continuation's 1)
    assert tokens == [7, 6, 8, 3, 9, 4] and parents == [-1, -1, 0, 1, 2, 2]


def test_prompt_lookup_tree_is_exact():
    from decode.drafters.prompt_lookup import PromptLookupDrafter

    target = tiny_model("qwen2")
    generation = Generation(24, GREEDY, (2,))
    # prompts that repeat themselves, so that lookups match, several times, with different continuations
    ids = torch.tensor([[0, 0, 5, 7, 8, 9, 5, 7, 8, 4, 5, 7, 3, 5, 7], [5, 6, 9, 9, 5, 6, 11, 5, 6, 9, 9, 5, 6, 12, 5]])
    mask = (torch.arange(15) >= torch.tensor([[2], [0]])).long()
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, PromptLookupDrafter(2, 1, matches=3, budget=8), ids, mask, generation, 4)
    assert [r.output_ids for r in spec] == [r.output_ids for r in base]
    rounds = [r for s in spec for r in s.rounds]
    branched = [r for r in rounds if len(set(r.get("parents", []))) < len(r.get("parents", []))]
    assert branched, "some round verified several continuations (a node with two children)"


def test_a_tree_round_records_the_batchs_widest_tree():
    """Prompt lookup tries differ row by row (a row without a match has none): every row's round records the width
    the target verified, the widest row's trie, which is what the round cost (eval/trees.py tree_prediction)."""
    from decode.drafters.prompt_lookup import PromptLookupDrafter

    target = tiny_model("qwen2")
    ids = torch.tensor([[0, 0, 5, 7, 8, 9, 5, 7, 8, 4, 5, 7, 3, 5, 7], [5, 6, 9, 9, 5, 6, 11, 5, 6, 9, 9, 5, 6, 12, 5]])
    mask = (torch.arange(15) >= torch.tensor([[2], [0]])).long()
    with torch.inference_mode():
        spec = generate_speculative(target, PromptLookupDrafter(2, 1, matches=3, budget=8), ids, mask,
                                    Generation(16, GREEDY, ()), 4)
    both = list(zip(spec[0].rounds, spec[1].rounds))  # no EOS: the rows run the same rounds
    trees = [(x, y) for x, y in both if "parents" in x]
    assert any(x["drafted"] != y["drafted"] for x, y in trees), "the test needs rows whose tries differ"
    for x, y in trees:
        assert x["batch_nodes"] == y["batch_nodes"] == max(x["drafted"], y["drafted"])
