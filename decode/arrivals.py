"""Serving: requests that arrive and leave, with continuous batching (config load:, docs/load.md).

`Load` says when each request of a batch of prompts arrives and how many may be in flight; the engine's loops
(decode/generate.py) admit a waiting request into a free row as soon as one is free and it has arrived, in the order
`Queue` keeps (the schedule's replay, eval/replay.py, admits by the same Queue). A conversation's later turn is a
request that follows its previous turn: it arrives when that one's last token came, plus a think time (closed loop
per conversation).
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass


@dataclass(kw_only=True)
class RequestTimes:
    """A served request's times (decode/generate.py RowRecord, a line of samples.jsonl: eval/records.py
    SampleRecord), in seconds from the serving loop's start: when it arrived, when its prefill began (it waited in the
    queue between the two), its first token and its last; emits: (time_s, tokens) per time it received tokens (the
    first token, then per round its accepted drafts and the target's token, which come at once; [time_s, tokens] in
    JSON). None: not served (a fixed batch)."""
    arrival_s: float | None = None
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    emits: list[tuple[float, int]] | None = None


@dataclass(frozen=True)
class Load:
    """Request i (row i of the prompts) arrives at arrivals[i] seconds after the start; at most `concurrency`
    requests are in flight, the rest wait in arrival order. follows[i] = j (< i): request i is the next turn of
    request j's conversation and arrives think_s seconds after request j's last token (its arrivals[i] is not used);
    None (or no follows): on the schedule. The arrivals of requests that follow none are non-decreasing."""
    arrivals: list[float]
    concurrency: int
    follows: list[int | None] | None = None
    think_s: float = 0.0

    def check(self, requests: int) -> None:
        """ValueError (one line) unless this load fits `requests` prompts: one arrival each, finite, >= 0 and
        non-decreasing over the requests that follow none, each follows an earlier request, a finite think time
        >= 0, and a concurrency of at least 1."""
        if len(self.arrivals) != requests:
            raise ValueError(f"the load has {len(self.arrivals)} arrival times for {requests} requests")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"the load's concurrency must be an integer >= 1, got {self.concurrency!r}")
        follows = self.follows or [None] * requests
        if len(follows) != requests or any(j is not None and not 0 <= j < i for i, j in enumerate(follows)):
            raise ValueError("the load's follows must name, per request, None or an earlier request")
        scheduled = [a for a, j in zip(self.arrivals, follows) if j is None]
        if any(not math.isfinite(a) or a < 0 for a in scheduled) or any(b < a for a, b in zip(scheduled, scheduled[1:])):
            raise ValueError("the load's arrival times must be finite, >= 0 and non-decreasing")
        if not math.isfinite(self.think_s) or self.think_s < 0:
            raise ValueError(f"the load's think time must be finite and >= 0, got {self.think_s!r}")


class Queue:
    """The requests of a Load not yet admitted, in the order a server admits them: by arrival, then by index. A
    request that follows another has no arrival until that one finishes (`finished`): then think_s after it."""

    def __init__(self, load: Load):
        follows = load.follows or [None] * len(load.arrivals)
        self.think_s = load.think_s
        self.arrival: list[float | None] = [a if j is None else None for a, j in zip(load.arrivals, follows)]
        self.followers: dict[int, list[int]] = {}
        for i, j in enumerate(follows):
            if j is not None:
                self.followers.setdefault(j, []).append(i)
        self.heap = [(a, i) for i, a in enumerate(self.arrival) if a is not None]
        heapq.heapify(self.heap)
        self.left = len(self.arrival)  # requests not yet admitted
        self.known = sorted(a for a in self.arrival if a is not None)  # every arrival known so far, in order

    def finished(self, request: int, at: float) -> list[int]:
        """Request `request` had its last token at `at`: its followers arrive think_s later. Returns them."""
        followers = self.followers.pop(request, [])
        for i in followers:
            self.arrival[i] = at + self.think_s
            heapq.heappush(self.heap, (self.arrival[i], i))
            bisect.insort(self.known, self.arrival[i])
        return followers

    def next_arrival(self) -> float | None:
        """The earliest known arrival still waiting (None: every waiting request follows one in flight)."""
        return self.heap[0][0] if self.heap else None

    def waiting(self, now: float) -> int:
        """The requests that have arrived by `now` and are not admitted: those arrived less those admitted (each
        admitted at or after its arrival, by a clock that only runs forward). O(log n) a call."""
        return max(0, bisect.bisect_right(self.known, now) - (len(self.arrival) - self.left))

    def rate(self, now: float) -> float | None:
        """The rate requests have arrived at so far, per second: of the n that have arrived by `now` (admitted or
        waiting), n - 1 gaps over the time from the first arrival to the last; None before two arrivals at different
        times (a burst is no rate). What a server can know: nothing of requests not yet arrived. O(log n) a call."""
        seen = bisect.bisect_right(self.known, now)
        span = self.known[seen - 1] - self.known[0] if seen else 0.0
        return (seen - 1) / span if seen > 1 and span > 0 else None

    def admit(self, now: float, free: int) -> list[int]:
        """Up to `free` requests that have arrived by `now`, in admission order."""
        group = []
        while self.heap and len(group) < free and self.heap[0][0] <= now:
            group.append(heapq.heappop(self.heap)[1])
        self.left -= len(group)
        return group


PREFILL_PADDING = 0.25  # the share of a prefill forward's tokens that may be padding (`prefill_batches`)


def prefill_batches(group: list[int], tokens: list[int]) -> list[list[int]]:
    """The requests admitted at one moment (`group`, with their prompts' lengths `tokens`) as the prefill forwards
    that run them, shortest prompts first: a forward pads every row to its longest, so a row joins the forward before
    it only while that forward's padding stays within PREFILL_PADDING of its rows x width; else it starts the next.
    Prompts of like length share a forward (one pass over the weights for all), and a short prompt is not padded to a
    long one's width: a padded short-with-long pair cost 1.35x the two forwards apart on the CPU (7.5 s against
    4.4 + 1.2 s, the offline pair's target), and whether a moment's arrivals happened to share it moved a load's
    throughput by 8%. The engine's loop and the schedule's replay (eval/replay.py) both split by it."""
    batches = []
    for i, n in sorted(zip(group, tokens), key=lambda pair: pair[1]):
        batch = batches[-1] if batches else None
        if batch is None or (len(batch[0]) + 1) * n - (batch[1] + n) > PREFILL_PADDING * (len(batch[0]) + 1) * n:
            batches.append([[i], n])
        else:
            batch[0].append(i)
            batch[1] += n
    return [members for members, _ in batches]
