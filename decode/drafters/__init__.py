from decode.drafters.base import Drafter, Proposal
from decode.drafters.draft_model import DraftModelDrafter
from decode.drafters.early_exit import EarlyExitDrafter
from decode.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["Drafter", "Proposal", "DraftModelDrafter", "EarlyExitDrafter", "PromptLookupDrafter"]
