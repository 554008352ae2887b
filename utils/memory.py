"""Host memory as the kernel counts it: resident set, split into anonymous memory (what the process
allocated: weights it owns, activations) and file-backed pages (mmap'd weight files), plus peaks."""
from __future__ import annotations

import threading
from pathlib import Path

STATUS = Path("/proc/self/status")


def _status_kib(*names: str) -> dict[str, int | None]:
    values: dict[str, int | None] = {name: None for name in names}
    try:
        for line in STATUS.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in values:
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return values


def host_memory() -> dict[str, int | None]:
    """rss, anonymous and file-backed resident bytes now, and the peak resident set (VmHWM); None where
    /proc is missing (macOS)."""
    v = _status_kib("VmRSS", "RssAnon", "RssFile", "VmHWM")
    return {"rss_bytes": v["VmRSS"], "anon_bytes": v["RssAnon"], "file_bytes": v["RssFile"], "peak_rss_bytes": v["VmHWM"]}


def mapped_files(suffix: str = ".safetensors") -> list[str]:
    """Files with this suffix mapped into the process now (each once)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in lines if line.rstrip().endswith(suffix)})


class PeakSampler:
    """Samples the resident set and its anonymous part every `interval_s` in a daemon thread: the kernel
    keeps the peak RSS (VmHWM) but not the peak of anonymous memory."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.peak_anon_bytes: int | None = None
        self.peak_rss_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        now = host_memory()
        for attribute, key in (("peak_anon_bytes", "anon_bytes"), ("peak_rss_bytes", "rss_bytes")):
            if now[key] is not None:
                setattr(self, attribute, max(getattr(self, attribute) or 0, now[key]))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> "PeakSampler":
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=1)
        self.sample()
        return self.report()

    def report(self) -> dict:
        now = host_memory()
        return {"peak_rss_bytes": max(filter(None, [self.peak_rss_bytes, now["peak_rss_bytes"]]), default=None),
                "peak_anon_bytes": self.peak_anon_bytes, "rss_bytes": now["rss_bytes"], "anon_bytes": now["anon_bytes"],
                "file_bytes": now["file_bytes"]}
