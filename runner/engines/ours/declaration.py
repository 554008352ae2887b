"""Our engine, declared as every engine is: its methods (each a file of decode/methods: its run function and its
MethodSpec), what it can do (baseline's EngineCaps: the home engine) and no config section of its own (its settings
are the config's engine:, speculative: and the rest). Torch-free and importing only decode/methods:
decode/methods/__init__.py loads it by its path, as it loads the other engines' declarations."""
from decode.methods import baseline, eagle3, early_exit, hf, hybrid, medusa, prompt_lookup, speculative, suffix

METHODS = [  # in the order the report lists them
    baseline.SPEC,
    speculative.SPEC,
    prompt_lookup.SPEC,
    early_exit.SPEC,
    suffix.SPEC,
    hybrid.SPEC,
    eagle3.SPEC,
    medusa.SPEC,
    hf.GENERATE,
    hf.ASSISTED,
    hf.ASSISTED_DEFAULT,
    hf.PROMPT_LOOKUP,
]
