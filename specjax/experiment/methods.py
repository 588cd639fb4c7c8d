"""Decoding methods built from `ExperimentSettings`: a drafter, its parameters and a rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from specjax.acceptance import RULES
from specjax.config import ModelConfig
from specjax.drafters import (
  DraftModelDrafter,
  PromptLookupDrafter,
  VocabularyMismatchError,
  check_same_vocabulary,
)
from specjax.experiment.settings import ExperimentSettings
from specjax.model import Params
from specjax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Target:
  """The model being accelerated.

  Attributes:
    params: its weights.
    cfg: its config.
    tokenizer: its tokenizer (needs a chat template for Spec-Bench prompts).
    name: how reports name it.
  """

  params: Params
  cfg: ModelConfig
  tokenizer: Tokenizer
  name: str


@dataclasses.dataclass(frozen=True)
class Method:
  """A speculative method as the runner times it.

  Attributes:
    name: the column label in records and tables (e.g. "prompt_lookup_k4").
    drafter: static drafter object.
    draft_params: the drafter's parameter pytree (() for prompt lookup).
    rule: acceptance rule, or None for the loop's default (greedy at temperature 0).
  """

  name: str
  drafter: Any
  draft_params: Any
  rule: Any = None


def truncate_layers(params: Params, cfg: ModelConfig, n_layers: int) -> tuple[Params, ModelConfig]:
  """The model's first `n_layers` decoder layers, followed by its own final norm and LM head.

  Used untrained this is an early-exit draft model that shares the target's vocabulary by
  construction (its acceptance rate is what it is; nothing is tuned).
  """
  if not 0 < n_layers <= cfg.n_layers:
    raise ValueError(f"n_layers must be in [1, {cfg.n_layers}], got {n_layers}")
  layers = jax.tree.map(lambda a: a[:n_layers], params.layers)
  return dataclasses.replace(params, layers=layers), cfg.replace(n_layers=n_layers)


def make_rule(name: str) -> Any:
  """The acceptance rule called `name` ("auto" leaves the choice to the decode loop)."""
  return None if name == "auto" else RULES[name]()


def method_label(settings: ExperimentSettings) -> str:
  d = settings.drafter
  if settings.method == "draft_model" and d.n_layers:
    return f"draft_model_l{d.n_layers}_k{d.k}"
  return f"{settings.method}_k{d.k}"


def build_method(
  settings: ExperimentSettings,
  target: Target,
  load_model: Callable[[str], tuple[Params, ModelConfig, Tokenizer | None]] | None = None,
) -> Method | None:
  """Builds the method `settings` names; None for "ar" (the baseline alone).

  Args:
    settings: the experiment.
    target: the loaded target (a draft model spec of "" reuses its weights).
    load_model: loader for draft models given by spec (default `specjax.loading.registry`).

  Raises:
    VocabularyMismatchError: if a draft model does not share the target's vocabulary.
  """
  d, rule = settings.drafter, make_rule(settings.rule)
  if settings.method == "ar":
    return None
  if settings.method == "prompt_lookup":
    drafter = PromptLookupDrafter(d.k, d.max_ngram, d.min_ngram)
    return Method(method_label(settings), drafter, (), rule)
  if d.model in ("", settings.model):
    params, cfg, tok = target.params, target.cfg, target.tokenizer
  else:
    if load_model is None:
      from specjax.loading.registry import load_model
    params, cfg, tok = load_model(d.model)
  check_same_vocabulary(target.cfg, cfg)
  if tok is not None and tok.backend.get_vocab() != target.tokenizer.backend.get_vocab():
    raise VocabularyMismatchError(f"draft model {d.model!r} maps tokens to different ids")
  if d.n_layers:
    params, cfg = truncate_layers(params, cfg, d.n_layers)
  return Method(method_label(settings), DraftModelDrafter(cfg, d.k), params, rule)


def load_target(spec: str, dtype: str = "float32") -> Target:
  """Loads the target by registry name, Hugging Face directory or .gguf file (with its tokenizer).

  Raises:
    ValueError: if the checkpoint has no tokenizer or no chat template.
  """
  from specjax.loading.registry import load_model

  params, cfg, tok = load_model(spec, dtype=dtype)
  if tok is None or tok.chat_template is None:
    raise ValueError(f"{spec!r} needs a tokenizer with a chat template to run chat prompts")
  return Target(params, cfg, tok, spec)
