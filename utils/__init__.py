"""Loading things (config, models, data, files). Nothing here decodes: of decode/, utils/ imports only the method
registry (decode/methods: names, axes, what each method takes) and the tree labels (decode/tree_layout.py), which the config
schema validates against (tests/test_structure.py holds that, and that no module of the repository is in an import
cycle)."""
import contextlib


class UserError(Exception):
    """Bad input: printed as one line, exit code 2."""


class ConfigError(UserError):
    """Bad input in the config, naming the key."""


def raise_interrupt(signum, frame):
    """A signal handler that makes SIGTERM what Ctrl-C is: KeyboardInterrupt, so a run stops as it does on Ctrl-C."""
    raise KeyboardInterrupt


def hold_signals() -> dict:
    """Ctrl-C and SIGTERM deferred: a handler that only records them, so that what must not be cut (a report being
    written, a worker's shutdown) is not. Returns what release_signals needs (nothing off the main thread, where
    signals cannot be handled)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    return {"previous": previous, "caught": caught}


def release_signals(held: dict, deliver: bool = True) -> None:
    """The handlers back, then each signal that came meanwhile delivered to them (a deferred Ctrl-C still stops);
    deliver False: dropped (a finished report is not an interrupted one)."""
    import signal

    if not held:
        return
    for sig, handler in held["previous"].items():
        signal.signal(sig, handler)
    for sig in dict.fromkeys(held["caught"]) if deliver else ():
        signal.raise_signal(sig)


@contextlib.contextmanager
def signals_held(deliver: bool = True):
    """hold_signals ... release_signals around a block."""
    held = hold_signals()
    try:
        yield
    finally:
        release_signals(held, deliver)


def positive_ints(text: str) -> list[int]:
    """A command line's '1,2,4' -> [1, 2, 4], each a positive integer, each once, in order; an argparse type
    (ArgumentTypeError names the part that is not one)."""
    import argparse

    values = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a positive integer (e.g. 1,2,4)")
        values.append(value)
    return sorted(set(values))
