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
in `StepResult.path`. This module sits below the drafters and the loops: it imports neither.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

import jax

from specjax.sampling import SamplingConfig

if TYPE_CHECKING:
  from specjax.decode import Prefill
  from specjax.trees import TokenTree


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


class Drafter(Protocol):
  """Structural type of a drafter (see the module docstring for the call order)."""

  k: int
  # Target layers whose outputs the drafter consumes (EAGLE-3); () for none. The loop requests them
  # in prefill and verify and hands them over in `Prefill.layer_hidden` / `StepResult.layer_hidden`.
  hidden_layers: tuple[int, ...]

  def init(
    self, params: Any, prefill: Prefill, prompts: jax.Array, prompt_lens: jax.Array, capacity: int
  ) -> Any: ...

  def propose(
    self,
    params: Any,
    state: Any,
    seq: jax.Array,
    seq_len: jax.Array,
    key: jax.Array,
    sampling: SamplingConfig,
  ) -> Proposal: ...

  def commit(
    self, params: Any, state: Any, seq: jax.Array, seq_len: jax.Array, step: StepResult
  ) -> Any: ...

  def reorder(self, state: Any, rows: jax.Array) -> Any:
    """Row i of the returned state is row rows[i] of `state` (forks and resampling in SMC-SD)."""
    ...

  def capacity_slack(self) -> int:
    """Extra cache/sequence slots the drafter writes past seq_len (beyond the K + 1 of verify)."""
    ...


class TreeDrafter(Protocol):
  """Structural type of a tree drafter (same call order; `propose` drafts a `TreeProposal`).

  Attributes:
    n_nodes: N, nodes per drafted tree including the root (static).
    max_depth: the deepest node's depth (static).
    draws: how children are chosen when sampling: "deterministic" (top-k), or "without_replacement"
      / "iid" draws from the logq the proposal reports.
    hidden_layers: target layers the drafter consumes (as `Drafter.hidden_layers`).
  """

  n_nodes: int
  max_depth: int
  draws: str
  hidden_layers: tuple[int, ...]

  def capacity_slack(self) -> int: ...

  def init(
    self, params: Any, prefill: Prefill, prompts: jax.Array, prompt_lens: jax.Array, capacity: int
  ) -> Any: ...

  def propose(
    self,
    params: Any,
    state: Any,
    seq: jax.Array,
    seq_len: jax.Array,
    key: jax.Array,
    sampling: SamplingConfig,
  ) -> TreeProposal: ...

  def commit(
    self, params: Any, state: Any, seq: jax.Array, seq_len: jax.Array, step: StepResult
  ) -> Any: ...
