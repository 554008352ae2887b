"""llama.cpp's model-free n-gram drafting (--spec-type ngram-simple): where the last llama_cpp_ngram_n tokens occurred
before in the context, the gamma tokens that followed them are the draft (--spec-ngram-simple-size-m)."""
from dataclasses import dataclass

from decode.methods import prompt_lookup
from decode.methods.base import MethodSpec, option


@dataclass(frozen=True)
class NgramOptions:
    llama_cpp_ngram_n: int = option(3, "llama_cpp_ngram: --spec-ngram-simple-size-n, the n-gram looked up (one "
                                       "size: prompt_lookup tries ngram_max down to ngram_min)", ge=1, le=1024)


def deploy(choice) -> tuple[list[str], list[str]]:
    """Prompt lookup as ngram-simple, its closest: a lookup n-gram of ngram_max tokens, a draft of K."""
    ngram_max = prompt_lookup.SPEC.typed_options(choice.options).ngram_max
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram_max), "--spec-ngram-simple-size-m",
            str(choice.gamma)], []


def server_args(point, drafts, options: NgramOptions):
    return {"spec_type": "ngram-simple", "n_max": point.gamma, "ngram_n": options.llama_cpp_ngram_n}


RANK = 2  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("llama_cpp_ngram", "llama.cpp's n-gram drafting (ngram-simple): the tokens that followed the last "
                  "n-gram's earlier match, up to gamma a step", axes=("gamma",), run=None, has_rounds=True,
                  per_row_timing=False, engine="llama_cpp", counterpart="prompt_lookup", options=NgramOptions,
                  engine_config=server_args, deploy=deploy)
