"""Serving: requests that arrive and leave, with continuous batching (config load:, docs/load.md).

`Load` says when each request of a batch of prompts arrives and how many may be in flight; the engine's loops
(decode/generate.py) admit a waiting request into a free row as soon as one is free and it has arrived.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """Request i (row i of the prompts) arrives at arrivals[i] seconds after the start (non-decreasing); at most
    `concurrency` requests are in flight, the rest wait in arrival order."""
    arrivals: list[float]
    concurrency: int
