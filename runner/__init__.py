"""The harness, split by responsibility: plan (points and units), session (models and one unit of work),
probes (costs, drift, environment), storage (the report folder, resume), display (progress), experiment
(the sweep), cluster (the same units on Ray workers)."""
from runner.experiment import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_POINTS_FAILED, Experiment

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_POINTS_FAILED", "Experiment"]
