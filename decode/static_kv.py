"""The compiled engine mode (`engine.compile: true`): static-shape caches and one compiled graph per step shape.

Eager transformers forwards issue ~2,000 small kernels each; on a GPU a small draft then costs nearly what the
target does and the run measures Python dispatch. Here each model's decode step is one `torch.compile`d function
(on CUDA, mode "reduce-overhead": a CUDA graph, one launch per step; on a CPU, inductor's C++ kernels) over buffers
whose shapes never change during a run:

- the KV cache: [B_cap, H_kv, L_max, D] per layer (`ColumnLayer`), written in place at the columns of this step;
- `valid` [B_cap, L_max] bool (the masked-cache design of decode/kv.py: a column belongs to its row, or is left
  padding, a rollback hole or unused) and `positions` [B_cap, L_max] (each column's token position);
- the attention mask is built inside the graph from them: a query sees a valid column whose position is not
  after its own (and within the window, for sliding-window layers), and itself. Positions, not column indices,
  order the tokens, so rollback holes cost nothing and sliding windows stay exact without compaction. A token
  tree's step (`StaticKVState.forward_tree`) also takes the nodes' ancestors: before the round's region a node sees
  the committed prefix by that rule, inside it only its ancestors (and itself);
- a model with grouped-query attention attends through `gqa_sdpa_attention` (scaled_dot_product_attention with
  enable_gqa): transformers' sdpa path repeats K and V to every query head whenever a mask is passed, a copy of
  [B, H, L_max, D] per layer per step.

Shapes are static per run: B_cap is the comparison's batch size (a short last batch and finished rows become
dead rows, masked, whose outputs are dropped), L_max holds the longest prompt plus the new tokens plus the widest
round (compaction runs only when a step would not fit), and a step of S tokens is padded to the smallest of the
model's step widths >= S (decode/compile_plan.py `compile_widths`: the target's verification widths, the draft's 1
and 2), its padding masked and rolled back. So a run compiles one graph per (model, batch capacity, step width, chain or tree) at its
warmup and none after: `CompiledModel.compiles` counts graphs and `recordings` CUDA graph captures, and both are
reported after the warmup.

The prefill runs eagerly (its length varies per batch) into the same static buffers.

A target whose hidden states a draft head reads (`head_layers`, decode/hidden.py numbering) returns them from the
same graph, beside the logits, while a head's loop runs (decode/hidden.py CompiledTap sets `hidden_layers`; a graph
each, compiled in the warmup as the others): transformers' output_hidden_states, whose capturing hooks are installed
when the model is compiled, before anything is traced. The other methods' steps return the logits alone, as without
heads. `hidden_out` holds the last step's, of the live rows, until the engine takes them.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.cache_utils import Cache, StaticLayer

from decode.kv import (KVState, TreeRounds, TreeUnsupported, host_to_device, kept_width, layer_masks, on_device,
                       sliding_window_of, tree_ancestry, tree_support_problem)


CAPTURED = "cudagraphs"  # engine.compile: cudagraphs, CompiledModel's mode without torch.compile
SCOPES = ("whole", "regional")  # engine.compile_scope: what torch.compile traces, the whole step or one decoder layer


class CompileRefused(ValueError):
    """A model or setting the compiled mode cannot run; the message is one line for the user."""


class ColumnLayer(StaticLayer):
    """A StaticLayer that writes at the columns the engine chose (a shared 0-d `start` tensor), not at its own
    running count: a rollback moves the write position back, with no copy."""

    def __init__(self, max_cache_len: int, start: torch.Tensor):
        super().__init__(max_cache_len)
        self.start = start

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        columns = self.start + torch.arange(key_states.shape[-2], device=self.keys.device)
        self.keys.index_copy_(2, columns, key_states)
        self.values.index_copy_(2, columns, value_states)
        return self.keys, self.values


def _layer_forward(layer, *args, **kwargs):
    """One decoder layer's own forward: regional compilation's compiled function. Every layer of a model has the same
    code and, with the layer's parameters graph inputs and its `layer_idx` 0 (`CompiledModel._regional`), the same
    guards, so dynamo compiles it once per step shape and every layer reuses it."""
    return type(layer).forward(layer, *args, **kwargs)


def decoder_layers(model, num_layers: int):
    """The model's decoder layers, the first module list of at least num_layers modules of one class (Llama's
    `model.layers`, GPT-2's `transformer.h`), or None."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) >= num_layers > 0 \
                and len({type(layer) for layer in module}) == 1:
            return list(module)[:num_layers]
    return None


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


# -- grouped-query attention without the K/V copy ------------------------------------------------------------------
GQA_ATTENTION = "speculate_sdpa_gqa"  # the name it is registered under in transformers' AttentionInterface


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       is_causal=None, **kwargs):
    """transformers' sdpa attention, but with the key/value heads as they are (enable_gqa) where a mask is passed.

    transformers (5.17 to 5.23) repeats K and V to every query head (`repeat_kv`: a copy of [B, H, L, D] per layer)
    whenever a mask is passed on CUDA and a CPU, and always while torch.compile traces; the compiled step always
    passes one. scaled_dot_product_attention takes the [B, H_kv, L, D] K and V itself (enable_gqa): the math kernel
    and the CPU flash kernel give the same numbers as after repeat_kv; on CUDA (torch >= 2.5) the memory-efficient
    kernel, the one a mask selects, supports it. Anything else this path does not handle (no mask, a position
    bias, a softcap, attention sinks, a paged cache) goes to transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups == 1 or key.shape[-1] != value.shape[-1]
            or any(kwargs.get(name) is not None for name in ("position_bias", "softcap", "s_aux", "cache"))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _register_gqa_attention() -> None:
    from transformers import AttentionInterface

    if GQA_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention)


def _uses_gqa(config) -> bool:
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return bool(heads and kv_heads and kv_heads < heads)


# -- CUDA graphs: recordings and skips ---------------------------------------------------------------------------
_RECORDED = {"graphs": 0}


def _on_compile_event(args) -> None:
    if getattr(args.callback_trigger, "name", "") == "CUDAGRAPH_RECORDING":
        _RECORDED["graphs"] += 1


def listen_for_cudagraph_recordings() -> bool:
    """Count CUDA graph recordings from here on: cudagraph trees announce each one to dynamo's compile callbacks
    (CallbackTrigger.CUDAGRAPH_RECORDING, around CUDAGraphTreeManager.record_function). False where this torch has no
    such trigger (then `cudagraph_events` reports recordings as None)."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    if not hasattr(CallbackTrigger, "CUDAGRAPH_RECORDING"):
        return False
    if _on_compile_event not in callback_handler.start_callbacks:  # torch._dynamo.reset() clears the callbacks
        callback_handler.register_start_callback(_on_compile_event)
    return True


def cudagraph_events() -> tuple[int | None, int]:
    """(CUDA graphs recorded in this process, graphs inductor decided to run without CUDA graphs: its
    counters["inductor"]["cudagraph_skips"]). A re-recording (new input addresses, a new buffer set, an invariant
    that failed) is a recording; a skipped graph runs, slower, with no error unless
    torch._inductor.config.triton.cudagraph_or_error is set."""
    from torch._dynamo.utils import counters

    return (_RECORDED["graphs"] if listen_for_cudagraph_recordings() else None), counters["inductor"]["cudagraph_skips"]


@dataclass
class StepInputs:
    """What one step of width W reads besides the cache, allocated once per (buffer set, width, chain or tree step) and
    written in place before each step (copy_, index_put): a captured graph (CUDA graphs) replays on fixed addresses,
    so nothing a step reads may be a new tensor or a view sliced by a host integer. The step writes `valid` and
    `positions` into the buffers' columns from `start` on itself."""
    ids: torch.Tensor  # [B_cap, W] long: the tokens (0 in padding and dead rows)
    valid: torch.Tensor  # [B_cap, W] bool: the column is a real token of its row
    positions: torch.Tensor  # [B_cap, W] long: each token's position
    ancestors: torch.Tensor | None = None  # [B_cap, W, L_max] bool, a tree step: the region's columns each node sees
    # a model's own per-column inputs by keyword, [B_cap, W, ...] (an EAGLE-3 head: the target's states `features`, or
    # its own `hidden`)
    extra: dict = field(default_factory=dict)


@dataclass
class _Buffers:
    """One (batch capacity, length) set of static buffers of one model; reused by every batch of that shape."""
    cache: Cache
    start: torch.Tensor  # 0-d long: the first column a step writes
    region: torch.Tensor  # 0-d long: a tree step's first column of its round's region (prefix before it)
    valid: torch.Tensor  # [B_cap, L_max] bool
    positions: torch.Tensor  # [B_cap, L_max] long
    count: torch.Tensor  # [B_cap] long: each row's next position (its tokens so far), the state's `count`
    owner: weakref.ref = field(default=lambda: None)  # the StaticKVState using them; dead: free
    # (width, tree) -> StepInputs; "rounds": decode/round_graph.py's round inputs, by drafter buffer set and gamma
    steps: dict = field(default_factory=dict)


class CompiledModel:
    """A model's compiled decode step and its static buffers. Attach with `attach` (runner/session.py); the engine
    then builds `StaticKVState`s for it through `decode.static_kv.new_state`.

    step_widths: the widths of its plain steps (a step of S tokens runs at the smallest >= S; a wider catch-up runs
    in chunks); tree_widths: those of its token-tree steps (forward_tree), a graph each; view_widths: the step and
    tree widths of a view over its weights (early exit's truncated target drafts: 1 and 2)."""

    def __init__(self, model, step_widths: tuple[int, ...], max_length: int, batch_sizes: tuple[int, ...],
                 mode: str | None = None, backend="inductor", tree_widths: tuple[int, ...] = (),
                 view_widths: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 2), ()),
                 head_layers: tuple[int, ...] = (), scope: str = "whole"):
        self.model = model
        self.head_layers = tuple(head_layers)  # the hidden states the run's heads read (their union)
        self.hidden_layers: tuple[int, ...] = ()  # those the steps return now: head_layers while a head's loop runs
        self.hidden_out: torch.Tensor | None = None  # the last step's [B, S, len x H] (live rows), until taken
        if self.head_layers:  # transformers installs its capturing hooks at the first such call: before any trace
            with torch.inference_mode():
                model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device),
                      output_hidden_states=True, use_cache=False)
        self.step_widths = tuple(sorted(set(step_widths)))
        self.tree_widths = tuple(sorted(set(tree_widths)))
        self.view_widths = view_widths
        self.max_length = max_length
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.device = next(model.parameters()).device
        config = _text_config(model.config)
        self.num_layers, self.hidden_size = config.num_hidden_layers, config.hidden_size
        self.window = sliding_window_of(model.config)
        layer_types = getattr(config, "layer_types", None)
        self.mask_keys = sorted(set(layer_types)) if layer_types else None  # a model that takes a dict of masks
        implementation = getattr(model.config, "_attn_implementation", "sdpa")
        if implementation not in ("sdpa", "eager"):
            raise CompileRefused(f"engine.compile: attention {implementation!r} takes no prebuilt mask; "
                                 "use attn_implementation: sdpa (or eager) with engine.compile")
        self.additive_mask = implementation == "eager"
        # sdpa with grouped-query attention: the configs whose attention the step swaps to gqa_sdpa_attention
        self.gqa_configs = []
        if implementation == "sdpa" and _uses_gqa(config):
            _register_gqa_attention()
            held = {id(m.config): m.config for m in model.modules() if getattr(m, "config", None) is not None}
            held.setdefault(id(model.config), model.config)
            self.gqa_configs = [c for c in held.values() if getattr(c, "_attn_implementation", None) == "sdpa"]
        self.mode = mode or ("reduce-overhead" if self.device.type == "cuda" else "default")
        self.backend = backend  # "eager": dynamo's graph capture and guards without code generation (the tests)
        # mode "cudagraphs": no torch.compile; each step shape is captured with torch.cuda.graph over the static
        # cache and its StepInputs at its first call (a CPU runs the same step uncaptured, through the same buffers)
        self.captured = self.mode == CAPTURED
        self.overlap = False  # engine.overlap: the loop launches a fused round before reading the one before it
        # CUDA graphs: cudagraph trees run a graph's first call eagerly, record at its second, replay from its third
        self.cudagraphs = (self.device.type == "cuda" and backend == "inductor"
                           and self.mode in ("reduce-overhead", "max-autotune"))
        self.graphs: dict = {}  # captured mode on CUDA: (buffer set, width, tree, hidden layers) -> (graph, outputs)
        self.capture_s: list[float] = []  # captured mode: the seconds each graph's capture took, in capture order
        self._pool = None  # captured mode: the memory pool its graphs share
        self.buffers: dict[int, list[_Buffers]] = {}  # by batch capacity; one set per KV state alive at once
        self.compiles = 0  # graphs compiled for this model (dynamo's count, read around each call)
        self.recordings = 0 if listen_for_cudagraph_recordings() else None  # CUDA graphs captured (cudagraph trees)
        self.skips = 0  # graphs inductor runs without a CUDA graph
        self.warm = False  # set by the runner after the warmup: any compile or capture after it is a late one
        self.recompiles_after_warmup = 0
        self.recordings_after_warmup = 0
        self.views: list[CompiledModel] = []  # compiled steps of views over this model's weights (early exit)
        # every CompiledModel compiles the same function (this class's _forward): dynamo keeps its graphs in one
        # cache, guarded per model, per batch capacity and per width; past its limit (8) it would run eagerly, silently
        for limit in ("recompile_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 1024))
        options = {"mode": self.mode} if backend == "inductor" else {}
        # scope "regional": torch.compile traces one decoder layer, not the step; the layers run one compiled code and
        # the rest of the step (embedding, mask, final norm, LM head) runs eagerly around them. The captured mode
        # compiles nothing: its scope is not read
        self.scope = "whole" if self.captured else scope
        self.layers = None
        if self.scope == "regional":
            self.layers = decoder_layers(model, self.num_layers)
            if self.layers is None:
                raise CompileRefused(f"engine.compile_scope: regional found no list of {self.num_layers} decoder "
                                     "layers in this model; set engine.compile_scope: whole")
            self._layer_step = torch.compile(_layer_forward, backend=backend, dynamic=False, fullgraph=True,
                                             **options)
        if self.captured:
            self._step = self._captured_step
        elif self.scope == "regional":
            self._step = self._forward
        else:
            self._step = torch.compile(self._forward, backend=backend, dynamic=False, fullgraph=True, **options)

    def for_view(self, view) -> "CompiledModel":
        """The same settings for another module over the same weights (early exit's truncated target, which drafts:
        view_widths); kept in `views`, so the runner warms and counts it with this one."""
        steps, trees = self.view_widths
        compiled = CompiledModel(view, steps, self.max_length, self.batch_sizes, self.mode, self.backend, trees,
                                 self.view_widths, scope=self.scope)
        self.views.append(compiled)
        return compiled

    def precompile(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Compile every width at every batch capacity up to this batch's [B, P], on a throwaway state: a graph the
        warmup's own rounds happened not to need (a catch-up after a full accept, a short last batch) compiles
        here, not inside a timed batch. With CUDA graphs every shape runs three times: cudagraph trees record a
        graph at its second call, so the capture happens here too, and the third replays it. A target that heads read
        compiles each shape twice: returning the logits alone, and their hidden states too."""
        variants = [()] + ([self.head_layers] if self.head_layers else [])
        try:
            for _ in range(3 if self.cudagraphs else 1):
                for layers in variants:
                    self.hidden_layers = layers
                    self._precompile(ids, mask)
        finally:
            self.hidden_layers = ()

    def _precompile(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        for capacity in [b for b in self.batch_sizes if b <= ids.shape[0]]:
            state = StaticKVState(self)
            state.forward(self.model, ids[:capacity], mask[:capacity], last_only=True)
            rows = torch.zeros(capacity, dtype=torch.long, device=ids.device)
            for width in self.step_widths:
                state.forward(self.model, ids[:capacity, -1:].expand(-1, width).contiguous())
                state.keep_prefix_of_last(width, rows, 0)
            for width in self.tree_widths:  # a chain-shaped tree: any tree of the width runs this graph
                parents = np.tile(np.arange(-1, width - 1), (capacity, 1))
                state.forward_tree(self.model, ids[:capacity, -1:].expand(-1, width).contiguous(), parents,
                                   np.ones((capacity, width), dtype=bool), new_round=True)
                state.keep_region(np.zeros((capacity, width), dtype=bool))

    # -- shapes -----------------------------------------------------------------------------------------
    def capacity(self, batch: int) -> int:
        fitting = [b for b in self.batch_sizes if b >= batch]
        if not fitting:
            raise CompileRefused(f"engine.compile: a batch of {batch} rows is above the configured batch sizes "
                                 f"{list(self.batch_sizes)}")
        return fitting[0]

    def width_for(self, num_tokens: int, tree: bool = False) -> int:
        """The compiled step width a step of num_tokens runs at (num_tokens <= the widest)."""
        widths = self.tree_widths if tree else self.step_widths
        fitting = [w for w in widths if w >= num_tokens]
        if not fitting:
            kind = "tree step" if tree else "step"
            raise RuntimeError(f"engine.compile: a {kind} of {num_tokens} tokens is wider than the compiled widths "
                               f"{list(widths)}; this is a bug in choosing them (decode/compile_plan.py "
                               "compile_widths)")
        return fitting[0]

    def step_inputs(self, buffers: _Buffers, width: int, tree: bool = False) -> StepInputs:
        """The buffer set's StepInputs of this width (a chain step, or a tree step with ancestors), allocated at the
        first step of that shape and reused by every later one."""
        found = buffers.steps.get((width, tree))
        if found is None:
            capacity, device = buffers.valid.shape[0], self.device
            found = StepInputs(torch.zeros(capacity, width, dtype=torch.long, device=device),
                               torch.zeros(capacity, width, dtype=torch.bool, device=device),
                               torch.zeros(capacity, width, dtype=torch.long, device=device),
                               torch.zeros(capacity, width, self.max_length, dtype=torch.bool, device=device)
                               if tree else None)
            if device.type == "cuda":
                for tensor in (found.ids, found.valid, found.positions, found.ancestors):
                    if tensor is not None:
                        torch._dynamo.mark_static_address(tensor)
            buffers.steps[(width, tree)] = found
        return found

    def buffers_for(self, batch: int, owner) -> _Buffers:
        """A free set of buffers for a batch of this size (another set only where two states of this model live at
        once, e.g. a model drafting for itself: new buffers, so new graphs or, with CUDA graphs, new recordings,
        counted)."""
        capacity = self.capacity(batch)
        pool = self.buffers.setdefault(capacity, [])
        free = next((b for b in pool if b.owner() is None), None)
        if free is None:
            start = torch.zeros((), dtype=torch.long, device=self.device)
            region = torch.zeros((), dtype=torch.long, device=self.device)
            cache = Cache(layers=[ColumnLayer(self.max_length, start) for _ in range(self.num_layers)])
            valid = torch.zeros(capacity, self.max_length, dtype=torch.bool, device=self.device)
            positions = torch.zeros(capacity, self.max_length, dtype=torch.long, device=self.device)
            count = torch.zeros(capacity, dtype=torch.long, device=self.device)
            if self.device.type == "cuda":  # CUDA graphs replay on fixed addresses
                for tensor in (start, region, valid, positions, count):
                    torch._dynamo.mark_static_address(tensor)
            free = _Buffers(cache, start, region, valid, positions, count)
            pool.append(free)
        free.owner = weakref.ref(owner)
        return free

    # -- the step -----------------------------------------------------------------------------------------
    def masks(self, buffers: _Buffers, query_positions: torch.Tensor, query_columns: torch.Tensor,
              ancestors: torch.Tensor | None = None):
        """The attention mask(s) of a step: [B, 1, S, L_max] bool (sdpa) or additive (eager), or a dict of them
        by layer type. ancestors [B, S, L_max] bool (a tree step): the columns of the round's region (from
        buffers.region on) each query sees, its ancestors; before the region the committed prefix's rule holds."""
        key_positions = buffers.positions[:, None, :]  # [B, 1, L]
        query = query_positions[:, :, None]  # [B, S, 1]
        columns = torch.arange(self.max_length, device=query_columns.device)
        itself = columns[None, None, :] == query_columns[None, :, None]  # [1, S, L]
        seen = buffers.valid[:, None, :] & (key_positions <= query)  # [B, S, L]
        if ancestors is not None:
            seen = (seen & (columns < buffers.region)[None, None, :]) | (ancestors & buffers.valid[:, None, :])
        full = seen | itself
        masks = {"full_attention": full}
        if self.window is not None:
            masks["sliding_attention"] = (seen & (query - key_positions < self.window)) | itself
        return layer_masks(masks, self.mask_keys, self.window, self.additive_mask,
                           next(self.model.parameters()).dtype)

    def _forward(self, buffers: _Buffers, input_ids, query_positions, query_valid, ancestors=None,
                 last_only: bool = False, **inputs):
        """One step: input_ids, query_positions, query_valid [B_cap, S] go to the columns from buffers.start on (the
        valid and positions columns written here, inside the graph, as the cache's keys and values are)."""
        query_columns = buffers.start + torch.arange(input_ids.shape[1], device=input_ids.device)  # [S]
        buffers.valid.index_copy_(1, query_columns, query_valid)
        buffers.positions.index_copy_(1, query_columns, query_positions)
        mask = self.masks(buffers, query_positions, query_columns, ancestors)
        extra = {"output_hidden_states": True} if self.hidden_layers else {}
        if last_only:
            extra["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=query_positions,
                         past_key_values=buffers.cache, use_cache=True, **extra, **inputs)
        if not self.hidden_layers:
            return out.logits.float(), None
        return out.logits.float(), torch.cat([out.hidden_states[i] for i in self.hidden_layers], dim=-1)

    @contextlib.contextmanager
    def _attention(self):
        """The step's attention: gqa_sdpa_attention on a model with grouped-query attention (sdpa), else its own.
        Only around the step's own calls: the model, shared with the eager paths, keeps its setting."""
        for config in self.gqa_configs:
            config._attn_implementation_internal = GQA_ATTENTION
        try:
            yield
        finally:
            for config in self.gqa_configs:
                config._attn_implementation_internal = "sdpa"

    @contextlib.contextmanager
    def _regional(self, buffers: _Buffers):
        """Regional compilation around one step: each decoder layer's forward becomes the shared compiled
        `_layer_forward`, given a cache of its own layer alone (Cache(layers=[its ColumnLayer])) in place of the
        model's, and its attention's `layer_idx` 0 meanwhile, so that no layer-specific constant enters the guards
        (dynamo guards an int attribute by value: one graph per layer otherwise). Undone after the step: the eager
        paths (the prefill, the eager engine) and a fused round's trace see the model as it is."""
        if self.scope != "regional":
            yield
            return
        whole = buffers.cache
        indexed = [(module, module.layer_idx) for layer in self.layers for module in layer.modules()
                   if isinstance(getattr(module, "layer_idx", None), int)]
        try:
            for module, _ in indexed:
                module.layer_idx = 0
            for layer, column_layer in zip(self.layers, whole.layers):
                own = Cache(layers=[column_layer])

                def forward(*args, _layer=layer, _own=own, **kwargs):
                    args = tuple(_own if a is whole else a for a in args)
                    kwargs = {k: _own if v is whole else v for k, v in kwargs.items()}
                    return self._layer_step(_layer, *args, **kwargs)
                layer.forward = forward  # an instance attribute: nn.Module's hooks still run around it, eagerly
            yield
        finally:
            for layer in self.layers:
                layer.__dict__.pop("forward", None)
            for module, index in indexed:
                module.layer_idx = index

    def _captured_step(self, buffers: _Buffers, input_ids, query_positions, query_valid, ancestors=None, **inputs):
        """The captured mode's step: on CUDA the replay of this shape's graph, captured at its first call (over the
        static cache and the step's StepInputs, whose addresses never change); on a CPU the same step, uncaptured."""
        if self.device.type != "cuda":
            return self._forward(buffers, input_ids, query_positions, query_valid, ancestors, **inputs)
        key = (id(buffers), input_ids.shape[1], ancestors is not None, self.hidden_layers, tuple(sorted(inputs)))
        found = self.graphs.get(key)
        if found is None:
            # the warm run and the capture both write the step's columns with what its replay writes again, so
            # running it twice is harmless: nothing to restore
            found = self.capture_graph(self._forward, buffers, input_ids, query_positions, query_valid, ancestors,
                                       **inputs)
            self.graphs[key] = found
        graph, outputs = found
        graph.replay()
        return outputs

    def capture_graph(self, fn, *args, restore=None, **inputs):
        """Capture fn(*args, **inputs) as one CUDA graph in this model's pool -> (graph, its outputs): a warm run on a
        side stream (lazy initialisations, the allocator), restore() (where given) to undo what it wrote, then the
        capture, counted as a recording (after the warmup too when warm) with its seconds in capture_s."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*args, **inputs)
        torch.cuda.current_stream().wait_stream(side)
        if restore is not None:
            restore()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        began = time.perf_counter()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn(*args, **inputs)
        self.capture_s.append(time.perf_counter() - began)
        if self.recordings is not None:
            self.recordings += 1
        if self.warm:
            self.recordings_after_warmup += 1
        return graph, outputs

    def run(self, buffers: _Buffers, input_ids, query_positions, query_valid, compiled: bool = True,
            ancestors: torch.Tensor | None = None, last_only: bool = False, **inputs):
        """One step over [B_cap, S] (S one of step_widths, or tree_widths with ancestors, when compiled) -> (fp32
        logits [B_cap, S, V], the hidden_layers' states [B_cap, S, len x H] or None). Both are the graph's outputs
        (with CUDA graphs, overwritten by its next replay): index them before the next step."""
        from torch._dynamo.utils import counters

        with self._attention():
            if not compiled:  # last_only (the eager prefill): the LM head on the last column alone, [B_cap, 1, V]
                return self._forward(buffers, input_ids, query_positions, query_valid, ancestors, last_only, **inputs)
            assert not last_only, "a compiled step returns every column's logits (its last may be padding)"
            if self.captured:  # no dynamo: its captures are counted as they happen (capture_graph)
                return self._step(buffers, input_ids, query_positions, query_valid, ancestors, **inputs)
            before, events = counters["stats"]["unique_graphs"], cudagraph_events()
            with self._regional(buffers):
                out = self._step(buffers, input_ids, query_positions, query_valid, ancestors, **inputs)
            self.count_events(counters["stats"]["unique_graphs"] - before, events, cudagraph_events())
        return out

    def count_events(self, graphs: int, before: tuple, after: tuple) -> None:
        """Add one call's new dynamo graphs and its CUDA graph events (cudagraph_events before and after it)."""
        self.compiles += graphs
        recorded = None if before[0] is None or after[0] is None else after[0] - before[0]
        if recorded is not None and self.recordings is not None:
            self.recordings += recorded
        self.skips += after[1] - before[1]
        if self.warm:
            self.recompiles_after_warmup += graphs
            self.recordings_after_warmup += recorded or 0

    def summary(self) -> dict:
        return {"mode": self.mode if self.backend == "inductor" or self.captured else str(self.backend),
                "scope": self.scope,
                "step_widths": list(self.step_widths), "tree_widths": list(self.tree_widths),
                "max_length": self.max_length, "gqa_attention": bool(self.gqa_configs),
                "buffer_sets": {b: len(pool) for b, pool in sorted(self.buffers.items())}, "graphs": self.compiles,
                "recompiles_after_warmup": self.recompiles_after_warmup,
                "cuda_graphs": self.cudagraphs or (self.captured and self.device.type == "cuda"),
                "recordings": self.recordings, "recordings_after_warmup": self.recordings_after_warmup,
                "skips": self.skips, "captures": len(self.capture_s),
                "capture_s": [round(seconds, 4) for seconds in self.capture_s]}


def _shaped_like(layer, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value states of one column for `capacity` rows, as a layer's are: what lazy_initialization sizes from."""
    keys, values = layer.keys, layer.values
    return (keys.new_zeros(capacity, keys.shape[1], 1, keys.shape[3]),
            values.new_zeros(capacity, values.shape[1], 1, values.shape[3]))


def attach(model, compiled: CompiledModel) -> None:
    model._speculate_compiled = compiled


def compiled_of(model) -> CompiledModel | None:
    return getattr(model, "_speculate_compiled", None)


def new_state(model):
    """The KV state the engine keeps for this model: static and compiled where `attach`ed, else decode/kv.py's."""
    compiled = compiled_of(model)
    return StaticKVState(compiled) if compiled is not None else KVState()


class StaticKVState(TreeRounds):
    """KVState's interface (decode/kv.py) over a CompiledModel's static buffers, token trees included
    (forward_tree, keep_region, region_width).

    The engine's rows are a subset of the buffers' rows (`rows`): a batch smaller than the capacity, and rows
    that finished, are dead rows whose inputs are masked and whose outputs are dropped.
    """

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled
        self.buffers: _Buffers | None = None
        self.rows: torch.Tensor | None = None  # [B] the buffers' row of each live row
        self.count: torch.Tensor | None = None  # [B_cap] tokens so far per row (the next position)
        self.length = 0  # columns in use (host)
        self.forwards = 0
        self.compactions = 0
        self.slots_freed = 0
        self._tree: dict | None = None  # the tree round under way (forward_tree), else None

    def _start(self, batch: int) -> None:
        self.buffers = self.compiled.buffers_for(batch, self)
        self.buffers.valid.zero_()
        self.buffers.positions.zero_()
        self.rows = torch.arange(batch, device=self.compiled.device)
        self.rows_host: list[int] | None = list(range(batch))  # the same on the host, where known without a read
        self.count = self.buffers.count.zero_()  # the buffers' own: a captured round reads it at a fixed address
        self.length = 0
        self._tree = None

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | None = None,
                last_only: bool = False, **inputs) -> torch.Tensor:
        """Append input_ids [B, S] (input_mask [B, S]) and return fp32 logits [B, S, V] ([B, 1, V] with last_only).
        inputs: the model's own per-column inputs [B, S, ...] by keyword (an EAGLE-3 head's features or hidden)."""
        assert model is self.compiled.model, "a StaticKVState serves the model it was built for"
        first = self.buffers is None
        if first:
            self._start(input_ids.shape[0])
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        elif not isinstance(input_mask, torch.Tensor):  # a host (numpy) mask, as the drafters build them
            input_mask = host_to_device(input_mask, input_ids.device)
        widest = self.compiled.step_widths[-1]
        if first or input_ids.shape[1] > widest:
            # the prefill, or a catch-up wider than any compiled step: eager when first, else in compiled chunks
            if first:  # eager: with last_only the LM head runs on the last column alone, as decode/kv.py's
                logits, hidden = self._step(input_ids, input_mask, compiled=False, last_only=last_only, inputs=inputs)
            else:
                chunks = [self._step(input_ids[:, i:i + widest], input_mask[:, i:i + widest],
                                     inputs={k: v[:, i:i + widest] for k, v in inputs.items()})
                          for i in range(0, input_ids.shape[1], widest)]
                logits = torch.cat([chunk for chunk, _ in chunks], dim=1)
                hidden = torch.cat([h for _, h in chunks], dim=1) if chunks[0][1] is not None else None
        else:
            logits, hidden = self._step(input_ids, input_mask, inputs=inputs)
        self.compiled.hidden_out = hidden
        self.forwards += 1
        return logits[:, -1:] if last_only else logits

    def _room(self, width: int) -> None:
        """Make room for a step of `width` columns (compacting), or raise."""
        if self.length + width > self.compiled.max_length:
            self.compact()
            if self.length + width > self.compiled.max_length:
                raise RuntimeError(f"engine.compile: the static cache of {self.compiled.max_length} columns is full "
                                   f"({self.length} in use, a step of {width}); this is a bug in sizing it")

    def _step(self, input_ids: torch.Tensor, input_mask: torch.Tensor, compiled: bool = True,
              last_only: bool = False, inputs: dict | None = None) -> torch.Tensor:
        buffers, capacity = self.buffers, self.buffers.valid.shape[0]
        num_tokens = input_ids.shape[1]
        width = self.compiled.width_for(num_tokens) if compiled else num_tokens
        self._room(width)
        device = input_ids.device
        if compiled:  # the width's inputs, written in place (StepInputs)
            step = self.compiled.step_inputs(buffers, width)
        else:  # the eager prefill: its width varies per batch, nothing is captured
            step = StepInputs(*(torch.empty(capacity, width, dtype=t, device=device)
                                for t in (torch.long, torch.bool, torch.long)))
        full = num_tokens == width and len(self.rows) == capacity
        if not full:  # padding columns and dead rows: no token
            step.ids.zero_()
            step.valid.zero_()
        step.ids[self.rows, :num_tokens] = input_ids
        step.valid[self.rows, :num_tokens] = input_mask.bool()
        for name, values in (inputs or {}).items():  # [B, S, ...] -> the step's [B_cap, W, ...], in place
            held = step.extra.get(name)
            if held is None or held.shape[2:] != values.shape[2:] or held.dtype != values.dtype:
                held = step.extra[name] = values.new_zeros(capacity, width, *values.shape[2:])
            elif not full:
                held.zero_()
            held[self.rows, :num_tokens] = values
        torch.add(self.count[:, None], step.valid.cumsum(dim=1), out=step.positions)
        step.positions.sub_(1).clamp_min_(0)  # [B_cap, W]
        buffers.start.fill_(self.length)
        logits, hidden = self.compiled.run(buffers, step.ids, step.positions, step.valid, compiled=compiled,
                                           last_only=last_only, **{name: step.extra[name] for name in inputs or {}})
        own = getattr(self.compiled.model, "last_hidden", None)
        if isinstance(own, torch.Tensor) and own.shape[:2] == (capacity, width):
            # an EAGLE-3 head keeps its pre-norm states for its next step: the live rows' real columns, as eager
            self.compiled.model.last_hidden = own[self.rows, :num_tokens]
        # the step's padding (columns past num_tokens) was only ever seen by itself: free it
        self.count += step.valid.sum(dim=1)
        self.length += num_tokens
        return logits[self.rows, :num_tokens], (hidden[self.rows, :num_tokens] if hidden is not None else None)

    # -- token trees (decode/tree_layout.py) ----------------------------------------------------------------------
    def forward_tree(self, model, input_ids: torch.Tensor, parents, valid, new_round: bool) -> torch.Tensor:
        """KVState.forward_tree over the static buffers: append tree nodes input_ids [B, S] (parents [B, S]: columns of
        the round's region, -1 after the committed prefix; valid [B, S] False for padding nodes; tensors on the device
        or host arrays) and return fp32 logits [B, S, V]. A node sees the committed prefix (within the window on
        sliding-window layers) and its ancestors in the region, and itself, at position prefix length + its depth; the
        step runs at the smallest tree width >= S. The round ends with `keep_region`."""
        assert model is self.compiled.model, "a StaticKVState serves the model it was built for"
        problem = tree_support_problem(model)
        if problem:
            raise TreeUnsupported(problem)
        if self.buffers is None:
            raise ValueError("forward_tree needs a prefilled cache")
        num_nodes = input_ids.shape[1]
        device = input_ids.device
        parents, valid = on_device(parents, device), on_device(valid, device, torch.bool)
        if new_round or self._tree is None:
            # the root's children sit at each row's next position: the count when the round starts
            self._tree = {"start": self.length, "base": self.count.clone(), "parents": parents[:, :0],
                          "valid": valid[:, :0]}
        tree = self._tree
        old = tree["parents"].shape[1]
        region = old + num_nodes
        tree["parents"], tree["valid"] = torch.cat([tree["parents"], parents], 1), torch.cat([tree["valid"], valid], 1)
        depths, ancestors = tree_ancestry(tree["parents"], tree["valid"])  # [B, R], [B, R, R]
        buffers, capacity = self.buffers, self.buffers.valid.shape[0]
        width = self.compiled.width_for(num_nodes, tree=True)
        self._room(width)  # a compaction keeps the region's columns together, moving tree["start"]
        start = tree["start"]
        step = self.compiled.step_inputs(buffers, width, tree=True)  # written in place (StepInputs)
        step.ids.zero_()
        step.ids[self.rows, :num_nodes] = input_ids
        step.valid.zero_()
        step.valid[self.rows, :num_nodes] = valid
        step.positions.copy_(tree["base"][:, None].expand(capacity, width))
        step.positions[self.rows, :num_nodes] += depths[:, old:]
        step.ancestors.zero_()  # each query's ancestors among the region's columns
        step.ancestors[self.rows, :num_nodes, start: start + region] = ancestors[:, old:]
        buffers.start.fill_(self.length)
        buffers.region.fill_(start)
        logits, hidden = self.compiled.run(buffers, step.ids, step.positions, step.valid, ancestors=step.ancestors)
        self.compiled.hidden_out = hidden[self.rows, :num_nodes] if hidden is not None else None
        self.length += num_nodes
        self.forwards += 1
        return logits[self.rows, :num_nodes]

    def keep_region(self, keep: np.ndarray) -> None:
        """End a tree round: of its region's columns keep those with keep [B, R] (host bool: the accepted path),
        the rest become holes; the columns after the last one kept are freed."""
        tree, keep = self._end_round(keep, 0 if self.rows is None else len(self.rows))
        start = tree["start"]
        window = self.buffers.valid[self.rows, start: self.length] & host_to_device(keep, self.rows.device,
                                                                                     dtype=torch.bool)
        self.buffers.valid[self.rows, start: self.length] = window
        self.count[self.rows] = tree["base"][self.rows] + window.sum(dim=1)
        self.length = start + kept_width(keep)

    def keep_prefix_of_last(self, num_new: int, kept: torch.Tensor, max_kept: int, kept_host=None) -> None:
        """Of the last num_new columns keep the first kept[b] for each live row [B]; the rest become holes."""
        start = self.length - num_new
        offsets = torch.arange(num_new, device=kept.device)
        window = self.buffers.valid[self.rows, start: self.length]  # [B, num_new]
        dropped = (window & ~(offsets[None, :] < kept[:, None])).sum(dim=1)
        self.buffers.valid[self.rows, start: self.length] = window & (offsets[None, :] < kept[:, None])
        self.count[self.rows] -= dropped
        self.length = start + max_kept

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given live rows [B'] (a tensor or a host list); the others become dead rows of the buffers."""
        on_device = isinstance(rows, torch.Tensor) and rows.device == self.rows.device
        keep = self.rows[rows if on_device else host_to_device(rows, self.rows.device)]
        if self.rows_host is not None and (not isinstance(rows, torch.Tensor) or rows.device.type == "cpu"):
            self.rows_host = [self.rows_host[i] for i in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]
        else:
            self.rows_host = None
        dead = torch.ones(self.buffers.valid.shape[0], dtype=torch.bool, device=keep.device)
        dead[keep] = False
        self.buffers.valid[dead] = False
        self.rows = keep

    # -- continuous batching: rows join between rounds, in row buckets -------------------------------------------
    def join(self, other: "StaticKVState") -> None:
        """Append other's live rows (a prefilled batch of the same compiled model, in a buffer set of its own) after
        these, between rounds: served requests join the running batch. They take free rows of this buffer set, or,
        where it has too few, every row moves to the set of the next capacity (CompiledModel.capacity: with batch
        sizes 1, 2, 4, .., 64 a row bucket, padded with dead rows), whose steps are compiled (or captured) for it at
        the warmup: a join compiles nothing. Positions, not columns, order a row's tokens, so the joining rows' columns
        end where the widest state's do (left padding is no hole). other's buffers are free after."""
        if not isinstance(other, StaticKVState) or other.compiled is not self.compiled:
            raise ValueError("join: a static state joins another of the same compiled model")
        if self._tree is not None or other._tree is not None:
            raise ValueError("join: a tree round is under way; rows join between rounds")
        if other.buffers is None:
            return
        if self.buffers is None:  # no rows yet: other's rows are this state's
            self.__dict__.update(other.__dict__)
            self.buffers.owner = weakref.ref(self)
            other.buffers = None
            return
        mine = self.rows_host if self.rows_host is not None else self.rows.tolist()  # at an admission: one read
        theirs = other.rows_host if other.rows_host is not None else other.rows.tolist()
        width = max(self.length, other.length)  # a step that would not fit compacts (_room), as ever
        if self.compiled.capacity(len(mine) + len(theirs)) != self.buffers.valid.shape[0]:
            mine = self._move_to(self.compiled.capacity(len(mine) + len(theirs)), mine)
        free = [row for row in range(self.buffers.valid.shape[0]) if row not in set(mine)][: len(theirs)]
        device = self.rows.device
        to_rows, from_rows = host_to_device(free, device), host_to_device(theirs, device)
        to_columns = torch.arange(width - other.length, width, device=device)
        buffers, source = self.buffers, other.buffers
        buffers.valid[to_rows] = False
        if other.length:
            for layer, joining in zip(buffers.cache.layers, source.cache.layers):
                if not joining.is_initialized:
                    continue
                if not layer.is_initialized:  # a layer sized [B_cap, H, L_max, D] by the first states it sees
                    layer.lazy_initialization(*_shaped_like(joining, buffers.valid.shape[0]))
                for mine_t, theirs_t in ((layer.keys, joining.keys), (layer.values, joining.values)):
                    mine_t[to_rows[:, None], :, to_columns[None, :]] = \
                        theirs_t[from_rows, :, : other.length].transpose(1, 2)
            buffers.valid[to_rows[:, None], to_columns[None, :]] = source.valid[from_rows, : other.length]
            buffers.positions[to_rows[:, None], to_columns[None, :]] = source.positions[from_rows, : other.length]
        buffers.count[to_rows] = source.count[from_rows]
        self.rows = torch.cat([self.rows, to_rows])
        self.rows_host = mine + free
        self.length = width
        self.forwards += other.forwards
        source.owner, other.buffers = (lambda: None), None

    def _move_to(self, capacity: int, rows: list[int]) -> list[int]:
        """Every live row (rows: the buffers' rows, on the host) into a free buffer set of this capacity, rows 0 ..;
        the old set is free after. Returns the new buffer rows."""
        old, new = self.buffers, self.compiled.buffers_for(capacity, self)
        count = len(rows)
        index = host_to_device(rows, self.rows.device)
        new.valid.zero_()
        new.positions.zero_()
        new.count.zero_()
        length = self.length
        for layer, moving in zip(new.cache.layers, old.cache.layers):
            if not moving.is_initialized:
                continue
            if not layer.is_initialized:
                layer.lazy_initialization(*_shaped_like(moving, capacity))
            layer.keys[:count, :, :length] = moving.keys[index, :, :length]
            layer.values[:count, :, :length] = moving.values[index, :, :length]
        new.valid[:count, :length] = old.valid[index, :length]
        new.positions[:count, :length] = old.positions[index, :length]
        new.count[:count] = old.count[index]
        old.owner = lambda: None
        self.buffers, self.count = new, new.count
        self.rows = torch.arange(count, device=self.rows.device)
        return list(range(count))

    def compact(self) -> None:
        """Move each row's valid columns to the right end of the columns kept, in order (one gather per layer, in
        place), as decode/kv.py does: a row's newest tokens stay its last columns, so a drafter's rollback of the
        last G columns after a compaction in the middle of its draft steps still finds them there. During a tree
        round only the columns before its region are compacted; the region moves left as one block."""
        buffers = self.buffers
        valid = buffers.valid
        end = self._tree["start"] if self._tree is not None else self.length
        prefix_length = int(valid[:, :end].sum(dim=1).max().item())
        order = torch.argsort(valid[:, :end].to(torch.int8), dim=1, stable=True)[:, end - prefix_length:]  # [B, L']
        if end < self.length:  # the region's columns, as they are
            region = torch.arange(end, self.length, device=order.device)
            order = torch.cat([order, region[None, :].expand(order.shape[0], -1)], dim=1)
        new_length = order.shape[1]
        for layer in buffers.cache.layers:
            if layer.is_initialized:
                for tensor in (layer.keys, layer.values):
                    index = order[:, None, :, None].expand(tensor.shape[0], tensor.shape[1], new_length, tensor.shape[3])
                    tensor[:, :, :new_length] = tensor.gather(2, index)
        buffers.positions[:, :new_length] = buffers.positions.gather(1, order)
        valid[:, :new_length] = valid.gather(1, order)
        valid[:, new_length:] = False
        self.slots_freed += (self.length - new_length) * len(self.rows)
        self.length = new_length
        if self._tree is not None:
            self._tree["start"] = prefix_length
        self.compactions += 1
