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


def sharegpt_first_turns(data: bytes, min_ascii: float) -> list[tuple[int, str]]:
  """(conversation index, first human message) for mostly-ASCII conversations, deduplicated."""
  seen, out = set(), []
  for i, turns in enumerate(sources.sharegpt_conversations(data)):
    first = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
    text = first.strip() if isinstance(first, str) else ""
    key = decontam.normalize(text)
    if text and key not in seen and sources.ascii_fraction(text) >= min_ascii:
      seen.add(key)
      out.append((i, text))
  return out


def select(
  candidates: Sequence[tuple[str, int, str]],
  want: int,
  tokenizer,
  recipe: PromptRecipe | TaskRecipe,
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


@dataclasses.dataclass(frozen=True)
class TaskRecipe:
  """A corpus that extends a packed one with task-shaped prompts (`train.task_prompts`).

  The new prompt list keeps the base corpus's prompts (those the decontaminator now rejects are
  dropped) and adds tasks. Its order is: the base's held-out front, `heldout_per_task` held-out
  prompts of each task, the base's answered training prompts, then a shuffle of every task's
  training prompts with the base's next `n_base_more` unanswered prompts (so any prefix of what is
  generated next mixes them), and last the base's other unanswered prompts.

  Attributes:
    base: file name of the packed corpus extended.
    base_sha256: its sha256.
    tasks: ((task, prompts wanted), ...) in `task_prompts.TASKS` order.
    heldout_per_task: held-out prompts of each task.
    n_base_more: unanswered base prompts shuffled in with the tasks.
    min_tokens, max_tokens: rendered length limits of a task prompt.
    min_ascii: the base recipe's ShareGPT filter (rebuilds its first turns).
    seed: shuffle seed.
  """

  base: str
  base_sha256: str
  tasks: tuple[tuple[str, int], ...]
  heldout_per_task: int = 40
  n_base_more: int = 3000
  min_tokens: int = 16
  max_tokens: int = 1024
  min_ascii: float = 0.97
  seed: int = 2


def task_prompts_for(
  recipe: TaskRecipe, tokenizer, clean: decontam.Decontaminator, pools=None
) -> dict[str, list[TrainPrompt]]:
  """Each task's prompts: its candidates in a seeded shuffle, the first that fit the length limits
  and are clean, as many as the recipe wants (`pools`: `task_prompts.Pools`, default ShareGPT's)."""
  from train import task_prompts

  out = {}
  for k, (task, want) in enumerate(recipe.tasks):
    cands = [(task, i, text) for i, text in task_prompts.candidates(task, pools)]
    rng = random.Random(recipe.seed * 1000 + k)
    out[task] = select(cands, want, tokenizer, recipe, clean, rng)
  return out


def extend_prompts(
  recipe: TaskRecipe,
  base: Sequence[TrainPrompt],
  base_heldout: int,
  base_answered: set[int],
  tokenizer,
  clean: decontam.Decontaminator,
  pools=None,
) -> tuple[list[TrainPrompt], int]:
  """The extended prompt list (order in `TaskRecipe`) and its number of held-out prompts.

  Args:
    recipe: the extension.
    base: the base corpus's whole prompt list, in its order.
    base_heldout: its held-out front.
    base_answered: indices into `base` that the base corpus answered.
    tokenizer: the target's tokenizer.
    clean: the decontaminator over every evaluation set (`sources.eval_texts`).
    pools: `task_prompts.Pools` to draw tasks from (default: the pinned ShareGPT file's).
  """
  kept = [i for i, p in enumerate(base) if clean.is_clean(p.text)]
  tasks = task_prompts_for(recipe, tokenizer, clean, pools)
  h = recipe.heldout_per_task
  front = [base[i] for i in kept if i < base_heldout]
  front += [p for ps in tasks.values() for p in ps[:h]]
  answered = [base[i] for i in kept if i >= base_heldout and i in base_answered]
  rest = [base[i] for i in kept if i >= base_heldout and i not in base_answered]
  mixed = [p for ps in tasks.values() for p in ps[h:]] + rest[: recipe.n_base_more]
  random.Random(recipe.seed).shuffle(mixed)
  return front + answered + mixed + rest[recipe.n_base_more :], len(front)
