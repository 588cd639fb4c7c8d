"""Token trees: static buffers, tree rules (exact greedy, lossless sampling with negative controls),
and the tree decode loop (greedy identical to AR on tiny models and on SmolLM2, exact sampling
distribution, per-row cache compaction, no host sync)."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from toy_models import exact_continuation_probs, tiny_model

from specjax.drafters.draft_lm import DraftLMParams
from specjax.drafters.pard import PardDrafter, PardParams
from specjax.drafters.tree_draft_model import DynamicTreeDrafter, StaticTreeDrafter
from specjax.drafters.tree_heads import (
  BlockTreeDrafter,
  HeadTreeDrafter,
  MedusaHeadParams,
  fitted_tree,
  medusa_logits_source,
  published_medusa_logits,
)
from specjax.generate import GenerateConfig, generate, pad_prompts, prefill
from specjax.kv_cache import KVCache
from specjax.metrics import summarize
from specjax.sampling import SamplingConfig, sample_from_logprobs
from specjax.tree_acceptance import (
  TreeGreedyRule,
  TreePointMassRule,
  TreeSpeculativeRule,
  TreeTypicalRule,
)
from specjax.tree_speculative import _tree_speculative, compact_path, tree_speculative_generate
from specjax.trees import (
  TREE_RANKS,
  StaticTree,
  TokenTree,
  ancestor_mask,
  children_table,
  conditional_rates,
  default_static_tree,
  heldout_depth_top1,
  heldout_rank_rates,
  static_token_tree,
  tree_from_rank_probs,
)

# ---------------------------------------------------------------- static buffers


def test_buffers_of_a_small_tree():
  t = StaticTree.from_paths([(1,), (0,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
  assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
  b = t.buffers()
  np.testing.assert_array_equal(b.depth, [0, 1, 1, 2, 2, 2, 3])
  np.testing.assert_array_equal(b.parent, [-1, 0, 0, 1, 1, 2, 3])
  np.testing.assert_array_equal(b.rank, [0, 0, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(
    b.children, [[1, 2], [3, 4], [5, -1], [6, -1], [-1, -1], [-1, -1], [-1, -1]]
  )
  np.testing.assert_array_equal(b.mask[6], [1, 1, 0, 1, 0, 0, 1])
  np.testing.assert_array_equal(b.mask[5], [1, 0, 1, 0, 0, 1, 0])
  assert b.mask.sum() == (b.depth + 1).sum()  # each node sees itself and its depth ancestors
  np.testing.assert_array_equal(b.retrieve, [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]])
  np.testing.assert_array_equal(b.n_upto, [1, 3, 6, 7])
  assert (t.n_nodes, t.max_depth) == (7, 3) and t.ranks_are_contiguous()
  assert not StaticTree.from_paths([(0,), (2,)]).ranks_are_contiguous()


@pytest.mark.parametrize(
  "paths, match",
  [
    ([(0, 1)], "no parent"),
    ([(0,), (0,)], "twice"),
    ([()], "empty"),
    ([(-1,)], "negative"),
    ([], "at least"),
  ],
)
def test_invalid_paths(paths, match):
  with pytest.raises(ValueError, match=match):
    StaticTree.from_paths(paths)


def test_chain_full_and_rank_prob_trees():
  assert StaticTree.chain(3).paths == ((0,), (0, 0), (0, 0, 0))
  full = StaticTree.full((3, 2))
  assert full.n_nodes == 1 + 3 + 6 and full.max_depth == 2
  t = tree_from_rank_probs(np.array([[0.6, 0.3, 0.1], [0.5, 0.2, 0.1]]), n_nodes=5)
  # Reach estimates: (0,) .6, (1,) .3, (0, 0) .3, (1, 0) .15, (0, 1) .12, (2,) .1, ...
  assert set(t.paths) == {(0,), (1,), (0, 0), (1, 0)}


def test_static_trees_fitted_to_heldout_accuracy():
  # The fixed prior (top-1 0.6 at every depth) goes deep; weak later depths make the tree wide.
  assert set(default_static_tree(6, 3).paths) == {(0,), (1,), (0, 0), (0, 1), (0, 0, 0)}
  fitted = default_static_tree(6, 3, [0.7, 0.3, 0.2])  # reach: .7 .35 .21 .175 .105 (ties: .105)
  assert set(fitted.paths) == {(0,), (1,), (2,), (0, 0), (0, 1)} and fitted.max_depth == 2
  assert default_static_tree(4, 2, [0.3, 0.1]).max_depth == 1
  # Later depths that read the greedy depth-1 draft hang under that node only.
  assert (1, 0) in default_static_tree(6, 2, [0.7, 0.7]).paths
  spine = default_static_tree(6, 2, [0.7, 0.7], greedy_first=True)
  assert set(spine.paths) == {(0,), (1,), (2,), (0, 0), (0, 1)}
  # A shipped first-token drafter's tree: its chained rates (0.7, then 0.49 / 0.7) and the spine.
  held = {"prefix_step1": 0.7, "prefix_step2": 0.49, "top1_step1": 0.7, "top1_step2": 0.5}
  peagle = types.SimpleNamespace(metadata={"config": {"first_token": True}, "heldout": held})
  assert fitted_tree(peagle, types.SimpleNamespace(n_nodes=6, depth=2)).paths == spine.paths
  with pytest.raises(ValueError, match="depth_top1 has"):
    default_static_tree(6, 3, [0.7, 0.3])
  medusa = {"heldout": {"top1_head0": 0.3, "top1_head1": 0.2, "simulated_tau": 1.4}}
  assert heldout_depth_top1(medusa, 2) == [0.3, 0.2]
  assert heldout_depth_top1(medusa, 3) is None  # not recorded at depth 3: the prior applies
  block = {"heldout": {"top1_step1": 0.7, "top1_step2": 0.3}}
  assert heldout_depth_top1(block, 2) == [0.7, 0.3]
  assert heldout_depth_top1({}, 1) is None
  # Chained agreement (depths 1..j all right) gives rates conditional on the earlier depths.
  chained = {"heldout": {**block["heldout"], "prefix_step1": 0.7, "prefix_step2": 0.28}}
  assert heldout_depth_top1(chained, 2) == pytest.approx([0.7, 0.4])
  assert conditional_rates([0.5, 0.6, 0.0, 0.0]) == [0.5, 1.0, 0.0, 0.0]  # clipped; 0 stays 0


def test_a_tree_fits_recorded_rank_rates():
  """Medusa heads' metadata with per-rank rates: the tree follows them, not the 0.5**r prior."""
  top1 = {"top1_head0": 0.3, "top1_head1": 0.2}
  ranks = {f"rank{r}_head{d}": 0.25 if (d, r) == (0, 1) else 0.01 for d in (0, 1) for r in (1, 7)}
  ranks.update({f"rank{r}_head{d}": 0.01 for d in (0, 1) for r in range(2, 7)})
  meta = {"heldout": {**top1, **ranks}}
  rates = heldout_rank_rates(meta, 2)
  assert rates.shape == (2, TREE_RANKS) and rates[0, 1] == 0.25 and rates[1, 0] == 0.2
  assert heldout_rank_rates(meta, 3) is None and heldout_rank_rates({"heldout": top1}, 2) is None
  heads = types.SimpleNamespace(metadata={"config": {}, **meta})
  t = types.SimpleNamespace(n_nodes=5, depth=2)
  # reach: (0,) .3, (1,) .25, (0, 0) .06, (1, 0) .05; the prior would take (2,) at .075
  assert set(fitted_tree(heads, t).paths) == {(0,), (1,), (0, 0), (1, 0)}
  prior = fitted_tree(types.SimpleNamespace(metadata={"config": {}, "heldout": top1}), t)
  assert set(prior.paths) == {(0,), (1,), (2,), (0, 0)}


def test_dynamic_helpers_match_static_buffers():
  b = StaticTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (2, 0), (0, 0, 0)]).buffers()
  parent = jnp.asarray(b.parent)[None]
  np.testing.assert_array_equal(np.asarray(ancestor_mask(parent, 3))[0], b.mask)
  np.testing.assert_array_equal(np.asarray(children_table(parent, 3))[0], b.children)


# ---------------------------------------------------------------- rules on synthetic trees
# Target tables over V = 5 tokens: P1[x1], P2[x1, x2], P3[x1, x2, x3]; draft tables Q1, Q2[x1].
# The tree is full (3, 2): three children of the root, two children each. Every emitted prefix is
# completed to three tokens by exact ancestral sampling from P (what the loop's next pass does), so
# a lossless rule makes the three-token sequences follow P1 * P2 * P3 exactly (125 cells).

V = 5
RULE_TREE = StaticTree.full((3, 2))
N_RULE = 100_000


def _tables(seed):
  rng = np.random.RandomState(seed)

  def dist(shape):
    d = rng.dirichlet(np.full(V, 0.8), size=shape)
    hole = rng.rand(*shape) < 0.5  # truncated supports, as after top-k / top-p
    kill = rng.randint(0, V, shape)
    d[hole, kill[hole]] = 0.0
    return d / d.sum(-1, keepdims=True)

  return [dist(()), dist((V,)), dist((V, V))], [dist(()), dist((V,))]


def _draw_tree(key, Q, n, how):
  """Children: "wor" draws without replacement, "iid" independent draws, "topk" the q-best."""
  b = RULE_TREE.buffers()
  lvl1, lvl2 = np.flatnonzero(b.depth == 1), np.flatnonzero(b.depth == 2)
  lq1 = jnp.broadcast_to(jnp.log(jnp.asarray(Q[0], jnp.float32)), (n, V))
  lq2_table = jnp.log(jnp.asarray(Q[1], jnp.float32))

  def pick(k, lq, m):
    if how == "wor":
      return jax.lax.top_k(lq + jax.random.gumbel(k, lq.shape), m)[1]
    if how == "iid":
      return jax.random.categorical(k, lq[..., None, :], -1, shape=lq.shape[:-1] + (m,))
    return jax.lax.top_k(lq, m)[1]

  k1, k2 = jax.random.split(key)
  c1 = pick(k1, lq1, len(lvl1))  # [n, 3]
  lq2 = lq2_table[c1]  # [n, 3, V]
  c2 = pick(k2, lq2, 2)
  tokens = jnp.zeros((n, RULE_TREE.n_nodes), jnp.int32).at[:, lvl1].set(c1)
  tokens = tokens.at[:, lvl2].set(c2[:, np.searchsorted(lvl1, b.parent[lvl2]), b.rank[lvl2]])
  logq = jnp.zeros((n, RULE_TREE.n_nodes, V)).at[:, 0].set(lq1).at[:, lvl1].set(lq2)
  return tokens, logq


def _target_logp(tokens, P):
  b = RULE_TREE.buffers()
  with np.errstate(divide="ignore"):
    L1, L2, L3 = (jnp.asarray(np.log(p), jnp.float32) for p in P)
  rows = [jnp.broadcast_to(L1, (tokens.shape[0], V))]
  for j in range(1, RULE_TREE.n_nodes):
    rows.append(L2[tokens[:, j]] if b.depth[j] == 1 else L3[tokens[:, b.parent[j]], tokens[:, j]])
  return jnp.stack(rows, 1)


def _simulate(rule, P, Q, how, seed=0):
  """Runs the rule on N_RULE drafted trees; returns ([N, 3] sequences, accepted depths)."""
  kt, kr = jax.random.split(jax.random.PRNGKey(seed))
  tokens, logq = _draw_tree(kt, Q, N_RULE, how)
  tree = static_token_tree(RULE_TREE, tokens, logq)
  fn = jax.jit(jax.vmap(lambda k, t, lp: rule(k, t, lp, RULE_TREE.max_depth)))
  path, n, nxt = map(np.asarray, fn(jax.random.split(kr, N_RULE), tree, _target_logp(tokens, P)))
  tokens, rows = np.asarray(tokens), np.arange(N_RULE)
  seqs = np.full((N_RULE, 3), -1)
  for j in (1, 2):
    seqs[n >= j, j - 1] = tokens[rows, path[:, j]][n >= j]
  seqs[rows, n] = nxt
  rng = np.random.RandomState(seed + 1)
  for i in (1, 2):
    miss = seqs[:, i] < 0
    probs = P[1][seqs[miss, 0]] if i == 1 else P[2][seqs[miss, 0], seqs[miss, 1]]
    seqs[miss, i] = np.minimum((rng.rand(miss.sum(), 1) > np.cumsum(probs, 1)).sum(1), V - 1)
  return seqs, n


def _joint_pvalue(seqs, P) -> float:
  expected = (P[0][:, None, None] * P[1][:, :, None] * P[2]).reshape(-1) * len(seqs)
  counts = np.bincount(seqs @ np.array([V * V, V, 1]), minlength=V**3).astype(np.float64)
  assert counts[expected == 0].sum() == 0, "a sequence outside the target's support was produced"
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


@dataclasses.dataclass(frozen=True)
class FallbackFromPRule(TreeSpeculativeRule):
  """A WRONG rule (negative control): after the last rejection it draws from p, not the residual."""

  def __call__(self, key, tree, logp, max_depth):
    path, n, _ = super().__call__(key, tree, logp, max_depth)
    return path, n, sample_from_logprobs(jax.random.fold_in(key, 3), logp[path[n]])


LOSSLESS_CASES = [
  ("rrs_without_replacement", TreeSpeculativeRule("without_replacement"), "wor"),
  ("multistep_iid", TreeSpeculativeRule("iid"), "iid"),
  ("point_mass_topk", TreePointMassRule(), "topk"),
  ("point_mass_sampled", TreePointMassRule(), "wor"),
]


@pytest.mark.parametrize("name, rule, how", LOSSLESS_CASES, ids=[c[0] for c in LOSSLESS_CASES])
def test_tree_sampling_rules_are_lossless(name, rule, how):
  P, Q = _tables(0)
  seqs, n = _simulate(rule, P, Q, how)
  assert 0.3 < n.mean() < 1.9 and (n == 2).mean() > 0.05  # every branch of the walk is exercised
  assert _joint_pvalue(seqs, P) > 1e-4, name


NEGATIVE_CASES = [
  ("fallback_from_p", FallbackFromPRule("without_replacement"), "wor"),
  ("q_aware_rule_on_topk_children", TreeSpeculativeRule("without_replacement"), "topk"),
  ("iid_rule_on_children_without_replacement", TreeSpeculativeRule("iid"), "wor"),
]


@pytest.mark.parametrize("name, rule, how", NEGATIVE_CASES, ids=[c[0] for c in NEGATIVE_CASES])
def test_negative_controls_fail(name, rule, how):
  """The same test must reject wrong rules (it has power)."""
  P, Q = _tables(0)
  seqs, _ = _simulate(rule, P, Q, how)
  assert _joint_pvalue(seqs, P) < 1e-8, name


def test_tree_greedy_rule_exact():
  # Root children 1 (tok 3), 2 (tok 4); node 1 children 3 (tok 0), 4 (tok 2); node 2 child 5 (tok 1).
  t = StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0)])
  tokens = jnp.array([[7, 3, 4, 0, 2, 1]])
  tree = jax.tree.map(lambda a: a[0], static_token_tree(t, tokens))
  argmax = [4, 2, 1, 5, 6, 0]  # target argmax after each node
  logp = jnp.log(jax.nn.one_hot(jnp.array(argmax), 8) + 1e-9)
  path, n, nxt = TreeGreedyRule()(None, tree, logp, 2)  # 4 -> node 2 (tok 4) -> node 5 (tok 1)
  assert (list(map(int, path)), int(n), int(nxt)) == ([0, 2, 5], 2, 0)
  argmax[0] = 3  # now node 1 (tok 3), whose argmax 2 is node 4
  logp = jnp.log(jax.nn.one_hot(jnp.array(argmax), 8) + 1e-9)
  path, n, nxt = TreeGreedyRule()(None, tree, logp, 2)
  assert (list(map(int, path)), int(n), int(nxt)) == ([0, 1, 4], 2, 6)
  argmax[0] = 5  # no child matches: nothing accepted, emit the argmax
  logp = jnp.log(jax.nn.one_hot(jnp.array(argmax), 8) + 1e-9)
  _, n, nxt = TreeGreedyRule()(None, tree, logp, 2)
  assert (int(n), int(nxt)) == (0, 5)


def test_typical_rule_is_labelled_lossy_and_keeps_plausible_paths():
  assert (
    not TreeTypicalRule.lossless and TreeSpeculativeRule.lossless and TreePointMassRule.lossless
  )
  t = StaticTree.from_paths([(0,), (1,), (0, 0)])
  tree = jax.tree.map(lambda a: a[0], static_token_tree(t, jnp.array([[0, 1, 2, 1]])))
  p = np.array([[0.05, 0.9, 0.05], [0.34, 0.33, 0.33], [0.2, 0.2, 0.6], [0.2, 0.2, 0.6]])
  path, n, _ = TreeTypicalRule()(jax.random.PRNGKey(0), tree, jnp.log(jnp.asarray(p)), 2)
  assert int(n) == 2 and list(map(int, path)) == [0, 1, 3]  # tok 1 (p .9), then tok 1 (flat p)
  p[0] = [0.05, 0.05, 0.9]  # tok 1 now implausible; tok 2 (node 2) passes but has no child
  path, n, _ = TreeTypicalRule()(jax.random.PRNGKey(0), tree, jnp.log(jnp.asarray(p)), 2)
  assert int(n) == 1 and int(path[1]) == 2


# ---------------------------------------------------------------- the decode loop


def test_compact_path_moves_each_rows_path():
  k = jnp.arange(2 * 3 * 12, dtype=jnp.float32).reshape(2, 3, 12, 1, 1)
  cache = KVCache(k, -k, jnp.zeros((3,), jnp.int32))
  base = jnp.array([2, 0, 5])
  path = jnp.array([[0, 3, 5], [0, 1, 2], [0, 6, 0]])
  out = compact_path(cache, base, path)
  for b in range(3):
    for j in range(3):
      src = int(base[b] + path[b, j])
      np.testing.assert_array_equal(out.k[:, b, int(base[b]) + j], k[:, b, src])
      np.testing.assert_array_equal(out.v[:, b, int(base[b]) + j], -k[:, b, src])
    np.testing.assert_array_equal(out.k[:, b, : int(base[b])], k[:, b, : int(base[b])])


@pytest.fixture(scope="module")
def models():
  target, cfg = tiny_model(0, vocab=64)
  draft, dcfg = tiny_model(1, vocab=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  return target, cfg, draft, dcfg


def _prompts():
  rng = np.random.RandomState(0)
  return [list(rng.randint(8, 20, n)) for n in (9, 15, 7, 21)]


@pytest.fixture(scope="module")
def ar_reference(models):
  """AR greedy outputs with a stop token that ends the rows at different steps, and budgets."""
  target, cfg, _, _ = models
  P, L = pad_prompts(_prompts(), bucket=8)
  toks = np.asarray(generate(target, cfg, P, L, GenerateConfig(max_new_tokens=30)).tokens)
  firsts = {
    t: [np.flatnonzero(r == t)[0] if (r == t).any() else 99 for r in toks] for t in range(64)
  }
  stop = max(firsts, key=lambda t: (sum(f < 99 for f in firsts[t]) >= 2, len(set(firsts[t]))))
  gen = GenerateConfig(max_new_tokens=30, stop_tokens=(stop,))
  budgets = jnp.array([30, 30, 11, 30])
  ar = generate(target, cfg, P, L, gen, max_new_per_row=budgets)
  assert len(set(np.asarray(ar.lengths).tolist())) > 2
  return P, L, gen, budgets, np.asarray(ar.tokens), np.asarray(ar.lengths)


def _random_medusa(cfg, n_heads=3, n_blocks=2, seed=5):
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  D, V = cfg.d_model, cfg.vocab_size
  return MedusaHeadParams(
    0.3 * jax.random.normal(k1, (n_heads, n_blocks, D, D)),
    0.1 * jax.random.normal(k2, (n_heads, n_blocks, D)),
    0.5 * jax.random.normal(k3, (n_heads, V, D)),
  )


def _fused_medusa(cfg, n_heads=4, seed=6):
  """Shared-head Medusa weights over the full vocabulary whose heads also read layers 0 and 1."""
  medusa = pytest.importorskip("specjax.drafters.medusa")
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
  D, V = cfg.d_model, cfg.vocab_size
  return medusa.MedusaParams(
    0.3 * jax.random.normal(k1, (n_heads, D, D)),
    0.1 * jax.random.normal(k2, (n_heads, D)),
    0.5 * jax.random.normal(k3, (V, D)),
    jnp.arange(V, dtype=jnp.int32),
    fuse=0.3 * jax.random.normal(k4, (D, 2 * D)),
    fuse_norm=jnp.ones((2, D)),
  )


@pytest.fixture(scope="module")
def noisy_target(models):
  """The target with 10% weight noise: a draft that agrees often but not always, so accepted paths
  also run through lower-ranked children (same shapes as the target: one compile for both)."""
  target = models[0]
  leaves, treedef = jax.tree.flatten(target)
  keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
  noisy = [a + 0.1 * jnp.std(a) * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, noisy)


def _pard(draft, dcfg, k, seed=7):
  """A PARD block drafter's weights over a draft model (full vocabulary, random mask inputs)."""
  head = draft.embed if draft.lm_head is None else draft.lm_head
  lm = DraftLMParams(draft.embed, draft.layers, draft.final_norm, head, jnp.arange(dcfg.vocab_size))
  mask = 0.3 * jax.random.normal(jax.random.PRNGKey(seed), (k - 1, dcfg.d_model))
  noisy = jax.tree.map(lambda a: a * 1.1, draft.layers)  # mask layers that differ from the draft's
  return PardParams(lm, noisy, mask)


def test_greedy_trees_identical_to_ar(models, noisy_target, ar_reference):
  target, cfg, draft, dcfg = models
  P, L, gen, budgets, ar_tokens, ar_lens = ar_reference
  tree = StaticTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])
  static = StaticTreeDrafter(cfg, tree)
  dynamic = DynamicTreeDrafter(cfg, top_k=3, depth=4, n_nodes=14)
  medusa = HeadTreeDrafter(published_medusa_logits, tree, cfg.vocab_size)
  cases = [
    ("static_self", static, target),
    ("static_noisy", static, noisy_target),
    ("dynamic_self", dynamic, target),
    ("dynamic_noisy", dynamic, noisy_target),
    ("medusa", medusa, _random_medusa(cfg, 4)),
    (
      "medusa_fused",
      HeadTreeDrafter(medusa_logits_source, tree, cfg.vocab_size, hidden_layers=(0, 1)),
      _fused_medusa(cfg),
    ),
    (
      "pard_block",
      BlockTreeDrafter(PardDrafter(dcfg, 4), tree, cfg.vocab_size),
      _pard(draft, dcfg, 4),
    ),
  ]
  for name, drafter, dparams in cases:
    out = tree_speculative_generate(
      target, cfg, drafter, dparams, P, L, gen, max_new_per_row=budgets
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), ar_lens, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens, err_msg=name)
    s = summarize(out.metrics)
    assert s["emitted"] == int(ar_lens.sum()) - len(ar_lens), name
    assert s["drafted"] == (drafter.n_nodes - 1) * s["target_passes"], name
    if name == "static_self":  # the target drafting for itself: every pass goes to full depth
      assert s["alpha_at"] == [1.0] * tree.max_depth, s
    if name.endswith("noisy"):  # partial acceptance at several depths
      assert s["tau"] > 1.3 and 0 < s["alpha_at"][1] < 1, (name, s)


def test_rule_and_drafter_mismatch_is_an_error(models, ar_reference):
  target, cfg, draft, dcfg = models
  P, L, _, _, _, _ = ar_reference
  sampling = GenerateConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=1.0))
  topk = DynamicTreeDrafter(dcfg, top_k=2, depth=2, n_nodes=5)
  with pytest.raises(ValueError, match="only for children drawn"):
    tree_speculative_generate(target, cfg, topk, draft, P, L, sampling, rule=TreeSpeculativeRule())
  with pytest.raises(ValueError, match="temperature 0"):
    tree_speculative_generate(target, cfg, topk, draft, P, L, sampling, rule=TreeGreedyRule())
  with pytest.raises(ValueError, match="ranks 0 .. c - 1"):
    StaticTreeDrafter(dcfg, StaticTree.from_paths([(0,), (2,)]), sample_children=True)


def test_no_host_callbacks_or_transfers_in_loop(models, ar_reference):
  """One XLA computation: no callbacks in the jaxpr, no transfers when run (same static arguments
  as the greedy test above, so the compiled loop is reused)."""
  target, cfg, _, _ = models
  P, L, gen, budgets, _, _ = ar_reference
  drafter = DynamicTreeDrafter(cfg, top_k=3, depth=4, n_nodes=14)
  args = (target, target, P, L, budgets, jax.random.PRNGKey(0))
  static = (cfg, drafter, TreeGreedyRule(), gen)
  jaxpr = str(jax.make_jaxpr(_tree_speculative, static_argnums=(6, 7, 8, 9))(*args, *static))
  assert "while" in jaxpr and "callback" not in jaxpr
  _tree_speculative(*args, *static)
  with jax.transfer_guard("disallow"):
    jax.block_until_ready(_tree_speculative(*args, *static))


# ---- distribution of the whole loop: 3 tokens over a 6-token vocabulary, enumerated exactly ----

N_LOOP = 100_000


@pytest.fixture(scope="module")
def small_vocab():
  kw = dict(vocab=6, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(10, scale=0.2, **kw)
  draft, dcfg = tiny_model(11, scale=0.2, **kw)
  prompt = [1, 2, 4, 1, 2]
  sampling = SamplingConfig(temperature=0.9, top_k=5)
  return (
    target,
    cfg,
    draft,
    dcfg,
    prompt,
    sampling,
    exact_continuation_probs(target, cfg, prompt, 3, sampling),
  )


def _loop_pvalue(small_vocab, drafter, rule=None, dparams=None):
  target, cfg, draft, _, prompt, sampling, probs = small_vocab
  draft = draft if dparams is None else dparams
  P, L = pad_prompts([prompt] * N_LOOP, bucket=len(prompt))
  gen = GenerateConfig(max_new_tokens=3, sampling=sampling)
  out = tree_speculative_generate(
    target, cfg, drafter, draft, P, L, gen, rule=rule, key=jax.random.PRNGKey(2)
  )
  toks = np.asarray(out.tokens)[:, :3]
  assert (np.asarray(out.lengths) == 3).all()
  expected = np.zeros(6**3)
  for (a, b, c), pr in probs.items():
    expected[a * 36 + b * 6 + c] = pr * N_LOOP
  counts = np.bincount(toks @ np.array([36, 6, 1]), minlength=6**3).astype(np.float64)
  assert counts[expected == 0].sum() == 0
  small = expected < 5
  obs, exp = (
    np.append(counts[~small], counts[small].sum()),
    np.append(expected[~small], expected[small].sum()),
  )
  keep = exp > 0
  s = summarize(out.metrics)
  return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue, s


def test_loop_sampling_distribution(small_vocab):
  dcfg = small_vocab[3]
  tree = StaticTree.full((2, 2))
  cases = [
    (StaticTreeDrafter(dcfg, tree, sample_children=True), None),  # q-aware RRS w/o replacement
    (DynamicTreeDrafter(dcfg, top_k=2, depth=2, n_nodes=5), None),  # point mass (q = 1)
  ]
  for drafter, rule in cases:
    pvalue, s = _loop_pvalue(small_vocab, drafter, rule)
    assert s["accepted"] > 10_000 and s["tau"] < 2.9, s  # accepting and rejecting both happen
    assert pvalue > 1e-4, type(drafter).__name__
  # A parallel drafter's block as a tree, children drawn without replacement per depth.
  block = BlockTreeDrafter(PardDrafter(dcfg, 2), tree, dcfg.vocab_size, sample_children=True)
  pvalue, s = _loop_pvalue(small_vocab, block, dparams=_pard(small_vocab[2], dcfg, 2))
  assert s["accepted"] > 10_000 and s["tau"] < 2.9, s
  assert pvalue > 1e-4, "BlockTreeDrafter"


def test_loop_negative_control_fails(small_vocab):
  """The whole-loop test has the power to catch a wrong rule inside `tree_speculative_generate`."""
  drafter = StaticTreeDrafter(small_vocab[3], StaticTree.full((2, 2)), sample_children=True)
  pvalue, s = _loop_pvalue(small_vocab, drafter, FallbackFromPRule("without_replacement"))
  assert s["accepted"] > 10_000, s
  assert pvalue < 1e-8


def test_dynamic_trees_are_well_formed(models):
  target, cfg, draft, dcfg = models
  drafter = DynamicTreeDrafter(dcfg, top_k=3, depth=3, n_nodes=10)
  P, L = pad_prompts(_prompts()[:2], bucket=8)

  @jax.jit
  def draft_once(P, L):
    pre = prefill(target, cfg, P, L, 64)
    state = drafter.init(draft, pre, P, L, 64)
    seq = jnp.zeros((2, 64), jnp.int32).at[:, : P.shape[1]].set(P)
    return drafter.propose(draft, state, seq, L, jax.random.PRNGKey(0), SamplingConfig()).tree

  t: TokenTree = draft_once(P, L)
  assert (
    t.tokens.shape == (2, 10) and t.mask.shape == (2, 10, 10) and t.children.shape == (2, 10, 3)
  )
  depth, parent = np.asarray(t.depth), np.asarray(t.parent)
  assert depth.max() == 3 and (parent[:, 1:] < np.arange(1, 10)).all()  # parents come first
  assert (depth[:, 1:] == np.take_along_axis(depth, parent[:, 1:], 1) + 1).all()
  np.testing.assert_array_equal(np.asarray(ancestor_mask(t.parent, 3)), np.asarray(t.mask))


def test_medusa_params_source_maps_draft_vocabulary(models):
  """Trees from the shared-head `MedusaParams` (draft vocabulary + d2t) of the chain drafter."""
  medusa = pytest.importorskip("specjax.drafters.medusa")
  _, cfg, _, _ = models
  D, K = cfg.d_model, 3
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(7), 3)
  d2t = jnp.arange(40, 64, dtype=jnp.int32)  # draft token i is target token 40 + i
  params = medusa.MedusaParams(
    0.3 * jax.random.normal(k1, (K, D, D)),
    0.1 * jax.random.normal(k2, (K, D)),
    jax.random.normal(k3, (24, D)),
    d2t,
  )
  tree = StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
  drafter = HeadTreeDrafter(medusa_logits_source, tree, cfg.vocab_size)
  h = jax.random.normal(jax.random.PRNGKey(8), (2, D))
  seq = jnp.full((2, 8), 3, jnp.int32)
  prop = jax.jit(drafter.propose, static_argnames="sampling")(
    params,
    medusa.MedusaState(h),
    seq,
    jnp.array([4, 6]),
    jax.random.PRNGKey(0),
    sampling=SamplingConfig(),
  )
  toks = np.asarray(prop.tree.tokens)
  top = np.argsort(-np.asarray(medusa.medusa_logits(params, h)), -1)  # [B, K, Vd] ranks
  np.testing.assert_array_equal(toks[:, 1], 40 + top[:, 0, 0])  # (0,): head 0's best
  np.testing.assert_array_equal(toks[:, 2], 40 + top[:, 0, 1])  # (1,): head 0's second
  np.testing.assert_array_equal(toks[:, 4], 40 + top[:, 1, 1])  # (0, 1): head 1's second
  np.testing.assert_array_equal(toks[:, 5], 40 + top[:, 2, 0])  # (0, 0, 0): head 2's best
