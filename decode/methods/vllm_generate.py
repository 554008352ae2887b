"""vLLM serving the target alone: the reference of every vLLM point (its ratios are against this, never against
our engine's baseline). Runs in a vLLM worker process (runner/vllm_engine.py), not here."""
from decode.methods.base import MethodSpec


def speculative_config(point, drafts, options):
    return None


SPEC = MethodSpec("vllm_generate", "vLLM, the target alone: the reference of the vllm_* points", axes=(), run=None,
                  is_reference=True, per_row_timing=False, engine="vllm", counterpart="baseline", vllm_config=speculative_config)
