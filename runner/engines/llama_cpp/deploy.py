"""llama.cpp: the recommendation as llama-server's flags, and acceptance as its synthetic rates (build b11434:
common/arg.cpp, common/speculative.cpp; --draft-max and --draft-min were removed there and refuse to start).

- A draft model drafting K every round as measured: --spec-type draft-simple, --spec-draft-n-min K and
  --spec-draft-p-min 0 so that no draft is cut short by its confidence.
- Prompt lookup as ngram-simple, its closest: a lookup n-gram of ngram_max tokens, a draft of K (it matches one n-gram
  length where ours tries ngram_max down to ngram_min, and drafts where it finds the n-gram often enough).
- Synthetic acceptance (benchmarking only): `--spec-synth-rates r_1,...,r_K`, unconditional rates, non-increasing,
  as many as --spec-draft-n-max. The server starts with them only where speculation is on, a drafter to replace the
  verification of (without: "synthetic acceptance requires an initialized speculative decoding context", exit): so
  the flags are draft-simple's, drafting K every round, and the user adds `-md DRAFT.gguf` (any draft: the rates
  decide acceptance, the draft only what a round costs).
"""
from __future__ import annotations

import shlex

from decode.methods import REGISTRY
from eval.deploy.base import AcceptanceError, AcceptanceForm, Choice, Settings, Target, rates_in, rises

NO_EQUIVALENT = {"hybrid": "llama.cpp has no per-round switch between drafters",
                 "early_exit": "llama.cpp drafts with no layers of the target itself",
                 "suffix": "llama.cpp has no suffix trie (ngram-cache keeps n-gram counts, another drafter)",
                 "medusa": "llama.cpp has no Medusa heads",
                 "eagle3": "llama.cpp's EAGLE-3 (--spec-type draft-eagle3) loads its own GGUF conversion of the "
                           "head: not emitted"}
SYNTH_FLAG = "--spec-synth-rates"
TITLE, ENGINE = "llama.cpp", "llama_cpp"


def flags(choice: Choice) -> tuple[list[str] | None, list[str]]:
    """The llama_cpp_* method whose counterpart is the recommended method deploys it (its MethodSpec.deploy)."""
    spec = next((s for s in REGISTRY.values() if s.engine == ENGINE and s.counterpart == choice.method and s.deploy),
                None)
    return spec.deploy(choice) if spec else (None, [])


def export(rates: list[float]) -> str:
    """The flags to add to `llama-server -m TARGET -md DRAFT`: a draft of K every round, its acceptance the rates."""
    k = len(rates)
    return (f"--spec-type draft-simple --spec-draft-n-max {k} --spec-draft-n-min {k} --spec-draft-p-min 0 {SYNTH_FLAG} "
            + ",".join(f"{round(r, 6):g}" for r in rates))


def parse(text: str, where: str) -> list[float]:
    """`--spec-synth-rates P0,P1,...` among its flags (with --spec-draft-n-max K, as many), or the bare list."""
    words = text.split()
    value, k = (words[0] if len(words) == 1 else None), None
    for flag, following in zip(words, words[1:]):
        value = following if flag == SYNTH_FLAG else value
        k = following if flag == "--spec-draft-n-max" else k
    try:
        rates = [float(x) for x in (value or "").split(",") if x.strip()]
    except ValueError:
        rates = None
    rates = rates_in(rates, SYNTH_FLAG, where)
    if rises(rates):
        raise AcceptanceError(f"{where}: {SYNTH_FLAG} rises ({rates}); llama.cpp's rates are unconditional, each at "
                              "most the one before")
    if k is not None and k != str(len(rates)):
        raise AcceptanceError(f"{where}: --spec-draft-n-max is {k} but it has {len(rates)} rates; one rate per draft "
                              "position")
    return rates


TARGET = Target(
    name="llama_cpp", title=TITLE, rank=3,
    settings=Settings(emit=flags, show=shlex.join, off=[], off_text="no speculation flags (off)",
                      no_equivalent=NO_EQUIVALENT),
    acceptance=AcceptanceForm(suffix="llama_cpp.args", key=None, export=export, parse=parse,
                              describe=f"llama.cpp's {SYNTH_FLAG}"))
