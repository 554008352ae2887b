from decode.drafters.base import Drafter, Proposal
from decode.drafters.draft_model import DraftModelDrafter

__all__ = ["Drafter", "Proposal", "DraftModelDrafter"]
