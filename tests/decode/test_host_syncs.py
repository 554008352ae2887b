"""Host syncs per speculative round, counted as ops on a CPU (where nothing waits, but every op that would
make the host wait for a GPU is still called).

Counted as a sync ("read"): an op whose result the host needs (aten._local_scalar_dense: item, int, float;
aten.is_nonzero: bool; ops with a data-dependent shape: nonzero, masked_select, unique) and a copy to the host
(tolist, cpu), except of tensors the host itself made from Python data. Counted as a "pageable copy": a
host-to-device copy that blocks on a GPU (torch.tensor(data, device=...), or a blocking .to(device) in our code).
Clock reads are counted apart: each synchronises the CUDA devices, the price of splitting time into draft and
target.

Budget per round (sdpa or eager attention, a model without sliding windows): one read, the verification result
(each row's accepted length, next token and drafts), from which the engine, the caches (hole counts) and the
drafters take every host fact they need; no pageable copy; three clock reads.
"""
import traceback
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from decode import Clock, DraftModelDrafter, Generation, Sampling, generate_speculative
from decode.drafters.prompt_lookup import PromptLookupDrafter
from tiny_models import VOCAB, ragged_batch, tiny_model

READ_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
            torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default, torch.ops.aten._unique2.default,
            torch.ops.aten.unique_consecutive.default, torch.ops.aten.unique_dim.default}
COPIES_TO_HOST = {torch.Tensor.tolist, torch.Tensor.cpu}  # numpy() needs a host tensor: .cpu() came first
FROM_DATA = {torch.tensor, torch.as_tensor, torch.from_numpy}


def _caller() -> str:
    """file:line of the innermost frame outside torch and this file."""
    for frame in reversed(traceback.extract_stack()):
        if "/torch/" not in frame.filename and not frame.filename.endswith("test_host_syncs.py"):
            return f"{'/'.join(frame.filename.split('/')[-2:])}:{frame.lineno} {frame.name}"
    return "?"


class _Reads(TorchDispatchMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READ_OPS:
            self.log.append(("read", func.__name__, _caller()))
        return func(*args, **(kwargs or {}))


class _Copies(TorchFunctionMode):
    def __init__(self, log):
        super().__init__()
        self.log = log
        self.host_made = {}  # id -> weakref of tensors made on the host: reading them costs nothing

    def _host_made(self, tensor) -> bool:
        ref = self.host_made.get(id(tensor))
        return ref is not None and ref() is tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in COPIES_TO_HOST and not self._host_made(args[0]):
            self.log.append(("read", func.__name__, _caller()))
        if func is torch.Tensor.to:
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            # transformers moves tensors to the device they are on (the embedding's, a layer's): no copy there
            if device is not None and not non_blocking and (where := _caller()).startswith("decode/"):
                self.log.append(("pageable copy", "to", where))
        out = func(*args, **kwargs)
        if func in FROM_DATA:
            if kwargs.get("device") is not None and out.numel():  # an empty one copies nothing
                self.log.append(("pageable copy", func.__name__, _caller()))
            elif kwargs.get("device") is None and "host_to_device" not in _caller():
                self.host_made[id(out)] = weakref.ref(out)
        return out


class CountingClock(Clock):
    """Marks the sync log at each clock read: start, prefill, draft prefill, then per round its start, the end
    of drafting and the end of verification."""

    def __init__(self, log):
        super().__init__("cpu")
        self.log, self.marks = log, []

    def now(self):
        self.marks.append(len(self.log))
        return super().now()


def count_syncs(drafter_kind, lengths, sampling, gamma=3, max_new_tokens=12, synthetic_acceptance=None):
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch(lengths, seed=0)
    generator = torch.Generator().manual_seed(0)
    if drafter_kind == "draft_model":
        drafter = DraftModelDrafter(tiny_model("llama", seed=2, layers=1), VOCAB, sampling, generator)
    else:
        drafter = PromptLookupDrafter()
    generation = Generation(max_new_tokens=max_new_tokens, sampling=sampling)
    log = []
    clock = CountingClock(log)
    with torch.inference_mode(), _Copies(log), _Reads(log):
        records = generate_speculative(target, drafter, ids, mask, generation, gamma, generator, clock,
                                       synthetic_acceptance=synthetic_acceptance)
    marks = clock.marks + [len(log)]
    rounds = [log[marks[i]: marks[i + 3]] for i in range(3, len(clock.marks), 3)]  # round start .. next start
    return records, log[: marks[3]], rounds, len(clock.marks)


@pytest.mark.parametrize("drafter_kind", ["draft_model", "prompt_lookup"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 1.0)], ids=["greedy", "sampling"])
@pytest.mark.parametrize("lengths", [[7], [5, 11, 2]], ids=["batch1", "ragged3"])
def test_one_host_sync_per_round(drafter_kind, sampling, lengths):
    records, setup, rounds, clock_reads = count_syncs(drafter_kind, lengths, sampling)
    assert len(rounds) == max(len(r.rounds) for r in records) >= 4
    for index, events in enumerate(rounds):
        reads = [e for e in events if e[0] == "read"]
        copies = [e for e in events if e[0] == "pageable copy"]
        assert len(reads) == 1 and reads[0][2].startswith("decode/generate.py"), f"round {index}: {reads}"
        assert copies == [], f"round {index}: {copies}"
    assert clock_reads == 3 + 3 * len(rounds)  # start, prefill, draft prefill, then three a round
    # per batch: the prompt mask to the host for each model's cache, prefill's finite check, the first tokens,
    # and prompt lookup's copy of the prompts (ids and mask) for its n-gram index
    expected_setup = 4 if drafter_kind == "draft_model" else 5
    assert len([e for e in setup if e[0] == "read"]) == expected_setup, setup
    assert [e for e in setup if e[0] == "pageable copy"] == []


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 1.0)], ids=["greedy", "sampling"])
def test_synthetic_acceptance_adds_no_host_sync(sampling):
    records, _, rounds, _ = count_syncs("draft_model", [5, 11, 2], sampling, synthetic_acceptance=0.7)
    assert len(rounds) == max(len(r.rounds) for r in records) >= 4
    for index, events in enumerate(rounds):
        reads = [e for e in events if e[0] == "read"]
        assert len(reads) == 1 and reads[0][2].startswith("decode/generate.py"), f"round {index}: {reads}"
        assert [e for e in events if e[0] == "pageable copy"] == [], f"round {index}"
