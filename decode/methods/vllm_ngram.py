"""vLLM's n-gram speculation (prompt lookup) at gamma, with this config's n-gram sizes."""
from decode.methods.base import MethodSpec
from decode.methods.prompt_lookup import Ngrams


def speculative_config(point, drafts, options: Ngrams):
    return {"method": "ngram", "num_speculative_tokens": point.gamma,
            "prompt_lookup_min": options.ngram_min, "prompt_lookup_max": options.ngram_max}


RANK = 2  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("vllm_ngram", "vLLM's n-gram speculation (prompt lookup, speculative.ngram_min..ngram_max)",
                  axes=("gamma",), run=None, has_rounds=True, per_row_timing=False, engine="vllm", counterpart="prompt_lookup", options=Ngrams,
                  engine_config=speculative_config)
