"""The target interface (`specjax.target`): a Flax NNX causal LM that is not specjax's Llama runs
as the target of the AR, chain and tree loops, and the speculative loops reproduce its AR output.

The toy module is a small GPT (learned absolute positions, LayerNorm, GELU, multi-head attention)
written with flax.nnx; it keeps its keys and values in specjax's KVCache layout. Its known answer
is its own full-sequence forward: the cached loops must produce the host-side greedy argmax chain.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from toy_models import tiny_model

from specjax.drafters import DraftModelDrafter, PromptLookupDrafter
from specjax.drafters.tree_draft_model import StaticTreeDrafter
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.kv_cache import KVCache, write_rows
from specjax.metrics import summarize
from specjax.model import Output, attention_mask
from specjax.nnx_target import NNXTarget
from specjax.speculative import speculative_generate
from specjax.target import LlamaTarget, as_target
from specjax.tree_speculative import tree_speculative_generate
from specjax.trees import StaticTree

V, D, L, H, MAX_POS = 64, 32, 2, 4, 256


class Block(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.ln1, self.ln2 = nnx.LayerNorm(D, rngs=rngs), nnx.LayerNorm(D, rngs=rngs)
    self.qkv = nnx.Linear(D, 3 * D, rngs=rngs)
    self.out = nnx.Linear(D, D, rngs=rngs)
    self.up, self.down = nnx.Linear(D, 4 * D, rngs=rngs), nnx.Linear(4 * D, D, rngs=rngs)

  def __call__(self, x, k_cache, v_cache, lengths, mask):
    B, T, _ = x.shape
    q, k, v = jnp.split(self.qkv(self.ln1(x)).reshape(B, T, 3 * H, D // H), 3, axis=2)
    k_all, v_all = write_rows(k_cache, k, lengths), write_rows(v_cache, v, lengths)
    s = jnp.einsum("bthd,bshd->bhts", q, k_all) / np.sqrt(D // H)
    p = jax.nn.softmax(jnp.where(mask[:, None], s, -1e30), -1)
    x = x + self.out(jnp.einsum("bhts,bshd->bthd", p, v_all).reshape(B, T, D))
    return x + self.down(jax.nn.gelu(self.up(self.ln2(x)))), k_all, v_all


class TinyGPT(nnx.Module):
  """A causal LM that follows `specjax.model.forward`'s contract (TargetModel.forward)."""

  def __init__(self, seed: int):
    rngs = nnx.Rngs(seed)
    self.embed = nnx.Embed(V, D, rngs=rngs)
    self.pos = nnx.Embed(MAX_POS, D, rngs=rngs)
    self.blocks = nnx.List([Block(rngs) for _ in range(L)])
    self.ln = nnx.LayerNorm(D, rngs=rngs)
    self.head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, tokens, cache, *, positions=None, new_mask=None, hidden_layers=(),
               logit_positions=None):  # fmt: skip
    B, T = tokens.shape
    lengths = cache.lengths
    if positions is None:
      positions = lengths[:, None] + jnp.arange(T)[None, :]
    mask = attention_mask(lengths, T, cache.capacity, new_mask)
    x = self.embed(tokens) + self.pos(positions)
    ks, vs, outs = [], [], []
    for i, block in enumerate(self.blocks):
      x, k, v = block(x, cache.k[i], cache.v[i], lengths, mask)
      ks.append(k)
      vs.append(v)
      outs.append(x)
    hidden = self.ln(x)
    at = hidden if logit_positions is None else jnp.take_along_axis(
      hidden, logit_positions[..., None], 1
    )  # fmt: skip
    layer_hidden = jnp.stack([outs[i] for i in hidden_layers]) if hidden_layers else None
    return Output(self.head(at), hidden, layer_hidden, KVCache(jnp.stack(ks), jnp.stack(vs),
                                                               lengths + T))  # fmt: skip


@pytest.fixture(scope="module")
def nnx_target():
  return NNXTarget.split(TinyGPT(0), n_layers=L, n_kv_heads=H, head_dim=D // H)


def _host_greedy(target, state, prompt, n, width=32):
  """The known answer: argmax chains from full, uncached forward passes. Each pass runs the
  sequence right-padded to `width` (one compiled shape); causal attention leaves the real
  positions' logits as they would be unpadded."""
  logits = jax.jit(lambda s, t: target.forward(s, t, target.init_cache(1, width)).logits)
  seq = list(prompt)
  for _ in range(n):
    toks = jnp.asarray(seq + [0] * (width - len(seq)))[None]
    seq.append(int(jnp.argmax(logits(state, toks)[0, len(seq) - 1])))
  return seq[len(prompt) :]


PROMPTS = [[5, 9, 3, 5, 9, 3, 5], [7, 1], [2, 4, 6, 8, 2, 4, 6, 8, 2, 4, 6]]


def test_ar_on_an_nnx_target_is_its_greedy_chain(nnx_target):
  target, state = nnx_target
  P, lens = pad_prompts(PROMPTS, bucket=16)
  out = generate(state, target, P, lens, GenerateConfig(max_new_tokens=12))
  for b, p in enumerate(PROMPTS):
    assert np.asarray(out.tokens[b, :12]).tolist() == _host_greedy(target, state, p, 12)


def test_speculative_loops_on_an_nnx_target_equal_its_ar(nnx_target):
  target, state = nnx_target
  P, lens = pad_prompts(PROMPTS, bucket=16)
  gen = GenerateConfig(max_new_tokens=20)
  ar = generate(state, target, P, lens, gen)
  draft, dcfg = tiny_model(3, vocab=V)  # a specjax Llama drafting for the NNX target
  tree = StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
  cases = [
    ("prompt lookup", speculative_generate, PromptLookupDrafter(k=3), ()),
    ("draft model", speculative_generate, DraftModelDrafter(dcfg, 3), draft),
    ("static tree", tree_speculative_generate, StaticTreeDrafter(dcfg, tree), draft),
  ]
  for name, loop, drafter, dparams in cases:
    out = loop(state, target, drafter, dparams, P, lens, gen)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens), err_msg=name)
    assert summarize(out.metrics)["target_passes"] < 3 * 20, name


def test_as_target_names_what_a_target_needs():
  _, cfg = tiny_model(0)
  assert as_target(cfg) == LlamaTarget(cfg)
  with pytest.raises(TypeError, match="forward and init_cache"):
    as_target(object())
