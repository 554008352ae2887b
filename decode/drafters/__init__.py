"""The drafters behind decode/drafters/base.py's interface. The names load on first use (PEP 562), as decode's do, so
that the draft-length schedules' names (schedules.py SCHEDULES), which the method registry reads, import without
torch."""
from importlib import import_module

_WHERE = {"Drafter": "decode.drafters.base", "Proposal": "decode.drafters.base",
          "DraftModelDrafter": "decode.drafters.draft_model", "EarlyExitDrafter": "decode.drafters.early_exit",
          "PromptLookupDrafter": "decode.drafters.prompt_lookup"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'decode.drafters' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
