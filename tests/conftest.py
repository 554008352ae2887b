import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))  # the shared helpers (tiny_models, helpers, stats, sample_records)


import signal  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _ctrl_c_as_a_terminal_gives_it():
    """Every test starts with Ctrl-C raising KeyboardInterrupt, as in a process started from a terminal, and the
    processes it starts inherit that: a handler or an ignored SIGINT left by an earlier test (or by the shell that
    started pytest in the background) must not decide whether an interrupt test interrupts anything."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
