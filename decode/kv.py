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
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

# compact once rollback holes are more than this share of the slots after each row's left padding
COMPACT_HOLE_FRACTION = 0.25

# layer types whose attention pattern is computed from slot indices within a window
WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention")


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


@dataclass
class KVState:
    cache: DynamicCache = field(default_factory=DynamicCache)
    mask: torch.Tensor | None = None  # [B, L] long, 1 = slot belongs to the row
    forwards: int = 0
    hole_free: bool = False  # set from the model's config at the first forward (sliding-window attention)
    compactions: int = 0  # gathers done by `compact`
    slots_freed: int = 0  # cache slots (rows x columns) dropped by compaction and by cropping unused columns

    @property
    def length(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Append input_ids [B, S] (input_mask [B, S], 1 = real token) and return fp32 logits.

        Returns [B, S, V], or [B, 1, V] with last_only (the LM head runs on the last slot alone).
        """
        if self.mask is None and sliding_window_of(getattr(model, "config", None)) is not None:
            self.hole_free = True
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        base = 0 if self.mask is None else self.mask.sum(dim=1, keepdim=True)  # [B, 1] tokens so far
        position_ids = (base + input_mask.cumsum(dim=1) - 1).clamp_min(0)  # [B, S]
        self.mask = input_mask if self.mask is None else torch.cat([self.mask, input_mask], dim=1)
        out = model(input_ids=input_ids, attention_mask=self.mask, position_ids=position_ids,
                    past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        self.forwards += 1
        self._check_layout()
        return out.logits.float()

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

    def keep_prefix_of_last(self, num_new: int, kept: torch.Tensor, max_kept: int) -> None:
        """Of the last num_new slots keep the first kept[b] for each row [B]; mask the rest.

        max_kept = max(kept), known on the host: the columns after it are cropped.
        """
        start = self.length - num_new
        offsets = torch.arange(num_new, device=self.mask.device)
        new_mask = self.mask[:, start:] * (offsets[None, :] < kept[:, None])
        self.mask = torch.cat([self.mask[:, :start], new_mask[:, :max_kept]], dim=1)
        if max_kept < num_new:
            self._map_slots(lambda t: t[:, :, : start + max_kept])
        self.maybe_compact()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows [B'] (finished rows stop costing work)."""
        self.mask = self.mask[rows]
        self._map_slots(lambda t: t[rows])
        self.maybe_compact()

    def hole_counts(self) -> tuple[int, int, int]:
        """(rollback holes, leading columns no row uses, slots after the rows' left padding). One host sync.

        A row's holes are its masked slots after its first real slot; left padding is not a hole.
        """
        count = self.mask.sum(dim=1)  # [B]
        first_real = torch.where(count > 0, (self.mask != 0).int().argmax(dim=1), self.length)  # [B]
        span = self.length - first_real  # [B] slots from the row's first real one on
        holes = (span - count).sum()
        holes_host, unused_host, span_host = torch.stack([holes, first_real.min(), span.sum()]).tolist()
        return int(holes_host), int(unused_host), int(span_host)

    def maybe_compact(self) -> None:
        if self.mask is None or not self.mask.numel():
            return
        # .item() syncs; it runs once per round, right after the round's one other sync
        holes, unused, span = self.hole_counts()
        if holes and (self.hole_free or holes > COMPACT_HOLE_FRACTION * span):
            self.compact()
        elif unused:  # columns of padding that no row needs any more (its longest row finished): a slice, no copy
            self.slots_freed += unused * self.mask.shape[0]
            self.mask = self.mask[:, unused:]
            self._map_slots(lambda t: t[:, :, unused:])

    def compact(self) -> None:
        """Move each row's slots to the right end, in order, and drop the columns no row needs."""
        new_length = int(self.mask.sum(dim=1).max().item())
        old_length = self.length
        # a stable sort of the 0/1 mask puts holes first and keeps the row's own order
        order = torch.argsort(self.mask, dim=1, stable=True)[:, old_length - new_length:]  # [B, L']
        self.mask = self.mask.gather(1, order)

        def gather_slots(t: torch.Tensor) -> torch.Tensor:  # t: [B, H, L, D]
            index = order[:, None, :, None].expand(t.shape[0], t.shape[1], new_length, t.shape[3])
            return t.gather(2, index)

        self._map_slots(gather_slots)
        self.compactions += 1
        self.slots_freed += (old_length - new_length) * self.mask.shape[0]

    def _map_slots(self, fn) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
                layer.keys = fn(layer.keys)
                layer.values = fn(layer.values)
