"""Decoding methods built from `ExperimentSettings`: a drafter, its parameters and a rule.

Every `config.method` is a `MethodKind` registered at the end of this module
(`specjax.experiment.registry`): how it is built, its label, what its header says, its own config
checks. An untrained drafter (e.g. a new model-free one) becomes a method with one more
`register(MethodKind(...))` here; trained drafters run through `shipped` and `tree`, which look
their kinds up in `specjax.drafters.registry`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from specjax.acceptance import RULES
from specjax.adaptive import AdaptiveConfig, CostTable
from specjax.config import ModelConfig
from specjax.drafters import (
  DraftModelDrafter,
  PromptLookupDrafter,
  VocabularyMismatchError,
  check_same_vocabulary,
)
from specjax.drafters import registry as drafter_registry
from specjax.drafters.lookup_first import LookupFirstDrafter
from specjax.drafters.suffix import SuffixDrafter, SuffixTreeDrafter
from specjax.drafters.tree_draft_model import DynamicTreeDrafter, StaticTreeDrafter
from specjax.experiment import registry
from specjax.experiment.registry import MethodKind, register
from specjax.experiment.settings import ExperimentSettings, SMCSettings
from specjax.model import Params
from specjax.tokenizer import Tokenizer
from specjax.trees import default_static_tree


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
    loop: which decode loop runs it: "chain" (`specjax.speculative`), "tree"
      (`specjax.tree_speculative`) or "smc" (`specjax.smc`, with `smc` its settings).
    smc: SMC-SD settings (loop "smc" only).
    adaptive: in-loop adaptive K (`specjax.adaptive`), or None for the drafter's fixed K.
    costs: the adaptive loop's cost table, or a function of the padded prompt width returning
      one (set by `specjax.experiment.calibrate.with_costs`).
  """

  name: str
  drafter: Any
  draft_params: Any
  rule: Any = None
  loop: str = "chain"
  smc: SMCSettings | None = None
  adaptive: AdaptiveConfig | None = None
  costs: CostTable | Callable[[int], CostTable] | None = None


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
  """The method's name in records and tables, e.g. "prompt_lookup_k4", "eagle1_k4", or
  "eagle2_eagle1_n16" (EAGLE-2's dynamic tree of 16 nodes drafted by the eagle1 head)."""
  label = registry.get(settings.method).label
  return label(settings) if label else f"{settings.method}_k{settings.drafter.k}"


def describe_method(settings: ExperimentSettings, method: Method | None) -> str:
  """The method as a report's header names it: label, kind, loop, and what drafts."""
  if method is None:
    return "ar"
  text = f"{method.name} ({settings.method}, {method.loop} loop)"
  text += (registry.get(settings.method).describe or _shipped_clause)(settings)
  if method.adaptive is not None:
    text += f", adaptive K in {method.adaptive.ks} (costs: {settings.adaptive.costs})"
  return text


def _layers(settings: ExperimentSettings) -> str:
  """The label's "_l<n>" for a draft model cut to its first n layers, else ""."""
  return f"_l{settings.drafter.n_layers}" if settings.drafter.n_layers else ""


def _head(settings: ExperimentSettings) -> str:
  """The shipped drafter's name without its target ("eagle1" for "eagle1-smollm2-135m")."""
  return settings.drafter.shipped.split("-smollm2")[0]


def _draft_clause(settings: ExperimentSettings) -> str:
  d = settings.drafter
  return f", draft {d.model or settings.model}" + (f" first {d.n_layers} layers" * bool(d.n_layers))


def _shipped_clause(settings: ExperimentSettings) -> str:
  d = settings.drafter
  return f", shipped drafter {d.shipped}" if d.shipped else ""


def _draft_model_clause(settings: ExperimentSettings) -> str:
  return _draft_clause(settings) + _shipped_clause(settings)


static_tree = default_static_tree  # the tree.kind=static topology (heads: tree_heads.fitted_tree)


def load_shipped_drafter(name: str, target: Target, weights_dtype: str = "float32"):
  """A shipped drafter (`specjax/drafters/shipped`) for `target`, with a clear error if absent;
  `weights_dtype` as in `load_shipped`."""
  from specjax.drafters.shipped import ShippedDrafterError, list_shipped, load_shipped

  if name not in list_shipped():
    raise ShippedDrafterError(
      f"shipped drafter {name!r} is not in this checkout (specjax/drafters/shipped has "
      f"{list_shipped()}); train it (see configs/train_*.py) or pick another"
    )
  return load_shipped(name, target.params, target.cfg, weights_dtype=weights_dtype)


def _draft_model(settings, target, load_model):
  """Weights and config of the draft model `settings.drafter` names (checked vocabulary)."""
  d = settings.drafter
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
  return params, cfg


def with_adaptive(method: Method, settings: ExperimentSettings) -> Method:
  """`method` in adaptive mode: chain drafters draft K_max = max(adaptive.ks) (the loop runs them
  with k = K per step), tree methods choose (0, max_depth); "_adaptive" ends the name."""
  a = settings.adaptive
  if method.loop == "tree":
    ks, drafter, suffix = (0, method.drafter.max_depth), method.drafter, "_adaptive"
  else:
    ks, drafter = a.ks, dataclasses.replace(method.drafter, k=max(a.ks))
    suffix = "_adaptive_" + "-".join(map(str, ks))
  config = AdaptiveConfig(ks, a.prior_a, a.prior_b, a.decay)
  return dataclasses.replace(method, name=method.name + suffix, drafter=drafter, adaptive=config)


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
  method = registry.get(settings.method).build(settings, target, load_model)
  return with_adaptive(method, settings) if method and settings.adaptive.on else method


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


# ---- the methods, one registered entry each (`specjax.experiment.registry`) ---------------------


def _ar(settings, target, load_model) -> None:
  return None  # the baseline alone: every run times it anyway


def _chain_only(config, tree: bool) -> None:
  if tree:
    raise ValueError(f"method {config.method!r} has no tree form; drop tree=True")


register(MethodKind("ar", _ar, adapts=False, by_name=_chain_only))


def _prompt_lookup(settings, target, load_model) -> Method:
  d = settings.drafter
  drafter = PromptLookupDrafter(d.k, d.max_ngram, d.min_ngram)
  return Method(method_label(settings), drafter, (), make_rule(settings.rule))


register(MethodKind("prompt_lookup", _prompt_lookup, by_name=_chain_only))


def _draft_model_method(settings, target, load_model) -> Method:
  params, cfg = _draft_model(settings, target, load_model)
  drafter = DraftModelDrafter(cfg, settings.drafter.k)
  return Method(method_label(settings), drafter, params, make_rule(settings.rule))


register(
  MethodKind(
    "draft_model",
    _draft_model_method,
    label=lambda s: f"draft_model{_layers(s)}_k{s.drafter.k}",
    describe=_draft_model_clause,
  )
)


def _shipped(settings, target, load_model) -> Method:
  d = settings.drafter
  shipped = load_shipped_drafter(d.shipped, target, d.weights_dtype)
  return Method(
    method_label(settings), shipped.drafter(d.k), shipped.params, make_rule(settings.rule)
  )


def _needs_shipped(config) -> None:
  if not config.drafter.shipped:
    raise ValueError("config.method=shipped needs config.drafter.shipped (a shipped drafter name)")


register(
  MethodKind(
    "shipped", _shipped, label=lambda s: f"{_head(s)}_k{s.drafter.k}", check=_needs_shipped
  )
)


COPIERS = ("prompt_lookup", "suffix")


def _lookup_first(settings, target, load_model) -> Method:
  """A copier (prompt lookup, or suffix decoding's chain) where the row's last tokens occurred
  before, else a trained chain drafter: the shipped one `drafter.shipped` names, or the draft
  model `drafter.model` (n_layers as usual). A suffix copier's global cache starts empty and the
  runner refills it from earlier outputs before each prompt."""
  d = settings.drafter
  if d.copier not in COPIERS:
    raise ValueError(f"config.drafter.copier must be one of {COPIERS}, got {d.copier!r}")
  if d.shipped:
    shipped = load_shipped_drafter(d.shipped, target, d.weights_dtype)
    model, params = shipped.drafter(d.k), shipped.params
  else:
    params, cfg = _draft_model(settings, target, load_model)
    model = DraftModelDrafter(cfg, d.k)
  suffix = None
  if d.copier == "suffix":
    suffix = SuffixDrafter(k=d.k, min_match=d.min_ngram, **_suffix_matching(settings))
  drafter = LookupFirstDrafter(model, d.k, d.max_ngram, d.min_ngram, suffix)
  return Method(method_label(settings), drafter, drafter.params(params), make_rule(settings.rule))


def _lookup_first_label(settings: ExperimentSettings) -> str:
  d = settings.drafter
  model = _head(settings) if d.shipped else f"draft_model{_layers(settings)}"
  copier = "suffix" if d.copier == "suffix" else "lookup"
  return f"{copier}_first_{model}_k{d.k}"


def _lookup_first_describe(settings: ExperimentSettings) -> str:
  d = settings.drafter
  clause = _shipped_clause(settings) if d.shipped else _draft_clause(settings)
  if d.copier == "suffix":
    return f", suffix decoding's chain (matches of >= {d.min_ngram} tokens) first" + clause
  return f", prompt lookup ({d.min_ngram}-{d.max_ngram}-grams) first" + clause


def _lookup_first_defaults(config, tree: bool) -> None:
  """Lookup first's defaults (`configs/lookup_first.py` starts from them too): the shipped EAGLE-3
  head behind prompt lookup, matches of 2-3 tokens, K = 3."""
  config.method = "lookup_first"
  _chain_only(config, tree)
  config.drafter.shipped, config.drafter.k = "eagle3-smollm2-135m", 3
  config.drafter.max_ngram, config.drafter.min_ngram = 3, 2


register(
  MethodKind(
    "lookup_first",
    _lookup_first,
    label=_lookup_first_label,
    describe=_lookup_first_describe,
    by_name=_lookup_first_defaults,
  )
)


# tree.kind values that draft with a shipped drafter's tree form (`DrafterKind.tree`): EAGLE-2's
# dynamic tree over an EAGLE head, or a static Medusa-style tree over per-depth candidates (Medusa
# heads, or the block of a parallel drafter). Which kinds each takes is `DrafterKind.tree_kind`.
SHIPPED_TREE_KINDS = ("eagle", "heads")


def shipped_tree_drafters(tree_kind: str) -> tuple[str, ...]:
  """The trained drafter kinds whose tree form `tree.kind=<tree_kind>` drafts with, sorted."""
  kinds = (drafter_registry.get(n) for n in drafter_registry.names())
  return tuple(k.name for k in kinds if k.tree is not None and k.tree_kind == tree_kind)


def _tree(settings, target, load_model) -> Method:
  if settings.rule != "auto":
    raise ValueError("tree methods choose their tree rule; leave config.rule=auto")
  t, name = settings.tree, method_label(settings)
  if t.kind in SHIPPED_TREE_KINDS:  # the shipped drafter's own tree form
    shipped = load_shipped_drafter(settings.drafter.shipped, target, settings.drafter.weights_dtype)
    takes = shipped_tree_drafters(t.kind)
    if shipped.kind not in takes:
      raise ValueError(
        f"tree.kind={t.kind} needs a drafter of kind {' or '.join(takes)}; "
        f"{shipped.name} is {shipped.kind}"
      )
    drafter = shipped.tree_drafter(t, target.cfg.vocab_size)
    return Method(name, drafter, shipped.params, None, "tree")
  params, cfg = _draft_model(settings, target, load_model)
  if t.kind == "static":
    drafter = StaticTreeDrafter(cfg, static_tree(t.n_nodes, t.depth))
  else:
    drafter = DynamicTreeDrafter(cfg, t.top_k, t.depth, t.n_nodes)
  return Method(name, drafter, params, None, "tree")


def _tree_label(settings: ExperimentSettings) -> str:
  t = settings.tree
  if t.kind == "eagle":
    return f"eagle2_{_head(settings)}_n{t.n_nodes}"
  if t.kind == "heads":
    return f"{_head(settings)}_tree_n{t.n_nodes}"
  return f"{t.kind}_tree{_layers(settings)}_n{t.n_nodes}"


def _tree_describe(settings: ExperimentSettings) -> str:
  if settings.tree.kind == "eagle":
    return f", EAGLE-2 dynamic tree drafted by the shipped EAGLE head {settings.drafter.shipped}"
  draft = _draft_clause(settings) if settings.tree.kind in ("static", "dynamic") else ""
  return draft + _shipped_clause(settings)


register(MethodKind("tree", _tree, label=_tree_label, describe=_tree_describe))


def _smc(settings, target, load_model) -> Method:
  params, cfg = _draft_model(settings, target, load_model)
  drafter = DraftModelDrafter(cfg, settings.drafter.k)
  return Method(method_label(settings), drafter, params, None, "smc", settings.smc)


def _smc_samples(config) -> None:
  if float(config.sampling.temperature) <= 0:
    raise ValueError("config.method=smc samples: set config.sampling.temperature > 0")


register(
  MethodKind(
    "smc",
    _smc,
    label=lambda s: f"smc{_layers(s)}_p{s.smc.n_particles}_k{s.drafter.k}",
    describe=_draft_model_clause,
    check=_smc_samples,
    adapts=False,
    by_name=_chain_only,
  )
)


def _suffix_matching(settings: ExperimentSettings) -> dict:
  """Suffix decoding's matching, scoring and global-cache settings (config.suffix)."""
  u = settings.suffix
  return dict(
    max_match=u.max_match,
    spec_factor=u.spec_factor,
    min_prob=u.min_prob,
    max_occurrences=u.max_occurrences,
    global_size=u.global_size,
  )


def _suffix(settings, target, load_model) -> Method:
  """Suffix decoding; its global cache starts empty and the runner refills it from earlier
  outputs before each prompt (`SuffixDrafter.with_outputs`)."""
  name, common = method_label(settings), _suffix_matching(settings)
  if settings.suffix.form == "tree":
    if settings.rule != "auto":
      raise ValueError("suffix trees choose their tree rule; leave config.rule=auto")
    t = settings.tree
    drafter = SuffixTreeDrafter(n_nodes=t.n_nodes, max_depth=t.depth, **common)
    return Method(name, drafter, drafter.cache_from_outputs([]), None, "tree")
  drafter = SuffixDrafter(k=settings.drafter.k, **common)
  return Method(name, drafter, drafter.cache_from_outputs([]), make_rule(settings.rule))


def _suffix_form(config, tree: bool) -> None:
  config.suffix.form = "tree" if tree else "chain"


register(
  MethodKind(
    "suffix",
    _suffix,
    label=lambda s: (
      f"suffix_tree_n{s.tree.n_nodes}" if s.suffix.form == "tree" else f"suffix_k{s.drafter.k}"
    ),
    by_name=_suffix_form,
  )
)
