"""The drafter protocols every speculative method implements: chain (`Drafter`) and tree
(`TreeDrafter`), with what they exchange with the decode loops (`specjax.decode`).

A drafter is a static, hashable object (its configuration) plus a state pytree; it holds no Python
state. The decode loop calls, inside one compiled `lax.while_loop`:

    state = drafter.init(params, prefill, prompts, prompt_lens, capacity)
    proposal = drafter.propose(params, state, seq, seq_len, key, sampling)
    ... target verifies proposal.tokens, the acceptance rule picks n_accepted per row ...
    state = drafter.commit(params, proposal.state, seq, seq_len, step)

`seq` [B, S] holds each row's prompt and generated tokens and `seq_len` [B] how many are valid; the
last valid token has not yet been fed to the target (its K/V are written by the next verify pass).
A tree drafter's `propose` returns a `TreeProposal` instead, and its `commit` gets the accepted path
in `StepResult.path`. The adaptive loops also call `catch_up` and `observe`; a drafter inherits their
defaults from `DrafterDefaults`, `LazyDrafterDefaults` or `TreeDrafterDefaults`. This module sits
below the drafters and the loops: it imports neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jax

from specjax.sampling import SamplingConfig

if TYPE_CHECKING:
  from specjax.kv_cache import KVCache
  from specjax.trees import TokenTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prefill:
  """The target's pass over the prompts (what `init` gets; `specjax.decode.prefill` makes it).

  Attributes:
    logits: [B, V] at each row's last prompt token.
    hidden: [B, Tp, D] final hidden states over the padded prompt.
    layer_hidden: [n, B, Tp, D] requested layer outputs, or None.
    cache: holds every prompt token; lengths = prompt_lens (padding slots are stale).
  """

  logits: jax.Array
  hidden: jax.Array
  layer_hidden: jax.Array | None
  cache: KVCache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Proposal:
  """K drafted tokens per row.

  Attributes:
    tokens: [B, K] int32 drafted tokens.
    logq: [B, K, V] float32 log of the drafter's processed distribution each token was drawn from,
      or None for a deterministic proposal (a point mass, e.g. prompt lookup).
    n_drafted: [B] int32 <= K, how many of the K tokens are real proposals; acceptance stops there.
    state: the drafter state after proposing.
  """

  tokens: jax.Array
  logq: jax.Array | None
  n_drafted: jax.Array
  state: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepResult:
  """What the loop tells a drafter after verification.

  Attributes:
    prev_seq_len: [B] sequence lengths before this step.
    n_accepted: [B] drafted tokens the rule accepted.
    n_committed: [B] tokens appended to the sequence this step (accepted drafts that survived stop
      and budget truncation, plus the correction/bonus token); 0 for finished rows.
    hidden: [B, K + 1, D] the target's final hidden states at the verified positions (position 0
      is the previously last token, position i the i-th drafted token).
    layer_hidden: [n, B, K + 1, D] outputs of the target layers named by the drafter's
      `hidden_layers` at the same positions, or None when it names none.
    path: tree loops only: [B, P] node ids of the accepted root-to-node path (P = max depth + 1,
      entries past n_accepted are junk); `hidden` and `layer_hidden` are then taken along it
      (index 0 the root, index i the accepted node of depth i). None in the chain loops.
  """

  prev_seq_len: jax.Array
  n_accepted: jax.Array
  n_committed: jax.Array
  hidden: jax.Array
  layer_hidden: jax.Array | None = None
  path: jax.Array | None = None


# What the tree loop tells a tree drafter: a `StepResult` whose `path` is set.
TreeStepResult = StepResult


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeProposal:
  """A drafted tree per row and the drafter state after drafting it.

  Attributes:
    tree: the rows' trees.
    state: the drafter state after drafting.
    n_drafted: optional [B] real drafted nodes, for the metrics of a drafter whose trees leave
      slots unused (default: all N - 1).
  """

  tree: TokenTree
  state: Any
  n_drafted: jax.Array | None = None


class _DrafterCalls(Protocol):
  """What the loops call on every drafter, chain or tree (see the module docstring's order)."""

  # Target layers whose outputs the drafter consumes (EAGLE-3); () for none. The loop requests them
  # in prefill and verify and hands them over in `Prefill.layer_hidden` / `StepResult.layer_hidden`.
  hidden_layers: tuple[int, ...]

  def capacity_slack(self) -> int:
    """Extra cache/sequence slots the drafter writes past seq_len (beyond the verify block)."""
    ...

  def init(
    self, params: Any, prefill: Prefill, prompts: jax.Array, prompt_lens: jax.Array, capacity: int
  ) -> Any: ...

  def commit(
    self, params: Any, state: Any, seq: jax.Array, seq_len: jax.Array, step: StepResult
  ) -> Any: ...

  def catch_up(
    self, params: Any, state: Any, seq: jax.Array, seq_len: jax.Array, width: int
  ) -> Any:
    """Adaptive loops, before every propose: the state brought up to date with the tokens AR steps
    committed since the last commit (draft models feed them here, lazily)."""
    ...

  def observe(
    self, params: Any, state: Any, seq: jax.Array, seq_len: jax.Array, new_seq: jax.Array,
    new_seq_len: jax.Array, step: StepResult, key: jax.Array, sampling: SamplingConfig,
  ) -> Any:  # fmt: skip
    """Adaptive loops, after an AR step (given as a step whose draft was rejected, with the
    target's hidden states padded to the loop's width): the state after it. Not called for a
    drafter whose state has no arrays."""
    ...


class Drafter(_DrafterCalls, Protocol):
  """Structural type of a chain drafter: K drafted tokens per step."""

  k: int

  def propose(
    self,
    params: Any,
    state: Any,
    seq: jax.Array,
    seq_len: jax.Array,
    key: jax.Array,
    sampling: SamplingConfig,
  ) -> Proposal: ...


class TreeDrafter(_DrafterCalls, Protocol):
  """Structural type of a tree drafter: an N-node `TreeProposal` per step; `commit` gets the
  accepted path in `StepResult.path`.

  Attributes:
    n_nodes: N, nodes per drafted tree including the root (static).
    max_depth: the deepest node's depth (static).
    draws: how children are chosen when sampling: "deterministic" (top-k), or "without_replacement"
      / "iid" draws from the logq the proposal reports.
  """

  n_nodes: int
  max_depth: int
  draws: str

  def propose(
    self,
    params: Any,
    state: Any,
    seq: jax.Array,
    seq_len: jax.Array,
    key: jax.Array,
    sampling: SamplingConfig,
  ) -> TreeProposal: ...


@runtime_checkable
class DraftsFromOutputs(Protocol):
  """A drafter whose parameters draw on earlier outputs (suffix decoding's global cache): the
  experiment runner rebuilds them before each prompt from the method's own parameters."""

  def with_outputs(self, params: Any, outputs: Sequence[Sequence[int]]) -> Any:
    """`params` with what draws on earlier outputs rebuilt from `outputs` (same shapes)."""
    ...


class DrafterDefaults:
  """The adaptive-loop hooks' defaults for a chain drafter (inherit, override what differs), and
  `sit_out`'s."""

  def sit_out(self, params, state, seq, seq_len, key, sampling):
    """The state for `commit` after a step whose draft another drafter made
    (`specjax.drafters.lookup_first`): a whole proposal's, discarded. A drafter with a cheaper way
    to stay current (EAGLE: one head pass over its pending window) overrides it."""
    return self.propose(params, state, seq, seq_len, key, sampling).state

  def catch_up(self, params, state, seq, seq_len, width: int):
    """Nothing to catch up."""
    del params, seq, seq_len, width
    return state

  def observe(self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling):
    """A discarded k = 1 proposal (it feeds the drafter the pending tokens), then the AR step
    committed as a rejected draft."""
    one = dataclasses.replace(self, k=1)
    state = one.propose(params, state, seq, seq_len, key, sampling).state
    return self.commit(params, state, new_seq, new_seq_len, step)


class LazyDrafterDefaults(DrafterDefaults):
  """For drafters that feed the AR steps' tokens in `catch_up` (which they define): AR steps cost
  them nothing."""

  def observe(self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling):
    del params, seq, seq_len, new_seq, new_seq_len, step, key, sampling
    return state


class TreeDrafterDefaults(DrafterDefaults):
  """The hooks' defaults for a tree drafter: a stateful one must define `observe` or
  `catch_up` (`LazyDrafterDefaults`) to run in the adaptive tree loop."""

  def observe(self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling):
    raise ValueError(f"{type(self).__name__} cannot take an AR step (no catch_up or observe)")


class StaticTreeShape:
  """n_nodes, max_depth and draws of a tree drafter with a static topology `self.tree`
  (`specjax.trees.StaticTree`) whose children are drawn without replacement when
  `self.sample_children` is set while sampling, and the check that such draws are possible."""

  def __post_init__(self):
    if self.sample_children and not self.tree.ranks_are_contiguous():
      raise ValueError("sampled children need each node's children to have ranks 0 .. c - 1")

  @property
  def n_nodes(self) -> int:
    return self.tree.n_nodes

  @property
  def max_depth(self) -> int:
    return self.tree.max_depth

  @property
  def draws(self) -> str:
    return "without_replacement" if self.sample_children else "deterministic"
