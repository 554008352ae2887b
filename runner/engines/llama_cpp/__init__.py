"""llama.cpp as a third engine (the llama_cpp_* methods of decode/methods): runner/engines/llama_cpp/engine.py drives
runner/engines/llama_cpp/worker.py processes, each of which runs one llama-server (.ci/llama-cpp-env builds it)."""
from runner.engines.llama_cpp.engine import LlamaCppExecutor
from runner.engines.process import ProcessEngine


class LlamaCppEngine(ProcessEngine):
    executor_class, checking = LlamaCppExecutor, "checking llama.cpp's server and its GGUF files"


ENGINE = LlamaCppEngine
