"""vLLM as a second engine (the vllm_* methods of decode/methods): runner/engines/vllm/engine.py drives
runner/engines/vllm/worker.py processes started with the interpreter of an environment that has vLLM."""
from runner.engines.process import ProcessEngine
from runner.engines.vllm.engine import VllmExecutor


class VllmEngine(ProcessEngine):
    executor_class, checking = VllmExecutor, "checking the vLLM environment"


ENGINE = VllmEngine
