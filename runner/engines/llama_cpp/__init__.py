"""llama.cpp as a third engine (the llama_cpp_* methods of decode/methods): runner/engines/llama_cpp/engine.py drives
runner/engines/llama_cpp/worker.py processes, each of which runs one llama-server (.ci/llama-cpp-env builds it)."""
from __future__ import annotations

import contextlib

from runner.engines.llama_cpp.engine import LlamaCppExecutor, check_llama_cpp
from runner.engines.process import ProcessEngine


class LlamaCppEngine(ProcessEngine):
    name, title = "llama_cpp", "llama.cpp"
    checked: dict | None = None

    def check(self) -> dict:
        """The server runs; the GGUF files it loads (re-quantized here when llama_cpp.weights asks)."""
        with self.status("checking llama.cpp's server and its GGUF files") if self.status else contextlib.nullcontext():
            self.checked = check_llama_cpp(self.config, self.out_dir / "llama_cpp-worker.log")
        return {"version": self.checked["llama_cpp"], "server": self.checked["server"]}

    def make_executor(self, session) -> LlamaCppExecutor:
        return LlamaCppExecutor(self.config, session, self.checked, self.out_dir)


ENGINE = LlamaCppEngine
