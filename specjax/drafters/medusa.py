"""Medusa-1 heads (Cai et al. 2024): K extra heads on the target's final hidden state.

Head k maps the target's hidden state h_t (after reading x_0..x_t; the target's own LM head on h_t
predicts x_{t+1}) through a residual block h + SiLU(W_k h + b_k), which starts as the identity
(W_k = 0, b_k = 0), to the token x_{t+k+2}. Heads with `fuse` read h_t plus a learned fusion of
target layers' outputs at t (EAGLE-3's fusion, `eagle.fused`; it starts at zero, so such heads
start as the plain ones): the last layer is shaped for x_{t+1}, and earlier layers keep more of
what the later tokens need. All heads share the target's LM head restricted to a
draft vocabulary (`head` = rows d2t of the target's output matrix, gathered at load time, frozen
in training); Medusa-1 gives each head its own trainable copy, which would not fit a ~20 MB drafter
for a 49k-token vocabulary.

In the decode loop the last committed token x_{n-1} (n = seq_len) has not been fed to the target,
so the newest hidden state is h_{n-2}: verification of the previous block computed it at index
n_committed - 1 of `StepResult.hidden` (index 0 is the previously last token at prev_seq_len - 1).
Head k then proposes x_{n+k}, i.e. draft token k + 1. Chain mode: one token per head.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters.base import DrafterDefaults, Proposal, StepResult
from specjax.drafters.draft_vocab import draw, scatter_logq
from specjax.drafters.eagle import fused, fused_layers
from specjax.drafters.registry import DrafterKind, ShippedDrafterError, register
from specjax.sampling import SamplingConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MedusaParams:
  """Weights of K Medusa heads.

  Attributes:
    w: [K, D, D] residual block weights ([out, in] layout).
    b: [K, D] residual block biases.
    head: [Vd, D] the target's LM head rows for the draft vocabulary (frozen, shared by heads).
    d2t: [Vd] int32 target id of each draft token.
    fuse: [D, n*D] fusion of n target layers added to the heads' input, or None (h alone).
    fuse_norm: [n, D] RMSNorm weights of each fused layer (`eagle.fused`), or None.
  """

  w: jax.Array
  b: jax.Array
  head: jax.Array
  d2t: jax.Array
  fuse: jax.Array | None = None
  fuse_norm: jax.Array | None = None


def head_logits(h: jax.Array, w, b, head, *, broadcast_input: bool = False) -> jax.Array:
  """Logits of K Medusa heads: per head, R residual blocks x <- x + SiLU(W x + b), then its head.

  Args:
    h: [..., D] the target's hidden state, read by every head (cast to float32).
    w: [K, R, D, D] block weights ([out, in] layout); b: [K, R, D] their biases.
    head: [V, D] an output matrix shared by the heads, or [K, V, D] one per head.
    broadcast_input: copy h to every head before the first block and project the copies (the
      order of the published heads' reference); otherwise the first block projects the shared h.
      The two agree up to float32 rounding.

  Returns:
    [..., K, V] float32 (weights are used in their own dtypes; cast them first for float32 dots).
  """
  x = h.astype(jnp.float32)
  if broadcast_input:
    x = jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], w.shape[0], x.shape[-1]))
  for r in range(w.shape[1]):
    if x.ndim == h.ndim:  # the shared h, before the first block
      x = x[..., None, :] + jax.nn.silu(jnp.einsum("...d,ked->...ke", x, w[:, r]) + b[:, r])
    else:
      x = x + jax.nn.silu(jnp.einsum("...kd,ked->...ke", x, w[:, r]) + b[:, r])
  if head.ndim == 2:
    return jnp.einsum("...kd,vd->...kv", x, head)
  return jnp.einsum("...kd,kvd->...kv", x, head)


def medusa_logits(params: MedusaParams, h: jax.Array, layers: jax.Array | None = None) -> jax.Array:
  """Draft-vocabulary logits of every head: h [..., D] (and, for heads that fuse n target layers,
  their outputs layers [n, ..., D] at the same positions) -> [..., K, Vd] float32."""
  x = h.astype(jnp.float32)
  if params.fuse is not None:
    if layers is None:
      raise ValueError("these Medusa heads fuse target layers: pass their outputs (layers)")
    x = x + fused(layers, params.fuse, params.fuse_norm)
  return head_logits(x, params.w[:, None], params.b[:, None], params.head)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MedusaState:
  """What heads read, at position seq_len - 2 of each row: h [B, D] the target's final hidden
  state; layers [n, B, D] the outputs of the target layers the heads fuse, or None."""

  h: jax.Array
  layers: jax.Array | None = None


def initial_state(prefill, prompt_lens) -> MedusaState:
  """The heads' input at each prompt's last position."""
  rows = jnp.arange(prefill.hidden.shape[0])
  pos = prompt_lens - 1
  layers = prefill.layer_hidden
  return MedusaState(
    prefill.hidden[rows, pos].astype(jnp.float32),
    None if layers is None else layers[:, rows, pos].astype(jnp.float32),
  )


def committed_state(state: MedusaState, step) -> MedusaState:
  """The heads' input at each row's newest verified position (index n_committed - 1 of the step;
  along the accepted path in the tree loops), kept for rows that committed nothing."""
  B = step.hidden.shape[0]
  idx = jnp.maximum(step.n_committed - 1, 0)
  rows = jnp.arange(B)
  done = step.n_committed > 0
  h = jnp.where(done[:, None], step.hidden[rows, idx].astype(jnp.float32), state.h)
  if state.layers is None:
    return MedusaState(h)
  layers = step.layer_hidden[:, rows, idx].astype(jnp.float32)
  return MedusaState(h, jnp.where(done[None, :, None], layers, state.layers))


@dataclasses.dataclass(frozen=True)
class MedusaDrafter(DrafterDefaults):
  """Chain drafting with Medusa heads: draft token k + 1 is head k's choice.

  Attributes:
    vocab_size: the target's V (sampled proposals report q over it).
    k: draft length K, at most the number of heads.
  """

  vocab_size: int
  k: int = 4
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return 0

  def init(self, params: MedusaParams, prefill, prompts, prompt_lens, capacity: int):
    del params, prompts, capacity
    return initial_state(prefill, prompt_lens)

  def propose(
    self, params: MedusaParams, state: MedusaState, seq, seq_len, key, sampling: SamplingConfig
  ) -> Proposal:
    if self.k > params.w.shape[0]:
      raise ValueError(f"k={self.k} exceeds the {params.w.shape[0]} trained Medusa heads")
    B = seq.shape[0]
    sub = jax.tree.map(lambda a: a[: self.k], (params.w, params.b))
    sub_params = dataclasses.replace(params, w=sub[0], b=sub[1])
    logits = medusa_logits(sub_params, state.h, state.layers)  # [B, K, Vd]
    tokens, logq_d = draw(key, logits, params.d2t, sampling)
    logq = None if sampling.greedy else scatter_logq(logq_d, params.d2t, self.vocab_size)
    return Proposal(tokens, logq, jnp.full((B,), self.k, jnp.int32), state)

  def sit_out(self, params, state: MedusaState, seq, seq_len, key, sampling) -> MedusaState:
    """Proposing leaves the state as it is, so sitting out costs nothing."""
    del params, seq, seq_len, key, sampling
    return state

  def commit(self, params, state: MedusaState, seq, seq_len, step: StepResult) -> MedusaState:
    return committed_state(state, step)

  def observe(
    self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
  ) -> MedusaState:
    """After an AR step of the adaptive loop: the heads need only its hidden state."""
    return self.commit(params, state, new_seq, new_seq_len, step)


def _chain(shipped, k: int) -> MedusaDrafter:
  n_heads = shipped.params.w.shape[0]
  if k > n_heads:
    raise ShippedDrafterError(f"{shipped.name} has {n_heads} Medusa heads; k={k} is too many")
  return MedusaDrafter(shipped.metadata["target"]["vocab_size"], k, fused_layers(shipped))


def _tree(shipped, t, vocab_size: int):
  """A static Medusa-style tree over the heads (`HeadTreeDrafter`), fitted to the heads' held-out
  top-1 accuracies (`tree_heads.fitted_tree`)."""
  from specjax.drafters.tree_heads import HeadTreeDrafter, fitted_tree, medusa_logits_source

  n_heads = shipped.params.w.shape[0]
  if t.depth > n_heads:
    raise ValueError(f"tree.depth={t.depth} exceeds the {n_heads} Medusa heads")
  tree = fitted_tree(shipped, t)
  return HeadTreeDrafter(
    medusa_logits_source, tree, vocab_size, hidden_layers=fused_layers(shipped)
  )


register(
  DrafterKind(
    "medusa",
    params=lambda t, d2t, out_matrix, target_params: MedusaParams(
      t["w"], t["b"], out_matrix[d2t], d2t, t.get("fuse"), t.get("fuse_norm")
    ),
    chain=_chain,
    tree=_tree,
    head_cfg=False,
    objective="train.objectives.medusa:make",
  )
)
