"""The toy engine: its worker (worker.py) in its own process, on the base for engines in their own process."""
from pathlib import Path

from decode.methods import REGISTRY
from runner.engines.process import ProcessEngine, ProcessExecutor, WorkerProcess


class ToyProcess(WorkerProcess):
    script, title = Path(__file__).with_name("worker.py"), "the toy worker"


class ToyExecutor(ProcessExecutor):
    name, title, process = "toy", "toy", ToyProcess

    def engine_kwargs(self, point) -> dict:
        return REGISTRY[point.method].engine_config(point, None, None)

    def measured(self, spec, row: dict, answer: dict | None) -> tuple[dict, dict]:
        rounds = [{"drafted": 2, "accepted": n - 1, "emitted": n} for n in row["steps"][1:]] if spec.has_rounds else None
        return dict(output_ids=row["output_ids"], new_tokens=row["new_tokens"], stop_reason="length",
                    target_forwards=len(row["steps"]), rounds=rounds), {}


class ToyEngine(ProcessEngine):
    executor_class = ToyExecutor


ENGINE = ToyEngine
