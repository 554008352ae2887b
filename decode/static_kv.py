"""The compiled engine mode (`engine.compile: true`): static-shape caches and one compiled graph per step shape.

Eager transformers forwards issue ~2,000 small kernels each; on a GPU a small draft then costs nearly what the
target does and the run measures Python dispatch. Here each model's decode step is one `torch.compile`d function
(on CUDA, mode "reduce-overhead": a CUDA graph, one launch per step; on a CPU, inductor's C++ kernels) over buffers
whose shapes never change during a run:

- the KV cache: [B_cap, H, L_max, D] per layer (`ColumnLayer`), written in place at the columns of this step;
- `valid` [B_cap, L_max] bool (the masked-cache design of decode/kv.py: a column belongs to its row, or is left
  padding, a rollback hole or unused) and `positions` [B_cap, L_max] (each column's token position);
- the attention mask is built inside the graph from them: a query sees a valid column whose position is not
  after its own (and within the window, for sliding-window layers), and itself. Positions, not column indices,
  order the tokens, so rollback holes cost nothing and sliding windows stay exact without compaction.

Shapes are static per run: B_cap is the comparison's batch size (a short last batch and finished rows become
dead rows, masked, whose outputs are dropped), L_max holds the longest prompt plus the new tokens plus one step
(compaction runs only when a step would not fit), and a step of S tokens is padded to the smallest of the
configured step widths >= S (1 and gamma + 1 for each gamma), its padding masked and rolled back. So a run
compiles one graph per (model, batch capacity, step width) at its warmup and none after: `CompiledModel.compiles`
counts graphs, and `recompiles_after_warmup` is reported.

The prefill runs eagerly (its length varies per batch) into the same static buffers.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, StaticLayer

from decode.kv import KVState, host_to_device, layer_masks, sliding_window_of


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


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


@dataclass
class _Buffers:
    """One (batch capacity, length) set of static buffers of one model; reused by every batch of that shape."""
    cache: Cache
    start: torch.Tensor  # 0-d long: the first column a step writes
    valid: torch.Tensor  # [B_cap, L_max] bool
    positions: torch.Tensor  # [B_cap, L_max] long
    owner: weakref.ref = field(default=lambda: None)  # the StaticKVState using them; dead: free


class CompiledModel:
    """A model's compiled decode step and its static buffers. Attach with `attach` (runner/session.py); the engine
    then builds `StaticKVState`s for it through `decode.static_kv.new_state`."""

    def __init__(self, model, step_widths: tuple[int, ...], max_length: int, batch_sizes: tuple[int, ...],
                 mode: str | None = None, backend: str = "inductor"):
        self.model = model
        self.step_widths = tuple(sorted(set(step_widths)))
        self.max_length = max_length
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.device = next(model.parameters()).device
        config = _text_config(model.config)
        self.num_layers = config.num_hidden_layers
        self.window = sliding_window_of(model.config)
        layer_types = getattr(config, "layer_types", None)
        self.mask_keys = sorted(set(layer_types)) if layer_types else None  # a model that takes a dict of masks
        implementation = getattr(model.config, "_attn_implementation", "sdpa")
        if implementation not in ("sdpa", "eager"):
            raise CompileRefused(f"engine.compile: attention {implementation!r} takes no prebuilt mask; "
                                 "use attn_implementation: sdpa (or eager) with engine.compile")
        self.additive_mask = implementation == "eager"
        self.mode = mode or ("reduce-overhead" if self.device.type == "cuda" else "default")
        self.buffers: dict[int, list[_Buffers]] = {}  # by batch capacity; one set per KV state alive at once
        self.compiles = 0  # graphs compiled for this model (dynamo's count, read around each call)
        self.warm = False  # set by the runner after the warmup: any compile after it is a recompile
        self.recompiles_after_warmup = 0
        self.views: list[CompiledModel] = []  # compiled steps of views over this model's weights (early exit)
        # every CompiledModel compiles the same function (this class's _forward): dynamo keeps its graphs in one
        # cache, guarded per model, per batch capacity and per width; past its limit (8) it would run eagerly, silently
        for limit in ("recompile_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 1024))
        self.backend = backend  # "eager": dynamo's graph capture and guards without code generation (the tests)
        options = {"mode": self.mode} if backend == "inductor" else {}
        self._step = torch.compile(self._forward, backend=backend, dynamic=False, fullgraph=True, **options)

    def for_view(self, view) -> "CompiledModel":
        """The same settings for another module over the same weights (early exit's truncated target); kept in
        `views`, so the runner warms and counts it with this one."""
        compiled = CompiledModel(view, self.step_widths, self.max_length, self.batch_sizes, self.mode, self.backend)
        self.views.append(compiled)
        return compiled

    def precompile(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Compile every width at every batch capacity up to this batch's [B, P], on a throwaway state: a graph the
        warmup's own rounds happened not to need (a catch-up after a full accept, a short last batch) compiles
        here, not inside a timed batch."""
        for capacity in [b for b in self.batch_sizes if b <= ids.shape[0]]:
            state = StaticKVState(self)
            state.forward(self.model, ids[:capacity], mask[:capacity], last_only=True)
            for width in self.step_widths:
                state.forward(self.model, ids[:capacity, -1:].expand(-1, width).contiguous())
                state.keep_prefix_of_last(width, torch.zeros(capacity, dtype=torch.long, device=ids.device), 0)

    # -- shapes -----------------------------------------------------------------------------------------
    def capacity(self, batch: int) -> int:
        fitting = [b for b in self.batch_sizes if b >= batch]
        if not fitting:
            raise CompileRefused(f"engine.compile: a batch of {batch} rows is above the configured batch sizes "
                                 f"{list(self.batch_sizes)}")
        return fitting[0]

    def width_for(self, num_tokens: int) -> int:
        """The compiled step width a step of num_tokens runs at (num_tokens <= the widest)."""
        return next(w for w in self.step_widths if w >= num_tokens)

    def buffers_for(self, batch: int, owner) -> _Buffers:
        """A free set of buffers for a batch of this size (another set only where two states of this model live at
        once, e.g. a model drafting for itself: new buffers, so new graphs, counted)."""
        capacity = self.capacity(batch)
        pool = self.buffers.setdefault(capacity, [])
        free = next((b for b in pool if b.owner() is None), None)
        if free is None:
            start = torch.zeros((), dtype=torch.long, device=self.device)
            cache = Cache(layers=[ColumnLayer(self.max_length, start) for _ in range(self.num_layers)])
            valid = torch.zeros(capacity, self.max_length, dtype=torch.bool, device=self.device)
            positions = torch.zeros(capacity, self.max_length, dtype=torch.long, device=self.device)
            if self.device.type == "cuda":  # CUDA graphs replay on fixed addresses
                for tensor in (start, valid, positions):
                    torch._dynamo.mark_static_address(tensor)
            free = _Buffers(cache, start, valid, positions)
            pool.append(free)
        free.owner = weakref.ref(owner)
        return free

    # -- the step -----------------------------------------------------------------------------------------
    def masks(self, buffers: _Buffers, query_positions: torch.Tensor, query_columns: torch.Tensor):
        """The attention mask(s) of a step: [B, 1, S, L_max] bool (sdpa) or additive (eager), or a dict of them
        by layer type."""
        key_positions = buffers.positions[:, None, :]  # [B, 1, L]
        query = query_positions[:, :, None]  # [B, S, 1]
        columns = torch.arange(self.max_length, device=query_columns.device)
        itself = columns[None, None, :] == query_columns[None, :, None]  # [1, S, L]
        seen = buffers.valid[:, None, :] & (key_positions <= query)  # [B, S, L]
        full = seen | itself
        masks = {"full_attention": full}
        if self.window is not None:
            masks["sliding_attention"] = (seen & (query - key_positions < self.window)) | itself
        return layer_masks(masks, self.mask_keys, self.window, self.additive_mask,
                           next(self.model.parameters()).dtype)

    def _forward(self, buffers: _Buffers, input_ids, query_positions, query_columns):
        mask = self.masks(buffers, query_positions, query_columns)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=query_positions,
                         past_key_values=buffers.cache, use_cache=True)
        return out.logits.float()

    def run(self, buffers: _Buffers, input_ids, query_positions, query_columns, compiled: bool = True):
        """One step over [B_cap, S] (S one of step_widths when compiled) -> fp32 logits [B_cap, S, V]."""
        from torch._dynamo.utils import counters

        if not compiled:
            return self._forward(buffers, input_ids, query_positions, query_columns)
        before = counters["stats"]["unique_graphs"]
        logits = self._step(buffers, input_ids, query_positions, query_columns)
        new = counters["stats"]["unique_graphs"] - before
        self.compiles += new
        if self.warm:
            self.recompiles_after_warmup += new
        return logits

    def summary(self) -> dict:
        return {"mode": self.mode if self.backend == "inductor" else self.backend, "step_widths": list(self.step_widths), "max_length": self.max_length,
                "buffer_sets": {b: len(pool) for b, pool in sorted(self.buffers.items())}, "graphs": self.compiles,
                "recompiles_after_warmup": self.recompiles_after_warmup}


def attach(model, compiled: CompiledModel) -> None:
    model._speculate_compiled = compiled


def compiled_of(model) -> CompiledModel | None:
    return getattr(model, "_speculate_compiled", None)


def new_state(model):
    """The KV state the engine keeps for this model: static and compiled where `attach`ed, else decode/kv.py's."""
    compiled = compiled_of(model)
    return StaticKVState(compiled) if compiled is not None else KVState()


class StaticKVState:
    """KVState's interface (decode/kv.py) over a CompiledModel's static buffers.

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

    def _start(self, batch: int) -> None:
        self.buffers = self.compiled.buffers_for(batch, self)
        capacity = self.buffers.valid.shape[0]
        self.buffers.valid.zero_()
        self.buffers.positions.zero_()
        self.rows = torch.arange(batch, device=self.compiled.device)
        self.count = torch.zeros(capacity, dtype=torch.long, device=self.compiled.device)
        self.length = 0

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Append input_ids [B, S] (input_mask [B, S]) and return fp32 logits [B, S, V] ([B, 1, V] with last_only)."""
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
            if first:
                logits = self._step(input_ids, input_mask, compiled=False)
            else:
                chunks = [self._step(input_ids[:, i:i + widest], input_mask[:, i:i + widest])
                          for i in range(0, input_ids.shape[1], widest)]
                logits = torch.cat(chunks, dim=1)
        else:
            logits = self._step(input_ids, input_mask)
        self.forwards += 1
        return logits[:, -1:] if last_only else logits

    def _step(self, input_ids: torch.Tensor, input_mask: torch.Tensor, compiled: bool = True) -> torch.Tensor:
        buffers, capacity = self.buffers, self.buffers.valid.shape[0]
        num_tokens = input_ids.shape[1]
        width = self.compiled.width_for(num_tokens) if compiled else num_tokens
        if self.length + width > self.compiled.max_length:
            self.compact()
            if self.length + width > self.compiled.max_length:
                raise RuntimeError(f"engine.compile: the static cache of {self.compiled.max_length} columns is full "
                                   f"({self.length} in use, a step of {width}); this is a bug in sizing it")
        device = input_ids.device
        ids = torch.zeros(capacity, width, dtype=torch.long, device=device)
        mask = torch.zeros(capacity, width, dtype=torch.long, device=device)
        ids[self.rows, :num_tokens] = input_ids
        mask[self.rows, :num_tokens] = input_mask.to(torch.long)
        positions = (self.count[:, None] + mask.cumsum(dim=1) - 1).clamp_min(0)  # [B_cap, W]
        columns = torch.arange(self.length, self.length + width, device=device)
        buffers.valid[:, self.length: self.length + width] = mask.bool()
        buffers.positions[:, self.length: self.length + width] = positions
        buffers.start.fill_(self.length)
        logits = self.compiled.run(buffers, ids, positions, columns, compiled=compiled)
        # the step's padding (columns past num_tokens) was only ever seen by itself: free it
        self.count += mask.sum(dim=1)
        self.length += num_tokens
        return logits[self.rows, :num_tokens]

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
        dead = torch.ones(self.buffers.valid.shape[0], dtype=torch.bool, device=keep.device)
        dead[keep] = False
        self.buffers.valid[dead] = False
        self.rows = keep

    def compact(self) -> None:
        """Move each row's valid columns to the right end of the columns kept, in order (one gather per layer, in
        place), as decode/kv.py does: a row's newest tokens stay its last columns, so a drafter's rollback of the
        last G columns after a compaction in the middle of its draft steps still finds them there."""
        buffers = self.buffers
        valid = buffers.valid
        new_length = int(valid.sum(dim=1).max().item())
        order = torch.argsort(valid.to(torch.int8), dim=1, stable=True)[:, valid.shape[1] - new_length:]  # [B, L']
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
        self.compactions += 1
