from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen; the same settings warp p and q."""
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


@dataclass(frozen=True)
class Generation:
    max_new_tokens: int = 128
    sampling: Sampling = Sampling()
    eos_token_ids: tuple[int, ...] = ()
