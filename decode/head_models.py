"""Draft heads: small modules that draft from the target's own hidden states, and the folders they come in.

- EAGLE-3 (Li et al. 2025): the target's hidden states at three layers (low, middle, high; the input of each of those
  decoder layers), concatenated and projected by `fc` to the head's width, meet the embedding of the next token in one
  decoder layer whose attention reads both ([embedding, hidden], 2 x hidden wide), then a final norm and an LM head
  over a reduced draft vocabulary (`d2t`: target id = draft id + d2t[draft id], whole offsets, a target id of its own
  for each draft id; `t2d`, where a folder has it, marks the target ids d2t reaches). The head's pre-norm output is its
  own hidden state, fed back in place of the target's at the next draft step. One layer, with a KV cache of its own.
- Medusa (Cai et al. 2024): K heads on the target's last hidden state (after its final norm), head k a stack of
  residual blocks x + SiLU(W x + b) then an LM head, predicting the token k + 2 places ahead (the target's own LM
  head predicts the next one). No cache: stateless.

Loaded from a folder (config.json and safetensors or a torch .bin) in the layouts users have:
- EAGLE-3 in the speculators format (`speculators_model_type: eagle3`, `transformer_layer_config`,
  `draft_vocab_size`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`, `norm_before_residual`, True when
  absent; weights `layers.0.*`), the EAGLE repository's (a Llama config with `draft_vocab_size`; weights `midlayer.*`)
  and SpecForge's (`architectures: [LlamaForCausalLMEagle3]`, the EAGLE layout, whose aux layer ids name a layer's
  output: id + 1 here). A head without `embed_tokens` shares the target's (so is as wide as the target); without
  `target_hidden_size` it reads states as wide as itself (its `hidden_size`, as the reference servers build `fc`);
  `norm_before_fc` / `fc_norm` are refused.
- Medusa in the FasterDecoding layout (`medusa_num_heads`, `medusa_num_layers`; weights
  `medusa_head.{k}.{j}.linear.weight|bias` for the blocks, `medusa_head.{k}.{layers}.weight` for the LM head, or the
  same without `medusa_head.` in medusa_lm_head.pt). FasterDecoding's blocks of one head share one module when
  medusa_num_layers > 1 (`[ResBlock] * L`): its saved weights repeat, which loads the same.

Both expose what the engine's KVState drives (decode/kv.py): `config` (a Llama config: the attention mask transformers
builds), `get_input_embeddings()`, and a forward in a causal LM's keywords plus the target's hidden states.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

KINDS = ("eagle3", "medusa")


class HeadFormatError(ValueError):
    """A folder that is not a head of the kind asked, or one that does not fit the target; one line for the user."""


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's layers when the head does not name them (the reference implementations' default): low, middle, high."""
    return (2, num_layers // 2, num_layers - 3) if num_layers > 4 else (0, num_layers // 2, num_layers - 1)


class Eagle3Layer(nn.Module):
    """The head's decoder layer: attention over [norm(embedding), norm(hidden)] (2 x hidden wide), then an MLP, with
    the hidden state as the residual (normed first where norm_before_residual)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool):
        super().__init__()
        width = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * width, old.out_features, bias=old.bias is not None))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, hidden, position_embeddings, attention_mask, past_key_values):
        if self.norm_before_residual:
            hidden = self.hidden_norm(hidden)
            residual = hidden
        else:
            residual, hidden = hidden, self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        x, _ = self.self_attn(hidden_states=x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                              past_key_values=past_key_values)
        x = x + residual
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head for a target of `vocab_size` tokens whose hidden states are `target_hidden_size` wide.

    forward(input_ids [B, S], ..., features=[B, S, len(target_layers) x target_hidden_size]) pairs each column's
    target hidden state with the next token's embedding (the caller aligns them); hidden=[B, S, hidden_size] instead
    feeds the head's own state (a draft step after the first). Returns `.logits` over the draft vocabulary; the
    pre-norm output stays in `last_hidden` for the next step."""

    kind = "eagle3"

    def __init__(self, config: LlamaConfig, target_hidden_size: int, draft_vocab_size: int,
                 target_layers: tuple[int, ...], norm_before_residual: bool = False):
        super().__init__()
        config._attn_implementation = config._attn_implementation or "sdpa"
        self.config = config
        self.target_layers = tuple(int(i) for i in target_layers)
        width = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, width)
        self.fc = nn.Linear(len(self.target_layers) * target_hidden_size, width, bias=False)
        self.midlayer = Eagle3Layer(config, norm_before_residual)
        self.norm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(width, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.last_hidden: torch.Tensor | None = None

    def get_input_embeddings(self):
        return self.embed_tokens

    @property
    def feature_width(self) -> int:
        """The width of the target's hidden states it reads, all layers together."""
        return self.fc.in_features

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def draft_to_target(self) -> torch.Tensor:
        """[V_draft] each draft id's target id."""
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True,
                logits_to_keep=0, features=None, hidden=None):
        embeds = self.embed_tokens(input_ids)
        if features is not None:
            hidden = self.fc(features.to(self.fc.weight.dtype))
        if hidden is None:
            raise ValueError("an EAGLE-3 head drafts from the target's hidden states (features) or its own (hidden)")
        mask = create_causal_mask(config=self.config, inputs_embeds=embeds, attention_mask=attention_mask,
                                  past_key_values=past_key_values, position_ids=position_ids)
        out = self.midlayer(embeds, hidden, self.rotary_emb(embeds, position_ids=position_ids), mask, past_key_values)
        self.last_hidden = out
        kept = out[:, -logits_to_keep:] if logits_to_keep else out
        # transformers' output class, not a namespace: torch.compile traces its construction (decode/round_graph.py)
        return CausalLMOutputWithPast(logits=self.lm_head(self.norm(kept)))


class ResBlock(nn.Module):
    """Medusa's block: x + SiLU(W x + b)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads on the target's last hidden state [B, H] (its final norm's output): head k's logits [B, K, V] are for
    the token k + 2 places after that state's position."""

    kind = "medusa"

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int, target_layer: int):
        super().__init__()
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          nn.Linear(hidden_size, vocab_size, bias=False)) for _ in range(num_heads))
        self.target_layers = (int(target_layer),)
        self.config = SimpleNamespace(model_type="medusa", hidden_size=hidden_size, vocab_size=vocab_size,
                                      medusa_num_heads=num_heads, medusa_num_layers=num_layers)

    @property
    def num_heads(self) -> int:
        return len(self.medusa_head)

    @property
    def feature_width(self) -> int:
        return self.config.hidden_size

    @property
    def dtype(self) -> torch.dtype:
        return self.medusa_head[0][-1].weight.dtype

    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        hidden = hidden.to(self.medusa_head[0][-1].weight.dtype)
        return torch.stack([head(hidden) for head in list(self.medusa_head)[:heads]], dim=1)


# -- folders ------------------------------------------------------------------------------------------------------

# the weight files a head's folder may hold (a trainer's optimizer.pt or training_args.bin beside them is not read)
WEIGHT_FILES = ("model*.safetensors", "medusa_lm_head.safetensors", "pytorch_model*.bin", "model*.bin",
                "medusa_lm_head.pt")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted({f for pattern in WEIGHT_FILES for f in folder.glob(pattern)})
    safetensors = [f for f in files if f.suffix == ".safetensors"]
    weights = {}
    for file in safetensors or files:  # both: the safetensors
        try:
            if file.suffix == ".safetensors":
                from safetensors.torch import load_file

                weights.update(load_file(str(file)))
            else:
                weights.update(torch.load(str(file), map_location="cpu", weights_only=True))
        except Exception as error:  # a corrupt or foreign file: one line
            raise HeadFormatError(f"{file}: cannot be read as weights ({type(error).__name__}: "
                                  f"{' '.join(str(error).split())[:120]})") from None
    if not weights:
        raise HeadFormatError(f"{folder}: no weights ({', '.join(WEIGHT_FILES)})")
    return weights


def head_kind(config: dict) -> str | None:
    """The kind of head a config.json describes (eagle3, medusa), or None."""
    if config.get("speculators_model_type") == "eagle3" or "draft_vocab_size" in config \
            or any("Eagle3" in a for a in config.get("architectures") or ()):
        return "eagle3"
    if "medusa_num_heads" in config:
        return "medusa"
    return None


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise HeadFormatError(f"{folder}: no config.json (a head's folder holds its config.json and weights)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise HeadFormatError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(config, dict):
        raise HeadFormatError(f"{path}: not a JSON object but a {type(config).__name__} (a head's config.json maps its "
                              "keys to values)")
    return config


# the sizes of a head's layer config: whole numbers where stated (null: not stated)
LAYER_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "max_position_embeddings", "draft_vocab_size", "target_hidden_size")


def _sizes(path: Path, config: dict, keys) -> None:
    """Each of `keys` that config states a whole number of at least 1 (a string, a float or 0 crashed or truncated
    later); HeadFormatError naming the key."""
    for key in keys:
        value = config.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise HeadFormatError(f"{path}: {key} is {value!r}, not a whole number of at least 1")


def _vocab(path: Path, config: dict, vocab: int) -> None:
    """A vocab_size that config states is the target's (the head's embedding or LM head rows are the target's ids)."""
    if config.get("vocab_size") is not None and config["vocab_size"] != vocab:
        raise HeadFormatError(f"{path}: vocab_size {config['vocab_size']} is not the target's {vocab} tokens: a head for "
                              "another target's vocabulary")


def load_head(folder: str | Path, kind: str, target, dtype: torch.dtype = torch.float32):
    """The head in `folder` (kind eagle3 or medusa), checked against the target (a causal LM: its vocabulary, width
    and depth), its weights in `dtype`, on the target's input device, in eval mode. HeadFormatError: one line."""
    folder = Path(folder)
    config = _read_config(folder)
    found = head_kind(config)
    if found != kind:
        raise HeadFormatError(f"{folder}: config.json describes {'a ' + found + ' head' if found else 'no head'} "
                              f"({'speculators_model_type, draft_vocab_size or an Eagle3 architecture' if kind == 'eagle3' else 'medusa_num_heads'} "
                              f"expected for kind {kind})")
    weights = _weights(folder)
    _, vocab, width, depth = _target_shape(target)
    head = _eagle3(folder, config, weights, vocab, width, depth, target) if kind == "eagle3" \
        else _medusa(folder, config, weights, vocab, width, depth)
    return _on_target(head, target, dtype)


SYNTHETIC_HEAD = "synthetic:head"
SYNTHETIC_PARAMETERS = ("draft_vocab", "heads", "seed")


def parse_synthetic_head(spec: str) -> dict:
    """'synthetic:head?draft_vocab=N&heads=K&seed=S' -> its parameters (ints); HeadFormatError: one line."""
    from urllib.parse import parse_qs

    body, _, query = spec.partition("?")
    if body != SYNTHETIC_HEAD:
        raise HeadFormatError(f"{spec}: a synthetic head is {SYNTHETIC_HEAD}[?draft_vocab=N&heads=K&seed=S] (its "
                              "shape follows the target's)")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    unknown = sorted(set(params) - set(SYNTHETIC_PARAMETERS))
    if unknown:
        raise HeadFormatError(f"{spec}: unknown synthetic head parameter {unknown[0]!r}; use "
                              f"{', '.join(SYNTHETIC_PARAMETERS)}")
    try:
        values = {k: int(v) for k, v in params.items()}
    except ValueError:
        raise HeadFormatError(f"{spec}: draft_vocab, heads and seed are whole numbers") from None
    if any(v < 1 for k, v in values.items() if k != "seed"):
        raise HeadFormatError(f"{spec}: draft_vocab and heads are at least 1")
    return values


def synthetic_head(spec: str, kind: str, target, dtype: torch.dtype = torch.float32):
    """A head of the target's shape with seeded random weights and no folder, for the cost of heads on a device with
    no weights (beside `synthetic:` targets): EAGLE-3, one decoder layer as wide as the target (its attention and KV
    heads, head size, MLP width), the target's embedding shared, a draft vocabulary of draft_vocab ids (default
    min(32000, the target's), EAGLE-3's usual size) mapped to the target's first ids, the default aux layers; Medusa,
    `heads` heads (default 4) of one residual block. Its drafts are random: it measures c, not acceptance."""
    params = parse_synthetic_head(spec)
    text, vocab, width, depth = _target_shape(target)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(params.get("seed", 0))
        if kind == "eagle3":
            heads = text.num_attention_heads
            llama = LlamaConfig(hidden_size=width, intermediate_size=text.intermediate_size, num_attention_heads=heads,
                                num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
                                head_dim=getattr(text, "head_dim", None) or width // heads, vocab_size=vocab,
                                max_position_embeddings=text.max_position_embeddings,
                                rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6), num_hidden_layers=1)
            head = Eagle3Head(llama, width, min(params.get("draft_vocab", 32000), vocab), default_aux_layers(depth))
            head.shares_embedding = True
        else:
            head = MedusaHeads(width, vocab, params.get("heads", 4), 1, depth)
    return _on_target(head, target, dtype)


def _target_shape(target) -> tuple:
    """(the target's text config, its output vocabulary, width, decoder layers): what a head is checked against."""
    text = target.config.get_text_config(decoder=True) if hasattr(target.config, "get_text_config") else target.config
    return text, target.get_output_embeddings().out_features, text.hidden_size, text.num_hidden_layers


def _on_target(head, target, dtype: torch.dtype):
    """The head on the target's input device in `dtype`, eval mode; a head that shares the target's embedding holds
    it (one copy where the dtypes agree)."""
    embedding = target.get_input_embeddings().weight
    head = head.to(device=embedding.device, dtype=dtype).eval()
    if getattr(head, "shares_embedding", False) and embedding.dtype == dtype:  # one copy in memory
        head.embed_tokens.weight = embedding
    elif getattr(head, "shares_embedding", False):
        head.embed_tokens.weight.data.copy_(embedding.detach().to(dtype))
    return head


def _eagle3(folder: Path, config: dict, weights: dict, vocab: int, width: int, depth: int, target) -> Eagle3Head:
    path = folder / "config.json"
    for key in ("transformer_layer_config", "eagle_config"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise HeadFormatError(f"{path}: {key} is {config[key]!r}, not a JSON object")
    layer_config = dict(config.get("transformer_layer_config") or config)
    for key in ("speculators_config", "transformer_layer_config", "architectures", "auto_map", "torch_dtype",
                "dtype", "transformers_version"):
        layer_config.pop(key, None)
    _sizes(path, config, ("draft_vocab_size", "target_hidden_size"))
    _sizes(path, layer_config, LAYER_SIZES)
    hidden, heads, kv_heads = (layer_config.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    if hidden and heads and hidden % heads:  # transformers' Llama asks it, head_dim stated or not
        raise HeadFormatError(f"{path}: num_attention_heads {heads} does not divide hidden_size {hidden}")
    if heads and kv_heads and heads % kv_heads:
        raise HeadFormatError(f"{path}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    try:
        llama = LlamaConfig(**{k: v for k, v in layer_config.items() if k not in ("model_type",)})
    except Exception as error:  # transformers' own checks of the layer config: one line
        raise HeadFormatError(f"{path}: not a layer config transformers builds ({type(error).__name__}: "
                              f"{' '.join(str(error).split())[:160]})") from None
    llama.num_hidden_layers = 1
    draft_vocab = int(config.get("draft_vocab_size") or layer_config.get("draft_vocab_size") or llama.vocab_size)
    # absent, the target's states are as wide as the head (as the reference servers build its fc)
    target_hidden = int(config.get("target_hidden_size") or layer_config.get("target_hidden_size") or llama.hidden_size)
    eagle = config.get("eagle_config") or {}
    speculators = config.get("speculators_model_type") == "eagle3"
    for flag in ("norm_before_fc", "fc_norm"):
        if config.get(flag) or layer_config.get(flag):
            raise HeadFormatError(f"{folder}: {flag} is set, a variant of EAGLE-3 this engine does not run")
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    specforge = not speculators and "LlamaForCausalLMEagle3" in (config.get("architectures") or ())
    if not layers and eagle.get("eagle_aux_hidden_state_layer_ids"):
        layers, specforge = eagle["eagle_aux_hidden_state_layer_ids"], True  # SpecForge's eagle_config
    if layers is not None and (not isinstance(layers, list) or any(type(i) is not int for i in layers)):
        raise HeadFormatError(f"{path}: eagle_aux_hidden_state_layer_ids is {layers!r}, not a list of layer numbers")
    if layers and specforge:
        layers = [int(i) + 1 for i in layers]  # SpecForge counts a layer's output, i.e. the next layer's input
    layers = layers or default_aux_layers(depth)
    if target_hidden != width:
        raise HeadFormatError(f"{folder}: the head reads hidden states {target_hidden} wide (target_hidden_size, else its "
                              f"hidden_size), the target's are {width}: a head for another target")
    _vocab(path, layer_config, vocab)
    llama.vocab_size = vocab  # unstated, LlamaConfig's default: its embedding is the target's vocabulary
    if any(not 0 <= int(i) < depth for i in layers):
        raise HeadFormatError(f"{folder}: aux hidden state layers {list(layers)} outside the target's 0..{depth - 1}")
    # the speculators layout's default is True (as the reference server reads it), the EAGLE layout's False
    norm_before_residual = config.get("norm_before_residual", layer_config.get("norm_before_residual", speculators))
    head = Eagle3Head(llama, target_hidden, draft_vocab, tuple(layers), bool(norm_before_residual))
    state = {}
    for name, tensor in weights.items():
        name = name.removeprefix("model.")
        name = "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name
        state[name] = tensor
    t2d = state.pop("t2d", None)  # a mask the engine does not read: checked against d2t below
    shared = "embed_tokens.weight" not in state  # the EAGLE layout shares the target's embedding
    if shared and llama.hidden_size != width:
        raise HeadFormatError(f"{folder}: the head is {llama.hidden_size} wide and has no embed_tokens, so it would share "
                              f"the target's embedding, {width} wide: a head for another target, or its folder lacks "
                              "embed_tokens.weight")
    if shared:
        state["embed_tokens.weight"] = head.embed_tokens.weight.detach()  # placeholder: the target's, below
    if "d2t" not in state:
        if draft_vocab != vocab:
            raise HeadFormatError(f"{folder}: a draft vocabulary of {draft_vocab} tokens and no d2t map to the target's")
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
    d2t = state["d2t"].flatten()
    fractional = (d2t != d2t.round()).nonzero() if d2t.is_floating_point() else []
    if len(fractional):  # .long() would truncate it onto a neighbour's target id
        i = int(fractional[0])
        raise HeadFormatError(f"{folder}: d2t holds {d2t[i].item():g} at draft id {i}; its offsets are whole numbers "
                              "(target id = draft id + d2t[draft id])")
    state["d2t"] = state["d2t"].long()
    _load(head, state, folder)
    index = head.draft_to_target
    if int(index.max()) >= vocab or int(index.min()) < 0:
        raise HeadFormatError(f"{folder}: d2t maps draft ids past the target's vocabulary of {vocab}")
    order = index.argsort(stable=True)
    same = (index[order][1:] == index[order][:-1]).nonzero()
    if len(same):  # two draft ids for one token: their probabilities would land on one id, one of them lost
        j = int(same[0])
        raise HeadFormatError(f"{folder}: d2t maps draft ids {int(order[j])} and {int(order[j + 1])} to one target id, "
                              f"{int(index[order[j]])}; each draft id is a target id of its own "
                              "(target id = draft id + d2t[draft id])")
    if t2d is not None:
        if tuple(t2d.shape) != (vocab,):
            raise HeadFormatError(f"{folder}: t2d has shape {tuple(t2d.shape)}, not the target's vocabulary ({vocab},) "
                                  "(t2d marks the target ids the draft vocabulary holds)")
        marked, reached = t2d != 0, torch.zeros(vocab, dtype=torch.bool)
        reached[index] = True
        if not torch.equal(marked, reached):
            raise HeadFormatError(f"{folder}: t2d marks {int(marked.sum())} target ids, d2t reaches {draft_vocab}, and "
                                  f"they disagree at target id {int((marked != reached).nonzero()[0])}: t2d marks the "
                                  "target ids d2t reaches; save both maps from one draft vocabulary")
    head.shares_embedding = shared
    return head


def _medusa(folder: Path, config: dict, weights: dict, vocab: int, width: int, depth: int) -> MedusaHeads:
    _sizes(folder / "config.json", config, ("medusa_num_heads", "medusa_num_layers"))
    _vocab(folder / "config.json", config, vocab)
    layers = config.get("medusa_num_layers") or 1
    names = {name.removeprefix("model."): t for name, t in weights.items()}
    if not any(name.startswith("medusa_head.") for name in names):  # medusa_lm_head.pt: the heads' own state dict
        names = {f"medusa_head.{name}": t for name, t in names.items() if name.split(".")[0].isdigit()}
    state = {name: t for name, t in names.items() if name.startswith("medusa_head.")}
    # the weights say how many heads there are (FasterDecoding's configs may state fewer than the file holds)
    heads = 1 + max((int(name.split(".")[1]) for name in state), default=(config["medusa_num_heads"] or 1) - 1)
    head = MedusaHeads(width, vocab, heads, layers, depth)
    _load(head, state, folder)
    return head


def _load(module: nn.Module, state: dict, folder: Path) -> None:
    """state into module: every weight it needs, of its shape, and none it does not have (a weight of a variant this
    engine does not run would otherwise be dropped in silence)."""
    expected = {k: v.shape for k, v in module.state_dict().items() if "rotary_emb" not in k}
    missing = sorted(set(expected) - set(state))
    if missing:
        raise HeadFormatError(f"{folder}: weights missing: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise HeadFormatError(f"{folder}: weights this head does not have: {', '.join(unknown[:4])}"
                              f"{' ...' if len(unknown) > 4 else ''} (a variant this engine does not run)")
    for name, shape in expected.items():
        if tuple(state[name].shape) != tuple(shape):
            raise HeadFormatError(f"{folder}: {name} has shape {tuple(state[name].shape)}, the head needs {tuple(shape)} "
                                  "(a head for another target?)")
    module.load_state_dict({k: state[k].float() if state[k].is_floating_point() else state[k] for k in expected},
                           strict=False)


def save_eagle3(head: Eagle3Head, folder: str | Path, layout: str = "speculators", verifier: str = "") -> Path:
    """Write an EAGLE-3 head as a folder in one of the layouts load_head reads: speculators, eagle or specforge, as
    the reference server reads them too: the layer config states its one layer (that server takes the config as
    written: without it a speculators folder fails and an EAGLE folder builds LlamaConfig's 32 layers), and a head
    whose draft vocabulary is the target's has no d2t / t2d (it then has no parameter for them)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layer = {k: v for k, v in head.config.to_dict().items() if k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
        "max_position_embeddings", "vocab_size", "rope_theta", "rope_parameters", "hidden_act", "attention_bias",
        "mlp_bias")}
    layer["num_hidden_layers"] = 1
    extra = {"draft_vocab_size": head.lm_head.out_features, "target_hidden_size": head.fc.in_features // len(head.target_layers),
             "eagle_aux_hidden_state_layer_ids": list(head.target_layers),
             "norm_before_residual": head.midlayer.norm_before_residual}
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items() if "rotary_emb" not in k}
    t2d = torch.zeros(head.embed_tokens.num_embeddings, dtype=torch.bool)
    t2d[head.draft_to_target.cpu()] = True
    if layout == "speculators":
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": {"model_type": "llama", **layer}, **extra,
                  "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": verifier}}}
        state = {("layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k): v
                 for k, v in state.items()}
    elif layout in ("eagle", "specforge"):  # SpecForge names a layer's output: the layer before the one read
        ids = extra["eagle_aux_hidden_state_layer_ids"]
        config = {"architectures": ["LlamaForCausalLM" if layout == "eagle" else "LlamaForCausalLMEagle3"],
                  "model_type": "llama", **layer, **extra,
                  "eagle_aux_hidden_state_layer_ids": ids if layout == "eagle" else [i - 1 for i in ids]}
        state.pop("embed_tokens.weight")  # shared with the target
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if head.lm_head.out_features == head.embed_tokens.num_embeddings and not head.d2t.any():
        state.pop("d2t")  # the whole vocabulary in the target's order: no maps
    else:
        state["t2d"] = t2d
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.cpu() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder
