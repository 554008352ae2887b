"""One model's KV cache for a batch of rows of different lengths.

The cache is a transformers DynamicCache whose slots are columns of a 2-D mask [B, L]: 1 for a
token that belongs to the row, 0 for left padding or a slot rolled back after a rejection. Rolling
back a row therefore costs no copy: its rejected slots are masked, trailing columns that no row uses
are cropped, and once holes make up too much of the cache it is compacted with one gather
(`compact`). Position ids are derived from the mask (a row's next position = its count of 1s), so
RoPE and absolute position embeddings both see each row's true positions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

# compact once more than this share of the cache's slots are holes
COMPACT_HOLE_FRACTION = 0.25


@dataclass
class KVState:
    cache: DynamicCache = field(default_factory=DynamicCache)
    mask: torch.Tensor | None = None  # [B, L] long, 1 = slot belongs to the row
    forwards: int = 0

    @property
    def length(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def forward(self, model, input_ids: torch.Tensor, input_mask: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Append input_ids [B, S] (input_mask [B, S], 1 = real token) and return fp32 logits.

        Returns [B, S, V], or [B, 1, V] with last_only (the LM head runs on the last slot alone).
        """
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        base = 0 if self.mask is None else self.mask.sum(dim=1, keepdim=True)  # [B, 1] tokens so far
        position_ids = (base + input_mask.cumsum(dim=1) - 1).clamp_min(0)  # [B, S]
        self.mask = input_mask if self.mask is None else torch.cat([self.mask, input_mask], dim=1)
        out = model(input_ids=input_ids, attention_mask=self.mask, position_ids=position_ids,
                    past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        self.forwards += 1
        return out.logits.float()

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

    def maybe_compact(self) -> None:
        # .item() syncs; it runs once per round, right after the round's one other sync
        if self.mask.numel() and (self.mask.numel() - int(self.mask.sum().item())) > COMPACT_HOLE_FRACTION * self.mask.numel():
            self.compact()

    def compact(self) -> None:
        """Move each row's slots to the right end, in order, and drop the columns no row needs."""
        new_length = int(self.mask.sum(dim=1).max().item())
        # a stable sort of the 0/1 mask puts holes first and keeps the row's own order
        order = torch.argsort(self.mask, dim=1, stable=True)[:, self.length - new_length:]  # [B, L']
        self.mask = self.mask.gather(1, order)

        def gather_slots(t: torch.Tensor) -> torch.Tensor:  # t: [B, H, L, D]
            index = order[:, None, :, None].expand(t.shape[0], t.shape[1], new_length, t.shape[3])
            return t.gather(2, index)

        self._map_slots(gather_slots)

    def _map_slots(self, fn) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
                layer.keys = fn(layer.keys)
                layer.values = fn(layer.values)
