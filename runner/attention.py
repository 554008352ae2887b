"""`attn_implementation: auto` where more than one implementation can run (CUDA with flash-attn 2 usable).

flash_attention_2 is not always the faster one at a run's batch size, and transformers drives it through a
different path for masked slots (unpadding) than sdpa (a 4-D mask): the engine's cache holds left padding and
rollback holes. So each candidate runs once at load on the run's largest batch, through the engine's own cache
path (decode/kv.py): a left-padded prompt batch, a rejected draft rolled back so that rows carry holes, then
timed verification forwards of `width` tokens. A candidate is exact when its greedy tokens there are sdpa's
(the reference: it takes any mask as given); the fastest exact one is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from decode.kv import KVState

REFERENCE = "sdpa"
PROMPT_TOKENS = 64  # the longest probe row; the others are shorter, i.e. left padded
REPEATS = 3  # timed forwards per implementation (after one untimed): the best one counts
TIE_OVER_NOISE = 4.0  # a greedy disagreement within this many times the rounding noise is a tie, not an error


@dataclass
class AttentionReading:
    name: str
    forward_s: float  # best of REPEATS synchronised `width`-token forwards at the batch
    mismatches: int  # positions whose greedy token is not the reference's (ties excused)
    positions: int  # positions compared: [B, width]


def pick_attention(readings: list[AttentionReading], batch_size: int, width: int) -> tuple[str, str]:
    """readings of the candidates, the reference (sdpa, exact by definition) among them -> (the fastest exact
    implementation, a note that says which and why)."""
    exact = [r for r in readings if r.mismatches == 0 or r.name == REFERENCE]
    chosen = min(exact, key=lambda r: r.forward_s)
    times = ", ".join(f"{r.name} {r.forward_s * 1e3:.2f} ms" for r in readings)
    why = f"auto -> {chosen.name}: a {width}-token forward at batch {batch_size} after a ragged prompt batch: {times}"
    wrong = [r for r in readings if r not in exact]
    if wrong:
        why += "; " + "; ".join(f"{r.name} gave other greedy tokens than {REFERENCE} at {r.mismatches} of "
                                f"{r.positions} positions (padding and rollback holes)" for r in wrong)
    elif len(readings) > 1:
        why += f"; all gave {REFERENCE}'s greedy tokens"
    return chosen.name, why + " (one measurement at load)"


@dataclass
class ProbeBatch:
    ids: torch.Tensor  # [B, PROMPT_TOKENS] left-padded random prompts: row 0 full, the others shorter
    mask: torch.Tensor  # [B, PROMPT_TOKENS]
    draft: torch.Tensor  # [B, W] a rejected draft: rows 1.. keep part of it, which leaves rollback holes
    verify: torch.Tensor  # [B, W] the timed verification's tokens

    @classmethod
    def random(cls, vocab_size: int, batch_size: int, width: int, device) -> "ProbeBatch":
        generator = torch.Generator().manual_seed(0)
        high = max(4, min(vocab_size, 1000))
        ids, draft, verify = (torch.randint(3, high, (batch_size, n), generator=generator)
                              for n in (PROMPT_TOKENS, width, width))
        lengths = torch.tensor([PROMPT_TOKENS - (row * 7) % (PROMPT_TOKENS // 2) for row in range(batch_size)])
        mask = (torch.arange(PROMPT_TOKENS)[None, :] >= PROMPT_TOKENS - lengths[:, None]).long()
        return cls(*(t.to(device) for t in (ids * mask, mask, draft, verify)))

    def first_row(self) -> "ProbeBatch":
        return ProbeBatch(self.ids[:1], self.mask[:1], self.draft[:1], self.verify[:1])


def run_probe(model, batch: ProbeBatch, clock) -> tuple[float, torch.Tensor]:
    """-> (best time of a verification forward, its fp32 logits [B, W, V]) after the prompts and a rollback
    that leaves rows 1.. with holes (row 0 keeps its draft: none)."""
    rows, width = batch.draft.shape
    device = batch.ids.device
    state = KVState()
    state.forward(model, batch.ids, batch.mask, last_only=True)
    state.forward(model, batch.draft)
    state.keep_prefix_of_last(width, torch.tensor([width] + [row % width for row in range(1, rows)], device=device),
                              width)
    nothing = torch.zeros(rows, dtype=torch.long, device=device)
    best, logits = float("inf"), None
    for repeat in range(REPEATS + 1):
        start = clock.now()
        logits = state.forward(model, batch.verify)
        elapsed = clock.now() - start
        state.keep_prefix_of_last(width, nothing, 0)  # rolled back whole: the next forward sees the same cache
        if repeat:
            best = min(best, elapsed)
    return best, logits


def greedy_mismatches(reference: torch.Tensor, candidate: torch.Tensor, noise: float) -> int:
    """Positions [B, W] whose greedy token differs, not counting ties: where the reference scores the
    candidate's token within TIE_OVER_NOISE x noise of its own."""
    ours, theirs = reference.argmax(-1), candidate.argmax(-1)
    margin = reference.gather(-1, ours[..., None]) - reference.gather(-1, theirs[..., None])
    return int(((ours != theirs) & (margin[..., 0] > TIE_OVER_NOISE * noise)).sum())


@torch.inference_mode()
def settle_attention(loaded, batch_size: int, width: int, clock) -> None:
    """Measure loaded.attention_candidates (REFERENCE among them; see the module's docstring), switch the model
    to the pick, and set loaded.attn_implementation and loaded.attention_note. Nothing to do without candidates."""
    if len(loaded.attention_candidates) < 2:
        return
    model = loaded.model
    # exactness needs a second row (the first is the yardstick); the time is taken at the run's batch size
    batch = ProbeBatch.random(loaded.vocab_size, max(2, batch_size), width, next(model.parameters()).device)
    timed = batch if batch_size > 1 else batch.first_row()
    results = {}
    for name in sorted(loaded.attention_candidates, key=lambda n: n != REFERENCE):  # the reference first
        model.set_attn_implementation(name)
        if model.config._attn_implementation != name:  # a model that cannot switch: keep what it loaded with
            model.set_attn_implementation(loaded.attn_implementation)
            loaded.attention_note = f"auto -> {loaded.attn_implementation} ({type(model).__name__} cannot switch " \
                                    "its attention after loading, so none was measured)"
            return
        seconds, logits = run_probe(model, batch, clock)
        results[name] = (seconds if timed is batch else run_probe(model, timed, clock)[0], logits)
    reference = results[REFERENCE][1]
    # rounding alone, at this model and dtype: the reference's row 0 in the batch vs the same row alone (other
    # kernel shapes, same masks); independent of any candidate, so a candidate wrong everywhere is not excused
    model.set_attn_implementation(REFERENCE)
    noise = float((run_probe(model, batch.first_row(), clock)[1][0] - reference[0]).abs().max())
    readings = [AttentionReading(name, seconds, greedy_mismatches(reference, logits, noise), reference.shape[:2].numel())
                for name, (seconds, logits) in results.items()]
    chosen, loaded.attention_note = pick_attention(readings, batch_size, width)
    model.set_attn_implementation(chosen)
    loaded.attn_implementation = chosen
