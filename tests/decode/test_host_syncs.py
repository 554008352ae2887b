"""Host syncs per speculative round and per admission, counted as ops on a CPU (where nothing waits, but every op
that would make the host wait for a GPU is still called), and the device synchronizes of the round's timing, counted
with a fake CUDA device (torch.cuda.synchronize and CUDA events replaced by counting fakes).

Counted as a sync ("read"): an op whose result the host needs (aten._local_scalar_dense: item, int, float;
aten.is_nonzero: bool; ops with a data-dependent shape: nonzero, masked_select, unique) and a copy to the host
(tolist, cpu), except of tensors the host itself made from Python data. Counted as a "pageable copy": a
host-to-device copy that blocks on a GPU (torch.tensor(data, device=...), or a blocking .to(device) in our code).

Budget (sdpa or eager attention): a round, one read (the verification result: each row's accepted length, next token
and drafts, from which the engine, the caches and the drafters take every host fact they need), no pageable copy and
no synchronize (its draft and verification seconds come from marks in the stream, read after a later read); an
admission, one read (its first tokens with the prefill's finite check); static and served; every drafter and
schedule, a dynamic tree (ranked on the device) and hybrid with a confidence threshold (its draft's lengths kept on the
device) included.
"""
import traceback
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.fake_cuda import fake_cuda
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
    """Marks the sync log at each synchronizing clock read (benchmarks/round_ab.py counts with it)."""

    def __init__(self, log):
        super().__init__("cpu")
        self.log, self.marks = log, []

    def now(self):
        self.marks.append(len(self.log))
        return super().now()


def fake_cuda_clock(monkeypatch, log) -> Clock:
    """A clock that believes it times one CUDA device: its synchronizes are logged, its marks are fake events."""
    clock = Clock("cpu")
    fake_cuda(clock, lambda device=None: log.append(("synchronize", "", _caller())), monkeypatch.setattr)
    return clock


def drafter_of(kind: str, target, sampling, generator):
    """Every drafter and schedule the engine runs, by name."""
    from decode.drafters.draft_tree import DynamicTree, StaticTree
    from decode.drafters.head_drafters import Eagle3Drafter, MedusaDrafter
    from decode.drafters.hybrid import HybridDrafter
    from decode.drafters.schedules import make_schedule
    from decode.drafters.suffix import SuffixDrafter
    from decode.head_models import MedusaHeads
    from decode.tree_layout import static_parents
    from test_heads import eagle3_head

    def draft(schedule=None, tree=None):
        return DraftModelDrafter(tiny_model("llama", seed=2, layers=1), VOCAB, sampling, generator, schedule=schedule,
                                 tree=tree)
    costs = (0.2, {1: 1.0, 2: 1.05, 3: 1.1})
    return {
        "draft_model": lambda: draft(),
        "heuristic": lambda: draft(make_schedule("heuristic", 3)),
        "confidence": lambda: draft(make_schedule("confidence", 3)),
        "cost_model": lambda: draft(make_schedule("cost_model", 3, c=costs[0], v=costs[1])),
        "static_tree": lambda: draft(tree=StaticTree(static_parents([2, 2]), sampling)),
        "dynamic_tree": lambda: draft(tree=DynamicTree(budget=6, top_k=2, sampling=sampling)),
        "eagle3": lambda: Eagle3Drafter(eagle3_head(target, layers=(0, 1, 2)), VOCAB, sampling, generator),
        "medusa": lambda: MedusaDrafter(MedusaHeads(64, VOCAB, 2, 1, 2).eval(), VOCAB, sampling, generator),
        "prompt_lookup": lambda: PromptLookupDrafter(),
        "suffix": lambda: SuffixDrafter(None, min_prob=0.0, depth=8),
        "hybrid": lambda: HybridDrafter(draft(), VOCAB, 3, *costs),
        # a cheap draft plans long branches, merged with a free source's into trees where one matches, and a threshold
        # of 1 ends each after its first token: shorter than planned, known on the device only
        "hybrid_confidence": lambda: HybridDrafter(draft(), VOCAB, 3, 0.02, {k: 1.0 for k in range(1, 4)},
                                                   confidence=1.0),
    }[kind]()


def count_syncs(monkeypatch, drafter_kind, lengths, sampling, gamma=3, max_new_tokens=12, synthetic_acceptance=None,
                load=None, target=None, repeat=False):
    """Runs the engine with every sync logged; returns (records, the log before the first round, each round's log,
    each admission's log: a prefill forward's or a join's, each round's wall by the host's clock)."""
    import decode.generate as engine

    target = target if target is not None else tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch(lengths, seed=0)
    for row, half in enumerate(length // 2 if repeat else 0 for length in lengths):
        if half:  # the prompt's second half repeats its first: prompt lookup and suffix match, hybrid merges trees
            ids[row, -half:] = ids[row, -2 * half:-half].clone()
    generator = torch.Generator().manual_seed(0)
    drafter = drafter_of(drafter_kind, target, sampling, generator)
    generation = Generation(max_new_tokens=max_new_tokens, sampling=sampling)
    log, walls = [], []
    # an admission's spans: each prefill forward (with its read of the first tokens), then each join of its rows
    spans = {"round": engine._speculative_round, "admit": engine._Loop._prefill, "join": engine._Loop._join}

    def marked(kind, function):
        def run(*args, **kwargs):
            log.append(("begin", kind))
            try:
                return function(*args, **kwargs)
            finally:
                log.append(("end", kind))
        return run
    monkeypatch.setattr(engine, "_speculative_round", marked("round", spans["round"]))
    monkeypatch.setattr(engine._Loop, "_prefill", marked("admit", spans["admit"]))
    monkeypatch.setattr(engine._Loop, "_join", marked("join", spans["join"]))
    verified = engine._RoundRecorder.verified
    monkeypatch.setattr(engine._RoundRecorder, "verified",
                        lambda self: walls.append(verified(self) - self.started) or self.verified_at)
    clock = fake_cuda_clock(monkeypatch, log)
    with torch.inference_mode(), _Copies(log), _Reads(log):
        records = generate_speculative(target, drafter, ids, mask, generation, gamma, generator, clock,
                                       synthetic_acceptance=synthetic_acceptance, load=load)
    # split the log by the begin/end markers
    rounds, admissions, current, setup, first = [], [], None, [], True
    for event in log:
        if event[0] == "begin":
            current = [] if event[1] == "round" else [("span", event[1])]  # an admission's: "admit" or "join"
            (rounds if event[1] == "round" else admissions).append(current)
            first = first and event[1] != "round"
        elif event[0] == "end":
            current = None
        elif current is not None:
            current.append(event)
        elif first:
            setup.append(event)
    return records, setup, rounds, admissions, walls


DRAFTERS = ["draft_model", "heuristic", "confidence", "cost_model", "static_tree", "dynamic_tree", "eagle3", "medusa",
            "prompt_lookup", "suffix", "hybrid", "hybrid_confidence"]


def _assert_budget(records, rounds, admissions):
    assert len(rounds) >= 4
    for index, events in enumerate(rounds):
        reads = [e for e in events if e[0] == "read"]
        assert len(reads) == 1 and reads[0][2].startswith("decode/generate.py"), f"round {index}: {reads}"
        assert [e for e in events if e[0] in ("pageable copy", "synchronize")] == [], f"round {index}: {events}"
    for index, events in enumerate(admissions):  # a prefill forward reads its first tokens; a join reads nothing
        allowed = 1 if events[0] == ("span", "admit") else 0
        assert len([e for e in events if e[0] == "read"]) <= allowed, f"admission {index}: {events}"
        assert [e for e in events if e[0] in ("pageable copy", "synchronize")] == [], f"admission {index}: {events}"


@pytest.mark.parametrize("drafter_kind", DRAFTERS)
@pytest.mark.parametrize("served", [False, True], ids=["static", "served"])
def test_one_read_and_no_synchronize_a_round_for_every_drafter(monkeypatch, drafter_kind, served):
    from decode.arrivals import Load

    load = Load([0.0, 0.0, 0.01], 2) if served else None
    records, _, rounds, admissions, _ = count_syncs(monkeypatch, drafter_kind, [6, 13, 4], Sampling(), load=load,
                                                    max_new_tokens=16, repeat=True)
    _assert_budget(records, rounds, admissions)
    # served: prompts 6 and 13 at 0 (26 wide for 19 tokens: 27% padding) in two forwards and one join, 4 at 0.01 in
    # a third and its join
    assert len(admissions) == (5 if served else 2)
    if drafter_kind in ("dynamic_tree", "hybrid_confidence"):  # the test bites: trees were verified
        assert any("parents" in r for record in records for r in record.rounds)


@pytest.mark.parametrize("drafter_kind", ["draft_model", "prompt_lookup"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 1.0)], ids=["greedy", "sampling"])
@pytest.mark.parametrize("lengths", [[7], [5, 11, 2]], ids=["batch1", "ragged3"])
def test_one_host_sync_per_round(monkeypatch, drafter_kind, sampling, lengths):
    records, setup, rounds, admissions, _ = count_syncs(monkeypatch, drafter_kind, lengths, sampling)
    assert len(rounds) == max(len(r.rounds) for r in records)
    _assert_budget(records, rounds, admissions)
    # before the first round: the prompts to the host once (ids and mask) before the clock starts, which synchronizes
    assert [e[0] for e in setup if e[0] != "pageable copy"] == ["read", "read", "synchronize"], setup


def test_a_windowed_model_reads_once_a_round(monkeypatch):
    """Sliding-window layers keep the cache hole-free; their masks are built on the device (decode/kv.py)."""
    from decode.arrivals import Load
    from test_sliding_window import tiny_windowed

    for load in (None, Load([0.0, 0.0, 0.01], 2)):
        records, _, rounds, admissions, _ = count_syncs(monkeypatch, "draft_model", [5, 11, 2], Sampling(), load=load,
                                                        target=tiny_windowed("mistral", 4, 1))
        _assert_budget(records, rounds, admissions)


def test_a_rounds_parts_add_up_to_its_wall(monkeypatch):
    """Each round's draft and verification seconds (marks in the stream, settled after a later read) add up to its
    wall on the host's clock, within 2 ms a round; the prefill and the draft's prefill are counted apart."""
    records, _, rounds, _, walls = count_syncs(monkeypatch, "draft_model", [7], Sampling(), max_new_tokens=16)
    record = records[0]
    assert len(walls) == len(rounds) == len(record.rounds) >= 4
    parts = (record.draft_s - record.draft_prefill_s) + (record.target_s - record.prefill_s)
    assert record.draft_prefill_s > 0 and record.draft_s > record.draft_prefill_s
    assert abs(parts - sum(walls)) <= 0.002 * len(walls), (parts, sum(walls))


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 1.0)], ids=["greedy", "sampling"])
def test_synthetic_acceptance_adds_no_host_sync(monkeypatch, sampling):
    records, _, rounds, admissions, _ = count_syncs(monkeypatch, "draft_model", [5, 11, 2], sampling,
                                                    synthetic_acceptance=0.7)
    _assert_budget(records, rounds, admissions)
