"""SGLang: the recommendation as its server flags (server_args.py's --speculative-*; its version not pinned by the
copy at hand): one chain of K drafts (top-k 1; NGRAM's breadth 1), K + 1 tokens verified. No acceptance form."""
from __future__ import annotations

import shlex

from eval.targets.base import HF, Choice, Settings, Target

TITLE = "SGLang"

# our method -> --speculative-algorithm, or a head's kind -> it
NGRAM = "NGRAM"
ALGORITHM = {"speculative": "STANDALONE", "prompt_lookup": NGRAM, "eagle3": {"eagle": "EAGLE", "eagle3": "EAGLE3"}}
NO_EQUIVALENT = {"hybrid": "SGLang has no per-round switch between drafters",
                 "early_exit": "SGLang drafts with no layers of the target itself",
                 "suffix": "SGLang has no suffix decoding", "medusa": "SGLang has no Medusa heads"}


def flags(choice: Choice) -> tuple[list[str] | None, list[str]]:
    algorithm = ALGORITHM.get(choice.method)
    algorithm = algorithm.get(choice.kind) if isinstance(algorithm, dict) else algorithm
    if algorithm is None:
        return None, []
    out = ["--speculative-algorithm", algorithm]
    model, notes = choice.model_for(HF, TITLE)
    if model:
        out += ["--speculative-draft-model-path", model]
    # NGRAM's top-k is its trie's breadth (server_args.py _handle_ngram sets --speculative-eagle-topk from
    # --speculative-ngram-max-bfs-breadth, default 10: a tree): a chain is breadth 1
    width = ["--speculative-ngram-max-bfs-breadth", "1"] if algorithm == NGRAM else ["--speculative-eagle-topk", "1"]
    return out + ["--speculative-num-steps", str(choice.gamma), *width,
                  "--speculative-num-draft-tokens", str(choice.gamma + 1)], notes


TARGET = Target(name="sglang", title=TITLE, rank=1,
                settings=Settings(emit=flags, show=shlex.join, off=[], off_text="no speculation flags (off)",
                                  no_equivalent=NO_EQUIVALENT))
