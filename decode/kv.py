"""One model's KV cache for a batch of rows of different lengths.

The cache is a transformers DynamicCache whose slots are columns of a 2-D mask [B, L]: 1 for a
token that belongs to the row, 0 for left padding or a slot rolled back after a rejection. Rolling
back a row therefore costs no copy: its rejected slots are masked, trailing columns that no row uses
are cropped, and once rollback holes make up too much of the cache it is compacted with one gather
(`compact`). Position ids are derived from the mask (a row's next position = its count of 1s), so
RoPE and absolute position embeddings both see each row's true positions.

Left padding is not a hole: it precedes every real slot of its row, costs nothing to attend past, and
compaction cannot free it (the longest row sets the cache length). A hole is a masked slot after a
row's first real slot, i.e. one left by a rollback.

Sliding-window attention (Mistral, Qwen2 with use_sliding_window, gemma-2/3 local layers) counts
cache slots, not positions: a hole inside a row would shrink its window. For such models the cache
is kept hole-free (compacted right after any rollback that leaves holes), so a row's slot index is
its position plus a constant left pad and a window of W slots is a window of W tokens.

Devices and host syncs. The mask lives on the engine's device (that of the input ids) and has a copy on the
host (numpy, so no torch op and no device is involved): hole counts, compaction sizes and whether a forward
needs an attention mask at all are read there, never from the device. Each model is fed on its input
embedding's device and its logits come back to the engine's device; each cache layer is indexed with an index
on that layer's own device (a target split over several GPUs by a device map).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

# compact once rollback holes are more than this share of the slots after each row's left padding
COMPACT_HOLE_FRACTION = 0.25

# layer types whose attention pattern is computed from slot indices within a window
WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention")

# model types whose decoder hands its attention mask to transformers' create_causal_mask and uses it for nothing
# else (ALiBi models such as Bloom and Falcon build their bias from the 2-D mask), so a prebuilt 4-D mask, built
# by that same function, is taken as it is; with sdpa and eager attention this saves the host sync by which
# transformers decides whether a mask is needed at all (at every one-token forward, e.g. a draft step)
PREBUILT_MASK_MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma", "gemma2", "gemma3_text", "phi3", "smollm3", "olmo2",
    "granite", "gpt_neox"})
PREBUILT_MASK_ATTENTION = ("sdpa", "eager")


def host_to_device(values, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list, numpy array or CPU tensor on `device`. To a GPU the copy goes through pinned memory and does
    not block (a copy from pageable memory waits for every queued kernel); on a CPU it is the host tensor."""
    host = values if isinstance(values, torch.Tensor) else torch.as_tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def input_device(model) -> torch.device:
    """Where the model takes its input ids: its input embedding's device (the first one of a device map)."""
    return model.get_input_embeddings().weight.device


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """tensor on device; between two GPUs without a host sync."""
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=tensor.device.type == "cuda" and device.type == "cuda")


def on_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """values as a tensor on `device`: a tensor moved there (no host read), host data copied (host_to_device)."""
    if isinstance(values, torch.Tensor):
        return to_device(values, device).to(dtype)
    return host_to_device(np.asarray(values), device, dtype)


# the one line for a Load that meets the compiled mode's static caches
COMPILED_JOIN = "join: a static (compiled) state and a dynamic one cannot join; both models' states must be of one kind"


def joined(state, other):
    """state with other's rows appended (KVState.join, or a compiled model's StaticKVState.join: its row buckets);
    state None or empty (no rows yet): other itself."""
    if state is None:
        return other
    if not isinstance(state, KVState):  # a static state (decode/static_kv.py): its own join
        state.join(other)
        return state
    if not isinstance(other, KVState):
        raise ValueError(COMPILED_JOIN)
    if state.mask is None:
        return other
    state.join(other)
    return state


class TreeUnsupported(ValueError):
    """A model whose attention cannot take a tree mask; the message is one line for the user."""


def tree_support_problem(model) -> str | None:
    """Why token trees cannot run on this model (one line), or None: a tree needs a custom 4-D attention mask, which
    sdpa and eager attention take on the model types whose decoder uses create_causal_mask alone."""
    config = model.config
    implementation = getattr(config, "_attn_implementation", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in PREBUILT_MASK_MODEL_TYPES:
        return (f"token trees need a custom attention mask, which model type {model_type!r} does not take (supported: "
                f"{', '.join(sorted(PREBUILT_MASK_MODEL_TYPES))}); use speculative.tree: null")
    if implementation not in PREBUILT_MASK_ATTENTION:
        return (f"token trees need a custom attention mask, which attention {implementation!r} does not take; "
                "set attn_implementation: sdpa (or eager), or speculative.tree: null")
    return None


def tree_ancestry(parents: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A round's tree region on the device: parents [B, R] long (region columns, each before its node; -1: after the
    committed prefix) and valid [B, R] bool -> depths [B, R] (levels below the root's children: 0 for them and for
    padding nodes) and ancestors [B, R, R] bool (a node's ancestors in the region and itself; a padding node only
    itself). By pointer doubling (ceil(log2 R) gathers, no host read). Shared by the eager (KVState) and compiled
    (StaticKVState) tree forwards."""
    batch, width = parents.shape
    # column `width` stands for the committed prefix: its own parent, no ancestors
    up = torch.where(valid & (parents >= 0), parents, width)
    up = torch.cat([up, up.new_full((batch, 1), width)], dim=1)  # [B, R + 1]
    columns = torch.arange(width + 1, device=parents.device)
    seen = (columns[:, None] == columns[None, :]) | (up[:, :, None] == columns)  # [B, R + 1, R + 1]: itself, its parent
    seen[:, width] = False
    # after t steps, seen holds a node's ancestors up to 2^t levels up and `up` its ancestor 2^t levels up
    for _ in range(max(width - 1, 1).bit_length()):
        seen = seen | seen.gather(1, up[:, :, None].expand(-1, -1, width + 1))
        up = up.gather(1, up)
    ancestors = seen[:, :width, :width]
    return ancestors.sum(dim=2) - 1, ancestors


def layer_masks(allowed: dict, layer_types, window: int | None, additive: bool, dtype: torch.dtype):
    """Which keys each query may see, by kind ("full_attention", and "sliding_attention" for a model with a window):
    [B, S, L] bool -> the attention_mask a model takes: [B, 1, S, L] bool (sdpa) or additive (eager), as a dict by
    layer type where the config lists layer_types, else the one kind its layers use (windowed where the config has a
    window: Mistral). Used by tree verification here and by the compiled step's in-graph mask (decode/static_kv.py)."""
    def as_mask(mask: torch.Tensor) -> torch.Tensor:
        mask = mask[:, None]
        if not additive:
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

    built = {kind: as_mask(mask) for kind, mask in allowed.items()}
    if layer_types:
        return {kind: built.get(kind, built["full_attention"]) for kind in sorted(set(layer_types))}
    return built["sliding_attention" if window is not None else "full_attention"]


class CacheLayoutError(ValueError):
    """The cache's layers do not hold one slot per mask column (e.g. a sliding-window layer trimmed them)."""


def sliding_window_of(config) -> int | None:
    """The sliding window (in tokens) of a model config, or None when no layer uses one."""
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return int(window) if any(t in WINDOWED_LAYER_TYPES for t in layer_types) else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


class TreeRounds:
    """A KV state's token-tree round (forward_tree), shared by the eager (KVState) and compiled (StaticKVState)
    states: `_tree` is the round under way, its region the columns from _tree["start"] to `length`, else None."""

    @property
    def region_width(self) -> int:
        """Columns of the tree round under way (0: none)."""
        return 0 if self._tree is None else self.length - self._tree["start"]

    def _end_round(self, keep: np.ndarray, rows: int) -> tuple[dict, np.ndarray]:
        """keep_region's start: the round under way, ended, and keep as host bool, which must be [rows, R] (the
        live rows, the region's columns)."""
        if self._tree is None:
            raise ValueError("keep_region without a tree round")
        tree, self._tree = self._tree, None
        keep = np.asarray(keep, dtype=bool)
        region = self.length - tree["start"]
        if keep.shape != (rows, region):
            raise ValueError(f"keep_region: keep has shape {keep.shape}, the region is {(rows, region)}")
        return tree, keep


def kept_width(kept: np.ndarray) -> int:
    """Of a region's columns kept [B, R] (host bool), how many to keep: up to the last one that any row keeps."""
    columns = np.flatnonzero(kept.any(axis=0))
    return int(columns[-1]) + 1 if columns.size else 0


@dataclass
class KVState(TreeRounds):
    cache: DynamicCache = field(default_factory=DynamicCache)
    mask: torch.Tensor | None = None  # [B, L] long on the engine's device, 1 = slot belongs to the row
    _host: tuple | None = field(default=None, repr=False)  # (mask, its copy [B, L] on the host)
    forwards: int = 0
    hole_free: bool = False  # set from the model's config at the first forward (sliding-window attention)
    compactions: int = 0  # gathers done by `compact`
    slots_freed: int = 0  # cache slots (rows x columns) dropped by compaction and by cropping unused columns
    _tree: dict | None = field(default=None, repr=False)  # the tree round under way (forward_tree), else None

    @property
    def length(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    @property
    def mask_host(self) -> np.ndarray | None:
        """The mask on the host; read from the device (a sync) only if `mask` was set from outside."""
        if self.mask is None:
            return None
        if self._host is None or self._host[0] is not self.mask:
            self._host = (self.mask, self.mask.cpu().numpy().astype(np.int64))
        return self._host[1]

    def _set_mask(self, mask: torch.Tensor, host: np.ndarray) -> None:
        self.mask, self._host = mask, (mask, host)

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | np.ndarray | None = None,
                last_only: bool = False, **inputs) -> torch.Tensor:
        """Append input_ids [B, S] (input_mask [B, S], 1 = real token) and return fp32 logits.

        input_ids are on the engine's device, where the logits come back. input_mask is a numpy array (built
        on the host: no sync) or a tensor on the engine's device (read to the host once: a sync, as at prefill).
        Returns [B, S, V], or [B, 1, V] with last_only (the LM head runs on the last slot alone). `inputs` go to the
        model as they are (a draft head's hidden states, decode/head_models.py).
        """
        if self.mask is None and sliding_window_of(getattr(model, "config", None)) is not None:
            self.hole_free = True
        engine = input_ids.device
        if input_mask is None:
            input_host = np.ones(tuple(input_ids.shape), dtype=np.int64)
            input_mask = torch.ones_like(input_ids)
        elif isinstance(input_mask, np.ndarray):
            input_host = input_mask.astype(np.int64)
            input_mask = host_to_device(input_host, engine)
        else:
            input_host = input_mask.cpu().numpy().astype(np.int64)
        base = 0 if self.mask is None else self.mask.sum(dim=1, keepdim=True)  # [B, 1] tokens so far
        position_ids = (base + input_mask.cumsum(dim=1) - 1).clamp_min(0)  # [B, S]
        if self.mask is None:
            self._set_mask(input_mask, input_host)
        else:
            self._set_mask(torch.cat([self.mask, input_mask], dim=1), np.concatenate([self.mask_host, input_host], 1))
        feed = input_device(model)
        position_ids = to_device(position_ids, feed)
        out = model(input_ids=to_device(input_ids, feed), attention_mask=self._attention_mask(model, feed, position_ids),
                    position_ids=position_ids, past_key_values=self.cache, use_cache=True,
                    logits_to_keep=1 if last_only else 0, **inputs)
        self.forwards += 1
        self._check_layout()
        return to_device(out.logits, engine).float()

    # -- token trees (decode/tree_layout.py) ----------------------------------------------------------------------
    def forward_tree(self, model, input_ids: torch.Tensor, parents, valid, new_round: bool, **inputs) -> torch.Tensor:
        """Append tree nodes input_ids [B, S] and return fp32 logits [B, S, V].

        A round's tree nodes form a region of columns (`new_round` starts one at the current end). parents [B, S]
        index the region's columns (earlier forwards of the round included), -1: the node follows the committed
        prefix; valid [B, S] False for padding nodes. Both are tensors on the engine's device (a dynamic tree's come
        out of the draft) or host arrays (copied without a sync). A node sees the committed prefix (within the window,
        on sliding-window layers) and its ancestors in the region, and itself; its position is the prefix's length +
        its depth. A padding node sees the prefix and itself, and no other node sees it. The masks are built on the
        device: no host read. The region's columns count as real until the round ends with `keep_region`, which keeps
        the accepted path's (valid nodes all).
        """
        config = model.config
        implementation = getattr(config, "_attn_implementation", None)
        problem = tree_support_problem(model)
        if problem:
            raise TreeUnsupported(problem)
        if self.mask is None:
            raise ValueError("forward_tree needs a prefilled cache")
        if sliding_window_of(config) is not None:
            self.hole_free = True
        engine = input_ids.device
        parents, valid = on_device(parents, engine), on_device(valid, engine, torch.bool)
        if new_round or self._tree is None:
            # the root's children sit at each row's count of tokens so far
            self._tree = {"start": self.length, "base": self.mask.sum(dim=1), "parents": parents[:, :0],
                          "valid": valid[:, :0]}
        tree = self._tree
        old = tree["parents"].shape[1]
        tree["parents"], tree["valid"] = torch.cat([tree["parents"], parents], 1), torch.cat([tree["valid"], valid], 1)
        depths, ancestors = tree_ancestry(tree["parents"], tree["valid"])  # [B, R], [B, R, R]
        positions = tree["base"][:, None] + depths  # [B, R]
        prefix = self.mask[:, :tree["start"]]  # [B, P]
        self._set_mask(torch.cat([self.mask, torch.ones_like(input_ids)], dim=1),
                       np.concatenate([self.mask_host, np.ones(tuple(input_ids.shape), dtype=np.int64)], axis=1))
        batch, width = input_ids.shape
        full = torch.cat([prefix.bool()[:, None, :].expand(-1, width, -1), ancestors[:, old:]], dim=2)  # [B, S, L]
        window = sliding_window_of(config)
        masks = {"full_attention": full}
        if window is not None:
            # each committed column's position: holes are masked, so a count of the row's real slots is exact
            key_positions = torch.cat([prefix.cumsum(dim=1) - 1, positions], dim=1)[:, None, :]  # [B, 1, L]
            masks["sliding_attention"] = full & (positions[:, old:, None] - key_positions < window)
        feed = input_device(model)
        text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        attention_mask = layer_masks({kind: to_device(mask, feed) for kind, mask in masks.items()},
                                     getattr(text_config, "layer_types", None), window, implementation == "eager",
                                     model.get_input_embeddings().weight.dtype)
        out = model(input_ids=to_device(input_ids, feed), attention_mask=attention_mask,
                    position_ids=to_device(positions[:, old:], feed), past_key_values=self.cache, use_cache=True,
                    **inputs)
        self.forwards += 1
        self._check_layout()
        return to_device(out.logits, engine).float()

    def keep_region(self, keep: np.ndarray) -> None:
        """End a tree round: of its region's columns keep those with keep [B, R] (host bool: the accepted path),
        mask the rest, crop the columns after the last kept one, compact as after any rollback."""
        tree, keep = self._end_round(keep, 0 if self.mask is None else self.mask.shape[0])
        start = tree["start"]
        region = self.length - start
        new_host = self.mask_host[:, start:] * keep
        end = kept_width(new_host)
        new_mask = self.mask[:, start:] * host_to_device(keep.astype(np.int64), self.mask.device)
        self._set_mask(torch.cat([self.mask[:, :start], new_mask[:, :end]], dim=1),
                       np.concatenate([self.mask_host[:, :start], new_host[:, :end]], axis=1))
        if end < region:
            self._map_slots(lambda t: t[:, :, : start + end])
        self.maybe_compact()

    def _attention_mask(self, model, feed: torch.device, position_ids: torch.Tensor):
        """The mask to hand the model for the slots so far. For a model type in PREBUILT_MASK_MODEL_TYPES with
        sdpa or eager attention and no sliding window: None where every slot is real (causal alone), else the
        4-D mask transformers would build from the 2-D one; transformers reads the 2-D mask on the host to decide
        which (at every one-token forward), the host copy answers without a sync. With a sliding window (a hole-free
        cache): each layer kind's mask built on the device (`_windowed_mask`). Any other model: the 2-D mask.
        """
        config = model.config
        if (getattr(config, "model_type", None) not in PREBUILT_MASK_MODEL_TYPES
                or getattr(config, "_attn_implementation", None) not in PREBUILT_MASK_ATTENTION):
            return to_device(self.mask, feed)
        if self.hole_free:
            return self._windowed_mask(model, feed, position_ids.shape[1])
        if self.mask_host.all():
            return None
        embeddings = model.get_input_embeddings().weight
        # create_causal_mask reads only the batch size, query length, dtype and device of inputs_embeds
        shape_only = torch.empty((position_ids.shape[0], position_ids.shape[1], 0), dtype=embeddings.dtype, device=feed)
        return create_causal_mask(config=config, inputs_embeds=shape_only, attention_mask=to_device(self.mask, feed),
                                  past_key_values=self.cache, position_ids=position_ids, allow_is_causal_skip=False)

    def _windowed_mask(self, model, feed: torch.device, queries: int):
        """A hole-free cache's masks for the last `queries` slots, built on the device from the 2-D mask (no host
        read): a query sees the real slots up to its own (and itself, so a padding query's row is never empty) and, on
        sliding layers, those within the window; hole-free, a slot distance is a position distance."""
        config = model.config
        text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        window = sliding_window_of(config)
        length = self.length
        mask = to_device(self.mask, feed).bool()  # [B, L]
        query_slots = torch.arange(length - queries, length, device=feed)[:, None]  # [S, 1]
        distance = query_slots - torch.arange(length, device=feed)[None, :]  # [S, L]
        full = (mask[:, None, :] & (distance >= 0)) | (distance == 0)  # [B, S, L]
        allowed = {"full_attention": full}
        if window is not None:
            allowed["sliding_attention"] = full & (distance < window)
        return layer_masks(allowed, getattr(text_config, "layer_types", None), window,
                           getattr(config, "_attn_implementation", None) == "eager",
                           model.get_input_embeddings().weight.dtype)

    def _check_layout(self) -> None:
        # a DynamicCache built from a sliding-window config keeps only the last W-1 slots of a layer,
        # which the mask (and cropping by mask length) cannot follow
        for index, layer in enumerate(self.cache.layers):
            keys = getattr(layer, "keys", None)
            if getattr(layer, "is_initialized", True) and keys is not None and keys.numel() \
                    and keys.shape[-2] != self.length:
                raise CacheLayoutError(
                    f"cache layer {index} ({type(layer).__name__}) holds {keys.shape[-2]} slots but the mask has "
                    f"{self.length}; build KVState's cache as a plain DynamicCache() (no config), whose layers are not trimmed")

    def keep_prefix_of_last(self, num_new: int, kept: torch.Tensor, max_kept: int, kept_host=None) -> None:
        """Of the last num_new slots keep the first kept[b] for each row [B]; mask the rest.

        max_kept = max(kept), known on the host: the columns after it are cropped. kept_host: kept on the host
        where the caller has it; without it kept is read (a host sync).
        """
        kept_host = np.asarray(kept.tolist() if kept_host is None else kept_host, dtype=np.int64)
        start = self.length - num_new
        offsets = torch.arange(num_new, device=self.mask.device)
        new_mask = self.mask[:, start:] * (offsets[None, :] < kept[:, None])
        new_host = self.mask_host[:, start:] * (np.arange(num_new)[None, :] < kept_host[:, None])
        self._set_mask(torch.cat([self.mask[:, :start], new_mask[:, :max_kept]], dim=1),
                       np.concatenate([self.mask_host[:, :start], new_host[:, :max_kept]], axis=1))
        if max_kept < num_new:
            self._map_slots(lambda t: t[:, :, : start + max_kept])
        self.maybe_compact()

    def select_rows(self, rows) -> None:
        """Keep only the given rows [B'] (finished rows stop costing work): a list, or a tensor on any device
        (read to the host unless on the CPU)."""
        rows_host = np.asarray(rows.tolist() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64)
        index = self._index_on(rows if isinstance(rows, torch.Tensor) else rows_host)
        self._set_mask(self.mask[index(self.mask.device)], self.mask_host[rows_host])
        self._map_slots(lambda t: t[index(t.device)])
        self.maybe_compact()

    def join(self, other: "KVState") -> None:
        """Append other's rows (a prefilled batch of the same model) after these: continuous batching admits
        requests into the running batch between rounds. The narrower of the two caches is left padded with masked
        columns (positions come from the mask, so no row's positions move); left padding is not a hole, so a
        hole-free cache (sliding windows) stays hole-free. Both must be between rounds (no tree round under way)."""
        if not isinstance(other, KVState):
            raise ValueError(COMPILED_JOIN)
        if self._tree is not None or other._tree is not None:
            raise ValueError("join: a tree round is under way; rows join between rounds")
        width = max(self.length, other.length)

        def pad_mask(state: "KVState") -> tuple[torch.Tensor, np.ndarray]:
            extra = width - state.length
            host = np.pad(state.mask_host, ((0, 0), (extra, 0)))
            return (torch.nn.functional.pad(state.mask, (extra, 0)) if extra else state.mask), host

        (mask, host), (other_mask, other_host) = pad_mask(self), pad_mask(other)
        mine, theirs = self.cache.layers, other.cache.layers
        if len(mine) != len(theirs):
            raise ValueError(f"join: caches of {len(mine)} and {len(theirs)} layers (not the same model)")
        for layer, joining in zip(mine, theirs):
            if getattr(layer, "keys", None) is None or getattr(joining, "keys", None) is None:
                raise ValueError("join: a cache layer holds nothing (join prefilled states)")
            for name in ("keys", "values"):
                a, b = getattr(layer, name), getattr(joining, name)  # [B, H, L, D]
                a = torch.nn.functional.pad(a, (0, 0, width - a.shape[2], 0)) if a.shape[2] < width else a
                b = torch.nn.functional.pad(b, (0, 0, width - b.shape[2], 0)) if b.shape[2] < width else b
                setattr(layer, name, torch.cat([a, to_device(b, a.device)], dim=0))
        self._set_mask(torch.cat([mask, to_device(other_mask, mask.device)], dim=0),
                       np.concatenate([host, other_host], axis=0))
        self.hole_free = self.hole_free or other.hole_free
        self.forwards += other.forwards
        self.compactions += other.compactions
        self.slots_freed += other.slots_freed
        self._check_layout()

    def add_empty_rows(self, rows: int) -> None:
        """`rows` rows after these with nothing cached (every column masked): requests whose prefill waits for a
        later forward, whose right-aligned tokens start at position 0 (positions come from the mask)."""
        if self._tree is not None:
            raise ValueError("add_empty_rows: a tree round is under way; rows join between rounds")
        self._set_mask(torch.cat([self.mask, self.mask.new_zeros(rows, self.length)], dim=0),
                       np.concatenate([self.mask_host, np.zeros((rows, self.length), dtype=np.int64)], axis=0))
        self._map_slots(lambda t: torch.cat([t, t.new_zeros(rows, *t.shape[1:])], dim=0))

    @staticmethod
    def _index_on(index):
        """device -> index on that device: one copy per device however many cache layers live there."""
        copies = {index.device: index} if isinstance(index, torch.Tensor) else {}

        def on(device: torch.device) -> torch.Tensor:
            if device not in copies:
                source = next(iter(copies.values()), None)
                copies[device] = to_device(source, device) if source is not None else host_to_device(index, device)
            return copies[device]
        return on

    def hole_counts(self) -> tuple[int, int, int]:
        """(rollback holes, leading columns no row uses, slots after the rows' left padding), from the host copy.

        A row's holes are its masked slots after its first real slot; left padding is not a hole.
        """
        count = self.mask_host.sum(axis=1)  # [B]
        first_real = np.where(count > 0, (self.mask_host != 0).argmax(axis=1), self.length)  # [B]
        span = self.length - first_real  # [B] slots from the row's first real one on
        return int((span - count).sum()), int(first_real.min()), int(span.sum())

    def maybe_compact(self) -> None:
        if self.mask is None or not self.mask.numel():
            return
        holes, unused, span = self.hole_counts()
        if holes and (self.hole_free or holes > COMPACT_HOLE_FRACTION * span):
            self.compact()
        elif unused:  # columns of padding that no row needs any more (its longest row finished): a slice, no copy
            self.slots_freed += unused * self.mask.shape[0]
            self._set_mask(self.mask[:, unused:], self.mask_host[:, unused:])
            self._map_slots(lambda t: t[:, :, unused:])

    def compact(self) -> None:
        """Move each row's slots to the right end, in order, and drop the columns no row needs."""
        new_length = int(self.mask_host.sum(axis=1).max())
        old_length = self.length
        # a stable sort of the 0/1 mask puts holes first and keeps the row's own order
        order = torch.argsort(self.mask, dim=1, stable=True)[:, old_length - new_length:]  # [B, L']
        order_host = np.argsort(self.mask_host, axis=1, kind="stable")[:, old_length - new_length:]
        self._set_mask(self.mask.gather(1, order), np.take_along_axis(self.mask_host, order_host, axis=1))
        index = self._index_on(order)

        def gather_slots(t: torch.Tensor) -> torch.Tensor:  # t: [B, H, L, D]
            return t.gather(2, index(t.device)[:, None, :, None].expand(t.shape[0], t.shape[1], new_length, t.shape[3]))

        self._map_slots(gather_slots)
        self.compactions += 1
        self.slots_freed += (old_length - new_length) * self.mask.shape[0]

    def _map_slots(self, fn) -> None:
        """fn over every cache layer's keys and values [B, H, L, D], those of no slot (L = 0: every column dropped, as
        when only empty rows are left, add_empty_rows) included: their rows must still follow select_rows."""
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.dim() == 4:
                layer.keys = fn(layer.keys)
                layer.values = fn(layer.values)
