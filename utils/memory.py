"""Host memory as the kernel counts it: resident set, split into anonymous memory (what the process
allocated: weights it owns, activations) and file-backed pages (mmap'd weight files), plus peaks; and
giving back the resident pages of a mapped weight once it is no longer read."""
from __future__ import annotations

import ctypes
import mmap
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

STATUS = Path("/proc/self/status")
MAPS = Path("/proc/self/maps")


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
        lines = MAPS.read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in lines if line.rstrip().endswith(suffix)})


def file_mapped_ranges() -> list[tuple[int, int]]:
    """[start, end) addresses of every mapping of a file into this process; [] without /proc (macOS)."""
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return []
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def drop_file_pages(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> int:
    """Unmap from this process the resident pages of a CPU tensor that lies in a mapped file (`ranges`, from
    file_mapped_ranges), so they leave its resident set now rather than when the whole file is unmapped.

    Only pages wholly inside the tensor are dropped. Its contents stay valid: a page read again comes back
    from the file. (A private mapping's page written in place would come back as the file has it; the
    weights are never written.) Call it on a tensor nothing reads any more. Returns the bytes dropped (0
    for a tensor that is not file-backed, or where madvise is missing)."""
    if tensor.device.type != "cpu" or not tensor.numel() or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    begin = tensor.data_ptr()
    end = begin + tensor.numel() * tensor.element_size()
    if not any(start <= begin and end <= stop for start, stop in ranges):
        return 0
    page = mmap.PAGESIZE
    first, last = -(-begin // page) * page, end // page * page
    if last <= first:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), mmap.MADV_DONTNEED) != 0:
        return 0
    return last - first


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
