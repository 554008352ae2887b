"""oneDNN prepacked fp32 linears for CPU inference.

The default fp32 CPU GEMM is inefficient for the small M of decoding: on a 2-core CPU a
Qwen2.5-1.5B target forward of 4 tokens costs ~2.5x a 1-token one, which eats most of what speculation
saves. Reordering each weight once into oneDNN's blocked layout (`_reorder_linear_weight`) and calling
`_linear_pointwise` makes a (gamma+1)-token forward cost little more than a 1-token one. Outputs agree
with nn.Linear to fp32 rounding (~1e-6), not bit for bit: every method of a run uses the same modules.
"""
from __future__ import annotations

import torch
from torch import nn


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_hint: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


def usable(model: nn.Module) -> bool:
    parameter = next(model.parameters())
    return torch.backends.mkldnn.is_available() and parameter.device.type == "cpu" and parameter.dtype == torch.float32


def pack_linears(model: nn.Module, batch_hint: int = 4) -> int:
    """Replace every fp32 nn.Linear of a CPU model in place; returns how many were replaced.

    A weight memory-mapped from its file (safetensors loading) has its pages given back as soon as its packed
    copy exists: otherwise every page packing read stays resident until the file closes, and the resident
    set peaks at the weights twice (file pages + packed copies). A weight another module still uses (an LM
    head tied to the embeddings) keeps its pages.
    """
    from utils.memory import drop_file_pages, file_mapped_ranges

    uses: dict[int, int] = {}  # storage address -> parameters and buffers on it (tied weights share one)
    for _, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        address = tensor.untyped_storage().data_ptr()
        uses[address] = uses.get(address, 0) + 1
    ranges = file_mapped_ranges()
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child, batch_hint))
                replaced += 1
                if uses.get(child.weight.untyped_storage().data_ptr()) == 1:
                    drop_file_pages(child.weight, ranges)
    return replaced

