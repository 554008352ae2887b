"""The harness, split by responsibility: plan (points and units), session (models and one unit of work),
probes (costs, drift, environment), storage (the report folder, resume), display (progress), experiment
(the sweep), cluster (the same units on Ray workers)."""
__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_POINTS_FAILED", "Experiment"]


def __getattr__(name: str):
    """runner.Experiment and the exit codes, imported when asked for: runner.probes alone needs no config (pydantic)."""
    if name in __all__:
        from runner import experiment

        return getattr(experiment, name)
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
