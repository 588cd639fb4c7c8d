"""Drafters: pure-function proposal mechanisms that plug into the speculative decode loop.

Parallel (block) drafters are `pard` and `peagle` (`specjax.drafters.parallel`). Tree drafters
live in `specjax.drafters.tree_draft_model`, `tree_heads`, `tree_eagle` and `suffix`;
both protocols (chain and tree) are in `specjax.drafters.base`, which imports no loop.
"""

from specjax.drafters.base import Drafter, Proposal, StepResult
from specjax.drafters.draft_lm import DraftLMDrafter, DraftLMParams
from specjax.drafters.draft_model import (
  DraftModelDrafter,
  VocabularyMismatchError,
  check_same_vocabulary,
)
from specjax.drafters.eagle import EagleDrafter, EagleParams
from specjax.drafters.medusa import MedusaDrafter, MedusaParams
from specjax.drafters.pard import PardDrafter, PardParams
from specjax.drafters.peagle import PEagleDrafter, PEagleParams
from specjax.drafters.prompt_lookup import PromptLookupDrafter

__all__ = [
  "Drafter",
  "Proposal",
  "StepResult",
  "DraftModelDrafter",
  "VocabularyMismatchError",
  "check_same_vocabulary",
  "PromptLookupDrafter",
  "DraftLMDrafter",
  "DraftLMParams",
  "MedusaDrafter",
  "MedusaParams",
  "EagleDrafter",
  "EagleParams",
  "PardDrafter",
  "PardParams",
  "PEagleDrafter",
  "PEagleParams",
]
