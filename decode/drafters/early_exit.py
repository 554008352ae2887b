"""Self-speculation (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2024; transformers'
assistant_early_exit): the target's first exit_layer decoder layers, its final norm and its LM head draft.
No second model and no copy of a weight: the draft is a view sharing the target's modules."""
from __future__ import annotations

import copy

from torch import nn

from decode.drafters.draft_model import DraftModelDrafter


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of the module object whose submodule table can be changed without touching the original."""
    view = copy.copy(module)
    view._modules = dict(module._modules)
    view._parameters = dict(module._parameters)
    view._buffers = dict(module._buffers)
    return view


def num_layers(model) -> int:
    body = getattr(model, "model", None)
    if body is not None and hasattr(body, "layers"):
        return len(body.layers)
    body = getattr(model, "transformer", None)
    if body is not None and hasattr(body, "h"):
        return len(body.h)
    raise ValueError(f"early_exit: {type(model).__name__} has neither model.layers nor transformer.h; "
                     "this architecture is not supported for early exit")


def early_exit_view(model, exit_layer: int):
    """The target truncated to its first exit_layer layers (+ final norm and LM head), sharing every weight."""
    total = num_layers(model)
    if not 1 <= exit_layer < total:
        raise ValueError(f"early_exit: exit_layer {exit_layer} must be between 1 and {total - 1} "
                         f"(the target has {total} layers)")
    config = copy.deepcopy(model.config)
    view = _shallow(model)
    if hasattr(getattr(model, "model", None), "layers"):
        body = _shallow(model.model)
        body.layers = nn.ModuleList(list(model.model.layers)[:exit_layer])
        config.num_hidden_layers = exit_layer
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = list(config.layer_types)[:exit_layer]
        body.config = config
        view.model = body
    else:
        body = _shallow(model.transformer)
        body.h = nn.ModuleList(list(model.transformer.h)[:exit_layer])
        config.n_layer = exit_layer
        body.config = config
        view.transformer = body
    view.config = config
    return view


class EarlyExitDrafter(DraftModelDrafter):
    """A DraftModelDrafter over the target's early-exit view: its own KV cache of the first layers."""

    def __init__(self, target, exit_layer: int, target_vocab_size: int, sampling, generator=None, schedule=None):
        super().__init__(early_exit_view(target, exit_layer), target_vocab_size, sampling, generator, schedule)
