"""Self-speculation (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2024; transformers'
assistant_early_exit): the target's first exit_layer decoder layers, its final norm and its LM head draft.

No second model and no copy of a weight: the draft is a view of the target, a shallow copy of the causal LM
and of its decoder body whose layer list holds the first exit_layer layers (the same module objects), with a
config copy that says exit_layer layers. It drafts through DraftModelDrafter with a KV cache of its own (the
target's cache is not shared: its first layers' slots would serve, but it is rolled back at other times).
"""
from __future__ import annotations

import copy
import functools
import types
import weakref

from torch import nn

from decode.drafters.draft_model import DraftModelDrafter
from decode.static_kv import attach

# (body attribute, layer-list attribute) of the supported layouts; the final norm and the LM head sit beside
# the layer list (model.norm + lm_head; transformer.ln_f + lm_head) and are shared as they are
LAYOUTS = (("model", "layers"),  # Llama, Mistral, Qwen2/3, Gemma, Phi-3, ...
           ("transformer", "h"))  # GPT-2, GPT-J, Falcon, Bloom, ...


def _layout(model) -> tuple[str, str]:
    for body_name, layers_name in LAYOUTS:
        body = getattr(model, body_name, None)
        if isinstance(getattr(body, layers_name, None), nn.ModuleList):
            return body_name, layers_name
    known = " or ".join(f"{body}.{layers}" for body, layers in LAYOUTS)
    raise ValueError(f"early_exit: {type(model).__name__} has no {known} list of decoder layers; "
                     "this architecture is not supported for early exit")


def num_layers(model) -> int:
    """The target's number of decoder layers; ValueError for an unsupported layout."""
    body_name, layers_name = _layout(model)
    return len(getattr(getattr(model, body_name), layers_name))


def _rebind_forward(view: nn.Module, module: nn.Module) -> None:
    """A hook that replaced an instance's forward (accelerate's device-map hooks: forward = partial(new_forward,
    module), _old_forward = module's own bound forward) would run the original module, every layer of it.
    Bind both to the view."""
    if "forward" not in module.__dict__:
        return
    forward = module.__dict__["forward"]
    old_forward = module.__dict__.get("_old_forward")
    if not (isinstance(forward, functools.partial) and forward.args[:1] == (module,)) or not (
            isinstance(old_forward, types.MethodType) and old_forward.__self__ is module):
        raise ValueError(f"early_exit: the forward of {type(module).__name__} was replaced by something other than "
                         "accelerate's hook; the early-exit view cannot be built from it")
    view._old_forward = types.MethodType(old_forward.__func__, view)
    rebound = functools.partial(forward.func, view, *forward.args[1:], **forward.keywords)
    view.forward = functools.update_wrapper(rebound, view._old_forward)


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of the module object whose submodule table can be changed without touching the original; every
    submodule, parameter and buffer stays the same object."""
    view = copy.copy(module)
    view._modules = dict(module._modules)
    view._parameters = dict(module._parameters)
    view._buffers = dict(module._buffers)
    _rebind_forward(view, module)
    return view


def early_exit_view(model, exit_layer: int):
    """The target truncated to its first exit_layer layers (then its final norm and LM head), sharing every weight.

    ValueError when exit_layer is not in 1..layers-1 (0 layers is no model, all of them is the target itself)
    or the layout is not supported.
    """
    total = num_layers(model)
    if not 1 <= exit_layer < total:
        raise ValueError(f"early_exit: exit_layer {exit_layer} must be between 1 and {total - 1} "
                         f"(the target has {total} layers)")
    body_name, layers_name = _layout(model)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = exit_layer  # GPT-2's n_layer through its attribute_map
    if getattr(config, "layer_types", None) is not None:  # per-layer attention kinds (sliding or full)
        config.layer_types = list(config.layer_types)[:exit_layer]
    body = _shallow(getattr(model, body_name))
    setattr(body, layers_name, nn.ModuleList(list(getattr(body, layers_name))[:exit_layer]))
    body.config = config  # Llama-style bodies run self.layers[: config.num_hidden_layers]
    view = _shallow(model)
    setattr(view, body_name, body)
    view.config = config
    compiled = view.__dict__.pop("_speculate_compiled", None)  # the target's compiled step is not the view's
    if compiled is not None:
        attach(view, compiled.for_view(view))
    return view


_VIEWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class EarlyExitDrafter(DraftModelDrafter):
    """A DraftModelDrafter over the target's early-exit view: its own KV cache of the first exit_layer layers."""

    def __init__(self, target, exit_layer: int, target_vocab_size: int, sampling, generator=None, schedule=None):
        views = _VIEWS.setdefault(target, {})  # one view per target and depth: a compiled view compiles once
        if exit_layer not in views:
            views[exit_layer] = early_exit_view(target, exit_layer)
        super().__init__(views[exit_layer], target_vocab_size, sampling, generator, schedule)
        self.exit_layer = exit_layer
