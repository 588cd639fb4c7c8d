"""The training prompt recipe: which user messages the target answers to make self-distilled data.

Prompts are the first user turn of ShareGPT conversations (mostly-ASCII, deduplicated) and GSM8K
train questions, each rendered with the target's chat template, filtered by length, shuffled with a
seed, and checked against every evaluation prompt (`train.decontam`). The first `n_heldout` prompts
of the shuffled list are held out for evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence

from train import decontam, sources


@dataclasses.dataclass(frozen=True)
class PromptRecipe:
  """What goes into the prompt list (frozen: its fields are recorded in shipped metadata).

  Attributes:
    n_sharegpt: ShareGPT prompts wanted.
    n_gsm8k: GSM8K train questions wanted.
    n_heldout: prompts (from the front of the shuffled list) kept for held-out metrics.
    min_tokens: shortest rendered prompt.
    max_tokens: longest rendered prompt.
    min_ascii: least fraction of ASCII characters in a ShareGPT prompt (keeps mostly English).
    seed: shuffle seed.
  """

  n_sharegpt: int = 1200
  n_gsm8k: int = 200
  n_heldout: int = 24
  min_tokens: int = 24
  max_tokens: int = 320
  min_ascii: float = 0.97
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class TrainPrompt:
  """One prompt: where it came from, its text and its chat-template tokens."""

  source: str
  index: int
  text: str
  tokens: tuple[int, ...]


def _ascii_fraction(text: str) -> float:
  return sum(c.isascii() for c in text) / max(len(text), 1)


def sharegpt_first_turns(data: bytes, min_ascii: float) -> list[tuple[int, str]]:
  """(conversation index, first human message) for mostly-ASCII conversations, deduplicated."""
  seen, out = set(), []
  for i, turns in enumerate(sources.sharegpt_conversations(data)):
    first = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
    text = first.strip() if isinstance(first, str) else ""
    key = decontam.normalize(text)
    if text and key not in seen and _ascii_fraction(text) >= min_ascii:
      seen.add(key)
      out.append((i, text))
  return out


def select(
  candidates: Sequence[tuple[str, int, str]],
  want: int,
  tokenizer,
  recipe: PromptRecipe,
  clean: decontam.Decontaminator,
  rng: random.Random,
) -> list[TrainPrompt]:
  """Shuffles candidates and keeps the first `want` that fit the length limits and are clean."""
  order = list(range(len(candidates)))
  rng.shuffle(order)
  out = []
  for j in order:
    if len(out) == want:
      break
    source, index, text = candidates[j]
    if len(text) > 8 * recipe.max_tokens:  # cheap pre-filter before tokenizing
      continue
    tokens = tokenizer.encode_chat([{"role": "user", "content": text}])
    if recipe.min_tokens <= len(tokens) <= recipe.max_tokens and clean.is_clean(text):
      out.append(TrainPrompt(source, index, text, tuple(tokens)))
  return out


def build_prompts(recipe: PromptRecipe, tokenizer, shared_dir: str = "") -> list[TrainPrompt]:
  """The recipe's prompts, shuffled together; evaluation prompts are excluded.

  Args:
    recipe: the recipe.
    tokenizer: the target's tokenizer (with its chat template).
    shared_dir: the shared data directory (default: `../shared/data` beside the repository).
  """
  clean = decontam.Decontaminator(sources.eval_texts(shared_dir))
  rng = random.Random(recipe.seed)
  chat = sharegpt_first_turns(sources.read_bytes(sources.SHAREGPT), recipe.min_ascii)
  math = sources.gsm8k_questions(sources.read_bytes(sources.GSM8K_TRAIN, shared_dir))
  prompts = select(
    [("sharegpt", i, t) for i, t in chat], recipe.n_sharegpt, tokenizer, recipe, clean, rng
  )
  prompts += select(
    [("gsm8k_train", i, t) for i, t in enumerate(math)],
    recipe.n_gsm8k,
    tokenizer,
    recipe,
    clean,
    rng,
  )
  rng.shuffle(prompts)
  return prompts


def fingerprint(prompts: Sequence[TrainPrompt]) -> str:
  """sha256 over (source, index, text) of every prompt, in order: identifies the data exactly."""
  h = hashlib.sha256()
  for p in prompts:
    h.update(json.dumps([p.source, p.index, p.text]).encode())
  return h.hexdigest()
