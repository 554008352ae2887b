"""SGLang: the recommendation as its server flags (server_args.py's --speculative-*; its version not pinned by the
copy at hand): one chain of K drafts (top-k 1; NGRAM's breadth 1), K + 1 tokens verified. No acceptance form.

K by batch size (per_batch_size), checked against SGLang 0.5.23's speculative/adaptive_spec_params.py and
arg_groups/speculative_hook.py: `--speculative-adaptive` with `--speculative-adaptive-config FILE`, a JSON object
{"least batch size of a tier": {"candidate_steps": [...]}, ...} (a batch takes the tier of the largest key at or below
its size); within a tier the server moves between the candidates on an EMA of the accepted length, so one candidate
holds the tier at K (0: no drafts). --speculative-num-steps must be one of the candidates. Only EAGLE and EAGLE3 (top-k
1) adapt: the server turns adaptive off, with a warning, for any other algorithm."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from eval.deploy.base import HF, Choice, Settings, Target

TITLE = "SGLang"


@dataclass(frozen=True)
class Algorithm:
    """An SGLang --speculative-algorithm, declared as an engine declares its methods: the method of ours it deploys
    (counterpart, as MethodSpec.counterpart) and the draft kinds it loads (none: any). name None: SGLang has no form
    of its counterpart, for the reason `why`."""
    name: str | None
    counterpart: str
    draft_kinds: tuple[str, ...] = ()
    why: str = ""


NGRAM = "NGRAM"
ALGORITHMS = (
    Algorithm("STANDALONE", counterpart="speculative"),
    Algorithm(NGRAM, counterpart="prompt_lookup"),
    Algorithm("EAGLE", counterpart="eagle3", draft_kinds=("eagle",)),
    Algorithm("EAGLE3", counterpart="eagle3", draft_kinds=("eagle3",)),
    Algorithm(None, counterpart="hybrid", why="SGLang has no per-round switch between drafters"),
    Algorithm(None, counterpart="early_exit", why="SGLang drafts with no layers of the target itself"),
    Algorithm(None, counterpart="suffix", why="SGLang has no suffix decoding"),
    Algorithm(None, counterpart="medusa", why="SGLang has no Medusa heads"),
)


def flags(choice: Choice) -> tuple[list[str] | None, list[str]]:
    algorithm = next((a.name for a in ALGORITHMS if a.name and a.counterpart == choice.method
                      and (not a.draft_kinds or choice.kind in a.draft_kinds)), None)
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


ADAPTIVE = ("EAGLE", "EAGLE3")  # adaptive_spec_params.py adaptive_unsupported_reason
ADAPTIVE_FILE = "sglang-adaptive.json"


def per_batch_size(settings: list[str], ranges: list[list[int]]) -> tuple[list[str] | None, list[str]]:
    """The flags at the largest K with --speculative-adaptive and its tiers' file (the file in a note), where the
    algorithm adapts; else None and a note: one K a server."""
    algorithm = settings[settings.index("--speculative-algorithm") + 1]
    if algorithm not in ADAPTIVE:
        return None, [f"{TITLE} takes K by batch size (--speculative-adaptive) for {' and '.join(ADAPTIVE)} only, not "
                      f"{algorithm}: one K a server, each batch size's server in the settings by load"]
    top = max(k for _, _, k in ranges)
    out = list(settings)
    out[out.index("--speculative-num-steps") + 1] = str(top)
    out[out.index("--speculative-num-draft-tokens") + 1] = str(top + 1)
    tiers = {str(lo): {"candidate_steps": [k]} for lo, _, k in ranges}
    return out + ["--speculative-adaptive", "--speculative-adaptive-config", ADAPTIVE_FILE], [
        f"{ADAPTIVE_FILE} for {TITLE}: {json.dumps(tiers)} (each key the least batch size of its tier, one candidate "
        f"K: the tier holds it)", f"above {ranges[-1][1]} rows (the largest load priced) {TITLE} holds K {ranges[-1][2]}"]


TARGET = Target(name="sglang", title=TITLE, rank=1,
                settings=Settings(emit=flags, show=shlex.join, off=[], off_text="no speculation flags (off)",
                                  no_equivalent={a.counterpart: a.why for a in ALGORITHMS if a.name is None},
                                  per_batch_size=per_batch_size))
