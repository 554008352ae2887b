"""The toy's worker: counts on from each prompt's last token, the prefill's one, then per_step tokens a step (the start
job's)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "runner" / "engines"))  # for process_worker.py alone
from process_worker import ProcessWorker  # noqa: E402
sys.path.pop(0)


class Worker(ProcessWorker):
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
