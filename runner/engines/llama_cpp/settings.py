"""The config section of the llama_cpp_* methods (config llama_cpp:, the llama.cpp engine's settings), and the check of
a config that uses them; declaration.py names this file (SETTINGS), decode/methods/__init__.py ENGINE_SECTIONS loads
it by its path (it imports pydantic and nothing of the repository)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ENGINE = "llama_cpp"
DOC = "The `llama_cpp_*` methods ([engines.md](engines.md#llamacpp-as-a-third-engine))."
EXAMPLE = "{server: .llama-cpp/bin/llama-server, weights: as_is, threads: null, repack: true, pairing: auto}"
WEIGHTS = ("as_is", "f32", "f16", "q8_0", "q4_k_m")


class LlamaCppConfig(BaseModel):
    """The config's llama_cpp section."""
    model_config = ConfigDict(extra="forbid")

    server: str | None = Field(None, description="llama.cpp's llama-server binary (.ci/llama-cpp-env DIR builds "
                                                 "DIR/bin/llama-server); default: $SPECULATE_LLAMA_SERVER, else "
                                                 "llama-server on PATH. Missing or not running: exit 2")
    weights: Literal[WEIGHTS] = Field("as_is", description="the GGUF files as they are, or re-quantized to f32, f16, "
                                                           "q8_0 or q4_k_m by llama-quantize (next to the server; "
                                                           "cached beside the file)")
    threads: int | None = Field(None, ge=1, description="the server's threads (-t, -tb); default: every core, as ours")
    repack: bool = Field(True, description="llama.cpp's weight repacking for this CPU (its default); false: -nr (a "
                                           "server that dies at its start, of SIGILL or SIGSEGV, as with AMX in some "
                                           "VMs, runs without it)")
    pairing: Literal["auto", "batch", "engine"] = Field(
        "auto", description="batch: every server of a comparison up, batches back to back as ours; engine: one "
                            "server at a time over all batches; auto: batch where the weights fit")
    start_timeout_s: float = Field(600, gt=0, allow_inf_nan=False, description="a server not up by then fails")


def check(config) -> None:
    """A config with llama_cpp_* methods (ValueError: the validation error's message)."""
    if config.cluster.backend != "none":
        raise ValueError("the llama_cpp_* methods run in a server of the driver, not on a Ray cluster: set "
                         "cluster.backend: none")
    if not config.device.startswith("cpu"):
        raise ValueError(f"the llama_cpp_* methods run llama.cpp's CPU build (.ci/llama-cpp-env), not on "
                         f"{config.device}: set device: cpu, or drop them")
    if config.generation.do_sample:
        raise ValueError("the llama_cpp_* methods run greedy only: set generation.do_sample: false, or drop them")


SECTION, CHECK = LlamaCppConfig, check
