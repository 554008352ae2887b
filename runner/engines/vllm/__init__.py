"""vLLM as a second engine (the vllm_* methods of decode/methods): runner/engines/vllm/engine.py drives
runner/engines/vllm/worker.py processes started with the interpreter of an environment that has vLLM."""
from __future__ import annotations

import contextlib

from runner.engines.process import ProcessEngine
from runner.engines.vllm.engine import VllmExecutor, check_vllm


class VllmEngine(ProcessEngine):
    name, title = "vllm", "vLLM"
    checked: dict | None = None

    def check(self) -> dict:
        """The interpreter, vLLM, its support of the models and the packages the methods need."""
        with self.status("checking the vLLM environment") if self.status else contextlib.nullcontext():
            self.checked = check_vllm(self.config, self.out_dir / "vllm-worker.log")
        return {"version": self.checked["vllm"], "python": self.checked["python"]}

    def make_executor(self, session) -> VllmExecutor:
        return VllmExecutor(self.config, session, self.checked, self.out_dir)


ENGINE = VllmEngine
