"""EAGLE heads (Li et al. 2024, 2025): one decoder layer that drafts in the target's feature space.

Notation: x_t are tokens, f_t the target's feature at position t (after reading x_0..x_t; for
EAGLE-1 the final post-norm hidden state, whose LM-head image is the target's distribution for
x_{t+1}; for EAGLE-3 a learned fusion of the outputs of three target layers). The head reads the
pair (x_{t+1}, g_t) at position t, where g_t = f_t when the target has computed it and the head's
own previous output otherwise, and outputs o_t: EAGLE-1 regresses o_t onto f_{t+1} and scores
x_{t+2} with the target's LM head; EAGLE-3 scores x_{t+2} with its own norm and head.

    x_in = W_in [embed(x_{t+1}); g_t]        (W_in: [D, 2D])
    o_t  = DecoderLayer(x_in)                (causal attention over the head's own KV cache)

Drafting keeps a per-row KV cache of the head. Invariant at propose: slots [0, c) hold pairs
computed from true target features and the m pending features f_c..f_{c+m-1} (verified by the
last target pass, m = n_committed, plus one per AR step of the adaptive loop since, up to the
window's width) are fed as one window, together with tokens x_{c+1}..x_{c+m}
read from the sequence. The output at window index m - 1 (position seq_len - 2) gives draft token
1; tokens 2..K feed (d_{j-1}, o) one at a time. `commit` rolls the cache back to c = prev_seq_len - 1
(everything from there on was built on guesses) and stores the new verified features.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.branching import run_one_of
from specjax.config import ModelConfig
from specjax.drafters.base import DrafterDefaults, Proposal, StepResult
from specjax.drafters.decoder_layer import finish_layer, project_qkv
from specjax.drafters.draft_vocab import draw, scatter_logq
from specjax.drafters.registry import DrafterKind, layer_params, register
from specjax.kernels import linear, take_rows
from specjax.kernels.cache_attention import grouped_query_attention
from specjax.kv_cache import KVCache, init_cache, read_rows, write_rows
from specjax.model import LayerParams, attention_mask, rms_norm
from specjax.sampling import SamplingConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EagleParams:
  """Weights of an EAGLE head (layer weights without the stacked L axis).

  Attributes:
    w_in: [D, 2D] input projection of [embedding; feature].
    layer: one decoder layer.
    head: [Vd, D] draft-vocabulary LM head (the target's rows for EAGLE-1, trained for EAGLE-3).
    d2t: [Vd] int32 target id of each draft token.
    embed: [V, D] the target's token embedding (frozen, shared).
    fuse: [D, n*D] fusion of the n target layers (EAGLE-3), or None.
    norm: [D] norm before the head (EAGLE-3), or None (EAGLE-1 scores o_t directly).
    fuse_norm: [n, D] RMSNorm weights applied to each fused layer's output before `fuse`, or None
      (raw layer outputs are fused). The target's residual stream carries a few channels three
      orders of magnitude above the rest (SmolLM2: |x| up to ~2.5e4 in layers 15 and 27 against a
      median RMS of ~7-27), which would otherwise drown the token embedding in W_in's input.
  """

  w_in: jax.Array
  layer: LayerParams
  head: jax.Array
  d2t: jax.Array
  embed: jax.Array
  fuse: jax.Array | None = None
  norm: jax.Array | None = None
  fuse_norm: jax.Array | None = None


FUSE_NORM_EPS = 1e-5


def fused(layer_hidden: jax.Array, fuse: jax.Array, fuse_norm: jax.Array | None) -> jax.Array:
  """The fusion of n target layers [n, ..., D] into one [..., D] feature: each layer's output
  RMS-normalised by its row of fuse_norm [n, D] (when given), concatenated, then projected by fuse
  [D, n*D]."""
  layers = list(layer_hidden.astype(jnp.float32))
  if fuse_norm is not None:
    layers = [rms_norm(x, w, FUSE_NORM_EPS) for x, w in zip(layers, fuse_norm)]
  return linear(jnp.concatenate(layers, -1), fuse)  # [..., n*D] -> [..., D]


def feature(params: EagleParams, hidden: jax.Array, layer_hidden: jax.Array | None) -> jax.Array:
  """The head's feature g from the target: hidden [..., D] (EAGLE-1) or fused layers [n, ..., D]."""
  if params.fuse is None:
    return hidden.astype(jnp.float32)
  return fused(layer_hidden, params.fuse, params.fuse_norm)


def head_logits(params: EagleParams, o: jax.Array, eps: float) -> jax.Array:
  """Draft-vocabulary logits [..., Vd] from head outputs o [..., D]."""
  if params.norm is not None:
    o = rms_norm(o, params.norm, eps)
  return linear(o, params.head)


def layer_inputs(params: EagleParams, tokens: jax.Array, g: jax.Array) -> jax.Array:
  """W_in [embed(tokens); g]: [B, T] tokens and [B, T, D] features -> [B, T, D]."""
  e = take_rows(params.embed, tokens).astype(jnp.float32)
  return linear(jnp.concatenate([e, g.astype(jnp.float32)], -1), params.w_in)


def cached_layer(
  params: EagleParams, x, cache: KVCache, cfg: ModelConfig, positions=None, new_mask=None,
  split: tuple[int, LayerParams] | None = None,
):  # fmt: skip
  """The layer on T new inputs per row at slots cache.lengths + [0, T); returns (o, cache with
  lengths advanced by T). positions: [B, T] RoPE positions (default the slots); new_mask:
  [B, T, T] attention among the new inputs (default causal; a tree's ancestor mask); split:
  (n, lp): inputs n.. go through weights lp instead of the head's layer, in the same attention
  (P-EAGLE's masks in the pass that also holds the head's own step)."""
  B, T = x.shape[:2]
  if positions is None:
    positions = cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
  n, rest = split if split is not None else (T, params.layer)
  parts = [(lp, slice(a, b)) for lp, a, b in ((params.layer, 0, n), (rest, n, T)) if b > a]
  qkv = [project_qkv(lp, x[:, s], positions[:, s], cfg) for lp, s in parts]
  q, k, v = (jnp.concatenate(a, 1) for a in zip(*qkv))
  k_all = write_rows(cache.k[0], k, cache.lengths)
  v_all = write_rows(cache.v[0], v, cache.lengths)
  mask = attention_mask(cache.lengths, T, cache.capacity, new_mask)
  attn = grouped_query_attention(q, k_all, v_all, mask).reshape(B, T, -1)
  o = jnp.concatenate([finish_layer(lp, x[:, s], attn[:, s], cfg) for lp, s in parts], 1)
  return o, KVCache(k_all[None], v_all[None], cache.lengths + T)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EagleState:
  """Per-row drafting state.

  Attributes:
    cache: the head's KV cache ([1, B, S, Hkv, Dh]); lengths = c, slots built from true features.
    pending: [B, K + 1, D] verified features f_c.. not yet fed.
    n_pending: [B] how many of them are valid.
  """

  cache: KVCache
  pending: jax.Array
  n_pending: jax.Array


@dataclasses.dataclass(frozen=True)
class EagleDrafter(DrafterDefaults):
  """Chain drafting with an EAGLE-1 or EAGLE-3 head.

  Attributes:
    cfg: the head layer's config (n_layers = 1; vocab_size = the target's V).
    k: draft length K.
    hidden_layers: target layers fused by an EAGLE-3 head; () for EAGLE-1.
  """

  cfg: ModelConfig
  k: int = 4
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return 1  # the pending window reads one token past the verified block

  def init(self, params: EagleParams, prefill, prompts, prompt_lens, capacity: int) -> EagleState:
    B, Tp = prompts.shape
    g = feature(params, prefill.hidden, prefill.layer_hidden)  # [B, Tp, D]
    cache = init_cache(self.cfg, B, capacity, jnp.float32)
    if Tp > 1:  # pairs (x_{t+1}, f_t) for t < Tp - 1; slots at or past prompt_len - 1 are stale
      x = layer_inputs(params, prompts[:, 1:], g[:, :-1])
      _, cache = cached_layer(params, x, cache, self.cfg)
    pending = jnp.zeros((B, self.k + 1, g.shape[-1]), jnp.float32)
    pending = pending.at[:, 0].set(g[jnp.arange(B), prompt_lens - 1])
    return EagleState(cache.with_lengths(prompt_lens - 1), pending, jnp.ones((B,), jnp.int32))

  def propose(
    self, params: EagleParams, state: EagleState, seq, seq_len, key, sampling: SamplingConfig
  ) -> Proposal:
    B = seq.shape[0]
    keys = jax.random.split(key, self.k)
    c, m = state.cache.lengths, state.n_pending
    tokens = read_rows(seq, c + 1, state.pending.shape[1])  # K + 1 (K_max + 1 when adaptive)
    o, cache = cached_layer(
      params, layer_inputs(params, tokens, state.pending), state.cache, self.cfg
    )
    o_last = o[jnp.arange(B), jnp.maximum(m - 1, 0)]  # [B, D], at position seq_len - 2
    tok0, logq0 = draw(
      keys[0], head_logits(params, o_last, self.cfg.norm_eps), params.d2t, sampling
    )
    cache = cache.with_lengths(c + m)

    def step(carry, key):
      cache, tok, o_prev = carry
      x = layer_inputs(params, tok[:, None], o_prev[:, None])
      o, cache = cached_layer(params, x, cache, self.cfg)
      nxt, logq = draw(key, head_logits(params, o[:, 0], self.cfg.norm_eps), params.d2t, sampling)
      return (cache, nxt, o[:, 0]), (nxt, logq)

    (cache, _, _), (toks, logqs) = jax.lax.scan(step, (cache, tok0, o_last), keys[1:])
    drafted = jnp.concatenate([tok0[:, None], jnp.moveaxis(toks, 0, 1)], 1)  # [B, K]
    logq = None
    if not sampling.greedy:
      logq_d = jnp.concatenate([logq0[:, None], jnp.moveaxis(logqs, 0, 1)], 1)
      logq = scatter_logq(logq_d, params.d2t, self.cfg.vocab_size)
    state = EagleState(cache, state.pending, state.n_pending)
    return Proposal(drafted, logq, jnp.full((B,), self.k, jnp.int32), state)

  def observe(self, params: EagleParams, state: EagleState, seq, seq_len, new_seq, new_seq_len,
              step: StepResult, key, sampling) -> EagleState:  # fmt: skip
    """After an AR step of the adaptive loop (`specjax.adaptive`): the step's feature joins the
    pending window, which the next proposal feeds whole (no head pass now). Only when a row's window
    is full is it fed here (one head-layer pass for the batch) and the step committed as one whose
    draft was rejected, so a run of AR steps costs one head pass per window width, not one per step.
    """
    del key, sampling
    width = state.pending.shape[1]
    m = jnp.minimum(step.n_committed, 1).astype(jnp.int32)  # 0 for rows already done

    def defer(state):
      layers = None if step.layer_hidden is None else step.layer_hidden[:, :, :1]
      g = feature(params, step.hidden[:, :1], layers)  # [B, 1, D]: the AR step's one position
      slot = jnp.arange(width)[None, :] == state.n_pending[:, None]
      put = (slot & (m[:, None] > 0))[..., None]
      return EagleState(state.cache, jnp.where(put, g, state.pending), state.n_pending + m)

    def feed(state):
      return self.commit(params, self.feed(params, state, seq), new_seq, new_seq_len, step)

    full = jnp.any(state.n_pending + m > width)
    return run_one_of(full.astype(jnp.int32), (defer, feed), state)

  def feed(self, params: EagleParams, state: EagleState, seq) -> EagleState:
    """The pending window fed to the head layer (one pass, nothing drafted): the verified pairs
    land in slots c .. c + m - 1, as a proposal leaves them; `commit` then rolls the length back
    to the verified ones."""
    tokens = read_rows(seq, state.cache.lengths + 1, state.pending.shape[1])
    x = layer_inputs(params, tokens, state.pending)
    _, cache = cached_layer(params, x, state.cache, self.cfg)
    return EagleState(cache, state.pending, state.n_pending)

  def sit_out(self, params: EagleParams, state: EagleState, seq, seq_len, key, sampling):
    del seq_len, key, sampling
    return self.feed(params, state, seq)

  def commit(self, params: EagleParams, state: EagleState, seq, seq_len, step: StepResult):
    g = feature(params, step.hidden, step.layer_hidden)  # [B, K + 1, D]
    cache = state.cache.with_lengths(jnp.maximum(step.prev_seq_len - 1, 0))
    return EagleState(cache, g, step.n_committed.astype(jnp.int32))


def draft_head(t, d2t, out_matrix) -> jax.Array:
  """[Vd, D]: the shipped head rows, then the target's own output rows for the draft tokens past
  them (a vocabulary extended beyond the trained rows: `d2t` may list more tokens than `head` has
  rows); all of them are the target's rows when nothing is shipped (EAGLE-1)."""
  if "head" not in t:
    return out_matrix[d2t]
  n = t["head"].shape[0]
  if n > d2t.shape[0]:
    raise ValueError(f"the head has {n} rows for a draft vocabulary (d2t) of {d2t.shape[0]}")
  if n == d2t.shape[0]:
    return t["head"]
  return jnp.concatenate([t["head"], out_matrix[d2t[n:]].astype(t["head"].dtype)], 0)


def params_from_tensors(t, d2t, out_matrix, target_params) -> EagleParams:
  return EagleParams(
    w_in=t["w_in"],
    layer=layer_params(t, "layer"),
    head=draft_head(t, d2t, out_matrix),
    d2t=d2t,
    embed=target_params.embed,
    fuse=t.get("fuse"),
    norm=t.get("norm"),
    fuse_norm=t.get("fuse_norm"),
  )


def fused_layers(shipped) -> tuple[int, ...]:
  return tuple(shipped.metadata["config"].get("fuse_layers", ()))


def _tree(shipped, t, vocab_size: int):
  """EAGLE-2's dynamic tree over the head (`specjax.drafters.tree_eagle`)."""
  from specjax.drafters.tree_eagle import EagleTreeDrafter

  del vocab_size
  return EagleTreeDrafter(shipped.head_cfg, t.top_k, t.depth, t.n_nodes, fused_layers(shipped))


register(
  DrafterKind(
    "eagle",
    params=params_from_tensors,
    chain=lambda shipped, k: EagleDrafter(shipped.head_cfg, k, fused_layers(shipped)),
    tree=_tree,
    tree_kind="eagle",
    objective="train.objectives.eagle:make",
  )
)
