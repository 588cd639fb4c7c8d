"""The short route for the common case: a target and a method by name, a batch of chat prompts in,
texts and per-row metrics out.

    from specjax.api import SpeculativeLM

    lm = SpeculativeLM("smollm2-135m-instruct", method="eagle3-smollm2-135m", k=4)
    for c in lm.generate(["Why is the sky blue?", "Write a haiku about rain."]):
        print(c.text, c.metrics["tau"])

`method` is "ar", "prompt_lookup", "suffix", "smc", "lookup_first" (prompt lookup first, the
shipped EAGLE-3 head otherwise; another behind it by `config={"drafter.shipped": ...}`, suffix
decoding's chain as the copier by `config={"drafter.copier": "suffix"}`), or the
name of any shipped drafter
(`specjax.drafters.shipped.list_shipped()`); `tree=True` drafts with that drafter's tree form
(EAGLE-2's dynamic tree for an EAGLE head, a static Medusa-style tree for Medusa heads and the
parallel drafters). Everything else an experiment config can set is reachable through `config`
(a dict of dotted `specjax.experiment.settings.base_config` fields, e.g. {"tree.n_nodes": 32}).
The batch runs as one call of the method's compiled loop (`specjax.experiment.runner.run_method`);
outputs at temperature 0 equal the AR loop's, row by row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from specjax.experiment import registry
from specjax.experiment.methods import Method, Target, build_method, load_target
from specjax.experiment.runner import draft_slots, prompt_width, run_method
from specjax.experiment.settings import ExperimentSettings, base_config, settings_from_config
from specjax.generate import pad_prompts
from specjax.metrics import summarize


def untrained() -> tuple[str, ...]:
  """The methods `SpeculativeLM` takes by name besides shipped drafters: those whose registry
  entry has `by_name` (ar, prompt_lookup, smc, suffix, lookup_first), which need no weights
  named."""
  return tuple(n for n in registry.names() if registry.get(n).by_name is not None)


@dataclasses.dataclass(frozen=True)
class Completion:
  """One row's result.

  Attributes:
    text: the decoded response.
    tokens: its token ids (stop token included when one ended it).
    metrics: the row's speculative counters (`specjax.metrics.summarize`: tau, acceptance_rate,
      drafted, accepted, target_passes, ...); for AR only target_passes.
  """

  text: str
  tokens: list[int]
  metrics: dict


def method_settings(
  model: str, method: str, *, k: int | None = None, tree: bool = False, temperature: float = 0.0,
  max_new_tokens: int = 128, dtype: str = "float32", seed: int = 0, config: dict | None = None,
) -> ExperimentSettings:  # fmt: skip
  """The experiment settings `SpeculativeLM` runs (validated like any experiment config).

  Raises:
    ValueError: for an unknown method or config field, or a bad value.
  """
  from specjax.drafters.shipped import list_shipped

  c = base_config()
  c.model, c.dtype, c.seed = model, dtype, seed
  c.max_new_tokens = max_new_tokens
  c.sampling.temperature = temperature
  if method in untrained():
    c.method = method
    registry.get(method).by_name(c, tree)  # its chain or tree form (ValueError if it has none)
  elif method in list_shipped():
    c.drafter.shipped = method
    if tree:
      from specjax.drafters import registry as drafter_registry
      from specjax.drafters.shipped import read_metadata

      # the tree.kind that drafts with its kind's tree form ("eagle" or "heads")
      c.method, c.tree.kind = "tree", drafter_registry.get(read_metadata(method)["kind"]).tree_kind
    else:
      c.method = "shipped"
  else:
    raise ValueError(
      f"unknown method {method!r}; use one of {untrained()} or a shipped drafter: {list_shipped()}"
    )
  if k is not None:
    c.drafter.k = k
  for field, value in (config or {}).items():
    *path, leaf = field.split(".")
    node = c
    for name in path:
      node = node.get(name) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      raise ValueError(f"config field {field!r} does not exist (see experiment/settings.py)")
    node[leaf] = value
  return settings_from_config(c)


class SpeculativeLM:
  """A target and one speculative method, loaded once; `generate` runs batches of chat prompts.

  Args:
    model: registry name, Hugging Face directory or .gguf file of the target, or a loaded
      `Target` (`specjax.experiment.methods.load_target`) to share one between methods.
    method: "ar", "prompt_lookup", "suffix", "smc" (SMC-SD; temperature > 0, draft model and
      particles from config, e.g. {"smc.n_particles": 8}), "lookup_first" (prompt lookup, the
      shipped EAGLE-3 head otherwise) or a shipped drafter's name.
    k: draft length (block size for a parallel drafter); default the settings' (4; 3 for
      "lookup_first").
    tree: draft a token tree (the drafter's tree form) instead of a chain.
    temperature: 0 for greedy; > 0 samples (lossless rules keep the target's distribution).
    max_new_tokens: tokens generated per row at most.
    config: more experiment settings by dotted name (e.g. {"tree.n_nodes": 32}).
  """

  def __init__(
    self, model: str | Target = "smollm2-135m-instruct", method: str = "ar", *,
    k: int | None = None, tree: bool = False, temperature: float = 0.0, max_new_tokens: int = 128,
    dtype: str = "float32", seed: int = 0, config: dict | None = None,
  ):  # fmt: skip
    name = model.name if isinstance(model, Target) else model
    self.settings = method_settings(
      name, method, k=k, tree=tree, temperature=temperature, max_new_tokens=max_new_tokens,
      dtype=dtype, seed=seed, config=config,
    )  # fmt: skip
    self.target: Target = model if isinstance(model, Target) else load_target(model, dtype)
    self.method: Method | None = build_method(self.settings, self.target)
    self.gen = self.settings.generate_config(self.target.tokenizer.stop_ids)
    self._calls = 0

  def generate(self, prompts: Sequence[str | Sequence[dict]]) -> list[Completion]:
    """Responses to chat prompts: each a user message, or a list of {"role", "content"} turns.

    Raises:
      ValueError: for an empty batch, or a prompt that does not fit the target's context.
    """
    if not prompts:
      raise ValueError("generate needs at least one prompt")
    tok = self.target.tokenizer
    chats = [[{"role": "user", "content": p}] if isinstance(p, str) else list(p) for p in prompts]
    ids = [tok.encode_chat(c) for c in chats]
    longest, limit = max(len(i) for i in ids), self.target.cfg.max_position
    slots = draft_slots(self.method) if self.method is not None else 0
    room = limit - self.gen.max_new_tokens - slots
    if longest > room:
      raise ValueError(
        f"a prompt of {longest} tokens + max_new_tokens {self.gen.max_new_tokens} does not fit "
        f"the {limit}-token context of {self.target.name}; shorten it or lower max_new_tokens"
      )
    P, L = pad_prompts(ids, bucket=prompt_width(longest, self.settings.min_prompt_width, room))
    key = jax.random.fold_in(jax.random.PRNGKey(self.settings.seed), self._calls)
    self._calls += 1
    out = jax.block_until_ready(run_method(self.target, self.method, self.gen, P, L, key))
    return [self._completion(out, b) for b in range(len(ids))]

  def _completion(self, out, b: int) -> Completion:
    n = int(out.lengths[b])
    tokens = np.asarray(out.tokens[b, :n]).tolist()
    if self.method is None:
      metrics = {"target_passes": int(out.target_passes[b])}
    else:
      metrics = summarize(jax.tree.map(lambda x: x[b : b + 1], out.metrics))
    return Completion(self.target.tokenizer.decode(tokens), tokens, metrics)
