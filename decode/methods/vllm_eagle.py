"""vLLM's EAGLE / EAGLE-3 speculation with a head for the target: a draft entry of kind eagle or eagle3
(draft: {model: <the head's folder or hub id>, kind: eagle3}). Nothing here drafts with heads: vLLM only."""
from decode.methods.base import MethodSpec


def speculative_config(point, drafts, options):
    draft = drafts[point.draft]
    return {"method": draft.kind, "model": draft.vllm_model, "num_speculative_tokens": point.gamma}


RANK = 3  # its place among the engine's methods (decode/methods/__init__.py)
SPEC = MethodSpec("vllm_eagle", "vLLM's EAGLE / EAGLE-3 speculation with a head trained for the target (a draft of "
                  "kind eagle or eagle3)", axes=("draft", "gamma"), run=None, has_rounds=True, per_row_timing=False,
                  engine="vllm", counterpart="eagle3", draft_kinds=("eagle", "eagle3"), engine_config=speculative_config)
