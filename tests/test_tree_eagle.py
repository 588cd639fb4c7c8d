"""EAGLE-2 dynamic trees from an EAGLE head (`specjax.drafters.tree_eagle`) on a tiny target."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_models import tiny_model

from specjax.drafters.eagle import EagleDrafter, EagleParams
from specjax.drafters.tree_eagle import EagleTreeDrafter
from specjax.generate import GenerateConfig, generate, pad_prompts, prefill
from specjax.metrics import summarize
from specjax.model import init_params
from specjax.sampling import SamplingConfig
from specjax.tree_speculative import tree_speculative_generate
from specjax.trees import ancestor_mask


@pytest.fixture(scope="module")
def setup():
  target, cfg = tiny_model(0, vocab=64)
  hcfg = cfg.replace(n_layers=1)
  keys = jax.random.split(jax.random.PRNGKey(11), 2)
  d2t = jnp.arange(8, 56, dtype=jnp.int32)  # a 48-token draft vocabulary
  layer = jax.tree.map(lambda a: a[0], init_params(keys[1], hcfg, scale=0.3).layers)
  head = EagleParams(
    w_in=0.3 * jax.random.normal(keys[0], (cfg.d_model, 2 * cfg.d_model)),
    layer=layer,
    head=target.embed[d2t],
    d2t=d2t,
    embed=target.embed,
  )
  rng = np.random.RandomState(4)
  P, L = pad_prompts([list(rng.randint(1, 60, n)) for n in (6, 11, 3)], bucket=8)
  return target, cfg, hcfg, head, P, L


def _propose(setup, drafter, capacity=48):
  target, cfg, _, head, P, L = setup

  @jax.jit
  def once(P, L):
    pre = prefill(target, cfg, P, L, capacity)
    state = drafter.init(head, pre, P, L, capacity)
    seq = jnp.zeros((P.shape[0], capacity), jnp.int32).at[:, : P.shape[1]].set(P)
    seq = seq.at[jnp.arange(P.shape[0]), L].set(jnp.argmax(pre.logits, -1).astype(jnp.int32))
    return drafter.propose(head, state, seq, L + 1, jax.random.PRNGKey(0), SamplingConfig())

  return once(P, L)


def test_top_1_tree_is_the_greedy_eagle_chain(setup):
  """With one child per node the tree is a path: it must be exactly the chain head's greedy draft
  (same features, positions and cache), which pins down the level passes' inputs and masks."""
  hcfg = setup[2]
  chain = _propose(setup, EagleDrafter(hcfg, k=4))
  tree = _propose(setup, EagleTreeDrafter(hcfg, top_k=1, depth=4, n_nodes=5)).tree
  np.testing.assert_array_equal(np.asarray(tree.tokens[:, 1:]), np.asarray(chain.tokens))
  np.testing.assert_array_equal(np.asarray(tree.depth[0]), np.arange(5))


def test_eagle_trees_are_well_formed(setup):
  t = _propose(setup, EagleTreeDrafter(setup[2], top_k=3, depth=3, n_nodes=10)).tree
  depth, parent, tokens = np.asarray(t.depth), np.asarray(t.parent), np.asarray(t.tokens)
  assert depth.max() == 3 and (parent[:, 1:] < np.arange(1, 10)).all()
  assert (depth[:, 1:] == np.take_along_axis(depth, parent[:, 1:], 1) + 1).all()
  assert ((tokens[:, 1:] >= 8) & (tokens[:, 1:] < 56)).all()  # mapped through d2t
  np.testing.assert_array_equal(np.asarray(ancestor_mask(t.parent, 3)), np.asarray(t.mask))
  for b in range(tokens.shape[0]):  # siblings are distinct tokens
    for u in range(10):
      sib = tokens[b, 1:][parent[b, 1:] == u]
      assert len(set(sib.tolist())) == len(sib)


def test_greedy_eagle_trees_identical_to_ar_at_batch_3(setup):
  target, cfg, hcfg, head, P, L = setup
  gen = GenerateConfig(max_new_tokens=20)
  ar = generate(target, cfg, P, L, gen)
  drafter = EagleTreeDrafter(hcfg, top_k=3, depth=3, n_nodes=10)
  out = tree_speculative_generate(target, cfg, drafter, head, P, L, gen)
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ar.lengths))
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  s = summarize(out.metrics)
  assert s["drafted"] == 9 * s["target_passes"]
