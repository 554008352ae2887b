"""Files that survive a kill at any moment: whole-file writes are atomic, JSONL grows by whole lines."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from pathlib import Path

from utils import UserError


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over path."""
    path = Path(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj) -> None:
    """Strict JSON: a NaN or an infinity is a bug upstream (a missing figure is None, and eval's summary never
    holds one), so refuse it here, naming where it is, rather than write a file strict readers reject."""
    try:
        text = json.dumps(obj, indent=2, default=str, allow_nan=False)
    except ValueError as error:
        where = non_finite_paths(obj)
        raise ValueError(f"{path}: not strict JSON, a NaN or infinity at {', '.join(where[:5]) or '?'} "
                         f"({error}); a figure that does not exist is None") from error
    write_atomic(path, text + "\n")


def non_finite_paths(obj, where: str = "") -> list[str]:
    """Where obj holds a float NaN or infinity, as 'key.key[index]' paths."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [where or "(top)"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in non_finite_paths(v, f"{where}.{k}" if where else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in non_finite_paths(v, f"{where}[{i}]")]
    return []


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """One write of whole lines, then fsync: a kill loses at most these rows, and readers skip a torn tail."""
    if not rows:
        return
    payload = "".join(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n" for row in rows)
    with open(path, "a") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path, repair: bool = False) -> list[dict]:
    """Every complete line; a torn last line (a kill mid-write) is skipped, and cut off with repair=True. A broken
    line before the last is no kill's (a write appends whole lines): UserError naming it, rather than drop the lines
    after it. Blank lines are skipped."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    rows, good_until = [], 0
    lines = raw.splitlines(keepends=True)
    last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            good_until += len(line)
            continue
        try:
            row = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
            row = None
        if not isinstance(row, dict):
            if number == last:
                break
            raise UserError(f"{path}: line {number} is not a JSON record, and lines follow it "
                            f"(only a torn last line is a kill's); mend or delete line {number}")
        rows.append(row)
        good_until += len(line)
    if repair and good_until < len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(good_until)
    return rows


LOCK_FILE = ".lock"  # a report folder's: held by the run writing it (runner/storage.py ReportFolder.held)


@contextlib.contextmanager
def folder_lock(folder: Path, what: str):
    """An exclusive lock on FOLDER/.lock (flock) for the life of the block, for this process alone; UserError if
    another process holds it, or if the folder cannot be made or locked (`what` names the option that gave it). The
    kernel frees the lock when its holder exits however it exits (SIGKILL included), so a killed run's lock file is
    stale by construction. The file stays (deleting it would race a waiting opener)."""
    import fcntl
    import socket
    import time

    folder = Path(folder)
    lock = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise UserError(f"{what} {folder}: cannot make the report folder and its lock file {lock} there "
                        f"({error.strerror or error}); pick another folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{folder} is in use by another run ({_written_holder(lock)}); a folder holds one run "
                                f"at a time: wait for it to end (then --resume {folder} if it was stopped), or pick "
                                "another --output-dir") from None
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):  # else a file system without locks
                raise UserError(f"{what} {folder}: cannot lock {lock} ({error.strerror}); pick another folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        yield
    finally:
        os.close(fd)  # frees the lock


def lock_holder(folder: Path) -> str | None:
    """Who holds FOLDER/.lock now, as its holder wrote it; None where nobody does (or there is no lock file)."""
    import fcntl

    lock = Path(folder) / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError:
        return _written_holder(lock)
    finally:
        os.close(fd)


def _written_holder(lock: Path) -> str:
    """The holder of a lock held now, as it wrote itself into the lock file (it may not have written yet)."""
    try:
        held = json.loads(lock.read_text())
        return f"pid {held['pid']} on {held['host']}, since {held['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has just started"
