"""Draft heads fed by the target's hidden states (decode/head_models.py, decode/drafters/head_drafters.py): the hidden
states the engine hands over are transformers' own, an EAGLE-3 head drafts in the engine what it drafts from scratch over the
whole sequence, greedy output is the target's in static batches and under load, sampling keeps the target's
distribution, and the folders users have load as the same head."""
import json

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from decode import Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.head_drafters import Eagle3Drafter, MedusaDrafter
from decode.head_models import Eagle3Head, HeadFormatError, MedusaHeads, load_head, save_eagle3
from decode.hidden import HiddenTap
from decode.arrivals import Load
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts
from tiny_models import VOCAB, ragged_batch, save_medusa, tiny_model

GREEDY = Sampling()
LAYERS = (0, 2, 3)  # of the 4-layer target: the embeddings and the inputs of layers 2 and 3


def eagle3_head(target, layers=LAYERS, draft_vocab=VOCAB, seed=0, hidden=None) -> Eagle3Head:
    """A random head for the target, as wide as it unless `hidden` says otherwise."""
    torch.manual_seed(seed)
    width = hidden or target.config.hidden_size
    config = LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=target.config.vocab_size, max_position_embeddings=512)
    head = Eagle3Head(config, target.config.hidden_size, draft_vocab, layers)
    if draft_vocab < target.config.vocab_size:  # every other target id
        head.d2t.copy_(torch.arange(draft_vocab))
    return head


def fit(target, head, medusa, steps=150):
    """Both heads fit to the target's greedy continuations of 64 prompts (EAGLE-3's first step and each Medusa head),
    so that their drafts are accepted on those prompts: the rounds then keep drafts as well as reject them."""
    ids, mask = ragged_batch([6] * 64, seed=5)
    with torch.no_grad():
        out = generate_baseline(target, ids, mask, Generation(max_new_tokens=26))
        seqs = torch.cat([ids, torch.tensor([r.output_ids for r in out])], 1)
        states = target(seqs, output_hidden_states=True).hidden_states
    features, last = torch.cat([states[i] for i in head.target_layers], -1), states[-1]
    length = seqs.shape[1]
    positions = torch.arange(length - 1)[None].expand(seqs.shape[0], -1)
    heads = medusa.num_heads
    medusa_targets = torch.stack([seqs[:, 2 + k: length - heads + 1 + k] for k in range(heads)], -1)
    optimizer = torch.optim.Adam([*head.parameters(), *medusa.parameters()], lr=3e-3)
    for _ in range(steps):
        logits = head(seqs[:, 1:], position_ids=positions, past_key_values=None, features=features[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), seqs[:, 2:].flatten())
        guesses = medusa(last[:, : length - heads - 1].flatten(0, 1))
        loss = loss + torch.nn.functional.cross_entropy(guesses.flatten(0, 1), medusa_targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ids[:6], mask[:6]


@pytest.fixture(scope="module")
def heads():
    target = tiny_model("llama", seed=1, layers=4)
    head, medusa = eagle3_head(target), MedusaHeads(64, VOCAB, 3, 1, 4)
    ids, mask = fit(target, head, medusa)
    return target, head.eval(), medusa.eval(), ids, mask


def reference_drafts(target, head, sequence: list[int], count: int) -> list[int]:
    """The head's greedy drafts after `sequence` (committed tokens), from scratch: the target's hidden states at every
    position but the last, each paired with the next token, read in one forward without padding; then its own."""
    ids = torch.tensor([sequence])
    states = target(ids, output_hidden_states=True).hidden_states
    features = torch.cat([states[i] for i in head.target_layers], -1)[:, :-1]
    cache, n = DynamicCache(), len(sequence) - 1
    logits = head(ids[:, 1:], position_ids=torch.arange(n)[None], past_key_values=cache, features=features).logits
    drafts = []
    for k in range(count):
        draft_id = int(logits[0, -1].argmax())
        drafts.append(int(head.draft_to_target[draft_id]))
        logits = head(torch.tensor([[drafts[-1]]]), position_ids=torch.tensor([[n + k]]), past_key_values=cache,
                      hidden=head.last_hidden[:, -1:]).logits
    return drafts


class Recording(Eagle3Drafter):
    """An Eagle3Drafter that notes each round's drafts per request (a static batch: rows leave by select_rows)."""

    def start(self, prompt_ids, prompt_mask, host=None):
        self.rows, self.seen = list(range(prompt_ids.shape[0])), {}
        super().start(prompt_ids, prompt_mask, host)

    def propose(self, last_tokens, max_tokens, row_limits=None):
        proposal = super().propose(last_tokens, max_tokens, row_limits)
        for local, row in enumerate(self.rows):
            self.seen.setdefault(row, []).append(proposal.tokens[local, : int(proposal.lengths[local])].tolist())
        return proposal

    def select_rows(self, rows):
        self.rows = [self.rows[r] for r in rows.tolist()]
        super().select_rows(rows)


def test_the_tap_hands_over_transformers_hidden_states():
    target = tiny_model("llama", seed=1, layers=4)
    ids, mask = ragged_batch([5, 5], seed=1)
    with torch.inference_mode(), HiddenTap(target, (0, 2, 4)) as tap:
        states = target(ids, output_hidden_states=True).hidden_states
        got = tap.pop()
    # 0 and 2: the inputs of layers 0 and 2; 4 (= the layer count): the final norm's output, the LM head's input
    assert torch.equal(got, torch.cat([states[0], states[2], states[4]], -1))
    with pytest.raises(ValueError, match="does not exist"):
        HiddenTap(target, (5,))


def test_eagle3_drafts_in_the_engine_what_it_drafts_from_scratch(heads):
    target, head, _, ids, mask = heads
    lengths = [6, 2, 1, 4, 6, 3]  # ragged, one prompt of a single token
    ids, mask = ids * (torch.arange(6)[None] >= 6 - torch.tensor(lengths)[:, None]), \
        (torch.arange(6)[None] >= 6 - torch.tensor(lengths)[:, None]).long()
    drafter = Recording(head, VOCAB, GREEDY)
    generation = Generation(max_new_tokens=14)
    with torch.inference_mode():
        records = generate_speculative(target, drafter, ids, mask, generation, 3)
        accepted = sum(r["accepted"] for record in records for r in record.rounds)
        for row, record in enumerate(records):
            prompt = ids[row, 6 - lengths[row]:].tolist()
            committed = 1  # the prefill's token
            for round_facts, drafts in zip(record.rounds, drafter.seen[row]):
                sequence = prompt + record.output_ids[:committed]
                assert drafts == reference_drafts(target, head, sequence, len(drafts)), (row, committed)
                committed += round_facts["emitted"]
    assert accepted >= 10, "the fitted head's drafts should be accepted on these prompts (the test needs accepts)"


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_heads_are_exact_in_static_batches_and_under_load(heads, kind):
    target, head, medusa, ids, mask = heads
    other_ids, other_mask = ragged_batch([7, 1, 3], seed=9)  # prompts the heads never saw
    ids = torch.cat([torch.nn.functional.pad(ids, (1, 0)), other_ids])
    mask = torch.cat([torch.nn.functional.pad(mask, (1, 0)), other_mask])
    generation = Generation(max_new_tokens=12, eos_token_ids=(54,))

    def drafter():
        return Eagle3Drafter(head, VOCAB, GREEDY) if kind == "eagle3" else MedusaDrafter(medusa, VOCAB, GREEDY)

    with torch.inference_mode():
        alone = generate_baseline(target, ids, mask, generation)
        static = generate_speculative(target, drafter(), ids, mask, generation, 4)
        served = generate_speculative(target, drafter(), ids, mask, generation, 4,
                                      load=Load([0.0, 0.0, 0.001, 0.003, 0.004, 0.006, 0.02, 0.021, 0.03], 3))
    assert [r.output_ids for r in static] == [r.output_ids for r in alone]
    assert [r.output_ids for r in served] == [r.output_ids for r in alone]
    assert all(r.draft_forwards >= 0 for r in served)  # a drafter reset after a lull counts from 0
    # a request's drafts depend on its own tokens alone: the same rounds however the requests were batched
    assert [[(x["drafted"], x["accepted"]) for x in r.rounds] for r in served] == \
        [[(x["drafted"], x["accepted"]) for x in r.rounds] for r in static]
    assert sum(x["accepted"] for r in static for x in r.rounds) >= 10
    if kind == "medusa":  # as many drafts as heads, whatever gamma
        assert max(x["drafted"] for r in static for x in r.rounds) == 3


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "eagle3-tree", "medusa-tree"])
def test_heads_sample_the_target_distribution(kind):
    target = tiny_model("llama", seed=1, vocab_size=V, layers=2, hidden=32, init_range=0.3)
    sampling, rows = Sampling(True, 1.0), 12_000
    torch.manual_seed(3)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=V, max_position_embeddings=64, initializer_range=0.3)
    generator = torch.Generator().manual_seed(0)
    if kind == "eagle3":  # a draft vocabulary of 8 of the 12 ids: q = 0 on the others
        head = Eagle3Head(config, 32, 8, (0, 1, 2)).eval()
        head.d2t.copy_(torch.tensor([0, 0, 1, 1, 2, 2, 3, 4]))
        drafter = Eagle3Drafter(head, V, sampling, generator)
    elif kind == "eagle3-tree":  # a static tree: each node's children drawn from its own q
        from decode.drafters.draft_tree import StaticTree
        from decode.tree_layout import static_parents

        drafter = Eagle3Drafter(Eagle3Head(config, 32, V, (0, 1, 2)).eval(), V, sampling, generator,
                                tree=StaticTree(static_parents([2, 1]), sampling))
    elif kind == "medusa-tree":  # every depth-1 node's children drawn from head 2's q
        from decode.drafters.draft_tree import StaticTree
        from decode.tree_layout import static_parents

        drafter = MedusaDrafter(MedusaHeads(32, V, 2, 1, 2).eval(), V, sampling, generator,
                                tree=StaticTree(static_parents([2, 2]), sampling))
    else:
        drafter = MedusaDrafter(MedusaHeads(32, V, 2, 1, 2).eval(), V, sampling, generator)
    ids = PROMPT.expand(rows, -1).contiguous()
    with torch.inference_mode():
        spec = generate_speculative(target, drafter, ids, torch.ones_like(ids), Generation(4, sampling), 2, generator)
    acceptance = sum(r.rounds[0]["accepted"] for r in spec) / (2 * rows)
    assert 0.05 < acceptance < 0.95, "head and target should disagree sometimes for the test to bite"
    statistic, critical = chi_square(joint_counts(spec), exact_joint_of_tokens_2_and_3(target, sampling))
    assert statistic < critical, f"chi2 {statistic:.1f} > {critical:.1f}"


@pytest.mark.parametrize("layout", ["speculators", "eagle", "specforge"])
def test_eagle3_folders_load_as_the_same_head(tmp_path, layout):
    target = tiny_model("llama", seed=1, layers=4)
    head = eagle3_head(target, draft_vocab=48, seed=4)
    head.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight)  # the EAGLE layout shares it
    folder = save_eagle3(head, tmp_path / layout, layout)
    loaded = load_head(folder, "eagle3", target)
    assert loaded.target_layers == LAYERS and loaded.lm_head.out_features == 48
    assert torch.equal(loaded.draft_to_target, head.draft_to_target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    config = json.loads((folder / "config.json").read_text())
    assert ("speculators_model_type" in config) == (layout == "speculators")
    # as the reference server reads a folder: its one layer stated (it takes the layer config as written)
    assert config.get("transformer_layer_config", config)["num_hidden_layers"] == 1


def test_a_head_over_the_whole_vocabulary_writes_no_maps(tmp_path):
    """A head whose draft vocabulary is the target's, in the target's order, has no d2t / t2d in its folder (the
    reference server has no parameter for them) and loads as the same head."""
    from safetensors.torch import load_file

    target = tiny_model("llama", seed=1, layers=4)
    head = eagle3_head(target, seed=4)
    folder = save_eagle3(head, tmp_path / "full")
    assert not {"d2t", "t2d"} & set(load_file(str(folder / "model.safetensors")))
    loaded = load_head(folder, "eagle3", target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_medusa_folder_loads_and_bad_folders_are_named(tmp_path):
    target = tiny_model("llama", seed=1, layers=4)
    torch.manual_seed(2)
    heads = MedusaHeads(64, VOCAB, 3, 2, 4)
    loaded = load_head(save_medusa(heads, tmp_path / "medusa"), "medusa", target)
    assert loaded.num_heads == 3 and loaded.target_layers == (4,)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in heads.state_dict().items())
    with pytest.raises(HeadFormatError, match="describes a medusa head"):
        load_head(tmp_path / "medusa", "eagle3", target)
    with pytest.raises(HeadFormatError, match="no config.json"):
        load_head(tmp_path, "medusa", target)
    narrow = tiny_model("llama", seed=1, layers=4, hidden=32)
    with pytest.raises(HeadFormatError, match="another target"):
        load_head(tmp_path / "medusa", "medusa", narrow)


def test_head_folders_in_their_publishers_variants(tmp_path):
    """FasterDecoding's medusa_lm_head.pt holds the heads' own state dict (no medusa_head. prefix) and may hold more
    heads than its config says; SpecForge's aux layer ids name a layer's output; a weight the head does not have, a
    trainer's optimizer file and an unreadable weight file are named in one line, not dropped or crashed on."""
    target = tiny_model("llama", seed=1, layers=4)
    torch.manual_seed(2)
    heads = MedusaHeads(64, VOCAB, 3, 1, 4)
    folder = tmp_path / "medusa"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    torch.save(heads.medusa_head.state_dict(), folder / "medusa_lm_head.pt")
    (folder / "optimizer.pt").write_bytes(b"not a tensor file")
    assert load_head(folder, "medusa", target).num_heads == 3
    (folder / "medusa_lm_head.pt").write_bytes(b"corrupt")
    with pytest.raises(HeadFormatError, match="cannot be read as weights"):
        load_head(folder, "medusa", target)

    head = eagle3_head(target, seed=4)
    specforge = save_eagle3(head, tmp_path / "specforge", "specforge")
    assert json.loads((specforge / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [-1, 1, 2]
    loaded = load_head(specforge, "eagle3", target)
    assert loaded.target_layers == LAYERS
    assert loaded.embed_tokens.weight is target.get_input_embeddings().weight  # shared, not copied
    from safetensors.torch import load_file, save_file
    weights = load_file(str(specforge / "model.safetensors"))
    save_file({**weights, "midlayer.self_attn.q_norm.weight": torch.ones(16)}, str(specforge / "model.safetensors"))
    with pytest.raises(HeadFormatError, match="does not have: midlayer.self_attn.q_norm.weight"):
        load_head(specforge, "eagle3", target)


def edited(folder, config=None, weights=None):
    """A saved head's folder with its config.json replaced by config(the old one) and its model.safetensors changed in
    place by weights(the dict)."""
    from safetensors.torch import load_file, save_file

    if config is not None:
        (folder / "config.json").write_text(json.dumps(config(json.loads((folder / "config.json").read_text()))))
    if weights is not None:
        state = load_file(str(folder / "model.safetensors"))
        weights(state)
        save_file(state, str(folder / "model.safetensors"))
    return folder


def refused(folder, kind, target, fragment):
    """load_head refuses the folder in one line naming it and `fragment`."""
    with pytest.raises(HeadFormatError) as error:
        load_head(folder, kind, target)
    message = str(error.value)
    assert fragment in message and str(folder) in message and "\n" not in message, message


def without(key):
    return lambda config: {k: v for k, v in config.items() if k != key}


@pytest.mark.parametrize("layout, config, fragment", [
    # no target_hidden_size: the head reads states as wide as itself (as the reference servers build its fc)
    ("eagle", without("target_hidden_size"), "reads hidden states 32 wide"),
    # target_hidden_size bridges the states, but no embed_tokens: it would share the target's 64-wide embedding
    ("eagle", None, "32 wide and has no embed_tokens"),
], ids=["no-target-hidden-size", "no-embed-tokens"])
def test_a_head_of_another_width_is_refused_at_load(tmp_path, layout, config, fragment):
    """A head 32 wide for a 64-wide target loads only with target_hidden_size 64 and an embedding of its own."""
    target = tiny_model("llama", seed=1, layers=4)
    head = eagle3_head(target, seed=4, hidden=32)
    refused(edited(save_eagle3(head, tmp_path / "narrow", layout), config), "eagle3", target, fragment)
    loaded = load_head(save_eagle3(head, tmp_path / "own", "speculators"), "eagle3", target)  # both: it drafts
    logits = loaded(torch.tensor([[5, 6]]), position_ids=torch.arange(2)[None], features=torch.zeros(1, 2, 3 * 64))
    assert logits.logits.shape == (1, 2, VOCAB)


def layer(key, value):
    """A speculators config with transformer_layer_config[key] = value."""
    return lambda config: {**config, "transformer_layer_config": {**config["transformer_layer_config"], key: value}}


@pytest.mark.parametrize("kind, layout, config, fragment", [
    ("eagle3", "speculators", lambda config: [config], "config.json: not a JSON object"),
    ("medusa", None, lambda config: [config], "config.json: not a JSON object"),
    ("eagle3", "speculators", lambda config: {**config, "draft_vocab_size": "abc"}, "draft_vocab_size is 'abc'"),
    ("eagle3", "eagle", lambda config: {**config, "draft_vocab_size": 0}, "draft_vocab_size is 0"),
    ("eagle3", "speculators", layer("hidden_size", "64"), "hidden_size is '64'"),
    ("eagle3", "speculators", layer("num_attention_heads", 3), "num_attention_heads 3 does not divide hidden_size 64"),
    ("eagle3", "eagle", lambda config: {**config, "num_attention_heads": 3}, "num_attention_heads 3 does not divide"),
    ("eagle3", "eagle", lambda config: {**config, "num_key_value_heads": 3},
     "num_key_value_heads 3 does not divide num_attention_heads 4"),
    ("eagle3", "speculators", lambda config: {**config, "transformer_layer_config": "llama"},
     "transformer_layer_config is 'llama'"),
    ("eagle3", "eagle", lambda config: {**config, "eagle_aux_hidden_state_layer_ids": ["a", 2, 3]},
     "eagle_aux_hidden_state_layer_ids is ['a', 2, 3]"),
    ("medusa", None, lambda config: {**config, "medusa_num_heads": "three"}, "medusa_num_heads is 'three'"),
    ("medusa", None, lambda config: {**config, "medusa_num_layers": "x"}, "medusa_num_layers is 'x'"),
    ("medusa", None, lambda config: {**config, "medusa_num_layers": 1.5}, "medusa_num_layers is 1.5"),
], ids=["eagle3-list", "medusa-list", "draft-vocab-abc", "draft-vocab-0", "hidden-size-string", "heads-3-speculators",
        "heads-3-eagle", "kv-heads-3", "layer-config-string", "aux-ids-string", "medusa-heads-three", "medusa-layers-x",
        "medusa-layers-1.5"])
def test_malformed_head_configs_are_refused_in_one_line(tmp_path, kind, layout, config, fragment):
    target = tiny_model("llama", seed=1, layers=4)
    torch.manual_seed(2)
    folder = save_eagle3(eagle3_head(target, draft_vocab=48, seed=4), tmp_path / "head", layout) if kind == "eagle3" \
        else save_medusa(MedusaHeads(64, VOCAB, 3, 1, 4), tmp_path / "head")
    refused(edited(folder, config), kind, target, fragment)


def one_target_id(state):  # every draft id to target id 0
    state["d2t"] = -torch.arange(48)


def fractional(state):  # offsets 0.5 apart: truncated they would map draft ids 2i and 2i + 1 to one target id
    state["d2t"] = torch.arange(48) * 0.5


def flipped(state):  # a target id d2t never reaches marked, one it reaches not
    state["t2d"][1], state["t2d"][2] = True, False


@pytest.mark.parametrize("kind, layout, config, weights, fragment", [
    ("eagle3", "eagle", lambda config: {**config, "vocab_size": 32000}, None, "vocab_size 32000 is not the target's 96"),
    ("eagle3", "speculators", layer("vocab_size", 32000), None, "vocab_size 32000 is not the target's 96"),
    ("medusa", None, lambda config: {**config, "vocab_size": 32000}, None, "vocab_size 32000 is not the target's 96"),
    ("eagle3", "speculators", None, one_target_id, "d2t maps draft ids 0 and 1 to one target id, 0"),
    ("eagle3", "speculators", None, fractional, "d2t holds 0.5 at draft id 1"),
    ("eagle3", "eagle", None, lambda state: state.update(t2d=torch.zeros(VOCAB, dtype=torch.bool)),
     "t2d marks 0 target ids"),
    ("eagle3", "speculators", None, flipped, "they disagree at target id 1"),
    ("eagle3", "speculators", None, lambda state: state.update(t2d=torch.ones(48, dtype=torch.bool)),
     "t2d has shape (48,), not the target's vocabulary (96,)"),
], ids=["vocab-eagle", "vocab-speculators", "vocab-medusa", "d2t-one-target-id", "d2t-fractional", "t2d-all-false",
        "t2d-flipped", "t2d-draft-sized"])
def test_wrong_vocabularies_and_maps_are_refused(tmp_path, kind, layout, config, weights, fragment):
    """config.json's vocab_size is the target's; d2t maps each draft id to a target id of its own (target id = draft
    id + d2t[draft id], whole offsets); t2d, where present, marks exactly the target ids d2t reaches."""
    target = tiny_model("llama", seed=1, layers=4)
    torch.manual_seed(2)
    head = eagle3_head(target, draft_vocab=48, seed=4)  # draft id i: target id 2i
    folder = save_eagle3(head, tmp_path / "head", layout) if kind == "eagle3" \
        else save_medusa(MedusaHeads(64, VOCAB, 3, 1, 4), tmp_path / "head")
    refused(edited(folder, config, weights), kind, target, fragment)
    # the same maps in floats of whole offsets are the head's
    folder = edited(save_eagle3(head, tmp_path / "floats"), weights=lambda state: state.update(d2t=state["d2t"].double()))
    assert load_head(folder, "eagle3", target).draft_to_target.tolist() == list(range(0, 96, 2))


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
@pytest.mark.parametrize("shape", ["static", "dynamic", "auto"])
def test_head_trees_are_exact_and_keep_drafts(heads, kind, shape):
    """Heads drafting token trees (an EAGLE-3 node reads its parent's head state; a Medusa node at depth d takes its
    children from head d + 1): greedy output is the target's, in a static batch and under load, and the trees' paths
    are accepted as the chains' drafts are. auto: its exploring warmup tree, then the trees its own rounds price
    (a head's forward at c = 0.05 of a target step, a flat verification cost)."""
    from decode.drafters.draft_tree import AutoMemory, AutoTree, DynamicTree, StaticTree
    from decode.tree_layout import static_parents

    target, eagle, medusa, ids, mask = heads
    generation = Generation(max_new_tokens=12)
    kind, head = (Eagle3Drafter, eagle) if kind == "eagle3" else (MedusaDrafter, medusa)
    memory = AutoMemory(AutoTree.RECENT)

    def drafter(tree="tree", explore=False):
        if tree == "tree":
            tree = {"static": lambda: StaticTree(static_parents([2, 2, 1]), GREEDY),
                    "dynamic": lambda: DynamicTree(8, 2, GREEDY),
                    "auto": lambda: AutoTree(memory, 0.05, {n: 1.0 for n in (1, 2, 4, 8)}, GREEDY, explore)}[shape]()
        return kind(head, VOCAB, GREEDY, tree=tree)

    with torch.inference_mode():
        alone = generate_baseline(target, ids, mask, generation)
        warmup = generate_speculative(target, drafter(explore=True), ids, mask, generation, 3)
        static = generate_speculative(target, drafter(), ids, mask, generation, 3)
        served = generate_speculative(target, drafter(), ids, mask, generation, 3,
                                      load=Load([0.0, 0.0, 0.001, 0.003, 0.004, 0.006], 2))
    assert [r.output_ids for r in warmup] == [r.output_ids for r in alone]
    assert [r.output_ids for r in static] == [r.output_ids for r in alone]
    assert [r.output_ids for r in served] == [r.output_ids for r in alone]
    if shape == "auto" and head is medusa:  # its warmup saw second ranks accepted: wider trees than a chain pay
        assert max(x["drafted"] for r in static for x in r.rounds) > 3
    if shape != "static":
        return
    chain = generate_speculative(target, drafter(None), ids, mask, generation, 3)
    # a static tree holds the chain's path (its first branch is the head's top-1 at every depth)
    assert sum(x["accepted"] for r in static for x in r.rounds) >= sum(x["accepted"] for r in chain for x in r.rounds)


@pytest.mark.parametrize("kind", ["eagle3", "medusa-tree"])
def test_heads_read_a_compiled_target(heads, kind):
    """engine.compile: the target's graphs return the heads' hidden states beside the logits (the union of both
    heads' layers, each drafter taking its own, in its order); the rounds are the eager engine's and the output the
    target's, and a layer the graphs do not return is refused."""
    from decode.drafters.draft_tree import StaticTree
    from decode.hidden import CompiledTap
    from decode.static_kv import compiled_of
    from decode.tree_layout import static_parents
    from test_compiled_engine import compiled_copy

    torch._dynamo.reset()
    target, eagle, medusa, ids, mask = heads
    generation = Generation(max_new_tokens=12)

    def drafter():
        if kind == "eagle3":
            return Eagle3Drafter(eagle, VOCAB, GREEDY)
        return MedusaDrafter(medusa, VOCAB, GREEDY, tree=StaticTree(static_parents([2, 2, 1]), GREEDY))

    layers = tuple(sorted({*eagle.target_layers, *medusa.target_layers}))  # (0, 2, 3, 4): eagle3 reads 0, 2, 3
    compiled = compiled_copy(target, (1, 4), 64, (6,), tree_widths=(11,), head_layers=layers)
    with torch.inference_mode():
        alone = generate_baseline(target, ids, mask, generation)
        eager = generate_speculative(target, drafter(), ids, mask, generation, 3)
        fast = generate_speculative(compiled, drafter(), ids, mask, generation, 3)
    assert [r.output_ids for r in fast] == [r.output_ids for r in alone]
    assert [r.rounds for r in fast] == [r.rounds for r in eager]
    assert compiled_of(compiled).compiles >= 1
    with pytest.raises(ValueError, match="not \\[1\\]"):
        CompiledTap(compiled_of(compiled), (1, 2))
