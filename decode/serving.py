"""Serving: requests that arrive and leave, with continuous batching (config load:, docs/load.md).

`Load` says when each request of a batch of prompts arrives and how many may be in flight; the engine's loops
(decode/generate.py) admit a waiting request into a free row as soon as one is free and it has arrived.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """Request i (row i of the prompts) arrives at arrivals[i] seconds after the start (non-decreasing); at most
    `concurrency` requests are in flight, the rest wait in arrival order."""
    arrivals: list[float]
    concurrency: int

    def check(self, requests: int) -> None:
        """ValueError (one line) unless this load fits `requests` prompts: one arrival each, finite, >= 0 and
        non-decreasing, and a concurrency of at least 1."""
        if len(self.arrivals) != requests:
            raise ValueError(f"the load has {len(self.arrivals)} arrival times for {requests} requests")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"the load's concurrency must be an integer >= 1, got {self.concurrency!r}")
        if any(not math.isfinite(a) or a < 0 for a in self.arrivals) or \
                any(b < a for a, b in zip(self.arrivals, self.arrivals[1:])):
            raise ValueError("the load's arrival times must be finite, >= 0 and non-decreasing")
