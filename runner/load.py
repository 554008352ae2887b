"""A serving run's requests (config load:): which prompts, and when each arrives.

Every method of a load point, on either engine, serves the same requests on the same arrival schedule: request i
is prompt i of the dataset (cycling when there are more requests than prompts) and arrives at arrivals[i] seconds
after the load point starts, unless it is a conversation's later turn (below). A conversation's later turn (dataset.turns) follows the request of its previous turn:
it arrives load.think_s after that one's last token (closed loop per conversation), and the schedule (at
request_rate) is drawn for the requests that follow none: the conversations' starts.
"""
from __future__ import annotations

import numpy as np

from decode.arrivals import Load


def requests_of(prompts: list, count: int | None) -> list:
    """`count` requests (None: one per prompt), prompt i for request i, cycling through the prompts."""
    count = len(prompts) if count is None else count
    return [prompts[i % len(prompts)] for i in range(count)]


def request_count(config, num_prompts: int) -> int:
    """A serving run's requests per load point: load.requests, or one per prompt."""
    return config.load.requests or num_prompts


def arrival_gaps(count: int, rate: float, arrival: str = "poisson", burstiness: float = 1.0,
                 seed: int = 0) -> np.ndarray:
    """The gap before each of `count` requests (the first's after the start) at a finite rate, as drawn: 1/rate
    (constant), or gamma-distributed of shape `burstiness` and scale 1 / (rate x burstiness), mean 1/rate (poisson:
    exponential at burstiness 1; vLLM's bench serve draws its gaps so), from a generator seeded by `seed`."""
    if arrival == "constant":
        return np.full(count, 1.0 / rate)
    if arrival == "poisson":
        return np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    raise ValueError(f"unknown arrival {arrival!r}: poisson or constant")


def arrival_times(count: int, rate: float | None, arrival: str = "poisson", burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Seconds from the start at which each of `count` requests arrives, in order, as vLLM's `bench serve` sets
    them (benchmarks/serve.py get_request): all at 0 for rate None (inf); else the gaps (arrival_gaps, one before
    every request, the first included) accumulated, then every time scaled so that the last request arrives at
    count / rate exactly (vLLM's normalize_factor: the sum of random gaps misses it by a few percent, and the
    throughput would move with the seed)."""
    if rate is None or rate == float("inf") or count == 0:
        return [0.0] * count
    times = np.cumsum(arrival_gaps(count, rate, arrival, burstiness, seed))
    if times[-1] != 0:
        times = times * ((count / rate) / times[-1])
    return times.tolist()


def schedule_seed(config, unit) -> int:
    """The arrival generator's seed: the run's seed and the repeat, not the concurrency, so that every load point
    of one rate (a concurrency sweep) gets the same arrivals in a repeat, and each repeat its own."""
    return config.seed * 1_000_003 + unit.repeat * 101


def schedule_of(config, unit, num_prompts: int) -> list[float]:
    """The unit's arrival schedule: one per request, the same for every method (and engine) of its load point and
    repeat, and for every concurrency at its rate."""
    load = config.load
    return arrival_times(request_count(config, num_prompts), unit.request_rate, load.arrival, load.burstiness,
                         seed=schedule_seed(config, unit))


def follows_of(requests: list) -> list[int | None]:
    """Per request, the request whose next turn it is: the latest earlier request of the same conversation at the
    turn before (prompts with conversation and turn, utils/data.py); None for a first turn or a lone prompt."""
    last: dict[tuple, int] = {}  # (conversation, turn) -> its latest request so far
    follows = []
    for i, prompt in enumerate(requests):
        conversation, turn = getattr(prompt, "conversation", None), getattr(prompt, "turn", None)
        follows.append(last.get((conversation, turn - 1)) if conversation is not None and turn else None)
        if conversation is not None and turn:
            last[(conversation, turn)] = i
    return follows


def load_of(config, unit, requests: list) -> Load:
    """A serving unit's Load over its requests: the schedule (schedule_of) for those that follow none, in order; a
    later turn arrives load.think_s after the request it follows finished."""
    follows = follows_of(requests)
    starts = arrival_times(sum(j is None for j in follows), unit.request_rate, config.load.arrival,
                           config.load.burstiness, seed=schedule_seed(config, unit))[::-1]
    arrivals = [starts.pop() if j is None else 0.0 for j in follows]
    chained = any(j is not None for j in follows)
    return Load(arrivals, unit.concurrency, follows if chained else None, config.load.think_s if chained else 0.0)


def request_fields(load: Load | None, index: int) -> dict:
    """A served request's record fields: its index and, in a load of conversations, the request it follows (None: a
    first turn) and the think time (on every request, so that a replay of any of them has it)."""
    if load is None:
        return {}
    if not load.follows:
        return {"request": index}
    return {"request": index, "follows": load.follows[index], "think_s": load.think_s}  # every request of the loop
