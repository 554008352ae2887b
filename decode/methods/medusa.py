"""Medusa (Cai et al. 2024) in our engine: K heads on the target's last hidden state each draft one token further
ahead, up to min(gamma, K) a round, as a chain or a token tree (a draft of kind medusa: the heads' folder;
decode/head_models.py)."""
from decode.methods.base import MethodSpec
from decode.methods.eagle3 import run
from decode.methods.speculative import Trees


SPEC = MethodSpec("medusa", "Medusa heads on the target's last hidden state draft up to min(gamma, heads) tokens, "
                  "one per head, a chain or a token tree (a draft of kind medusa; our engine)",
                  axes=("draft", "gamma", "tree", "synthetic_acceptance"), run=run, has_rounds=True,
                  draft_kinds=("medusa",), tree_auto=True, options=Trees,
                  head_kinds=("medusa",))
