"""The config section of the vllm_* methods (config vllm:, the vLLM engine's settings), and the check of a config that
uses them; declaration.py names this file (SETTINGS). utils/config.py adds the section to the config from
decode/methods/__init__.py ENGINE_SECTIONS (the engine's name, this SECTION, its CHECK, and EXAMPLE and DOC for
docs/config.md). Loaded by its path: it imports pydantic and nothing of the repository."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENGINE = "vllm"
DOC = "The `vllm_*` methods ([engines.md](engines.md#vllm-as-a-second-engine))."
EXAMPLE = "{python: .vllm-venv/bin/python, tensor_parallel_size: 1, dtype: null, enforce_eager: null, pairing: auto}"


class VllmConfig(BaseModel):
    """The config's vllm section."""
    model_config = ConfigDict(extra="forbid")

    python: str | None = Field(None, description="the interpreter of an environment with vLLM (.ci/vllm-env builds "
                                                 "one); default: this one, where vllm imports. Missing, without "
                                                 "vLLM, or a model vLLM does not serve: exit 2")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine (a target larger than one GPU)")
    max_model_len: int | None = Field(None, ge=16, description="default: the longest prompt + max_new_tokens + 16")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] | None = Field(None, description="default: target.dtype")
    enforce_eager: bool | None = Field(None, description="no CUDA graphs / compilation; default: vLLM's (false)")
    kv_cache_memory_bytes: int | None = Field(None, ge=1, description="KV cache size; on a CPU default 256 MiB")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="default: 0.9 of the GPU memory "
                                                                              "free when the engine starts")
    pairing: Literal["auto", "batch", "engine"] = Field(
        "auto", description="batch: every vLLM engine of a comparison resident, batches back to back as ours; "
                            "engine: one engine at a time over all batches; auto: batch where the weights fit")
    engine_args: dict[str, Any] = Field({}, description="more keyword arguments of vllm.LLM, passed as they are")
    start_timeout_s: float = Field(900, gt=0, allow_inf_nan=False, description="an engine not up by then fails")

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, value):
        # what the tool sets per point or relies on to measure: overriding it would change what a point is
        reserved = {"model", "dtype", "seed", "max_model_len", "speculative_config", "per_request_spec_decode_metrics",
                    "disable_log_stats", "enable_prefix_caching", "tensor_parallel_size", "enforce_eager",
                    "kv_cache_memory_bytes", "gpu_memory_utilization", "quantization", "revision"}
        taken = sorted(set(value) & reserved)
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set in vllm.engine_args: the tool sets it (per point, or "
                             "to measure: the points' speculative_config, detailed per-request counters, no prefix "
                             "cache); use the vllm.* keys or the point's axes")
        return value


def check(config) -> None:
    """A config with vllm_* methods (ValueError: the validation error's message)."""
    if config.cluster.backend != "none":
        raise ValueError("the vllm_* methods run in a vLLM worker of the driver, not on a Ray cluster: set "
                         "cluster.backend: none (vllm.tensor_parallel_size spreads a model over GPUs)")


SECTION, CHECK = VllmConfig, check
