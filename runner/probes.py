"""Measurements of the machine rather than of a method: the environment, the cost ratios c and v of
Leviathan's model, the drift probe, and the numerics probe of each model."""
from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from decode.drafters.base import Proposal
from decode.drafters.draft_model import DraftModelDrafter
from decode.drafters.head_drafters import head_drafter, is_head
from decode.generate import Clock, baseline_step, prefill, round_layout
from decode.kv import KVState
from decode.names import TARGET, draft_model, label_of
from decode.settings import Sampling
from decode.static_kv import new_state
from decode.tree_layout import AUTO, tree_nodes
from eval.records import CostProbe


# Node counts whose verification the probes time for an auto tree (its shape, so its size, varies round to round):
# the tree prediction interpolates v between them
AUTO_TREE_NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)

# This OS process, as the records name it: a resumed run or a restarted Ray worker is another process, and the
# report says which pairs of batches two processes measured (not back to back)
PROCESS = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns() // 1_000_000 % 10 ** 10}"


def environment(device: torch.device) -> dict:
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": version("transformers"),
        "bitsandbytes": version("bitsandbytes"), "flash_attn": version("flash-attn"), "datasets": version("datasets"),
        "ray": version("ray"), "device": str(device), "device_name": device_name(device), "cuda": torch.version.cuda,
        "git_commit": commit,
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # the CPU model: a run on an EPYC and one on a Xeon are different machines
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _prefilled(model, ids, mask) -> KVState | None:
    """The model's cache of the prompts ids, mask [B, P]; a head (decode/head_models.py) reads them as its drafter does,
    with zeros for the target's hidden states (the cost is the same): its cache, None for one without (Medusa)."""
    if is_head(model):
        return _head_drafter(model, model.config.vocab_size, Sampling(False), ids, mask).state
    state = new_state(model)  # engine.compile: the compiled step's static state, whose cost is the one to measure
    state.forward(model, ids, mask, last_only=True)
    return state


# At most this many caches are probed for one comparison (each costs a full set of the steps' repetitions)
MAX_CONTEXT_BINS = 4


def context_bins(prompt_lengths: list[int], tokens: int) -> list[int]:
    """The caches to time the steps at for prompts of these lengths, decoding `tokens` tokens on average past them
    (max_new_tokens // 2): each length bin's median prompt (the lower middle) plus `tokens`. A bin spans a factor
    of 2 in length (a cache twice as long costs visibly more attention), widened by a factor of 2 at a time until at
    most MAX_CONTEXT_BINS remain: one bin where the prompts are alike. First the bin that holds the median prompt
    (where the prefills and the busy time are timed too), then the others, ascending."""
    lengths = sorted(length for length in prompt_lengths if length > 0)
    if not lengths:
        return []
    factor = 2
    while True:
        bins, start = [], 0
        for index in range(1, len(lengths) + 1):
            if index == len(lengths) or lengths[index] >= factor * lengths[start]:
                bins.append(lengths[start:index])
                start = index
        if len(bins) <= MAX_CONTEXT_BINS:
            break
        factor *= 2
    middle = statistics.median_low(lengths)
    first = next(b for b in bins if b[0] <= middle <= b[-1])
    return [statistics.median_low(first) + tokens] + [statistics.median_low(b) + tokens for b in bins if b is not first]


def at_cache(ids: torch.Tensor, mask: torch.Tensor, cache: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt batch ids, mask [B, P] as a cache of `cache` tokens [B, cache]: its last `cache` columns where
    shorter (a row shorter than that keeps its padding), else followed by tokens (decoding_context)."""
    width = ids.shape[1]
    if cache <= width:
        return ids[:, width - cache:].contiguous(), mask[:, width - cache:].contiguous()
    return decoding_context(ids, mask, cache - width)


def decoding_context(ids: torch.Tensor, mask: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt batch ids, mask [B, P] followed by `tokens` more (its last token repeated) [B, P + tokens]: the cache a
    decoding step sees halfway through max_new_tokens = 2 x tokens, where the probes time it."""
    if tokens <= 0:
        return ids, mask
    return (torch.cat([ids, ids[:, -1:].expand(-1, tokens)], dim=1),
            torch.cat([mask, torch.ones_like(mask[:, :1]).expand(-1, tokens)], dim=1))


def _head_drafter(head, vocab: int, sampling: Sampling, ids, mask):
    """A head's drafter with the rows of ids, mask [B, P] started, the target's hidden states zeros."""
    drafter = head_drafter(head, vocab, sampling)
    drafter.take_features(torch.zeros(*ids.shape, head.feature_width, device=ids.device, dtype=head.dtype))
    drafter.start(ids, mask)
    return drafter


def _restore(state: KVState | None, width: int, batch: int, device) -> None:
    """Back to the cache as it was before `width` slots were appended (None: a drafter without a cache)."""
    if state is None:
        return
    state.keep_prefix_of_last(width, torch.zeros(batch, dtype=torch.long, device=device), 0, [0] * batch)


def _timed_target_step(state: KVState, model, token: torch.Tensor, clock, sampling: Sampling) -> float:
    """One baseline decode step as generate_baseline runs it (decode/generate.py baseline_step: the forward of token
    [B], the next token, greedy also the top-2 gap; then the host read of the tokens), then back to the cache: the unit
    of c and v, since the baseline spends one per token."""
    start = clock.now()
    chosen, _ = baseline_step(state, model, token, sampling, None, not sampling.do_sample)
    chosen.tolist()
    elapsed = clock.now() - start
    _restore(state, 1, token.shape[0], token.device)
    return elapsed


def _timed_draft_step(drafter: DraftModelDrafter, token: torch.Tensor, clock, steps: int = 1) -> float:
    """A draft step as a round runs it: DraftModelDrafter.propose of `steps` tokens (each the forward of the last
    token, the draft's logits on the target's vocabulary, its choice), timed as one and divided by `steps`, then back
    to the cache. A round chains its draft steps with no host read between them, so on a GPU the host launches a
    step while the one before it runs; a step timed alone, waited for, pays both (an H100, compiled: 1.45x)."""
    start = clock.now()
    drafter.propose(token, steps)
    elapsed = clock.now() - start
    _restore(drafter.state, steps, token.shape[0], token.device)
    return elapsed / steps


def _timed_draft_catch_up(drafter: DraftModelDrafter, token: torch.Tensor, clock) -> float:
    """The first forward of a round after a full accept, as the round runs it: the last draft, never fed (waiting in
    the drafter's pending tokens), and the last token in one 2-token forward (DraftModelDrafter.propose, its host
    read of the last tokens and the masked forward included), timed alone, then back to the cache."""
    vocab = drafter.input_vocab_size
    drafter.pending = [[min(int(t), vocab - 1)] for t in token.tolist()]
    start = clock.now()
    drafter.propose(token, 1)
    elapsed = clock.now() - start
    _restore(drafter.state, 2, token.shape[0], token.device)
    return elapsed


def _timed_verification(state: KVState, model, token: torch.Tensor, gamma: int, clock, sampling: Sampling) -> float:
    """One chain verification as generate_speculative runs it: the target forward of [last token, gamma drafts], the
    acceptance, the round's host read and the cache's rollback (here to the cache before the round)."""
    batch = token.shape[0]
    proposal = Proposal(token[:, None].expand(-1, gamma).contiguous(), None)
    limit = torch.full_like(token, gamma)
    start = clock.now()
    layout = round_layout(proposal)
    logits = layout.verify(state, model, token)
    accepted_len, chosen, path = layout.accept(logits, limit, sampling, None)
    layout.read(layout.readout(accepted_len, chosen, limit, path).tolist())
    _restore(state, gamma + 1, batch, token.device)
    return clock.now() - start


def _timed_forward(state: KVState, model, tokens: torch.Tensor, clock) -> float:
    """One forward of tokens [B, W] on top of the prompt's cache, then back to the prompt's cache."""
    width = tokens.shape[1]
    start = clock.now()
    state.forward(model, tokens)
    elapsed = clock.now() - start
    state.keep_prefix_of_last(width, torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device), 0)
    return elapsed


def _busy_forward_s(state: KVState, model, tokens: torch.Tensor, clock, forwards: int) -> float | None:
    """CUDA: the seconds the GPU spent executing a forward of tokens [B, 1] (kernels, copies, memsets: the union of
    their intervals, from the profiler's device activity), over `forwards` forwards one after another (the cache grows
    a token each, as in decoding), then back to the prompt's cache; None when the profiler saw no device activity, or
    another profiler runs (one per process). One profiler session for them all: kineto prints two lines per session.

    Not CUDA events around the forward: the stream reaches the start event at once and the end event after the last
    kernel, so their span holds every gap in which the GPU waited for Python to launch the next kernel, and equals
    the wall time whether the GPU worked through it or idled. The profiler's host overhead slows the launches, not
    the kernels, so the busy time holds though the wall time under it does not (the wall time is the timed
    repetitions').

    CUPTI is torn down when the profiler stops (TEARDOWN_CUPTI=1, unless set otherwise: torch sets 0 where CUDA graphs
    and CUDA < 12.6 crash on a teardown). Later kernel launches still pay: on an H100 (torch 2.11, CUDA 13.0) an
    eager 1-token forward of a 1B shape took x1.14 after one session without it and x1.17 with it set before torch
    loaded, x1.04 and x1.40 in two runs of benchmarks/gpu_check.py's cupti row; measure_costs runs this probe before
    its timed steps for that reason."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("TEARDOWN_CUPTI", "1")  # read by kineto when the trace stops
    clock.now()  # synchronises every device the models use: no earlier kernel runs inside the window
    traced = profile(activities=[ProfilerActivity.CUDA])
    try:
        traced.start()
    except RuntimeError:  # a profiler already runs in this process (a user's): no busy time, the probe goes on
        return None
    try:
        for _ in range(forwards):
            state.forward(model, tokens)
        clock.now()  # every kernel of the forwards ran inside the window
    finally:
        traced.stop()
    state.keep_prefix_of_last(forwards, torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device), 0)
    spans = [(e.time_range.start, e.time_range.end) for e in traced.events()
             if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    del traced  # the profiler's buffers and its kineto session go with it
    return busy_time_s(spans, unit_s=1e-6) / forwards if spans else None


def busy_time_s(spans: list[tuple[float, float]], unit_s: float = 1.0) -> float:
    """The time covered by any of the (start, end) spans (kernels on several streams or GPUs overlap: counted once),
    in seconds given the spans' unit."""
    busy, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            busy += end - max(start, reached)
            reached = end
    return busy * unit_s


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the tensors a model holds as loaded, each storage once (tied embeddings share one): parameters and
    buffers; tensors held as plain attributes (utils/cpu_linear.py's PackedLinear keeps its oneDNN-packed weight and
    its bias so, replacing the nn.Linear's); and what a parameter carries beside its data (bitsandbytes: a 4-bit
    weight's packed uint8 data and its quant_state's absmax and code, an 8-bit weight's int8 data and its SCB scales).
    Meta tensors (offloaded to disk) hold nothing."""
    seen, total = set(), 0
    for tensor in _held_tensors(model):
        if tensor.device.type == "meta":
            continue
        try:
            storage = tensor.untyped_storage()
            key, size = (str(tensor.device), storage.data_ptr()), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # oneDNN's opaque blocked layout: no storage, its elements' size
            key, size = id(tensor), tensor.numel() * tensor.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


def _held_tensors(model: torch.nn.Module):
    for module in model.modules():
        for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
            if isinstance(tensor, torch.Tensor):
                yield tensor
                yield from _attached(tensor)


def _attached(owner, depth: int = 3):
    """Tensors an object keeps in its attributes, and those of its attributes' attributes (bitsandbytes' quant_state
    and its nested state2), a few levels deep."""
    if depth == 0:
        return
    for value in vars(owner).values() if hasattr(owner, "__dict__") else ():
        if isinstance(value, torch.Tensor):
            yield value
        elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
            yield from _attached(value, depth - 1)


def verify_widths(points) -> set[int]:
    """The target forward widths the points' verifications use: gamma + 1 for a chain, n + 1 for a tree of n nodes
    besides its root (decode/tree_layout.py tree_nodes; AUTO_TREE_NODES for auto)."""
    widths = set()
    for point in points:
        tree = getattr(point, "tree", None)
        nodes = AUTO_TREE_NODES if tree == AUTO else (tree_nodes(tree, point.gamma),)
        widths |= {n + 1 for n in nodes if n}
    return widths


def _timed_tree_forward(state: KVState, model, tokens: torch.Tensor, clock) -> float:
    """As _timed_forward, through the tree path (KVState.forward_tree: the ancestor mask built and handed to the
    model) that a tree's verification takes; a chain-shaped tree of the same width costs what any tree of it does."""
    batch, width = tokens.shape
    parents = np.tile(np.arange(-1, width - 1), (batch, 1))
    start = clock.now()
    state.forward_tree(model, tokens, parents, np.ones((batch, width), dtype=bool), new_round=True)
    elapsed = clock.now() - start
    state.keep_region(np.zeros((batch, width), dtype=bool))
    return elapsed


def measure_costs(target, drafts: dict, ids, mask, widths: list[int], clock, reps: int = 7,
                  draft_prefill: bool = False, busy_reps: int = 3, tree_widths=frozenset(),
                  sampling: Sampling | None = None, context: int = 0, target_vocab_size: int | None = None,
                  prefills: bool = True, cache: int | None = None) -> CostProbe:
    """c = t(draft step) / t(baseline step) per draft; v_k = t(verification of k + 1 tokens) / t(baseline step) for
    each draft length k = width - 1: each step timed as the run executes it, with its own choice of tokens and host
    read (_timed_target_step, _timed_draft_step, _timed_verification: the functions decode/generate.py and the draft
    drafter run), at this batch's prompt followed by `context` tokens (decoding_context; the session passes
    max_new_tokens // 2: the mean cache a decoding step sees). The baseline's step is the unit because the baseline
    spends one per token; Leviathan's model prices a round of gamma draft steps and one verification in it. A draft
    model's step is the mean of a chain of the longest chain's gamma steps, as a round drafts them (no host read
    between them); a head's step is timed alone.
    sampling: the comparison's (greedy, the default: argmax and, in the baseline's step, the top-2 gap).

    The steps are interleaved, one of each per repetition and the baseline step first and last (after one untimed
    pass), so that drift of the machine touches every ratio alike; each time is the median over the repetitions, and
    the repetitions are kept (reps_s) so the report can say when they disagree. draft_prefill: also fit each draft's
    prefill cost (draft_prefill_cost; the cost_model schedule and hybrid read it; a head has none). tree_widths: the
    widths only trees verify, timed through the tree path (its custom mask, the forward alone), as their
    verifications run. Beside c, for the host_bound flag: each model's weight bytes, and on CUDA the GPU's busy time in its 1-token forward (the mean of
    `busy_reps`, after the untimed pass and before the timed repetitions: a profiler session leaves later kernel
    launches slower, by x1.04 to x1.40 in an eager forward on an H100 (benchmarks/gpu_check.py's cupti row), so every
    step this process times comes after one, the probes' and the batches' alike; 0: none). After the steps' repetitions, the
    prefills of the batch and of its first row by each model (prefill_points: the cost profile's prefill points;
    prefills False: none, where the caller has them already). clock None: a clock on the ids' device.
    """
    clock = clock if clock is not None else Clock(ids.device)
    sampling = sampling or Sampling(False)
    vocab = target_vocab_size or target.get_output_embeddings().out_features
    at_ids, at_mask = decoding_context(ids, mask, context) if cache is None else at_cache(ids, mask, cache)
    token = at_ids[:, -1]
    states = {TARGET: _prefilled(target, at_ids, at_mask)}
    models = {TARGET: target}
    drafters = {}
    for label, model in drafts.items():
        if is_head(model):  # timed as its drafter runs it; the busy-time probe times causal LMs' forwards alone
            drafters[label] = _head_drafter(model, vocab, sampling, at_ids, at_mask)
            continue
        drafters[label] = DraftModelDrafter(model, vocab, sampling)
        drafters[label].start(at_ids, at_mask)
        states[draft_model(label)] = drafters[label].state
        models[draft_model(label)] = model
    # the unit opens and closes each repetition: every ratio divides by it, so it gets twice the repetitions, and a
    # drift within a repetition touches it on both sides
    # a draft model's 2-token catch-up (a round after a full accept) after its 1-token step, as their ratio (below)
    probes = ([(TARGET, 1)] + [(draft_model(label), 1) for label in drafts]
              + [(draft_model(label), 2) for label in drafts if draft_model(label) in states]
              + [(TARGET, w) for w in sorted(set(widths)) if w > 1] + [(TARGET, 1)])
    times: dict[tuple, list[float]] = {probe: [] for probe in probes}
    # a draft model's step timed in a chain as long as the longest chain verified (a head's, alone)
    chain = max([w - 1 for w in widths if w > 1 and w not in tree_widths] or [1])
    busy, chained = {}, {}
    for rep in range(reps + 1):
        if rep == 1 and ids.device.type == "cuda" and busy_reps:
            # after the untimed pass (a compiled step's graphs compiled), before the timed ones: what the profiler
            # leaves behind slows every later step alike
            busy = {name: _busy_forward_s(states[name], model, token[:, None].contiguous(), clock, busy_reps)
                    for name, model in models.items()}
        for name, width in probes:
            if name != TARGET and width == 2:
                # the 2-token forward and a 1-token one, each alone (a pair: the machine's drift cancels in their
                # ratio), priced in the chain: this repetition's chained step times their ratio
                drafter = drafters[label_of(name)]
                alone = _timed_draft_step(drafter, token, clock, 1)
                elapsed = chained[name] * _timed_draft_catch_up(drafter, token, clock) / alone
            elif name != TARGET:
                elapsed = chained[name] = _timed_draft_step(drafters[label_of(name)], token, clock,
                                                            chain if name in states else 1)
            elif width == 1:
                elapsed = _timed_target_step(states[name], target, token, clock, sampling)
            elif width in tree_widths:
                elapsed = _timed_tree_forward(states[name], target, token[:, None].expand(-1, width).contiguous(), clock)
            else:
                elapsed = _timed_verification(states[name], target, token, width - 1, clock, sampling)
            if rep:
                times[(name, width)].append(elapsed)
    median = {key: statistics.median(values) for key, values in times.items()}
    target_one = median[(TARGET, 1)]
    # the steps' caches go before the prefills make theirs (engine.compile: a prefill takes their static buffers
    # rather than a second set, which the model's pool would keep for the whole run)
    states.clear()
    drafters.clear()
    prefilled = prefill_points(target, drafts, ids, mask, clock) if prefills else []
    return CostProbe(
        c_by_draft={label: median[(draft_model(label), 1)] / target_one for label in drafts},
        v={w - 1: median[(TARGET, w)] / target_one for w in sorted(set(widths)) if w > 1},
        target_forward_s=target_one,
        target_reps_s={width: values for (name, width), values in times.items() if name == TARGET},
        draft_reps_s={label_of(name): values for (name, width), values in times.items()
                      if name != TARGET and width == 1},
        draft_catch_up_reps_s={label_of(name): values for (name, width), values in times.items()
                               if name != TARGET and width == 2},
        draft_prefill={label: draft_prefill_cost(model, ids, mask, clock, target_one)
                       for label, model in drafts.items() if not is_head(model)} if draft_prefill else {},
        target_weight_bytes=weight_bytes(target),
        draft_weight_bytes={label: weight_bytes(model) for label, model in drafts.items()},
        target_busy_s=busy.get(TARGET),
        draft_busy_s={label: busy[draft_model(label)] for label in drafts if busy.get(draft_model(label)) is not None},
        context_tokens=at_ids.shape[1],
        prefills=prefilled,
    )


def prefill_points(target, drafts: dict, ids, mask, clock, reps: int = 2, first_row: bool = True) -> list[dict]:
    """The prefills of the probe batch's prompts (ids, mask [B, P]) and of its first row alone (first_row; its own
    width: the leading columns that are padding in that row dropped; not twice where that is the batch's shape), by
    the target and by each draft, as a request group's admission runs them (the target: decode/generate.py prefill,
    its next-token logits and their finiteness check included; a draft: its prompt's cache, _prefilled), each the
    median of `reps` timed repetitions: eval/costs.py prefill points, which the replay prices an admission with."""
    from eval.costs import prefill_point

    shapes = [(ids, mask)]
    if first_row:
        first = int(mask[0].nonzero()[0]) if bool(mask[0].any()) else 0  # the first row's leading padding
        if (1, ids.shape[1] - first) != tuple(ids.shape):
            shapes.append((ids[:1, first:], mask[:1, first:]))
    models = [(TARGET, target, prefill)]
    models += [(draft_model(label), model, _prefilled) for label, model in drafts.items()]
    points = []
    for name, model, run in models:
        for shape_ids, shape_mask in shapes:
            times = []
            for _ in range(reps):
                start = clock.now()
                run(model, shape_ids, shape_mask)
                times.append(clock.now() - start)
            points.append(prefill_point(name, shape_ids.shape[0], shape_ids.shape[1], times))
    return points


def draft_prefill_cost(model, ids, mask, clock, target_one: float, reps: int = 3) -> dict:
    """The draft's prefill in target steps (1-token target forwards at this batch size), as a line in the
    prompt width P: fixed + per_token * P, fitted through prefills at P and 2P (the prompt twice), medians of
    `reps`. What the cost_model schedule weighs against what drafting can save (a long prompt, few new tokens:
    the draft's prefill may cost more than speculation saves)."""
    def timed(width_ids, width_mask) -> float:
        times = []
        for _ in range(reps):
            start = clock.now()
            _prefilled(model, width_ids, width_mask)
            times.append(clock.now() - start)
        return sorted(times)[len(times) // 2] / target_one

    width = ids.shape[1]
    once = timed(ids, mask)
    twice = timed(torch.cat([ids, ids], dim=1), torch.cat([mask, mask], dim=1))
    per_token = max(twice - once, 0.0) / width
    return {"fixed": max(once - per_token * width, 0.0), "per_token": per_token, "width": width}


def drift_probe(target, ids, mask, clock, reps: int = 3) -> float:
    """Median time of a 1-token target forward at this batch's cache: identical work each time it is
    measured, so a change means the machine changed speed, not the method."""
    state = _prefilled(target, ids, mask)
    tokens = ids[:, -1:].contiguous()
    times = [_timed_forward(state, target, tokens, clock) for _ in range(reps + 1)][1:]
    return sorted(times)[len(times) // 2]


# errors of a point at run time (the point fails, the sweep goes on); anything else is a bug
RUNTIME_ERRORS = (RuntimeError, FloatingPointError, ValueError, IndexError)
# the numerics probe of a bf16 or quantized model verifies M = gamma + 1 tokens for each gamma up to this (a wider
# gamma probes M = 17): each width costs a prefill and a verification of the probe's two short prompts
MAX_PROBED_GAMMA = 16


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def probe_widths(config, points, loaded) -> tuple[int, ...]:
    """The verify widths of the run's speculative points (`points`, our engine's) to probe a quantized or non-fp32
    model at: M = gamma + 1 of a chain (gamma capped at MAX_PROBED_GAMMA), nodes + 1 of a tree (verify_widths). fp32
    unquantized drifts ~1e-5 at any M, far below a gap that a flip needs: one probe, M = 5."""
    from decode.methods import REGISTRY

    if loaded.quantization == "none" and loaded.dtype == "float32":
        return (5,)
    trees = [p for p in points if REGISTRY[p.method].has_rounds and p.gamma and getattr(p, "tree", None) is not None]
    widths = {min(gamma, MAX_PROBED_GAMMA) + 1 for gamma in config.speculative.gamma} | verify_widths(trees)
    widths.add(min(config.longest_draft, MAX_PROBED_GAMMA) + 1)  # hybrid past gamma
    return tuple(sorted(widths))


def probe_numerics(config, models, points, ids, mask) -> dict:
    """Per model (`models`: runner/loading.py roles), how far one multi-token forward is from the same tokens fed one
    by one, and a row in a ragged batch (ids, mask: two prompts of different lengths) from the row alone. Greedy
    exactness rests on these being tiny (fp32); in bf16 or with quantized kernels they are not, and the report weighs
    each greedy mismatch against them (eval/flags.py). A quantized or non-fp32 model is probed at every verify width
    M the run uses (probe_widths; its kernels may take another path at another M), a quantized one also at M = 1 (a
    batch-1 baseline's kernel). With engine.compile the probe runs the compiled step (decode/numerics.py)."""
    from decode.numerics import numerics_probe

    result = {"drafts": {}}
    with torch.inference_mode():
        for _, label, loaded in models:
            try:
                probe = numerics_probe(loaded.model, ids, mask, probe_widths(config, points, loaded),
                                       single_steps=loaded.quantization != "none")
            except RUNTIME_ERRORS as error:
                probe = {"error": one_line(error)}
            for key, value in list(probe.items()):  # NaN logits (broken weights) give no difference to report
                if isinstance(value, dict):  # the readings per verify width
                    probe[key] = {width: None if diff != diff else diff for width, diff in value.items()}
                elif isinstance(value, float) and value != value:
                    probe[key] = None
                    probe["error"] = "the model returned NaN logits"
            probe.update(dtype=loaded.dtype, quantization=loaded.quantization)
            if label is None:
                result["target"] = probe
            else:
                result["drafts"][label] = probe
    return result


def comparison_costs(config, target, drafts: dict, points, ids, mask, clock, sampling,
                     prompt_lengths: list[int] | None = None, binned: bool = True) -> CostProbe | None:
    """c and v of a comparison's speculative points (`points`: those that run), measured on its first batch (ids,
    mask): each verify width they use (a chain's gamma + 1, a tree's nodes + 1; the cost_model schedule any draft
    length up to gamma and the draft's prefill; hybrid any chain up to gamma or a tree of two chains up to 2 gamma
    nodes and the draft's prefill (its deferred start and its catch-ups), timed as chains, and past gamma up to speculative.hybrid_max_draft a few widths between), each step timed as the run executes it, at the mean cache of decoding (the prompt +
    max_new_tokens / 2): with prompt_lengths (the comparison's prompts, in tokens), at the median prompt's, and where
    they differ widely (binned) also at each length bin's (context_bins: by_context, which the report gives each run
    by its own rows' cache); without, at the probe batch's width. None: no speculative point. Raises what the probes
    raise (RUNTIME_ERRORS: the caller notes it)."""
    from decode.methods import REGISTRY

    spec_points = [p for p in points if REGISTRY[p.method].has_rounds]
    if not spec_points:
        return None
    if os.environ.get("SPECULATE_INJECT_FAILURE") == "costs":  # fault injection for the tests
        raise RuntimeError("injected failure in the cost probes")
    gammas = sorted({p.gamma for p in spec_points if p.gamma})
    widths = verify_widths(spec_points)
    chains = verify_widths([p for p in spec_points if getattr(p, "tree", None) is None])
    measured = any(p.schedule in REGISTRY[p.method].measured_schedules for p in spec_points)
    if measured:
        widths |= set(range(2, max(gammas) + 2))
        chains |= set(range(2, max(gammas) + 2))
    priced = [p for p in spec_points if REGISTRY[p.method].prices_rounds]
    hybrid = [p.gamma for p in priced]
    if hybrid:
        hybrid_widths = set(range(2, 2 * max(hybrid) + 2))
        caps = {REGISTRY[p.method].draft_cap for p in priced} - {None}
        longest = max([max(hybrid), *(getattr(config.speculative, cap) or 0 for cap in caps)])
        if longest > max(hybrid):  # past gamma: a few widths up to a tree of two of the longest drafts
            hybrid_widths |= {longest + 1, (3 * longest) // 2 + 1, 2 * longest + 1}
        widths |= hybrid_widths
        # compiled, a merged tree wider than a chain runs as one tree step (decode/compile_plan.py): timed so, not as
        # a chain past the compiled chain widths (which would run in two steps)
        chains |= {w for w in hybrid_widths if not config.engine.compile or w <= max(hybrid) + 1}
    tokens = config.generation.max_new_tokens // 2
    caches = context_bins(prompt_lengths, tokens) if prompt_lengths else []
    probe = measure_costs(target.model, drafts, ids, mask, sorted(widths), clock, draft_prefill=measured or bool(hybrid),
                          tree_widths=widths - chains, sampling=sampling, context=tokens,
                          target_vocab_size=target.vocab_size, cache=caches[0] if caches else None)
    for cache in caches[1:] if binned else []:  # the steps alone: the prefills and the busy time are the first's
        probe.by_context[cache] = measure_costs(target.model, drafts, ids, mask, sorted(widths), clock, busy_reps=0,
                                                tree_widths=widths - chains, sampling=sampling,
                                                target_vocab_size=target.vocab_size, prefills=False, cache=cache)
    return probe
