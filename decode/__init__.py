"""Decoding algorithms: pure functions over tensors plus one drafter interface.

The names below load on first use (PEP 562), so that `decode.methods`' registry, which eval reads to know what
a method is, imports without torch: `python -m eval` rebuilds a report without loading the engine.
"""
from importlib import import_module

_WHERE = {
    "Drafter": "decode.drafters", "DraftModelDrafter": "decode.drafters", "Proposal": "decode.drafters",
    "Clock": "decode.generate", "RowRecord": "decode.generate", "choose_next": "decode.generate",
    "generate_baseline": "decode.generate", "generate_speculative": "decode.generate", "prefill": "decode.generate",
    "Generation": "decode.settings", "Sampling": "decode.settings",
    "VocabMismatch": "decode.vocab", "check_vocab_compatible": "decode.vocab",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'decode' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
