"""What a person sees while a run goes: a rich progress bar on a terminal; elsewhere (CI logs, nohup,
`| tee`) one plain line per finished batch of a point, so a long run is never silent."""
from __future__ import annotations

import time


def seconds_of(rows: list[dict]) -> float:
    """The seconds a finished batch of a point took: a static batch's longest row; a load point's span, from its
    start (t = 0) to its last finish, as its tok/s is reported (eval/served_figures.py load_figures), not its slowest
    request, which overlapped the others."""
    if all(r.get("finish_s") is not None for r in rows):
        return max(r["finish_s"] for r in rows)
    return max(r["latency_s"] for r in rows)


class Display:
    def __init__(self, console, total: int):
        self.console, self.total = console, total
        self.tokens: dict[str, int] = {}  # point label -> tokens so far
        self.seconds: dict[str, float] = {}
        self.done = 0
        self.workers: dict[str, int] = {}  # worker -> units done (a Ray run)
        self.start = time.monotonic()
        self.bar = None
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task("running", total=total, rate="")

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def status(self, text: str) -> None:
        if self.bar:
            self.bar.update(self.task, description=text)
        else:
            self._line(text)

    def skip(self, count: int = 1) -> None:
        self.done += count
        if self.bar:
            self.bar.advance(self.task, count)

    def point_done(self, label: str, rows: list[dict] | None, where: str, worker: str | None = None) -> None:
        """A point finished one batch (rows None: it failed there)."""
        self.done += 1
        rate = ""
        if rows:
            self.tokens[label] = self.tokens.get(label, 0) + sum(r["new_tokens"] for r in rows)
            self.seconds[label] = self.seconds.get(label, 0.0) + seconds_of(rows)
            rate = f"{self.tokens[label] / self.seconds[label]:.2f} tok/s so far"
        if self.bar:
            self.bar.update(self.task, description=label, rate=rate)
            self.bar.advance(self.task)
        else:
            who = f" [{worker}]" if worker else ""
            self._line(f"{self.done}/{self.total} {label} {where}: " + (rate or "failed") + who)

    def unit_done(self, worker: str) -> None:
        self.workers[worker] = self.workers.get(worker, 0) + 1
        if len(self.workers) > 1 or worker != "local":
            text = "units done: " + ", ".join(f"{w} {n}" for w, n in sorted(self.workers.items()))
            if self.bar:
                self.bar.update(self.task, rate=text)
            else:
                self._line(text)

    def _line(self, text: str) -> None:
        elapsed = time.monotonic() - self.start
        self.console.print(f"[{elapsed:7.1f}s] {text}", highlight=False, soft_wrap=True)
        file = getattr(self.console, "file", None)
        if file is not None and hasattr(file, "flush"):
            file.flush()
