"""vLLM as a second engine (the vllm_* methods of decode/methods): runner/engines/vllm/engine.py drives
runner/engines/vllm/worker.py processes started with the interpreter of an environment that has vLLM."""
from __future__ import annotations

import contextlib

from runner.engines.base import Engine
from runner.engines.vllm.engine import VllmExecutor, check_vllm
from runner.plan import Unit


class VllmEngine(Engine):
    name, title = "vllm", "vLLM"
    exclusive = True  # vLLM loads its own copies of the models
    checked: dict | None = None
    executor: VllmExecutor | None = None

    def check(self) -> dict:
        """The interpreter, vLLM, its support of the models and the packages the methods need."""
        with self.status("checking the vLLM environment") if self.status else contextlib.nullcontext():
            self.checked = check_vllm(self.config, self.out_dir / "vllm-worker.log")
        return {"version": self.checked["vllm"], "python": self.checked["python"]}

    def start(self, session) -> None:
        self.session = session
        self.executor = VllmExecutor(self.config, session, self.checked, self.out_dir)

    def run(self, units: list[Unit], done: set):
        yield from self.executor.run(units, done)

    def info(self) -> dict:
        return self.executor.info if self.executor is not None else {}

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()


ENGINE = VllmEngine
