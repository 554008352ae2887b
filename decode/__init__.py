"""Decoding algorithms: pure functions over tensors plus one drafter interface."""
from decode.drafters import DraftModelDrafter, Drafter, Proposal
from decode.generate import Clock, RowRecord, choose_next, generate_baseline, generate_speculative, prefill
from decode.settings import Generation, Sampling
from decode.vocab import VocabMismatch, check_vocab_compatible

__all__ = ["Clock", "Drafter", "DraftModelDrafter", "Generation", "Proposal", "RowRecord", "Sampling",
           "VocabMismatch", "check_vocab_compatible", "choose_next", "generate_baseline",
           "generate_speculative", "prefill"]
