"""The toy's worker: counts on from each prompt's last token, the prefill's one, then per_step tokens a step (the start
job's)."""
import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "speculate_process_worker", Path(__file__).resolve().parents[3] / "runner" / "engines" / "process_worker.py")
process_worker = sys.modules.setdefault("speculate_process_worker", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(process_worker)


class Worker(process_worker.ProcessWorker):
    flying: dict | None = None

    def start(self, job: dict) -> dict:
        self.flying, self.per_step = {}, job["engine"]["per_step"]
        return {"ok": True, "start_s": 0.0}

    def ready(self) -> bool:
        return self.flying is not None

    def sampling(self, job: dict) -> int:
        return job["max_new_tokens"]

    def add(self, request, prompt, budget) -> None:
        self.flying[request] = (prompt[-1], budget, [])

    def in_flight(self) -> bool:
        return bool(self.flying)

    def step(self) -> list:
        out = []
        for request, (last, budget, ids) in list(self.flying.items()):
            width = self.per_step if ids else 1  # the prefill gives one token
            new = [last + len(ids) + 1 + i for i in range(min(width, budget - len(ids)))]
            ids += new
            if len(ids) == budget:
                del self.flying[request]
            out.append((request, new, len(ids) == budget, None))
        return out

    def row(self, final, ids, steps, times) -> dict:
        return {**super().row(final, ids, steps, times), "stop_reason": "length", "finish_reason": "length"}


if __name__ == "__main__":
    sys.exit(Worker().main())
