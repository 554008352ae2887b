"""A serving run's requests (config load:): which prompts, and when each arrives.

Every method of a load point, on either engine, serves the same requests on the same arrival schedule: request i
is prompt i of the dataset (cycling when there are more requests than prompts) and arrives at arrivals[i] seconds
after the load point starts.
"""
from __future__ import annotations

import numpy as np


def requests_of(prompts: list, count: int | None) -> list:
    """`count` requests (None: one per prompt), prompt i for request i, cycling through the prompts."""
    count = len(prompts) if count is None else count
    return [prompts[i % len(prompts)] for i in range(count)]


def arrival_times(count: int, rate: float | None, arrival: str = "poisson", burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Seconds from the start at which each of `count` requests arrives, in order: all at 0 for rate None (inf);
    else the first at 0 and then gaps of 1/rate (constant) or gamma-distributed gaps of mean 1/rate and shape
    `burstiness` (poisson: exponential at burstiness 1; vLLM's bench serve draws its gaps so), from a generator
    seeded by `seed`."""
    if rate is None:
        return [0.0] * count
    if arrival == "constant":
        gaps = np.full(max(count - 1, 0), 1.0 / rate)
    elif arrival == "poisson":
        gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness),
                                                 size=max(count - 1, 0))
    else:
        raise ValueError(f"unknown arrival {arrival!r}: poisson or constant")
    return [0.0] + np.cumsum(gaps).tolist()


def schedule_of(config, unit, num_prompts: int) -> list[float]:
    """The unit's arrival schedule: one per request, the same for every method (and engine) of its load point and
    repeat."""
    load = config.load
    count = load.requests or num_prompts
    return arrival_times(count, unit.request_rate, load.arrival, load.burstiness,
                         seed=config.seed * 1_000_003 + unit.repeat * 101 + unit.concurrency)
