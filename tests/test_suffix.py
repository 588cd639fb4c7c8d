"""Suffix decoding: hand-computed trees, chains and global caches; greedy identical to AR (chain and
tree loops, batch 1 and ragged batches, with and without a global cache of earlier outputs); at
T > 0, the tree loop's exact distribution over every 3-token sequence of a 6-token vocabulary, and
the rule-level chi-square suite of tests/test_trees.py on suffix trees with a wrong rule as negative
control; the config and the harness's global cache of earlier outputs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_trees import V, _joint_pvalue, _tables  # the chi-square suite's tables and test
from toy_models import exact_continuation_probs, tiny_config, tiny_model

from specjax import adaptive as adp
from specjax.drafters.suffix import (
  SEP,
  SuffixCache,
  SuffixDrafter,
  SuffixTreeDrafter,
  latest,
  match_lengths,
  suffix_cache_from_outputs,
)
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.metrics import summarize
from specjax.sampling import SamplingConfig, sample_from_logprobs
from specjax.speculative import speculative_generate
from specjax.tree_acceptance import TreeGreedyRule, TreePointMassRule
from specjax.tree_speculative import _tree_speculative, tree_speculative_generate

# Positions: 0:5 1:1 2:2 3:3 4:9 5:1 6:2 7:4 8:8 9:1 10:2 11:3 12:7 13:1 14:2 (root). The suffix
# "1 2" (preceded by 7) was seen ending at 10, 6 and 2 (preceded by 8, 9, 5): M = 2, three
# occurrences continuing "3 7 1 2", "4 8 1 2 ..." and "3 9 1 2 ...".
ROW = [5, 1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 7, 1, 2]


def _row(tokens, width=20):
  return jnp.array([tokens + [0] * (width - len(tokens))]), jnp.array([len(tokens)])


def _draft(drafter, params, tokens):
  fn = drafter.draft_trees if isinstance(drafter, SuffixTreeDrafter) else drafter.draft_chains
  return jax.tree.map(lambda a: np.asarray(a)[0], fn(params, *_row(tokens)))  # eager: no compiles


def test_match_lengths_stop_at_separators_and_context_start():
  corpus = jnp.array([3, 1, 2, SEP, 1, 2, 7, 2])
  context = jnp.array([2, 1, 3, 9])  # newest first: the context ends "... 9 3 1 2"
  m = match_lengths(corpus, context, jnp.int32(4))
  np.testing.assert_array_equal(m, [0, 0, 3, 0, 0, 2, 0, 1])
  np.testing.assert_array_equal(
    match_lengths(corpus, context, jnp.int32(2)), [0, 0, 2, 0, 0, 2, 0, 1]
  )


def test_match_lengths_and_latest_hits_against_brute_force():
  """On random corpora over 3 tokens (many long matches): match lengths as counted one position at
  a time, and the latest hits as sorting the hit positions gives them."""
  rng = np.random.RandomState(0)
  for trial in range(20):
    C, X, n_ctx = 60, 6, rng.randint(1, 7)
    corpus = rng.randint(0, 3, C)
    corpus[rng.rand(C) < 0.1] = SEP
    context = rng.randint(0, 3, X)
    want = np.zeros(C, int)
    for c in range(C):
      while want[c] < n_ctx and want[c] <= c and corpus[c - want[c]] == context[want[c]]:
        want[c] += 1
    got = match_lengths(jnp.asarray(corpus), jnp.asarray(context), jnp.int32(n_ctx))
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=str(trial))
    hit = want == want.max()
    for n in (1, 4, 70):
      pos, ok = map(np.asarray, latest(jnp.asarray(hit), n))
      expect = np.flatnonzero(hit)[::-1][:n]
      np.testing.assert_array_equal(pos[ok], expect)
      assert ok.sum() == len(expect) and not ok[len(expect) :].any()


def test_tree_of_a_repeated_pattern():
  t = _draft(SuffixTreeDrafter(n_nodes=8, max_depth=4, spec_factor=3.0, min_prob=0.0), (), ROW)
  # Depth 1: "3" (2 of 3 occurrences), "4" (1); depth 2: "3 7", "4 8", "3 9"; depth 3: "3 7 1" ...
  # Best first by (count desc, depth asc, latest occurrence); budget floor(3.0 * 2) = 6 nodes.
  np.testing.assert_array_equal(t.tokens, [2, 3, 4, 7, 8, 9, 1, 0])
  np.testing.assert_array_equal(t.parent, [-1, 0, 0, 1, 2, 1, 3, -1])
  np.testing.assert_array_equal(t.depth, [0, 1, 1, 2, 2, 2, 3, 0])
  np.testing.assert_allclose(t.score, [1, 2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 0], atol=1e-6)
  assert (int(t.n_drafted), int(t.match_len)) == (6, 2)


def test_threshold_and_match_length_size_the_tree():
  # min_prob 0.5 keeps only "3" (2/3); spec_factor 1 allows floor(1 * 2) = 2 nodes.
  t = _draft(SuffixTreeDrafter(n_nodes=8, max_depth=4, min_prob=0.5, spec_factor=3.0), (), ROW)
  assert int(t.n_drafted) == 1 and t.tokens[1] == 3 and (t.parent[2:] == -1).all()
  t = _draft(SuffixTreeDrafter(n_nodes=8, max_depth=4, spec_factor=1.0, min_prob=0.0), (), ROW)
  np.testing.assert_array_equal(t.tokens[:3], [2, 3, 4])
  assert int(t.n_drafted) == 2 and (t.depth[3:] == 0).all()
  # A longer match allows a bigger tree: "5 7 1 2" ends the context, "3 7 1 2" ended at 14: M = 3,
  # one occurrence, continuing "5 7 1 2", floor(1 * 3) = 3 nodes.
  longer = ROW + [5, 7, 1, 2]
  t = _draft(SuffixTreeDrafter(n_nodes=8, max_depth=4, spec_factor=1.0, min_prob=0.0), (), longer)
  assert int(t.match_len) == 3 and int(t.n_drafted) == 3
  np.testing.assert_array_equal(t.tokens[:4], [2, 5, 7, 1])
  np.testing.assert_array_equal(t.parent[:4], [-1, 0, 1, 2])


def test_chain_is_the_most_frequent_path():
  toks, scores, n = _draft(SuffixDrafter(k=4, spec_factor=3.0, min_prob=0.0), (), ROW)
  np.testing.assert_array_equal(toks, [3, 7, 1, 2])  # "3" (2/3), then the latest of the tie
  np.testing.assert_allclose(scores, [2 / 3, 1 / 3, 1 / 3, 1 / 3], atol=1e-6)
  assert int(n) == 4
  _, _, n = _draft(SuffixDrafter(k=4, spec_factor=3.0, min_prob=0.5), (), ROW)
  assert int(n) == 1
  _, _, n = _draft(SuffixDrafter(k=4, spec_factor=1.0, min_prob=0.0), (), ROW)
  assert int(n) == 2  # floor(1 * M) with M = 2


def test_min_match_drafts_nothing_below_it():
  """ROW's matched suffix is "1 2" (M = 2): min_match 2 drafts, 3 does not, in both forms; and
  min_match is checked against max_match."""
  for m, drafted in ((2, True), (3, False)):
    chain = SuffixDrafter(k=4, spec_factor=3.0, min_prob=0.0, min_match=m)
    tree = SuffixTreeDrafter(n_nodes=8, max_depth=4, spec_factor=3.0, min_prob=0.0, min_match=m)
    assert (int(_draft(chain, (), ROW)[2]) > 0) == drafted, m
    t = _draft(tree, (), ROW)
    assert (int(t.n_drafted) > 0) == drafted and int(t.match_len) == 2, m
  with pytest.raises(ValueError, match="min_match"):
    SuffixDrafter(k=4, max_match=4, min_match=5)


def test_global_cache_layout_and_contribution():
  cache = suffix_cache_from_outputs([[2, 3, 7, 5], [1, 2, 6]], 12)
  np.testing.assert_array_equal(cache.tokens, [SEP] * 3 + [2, 3, 7, 5, SEP, 1, 2, 6, SEP])
  np.testing.assert_array_equal(cache.run, [0, 0, 4, 3, 2, 1, 0, 3, 2, 1, 0, 0])
  # Too small: the newest output whole, the next one cut to the room left (its beginning).
  small = suffix_cache_from_outputs([[2, 3, 7, 5], [1, 2, 6]], 6)
  np.testing.assert_array_equal(small.tokens, [2, SEP, 1, 2, 6, SEP])
  with pytest.raises(ValueError, match=">= 0"):
    suffix_cache_from_outputs([[1, -3]], 8)
  # "SEP 1 2" also matches "7 1 2" for M = 2: a fourth occurrence, continuing "6".
  d = SuffixTreeDrafter(n_nodes=8, max_depth=4, spec_factor=3.0, min_prob=0.0)
  t = _draft(d, cache, ROW)
  np.testing.assert_array_equal(t.tokens[:4], [2, 3, 4, 6])
  np.testing.assert_allclose(t.score[1:4], [2 / 4, 1 / 4, 1 / 4], atol=1e-6)
  # A root only the global cache has seen: the row alone drafts nothing, the cache drafts "7 5".
  t = _draft(d, (), [8, 9, 2, 3])
  assert int(t.n_drafted) == 0
  t = _draft(d, cache, [8, 9, 2, 3])
  assert int(t.match_len) == 2 and int(t.n_drafted) == 2
  np.testing.assert_array_equal(t.tokens[:3], [3, 7, 5])
  toks, _, n = _draft(SuffixDrafter(k=3, spec_factor=3.0, min_prob=0.0), cache, [8, 9, 2, 3])
  assert int(n) == 2 and list(toks[:2]) == [7, 5]


def test_no_match_drafts_nothing():
  t = _draft(SuffixTreeDrafter(n_nodes=6, max_depth=3), (), [4, 5, 6, 7])
  assert int(t.n_drafted) == 0 and int(t.match_len) == 0
  np.testing.assert_array_equal(t.parent, [-1] * 6)
  np.testing.assert_array_equal(t.depth, [0] * 6)
  _, _, n = _draft(SuffixDrafter(k=3), (), [4, 5, 6, 7])
  assert int(n) == 0


def test_unused_slots_are_never_accepted():
  """The tree of ROW with 2 drafted nodes ("3", "4") and 5 unused slots (token 0). They are nobody's
  children (the rejection-sampling walk only visits children), see only themselves, and with all
  the target's mass on token 0 after every node the greedy rule still accepts none of them."""
  d = SuffixTreeDrafter(n_nodes=8, max_depth=4, spec_factor=1.0, min_prob=0.0)
  one = jax.tree.map(lambda a: a[0], d.propose((), (), *_row(ROW), None, SamplingConfig()).tree)
  assert (np.asarray(one.tokens[3:]) == 0).all()
  assert not np.isin(np.asarray(one.children), range(3, 8)).any()
  np.testing.assert_array_equal(np.asarray(one.mask)[3:], np.eye(8, dtype=bool)[3:])
  logp = jnp.log(jax.nn.one_hot(jnp.zeros((8,), jnp.int32), 10) * 0.9 + 0.01)  # argmax 0
  path, n, nxt = TreeGreedyRule()(None, one, logp, 4)
  assert (int(n), int(path[0]), int(nxt)) == (0, 0, 0)


def test_invalid_settings():
  with pytest.raises(ValueError, match="n_nodes"):
    SuffixTreeDrafter(n_nodes=1)
  with pytest.raises(ValueError, match="spec_factor"):
    SuffixDrafter(spec_factor=0.0)
  with pytest.raises(ValueError, match=">= 1"):
    SuffixDrafter(k=0)


# ---------------------------------------------------------------- greedy: identical to AR


@pytest.fixture(scope="module")
def toy():
  """Two tiny targets (random; with attention damped 30x, so its output repeats itself), ragged
  prompts, a stop token and per-row budgets, and each target's AR outputs."""
  target, cfg = tiny_model(0, vocab=64)
  damped = dataclasses.replace(
    target, layers=dataclasses.replace(target.layers, wo=target.layers.wo * 0.03)
  )
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(8, 20, n)) for n in (9, 15, 7, 21)]
  P, L = pad_prompts(prompts, bucket=24)
  gen = GenerateConfig(max_new_tokens=24, stop_tokens=(38,))  # frequent in both: rows end apart
  budgets = jnp.array([24, 24, 10, 24])
  ar = {}
  for name, params in (("random", target), ("damped", damped)):
    out = generate(params, cfg, P, L, gen, max_new_per_row=budgets)
    ar[name] = (params, np.asarray(out.tokens), np.asarray(out.lengths))
    assert len(set(ar[name][2].tolist())) > 2, ar[name][2]
  return cfg, P, L, gen, budgets, ar


CHAIN = SuffixDrafter(k=4, max_match=8, spec_factor=2.0, global_size=256)
TREE = SuffixTreeDrafter(n_nodes=8, max_depth=4, max_match=8, spec_factor=2.0, global_size=256)


def _run(drafter, cache, target, cfg, P, L, gen, budgets):
  fn = tree_speculative_generate if isinstance(drafter, SuffixTreeDrafter) else speculative_generate
  out = fn(target, cfg, drafter, cache, P, L, gen, max_new_per_row=budgets)
  return np.asarray(out.tokens), np.asarray(out.lengths), summarize(out.metrics)


@pytest.mark.parametrize("drafter", [CHAIN, TREE], ids=["chain", "tree"])
def test_greedy_identical_to_ar(toy, drafter):
  cfg, P, L, gen, budgets, ar = toy
  taus = {}
  for name, (target, ar_tokens, ar_lens) in ar.items():
    outputs = [list(t[:n]) for t, n in zip(ar_tokens, ar_lens)]
    for kind, cache in (
      ("row", drafter.cache_from_outputs([])),
      ("global", drafter.cache_from_outputs(outputs)),
    ):
      toks, lens, s = _run(drafter, cache, target, cfg, P, L, gen, budgets)  # ragged batch of 4
      np.testing.assert_array_equal(lens, ar_lens, err_msg=f"{name} {kind}")
      np.testing.assert_array_equal(toks, ar_tokens, err_msg=f"{name} {kind}")
      assert s["emitted"] == int(ar_lens.sum()) - len(ar_lens)
      assert s["accepted"] <= s["drafted"]
      taus[name, kind] = s["tau"]
      if (name, kind) == ("random", "row"):  # mostly unmatched roots: most passes draft nothing
        assert s["drafted"] < s["target_passes"], s
    for b in (0, 2):  # batch 1, with the cache of the batch's outputs
      toks, lens, _ = _run(
        drafter, cache, target, cfg, P[b : b + 1], L[b : b + 1], gen, budgets[b : b + 1]
      )
      np.testing.assert_array_equal(toks[0], ar_tokens[b], err_msg=f"{name} row {b}")
      assert lens[0] == ar_lens[b]
  # Drafts from the row itself are accepted when the output repeats; the outputs of earlier calls
  # of the same model make drafts much better.
  assert taus["damped", "row"] > 1.1, taus
  assert taus["random", "global"] > taus["random", "row"] + 0.5, taus


@pytest.mark.parametrize("drafter", [CHAIN, TREE], ids=["chain", "tree"])
def test_adaptive_greedy_identical_to_ar(toy, drafter):
  """In adaptive mode (the tree form chooses between an AR step and its whole tree) under a table
  that makes speculating pay only when the suffix matched well: identical to AR, with both
  choices taken."""
  cfg, P, L, gen, budgets, ar = toy
  target, ar_tokens, ar_lens = ar["damped"]
  tree = isinstance(drafter, SuffixTreeDrafter)
  ks = (0, drafter.max_depth) if tree else (0, 2, 4)
  drafter = drafter if tree else dataclasses.replace(drafter, k=max(ks))
  costs = adp.CostTable(ks, (1.0,) + (1.5,) * (len(ks) - 1), (0.0,) * len(ks))
  fn = tree_speculative_generate if tree else speculative_generate
  out = fn(target, cfg, drafter, drafter.cache_from_outputs([]), P, L, gen,
           max_new_per_row=budgets, adaptive=adp.AdaptiveConfig(ks, decay=0.8), costs=costs)  # fmt: skip
  np.testing.assert_array_equal(np.asarray(out.lengths), ar_lens)
  np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens)
  trace = jax.tree.map(np.asarray, out.adaptive)
  chosen = set(trace.choices[: int(trace.n_steps)].tolist())
  assert 0 in chosen and len(chosen) >= 2, chosen


def test_no_host_callbacks_or_transfers_in_loop(toy):
  """Drafting from the row and the global cache is inside the one XLA computation: no callbacks in
  its jaxpr, no transfers when run (the greedy test's static arguments: its compiled loop)."""
  cfg, P, L, gen, budgets, ar = toy
  target, ar_tokens, ar_lens = ar["random"]
  cache = TREE.cache_from_outputs([list(t[:n]) for t, n in zip(ar_tokens, ar_lens)])
  args = (target, cache, P, L, budgets, jax.random.PRNGKey(0))
  static = (cfg, TREE, TreeGreedyRule(), gen)
  jaxpr = str(jax.make_jaxpr(_tree_speculative, static_argnums=(6, 7, 8, 9))(*args, *static))
  assert "while" in jaxpr and "callback" not in jaxpr
  _tree_speculative(*args, *static)
  with jax.transfer_guard("disallow"):
    jax.block_until_ready(_tree_speculative(*args, *static))


# ---- T > 0, rule level: suffix trees under the chi-square suite of tests/test_trees.py ----------
# Random contexts over its V = 5 tokens and a global cache give varied trees (up to 5 nodes, depth 2);
# the target's tables P1, P2, P3 do not depend on the context, so a lossless rule makes the emitted
# three-token sequences (completed by exact sampling) follow P1 * P2 * P3 whatever was drafted.

N_RULE = 50_000
RULE_DRAFTER = SuffixTreeDrafter(
  n_nodes=6, max_depth=2, max_match=3, spec_factor=4.0, min_prob=0.0, max_occurrences=8
)


@dataclasses.dataclass(frozen=True)
class FallbackFromPPointMass(TreePointMassRule):
  """A WRONG rule (negative control): after the walk stops it draws from p, not the residual."""

  def __call__(self, key, tree, logp, max_depth):
    path, n, _ = super().__call__(key, tree, logp, max_depth)
    return path, n, sample_from_logprobs(jax.random.fold_in(key, 3), logp[path[n]])


def _simulate_suffix_trees(rule, seed=0):
  P, _ = _tables(0)
  rng = np.random.RandomState(seed)
  seq = jnp.asarray(rng.randint(0, V, (N_RULE, 8)), jnp.int32)
  cache = suffix_cache_from_outputs([[0, 1, 2, 3], [1, 1, 4], [2, 0, 0, 1], [3, 4, 2]], 24)
  with np.errstate(divide="ignore"):
    L1, L2, L3 = (jnp.asarray(np.log(p), jnp.float32) for p in P)

  @jax.jit
  def run(key, seq):
    tree = RULE_DRAFTER.propose(cache, (), seq, jnp.full((N_RULE,), 8), None, SamplingConfig()).tree
    tok, par = tree.tokens, jnp.maximum(tree.parent, 0)
    x1 = jnp.take_along_axis(tok, par, 1)
    d = tree.depth[..., None]
    logp = jnp.where(d == 0, L1, jnp.where(d == 1, L2[tok], L3[x1, tok]))  # [n, N, V]
    keys = jax.random.split(key, N_RULE)
    path, n, nxt = jax.vmap(lambda k, t, lp: rule(k, t, lp, RULE_DRAFTER.max_depth))(
      keys, tree, logp
    )
    return tok, path, n, nxt

  tok, path, n, nxt = map(np.asarray, run(jax.random.PRNGKey(seed), seq))
  rows = np.arange(N_RULE)
  seqs = np.full((N_RULE, 3), -1)
  for j in (1, 2):
    seqs[n >= j, j - 1] = tok[rows, path[:, j]][n >= j]
  seqs[rows, n] = nxt
  for i in (1, 2):  # complete each prefix by exact ancestral sampling (the next pass's job)
    miss = seqs[:, i] < 0
    probs = P[1][seqs[miss, 0]] if i == 1 else P[2][seqs[miss, 0], seqs[miss, 1]]
    seqs[miss, i] = np.minimum((rng.rand(miss.sum(), 1) > np.cumsum(probs, 1)).sum(1), V - 1)
  return seqs, n


@pytest.mark.parametrize(
  "rule, lossless", [(TreePointMassRule(), True), (FallbackFromPPointMass(), False)]
)
def test_rules_on_suffix_trees(rule, lossless):
  """The right rule passes; the same test rejects a wrong rule on the same trees (it has power)."""
  seqs, n = _simulate_suffix_trees(rule)
  assert 0.3 < n.mean() < 1.9 and (n == 2).mean() > 0.02, n.mean()  # both depths accepted
  pvalue = _joint_pvalue(seqs, _tables(0)[0])
  assert pvalue > 1e-4 if lossless else pvalue < 1e-8, pvalue


# ---- T > 0, whole loop: 3 tokens over a 6-token vocabulary, enumerated exactly -----------------

N_LOOP = 20_000


@pytest.fixture(scope="module")
def small_vocab():
  kw = dict(vocab=6, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(10, scale=0.2, **kw)
  prompt = [1, 2, 4, 1, 2]
  sampling = SamplingConfig(temperature=0.9, top_k=5)
  probs = exact_continuation_probs(target, cfg, prompt, 3, sampling)
  # Earlier outputs continuing the prompt's suffixes several ways: branching trees.
  outputs = [[2, 4, 5, 0], [2, 3, 1, 0], [4, 1, 3], [2, 4, 3, 3], [0, 2, 5]]
  return target, cfg, prompt, sampling, probs, suffix_cache_from_outputs(outputs, 32)


def _loop_pvalue(small_vocab, drafter):
  target, cfg, prompt, sampling, probs, cache = small_vocab
  P, L = pad_prompts([prompt] * N_LOOP, bucket=len(prompt))
  gen = GenerateConfig(max_new_tokens=3, sampling=sampling)
  out = tree_speculative_generate(target, cfg, drafter, cache, P, L, gen, key=jax.random.PRNGKey(2))
  toks = np.asarray(out.tokens)[:, :3]
  assert (np.asarray(out.lengths) == 3).all()
  expected = np.zeros(6**3)
  for (a, b, c), pr in probs.items():
    expected[a * 36 + b * 6 + c] = pr * N_LOOP
  counts = np.bincount(toks @ np.array([36, 6, 1]), minlength=6**3).astype(np.float64)
  assert counts[expected == 0].sum() == 0
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  pvalue = stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
  return pvalue, summarize(out.metrics)


LOOP_TREE = SuffixTreeDrafter(n_nodes=6, max_depth=2, max_match=4, spec_factor=4.0, min_prob=0.0)


def test_loop_sampling_distribution_is_the_targets(small_vocab):
  """Suffix trees through the tree loop and its default rule at T > 0 (TreePointMassRule). The
  chain form goes through `SpeculativeSamplingRule` with a point mass, as prompt lookup does in
  tests/test_speculative.py's chi-square test."""
  pvalue, s = _loop_pvalue(small_vocab, LOOP_TREE)
  assert s["accepted"] > 0.1 * N_LOOP and s["drafted"] > 2 * s["accepted"], s  # accept and reject
  assert pvalue > 1e-4, (pvalue, s)


def test_cache_is_a_pytree_of_fixed_shape():
  a = suffix_cache_from_outputs([[1, 2]], 16)
  b = suffix_cache_from_outputs([[3, 4, 5], [6]], 16)
  assert isinstance(a, SuffixCache) and a.size == b.size == 16
  assert jax.tree.structure(a) == jax.tree.structure(b)
  assert [x.shape for x in jax.tree.leaves(a)] == [(16,), (16,)]


# ---- harness: configs and the global cache from earlier prompts ---------------------------------


@pytest.mark.parametrize(
  "arg, form, loop", [("", "tree", "tree"), ("chain,small", "chain", "chain")]
)
def test_config_builds_the_method(arg, form, loop):
  import os
  import runpy

  from specjax.experiment.methods import Method, build_method
  from specjax.experiment.runner import with_history
  from specjax.experiment.settings import settings_from_config

  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  get_config = runpy.run_path(os.path.join(path, "suffix.py"))["get_config"]
  settings = settings_from_config(get_config(arg))
  assert settings.method == "suffix" and settings.suffix.form == form
  method = build_method(settings, target=None)  # model-free: the target is not needed
  assert method.loop == loop and method.name == (
    "suffix_tree_n16" if form == "tree" else "suffix_k4"
  )
  G = settings.suffix.global_size
  assert (np.asarray(method.draft_params.tokens) == SEP).all()  # no earlier outputs yet
  later = with_history(method, [[5, 6, 7], [8, 9]])
  np.testing.assert_array_equal(later.draft_params.tokens[-7:], [5, 6, 7, SEP, 8, 9, SEP])
  assert later.draft_params.size == G and later.drafter is method.drafter
  other = Method("x", object(), ())  # a drafter without `with_outputs` is left alone
  assert with_history(other, [[1]]) is other


def test_runner_drafts_from_earlier_prompts_outputs():
  """A prompt asked again later drafts from its own earlier answer (the runner's global cache of
  earlier prompts' AR outputs), and still matches AR."""
  from test_experiments import byte_tokenizer

  from specjax.experiment.methods import Target, build_method
  from specjax.experiment.runner import Runner
  from specjax.experiment.settings import base_config, settings_from_config
  from specjax.experiment.tasks import Prompt
  from specjax.model import init_params

  tok = byte_tokenizer()
  cfg = tiny_config(vocab=tok.vocab_size, d_model=32, n_layers=2, max_position=512)
  target = Target(init_params(jax.random.PRNGKey(0), cfg, scale=0.5), cfg, tok, "tiny")
  c = base_config()
  c.method, c.suffix.form, c.max_new_tokens, c.suffix.global_size = "suffix", "chain", 24, 512
  settings = settings_from_config(c)
  runner = Runner(target, [build_method(settings, target)], settings.generate_config(tok.stop_ids))
  runner.log = lambda s: None
  ask = Prompt("qa", 1, ("Where is Paris?",))
  first = runner.run_prompt(ask)
  assert len(runner.history) == 1 and runner.history[0]  # only after the prompt finished
  again = runner.run_prompt(Prompt("qa", 2, ask.turns))
  m1, m2 = first["methods"]["suffix_k4"], again["methods"]["suffix_k4"]
  assert m1["same_as_ar"] and m2["same_as_ar"]
  assert m2["tau"] > m1["tau"] + 1, (m1["tau"], m2["tau"])
