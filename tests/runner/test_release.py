"""Releasing our engine's models (vLLM runs next): they leave memory, and on CUDA the allocator's cache goes back."""
import gc
import weakref
from types import SimpleNamespace

import torch

from runner.session import Session, quiet_heap
from tiny_models import tiny_model


def test_release_drops_the_models_and_empties_the_device_cache(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the CUDA path, on a CPU: its calls recorded
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("dynamo reset"))
    for compiled in (False, True):
        calls.clear()
        session = Session(SimpleNamespace(engine=SimpleNamespace(compile=compiled)), torch.device("cpu"))
        target, draft = tiny_model("llama", seed=1, layers=1), tiny_model("llama", seed=2, layers=1)
        alive = [weakref.ref(target), weakref.ref(draft)]
        session.target, session.drafts = SimpleNamespace(model=target), {"d": SimpleNamespace(model=draft)}
        session.context = SimpleNamespace(target=target, drafts={"d": draft})
        cycle = [target]  # a reference cycle holds the target: only the collector frees it
        cycle.append(cycle)
        del target, draft
        quiet_heap()  # as before timed batches: the cycle, alive, is frozen
        del cycle  # garbage now, frozen: out of the collector's view until unfrozen
        gc.collect()
        assert gc.get_freeze_count() > 0 and alive[0]() is not None
        session.release_models()  # unfreezes, then collects
        assert gc.get_freeze_count() == 0
        assert session.released and all(ref() is None for ref in alive)
        # the cache is emptied after the models' last references went (gc), so their blocks are free to return
        assert calls == (["dynamo reset"] if compiled else []) + ["synchronize", "empty_cache"]


def test_what_one_quiet_heap_froze_is_freed_by_the_next_once_garbage():
    """Frozen objects are out of the collector's view while batches are timed; a frozen cycle that became garbage
    (a warmup's drafter, say) is freed when the next comparison collects, not kept for the rest of the run."""

    class Box:
        pass

    box = Box()
    box.me = box
    alive = weakref.ref(box)
    try:
        quiet_heap()
        del box
        gc.collect()
        assert alive() is not None  # frozen: a collection does not see it
        quiet_heap()
        assert alive() is None
    finally:
        gc.unfreeze()
