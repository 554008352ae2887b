"""Loading things (config, models, data, files). Nothing here decodes: of decode/, utils/ imports only the method
registry (decode/methods: names, axes, what each method takes) and the tree labels (decode/tree_layout.py), which the config
schema validates against (tests/test_structure.py holds that, and that no module of the repository is in an import
cycle)."""


class UserError(Exception):
    """Bad input: printed as one line, exit code 2."""


class ConfigError(UserError):
    """Bad input in the config, naming the key."""


def raise_interrupt(signum, frame):
    """A signal handler that makes SIGTERM what Ctrl-C is: KeyboardInterrupt, so a run stops as it does on Ctrl-C."""
    raise KeyboardInterrupt


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
