"""The target's hidden states for a drafter that reads them (decode/head_models.py: EAGLE-3, Medusa).

A drafter declares `target_layers`: indices in transformers' hidden_states numbering, 0 .. L for a target of L decoder
layers, i < L the input of decoder layer i (0: the embeddings; what EAGLE-3's implementations call aux hidden state i), L the
final norm's output (what the LM head reads). While the engine's loop runs, forward hooks copy those tensors out of
every target forward; `pop` hands over the last forward's, concatenated in the order declared: [B, S, len x H].
No second forward and no change to the model: the hooks are removed when the loop ends. A compiled target
(engine.compile) returns them from its step's graph instead (CompiledTap, the same `pop`).
"""
from __future__ import annotations

import torch

from decode.kv import to_device


def _body(model):
    """(the decoder layers, the final norm) of a causal LM: model.model.layers and .norm (Llama, Qwen, Mistral, ...)
    or transformer.h and .ln_f (GPT-2 and kin)."""
    for body_name, layers_name, norm_name in (("model", "layers", "norm"), ("transformer", "h", "ln_f")):
        body = getattr(model, body_name, None)
        layers = getattr(body, layers_name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return layers, getattr(body, norm_name, None)
    raise ValueError(f"{type(model).__name__} has no model.layers or transformer.h list of decoder layers: a head "
                     "cannot read its hidden states")


class HiddenTap:
    """Hooks on the target that keep its hidden states at `layers` from each forward (a context manager)."""

    def __init__(self, model, layers: tuple[int, ...], device: torch.device | None = None):
        decoder_layers, norm = _body(model)
        self.layers, self.device = tuple(layers), device
        self._seen: dict[int, torch.Tensor] = {}
        self._handles = []
        for index in dict.fromkeys(self.layers):
            if 0 <= index < len(decoder_layers):
                hook = decoder_layers[index].register_forward_pre_hook(self._input_of(index), with_kwargs=True)
            elif index == len(decoder_layers) and norm is not None:
                hook = norm.register_forward_hook(self._output_of(index))
            else:
                self.close()
                raise ValueError(f"hidden state {index} does not exist: the target has {len(decoder_layers)} layers "
                                 f"(0 .. {len(decoder_layers)})")
            self._handles.append(hook)

    def _input_of(self, index: int):
        def hook(module, args, kwargs):
            self._seen[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    def _output_of(self, index: int):
        def hook(module, args, output):
            self._seen[index] = output[0] if isinstance(output, tuple) else output
        return hook

    def pop(self) -> torch.Tensor:
        """The last target forward's hidden states [B, S, len(layers) x H], on `device` (the engine's)."""
        if any(index not in self._seen for index in self.layers):
            raise RuntimeError("the target ran no forward since the last pop (or its layers were skipped)")
        seen = [self._seen[index] for index in self.layers]
        self._seen = {}
        out = seen[0] if len(seen) == 1 else torch.cat([to_device(t, seen[0].device) for t in seen], dim=-1)
        return to_device(out, self.device) if self.device is not None else out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._seen = [], {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CompiledTap:
    """HiddenTap's `pop` for a compiled target (decode/static_kv.py CompiledModel): while it is open the target's steps
    return the states at its `head_layers` beside the logits; this hands over the drafter's layers of the last step's.
    Closed, the steps return the logits alone."""

    def __init__(self, compiled, layers: tuple[int, ...], device: torch.device | None = None):
        missing = [index for index in layers if index not in compiled.head_layers]
        if missing:
            raise ValueError(f"the compiled target returns hidden states {list(compiled.head_layers)}, not "
                             f"{missing}: compile it with head_layers covering the head's layers")
        self.compiled, self.device = compiled, device
        self.width = compiled.hidden_size
        self.order = [compiled.head_layers.index(index) for index in layers]
        compiled.hidden_layers, compiled.hidden_out = compiled.head_layers, None

    def pop(self) -> torch.Tensor:
        hidden, self.compiled.hidden_out = self.compiled.hidden_out, None
        if hidden is None:
            raise RuntimeError("the compiled target ran no step since the last pop")
        if self.order != list(range(len(self.compiled.head_layers))):
            hidden = torch.cat([hidden[..., k * self.width:(k + 1) * self.width] for k in self.order], dim=-1)
        return to_device(hidden, self.device) if self.device is not None else hidden

    def close(self) -> None:
        self.compiled.hidden_layers, self.compiled.hidden_out = (), None
