"""How far can a static tree over Medusa heads go? Held-out tree tau by node budget.

A Medusa head proposes the token at its depth whatever the path above it, so on held-out text the
rank of the target's token at each depth (0 = the head's best) decides which tree paths a
verification accepts. This script ranks the target's greedy tokens under every head on the
training config's held-out windows (`train.rescore.heldout_setup`), splits the positions in two
halves at random, fits trees of each `--nodes` budget on one half and scores them on the other:

- `prior`: the tree from held-out top-1 rates and a 0.5**r prior for lower ranks
  (`trees.default_static_tree`, what the shipped heads were decoded with before they recorded
  per-rank rates);
- `rank rates`: the tree from measured per-rank rates (`trees.tree_from_rank_probs`, what
  `tree_heads.fitted_tree` builds from heads whose metadata records them);
- `rank paths`: the best tree for the fitting half's joint rank paths (greedy over path counts,
  which are monotone along a path), an upper reference for any static tree of that budget.

tau = 1 + the accepted depth, as the tree loop counts it (the bonus token included).

  python benchmarks/head_tree_budget.py --config=configs/train_medusa.py --nodes=6,16,32,64
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from specjax.drafters.medusa import medusa_logits
from specjax.trees import TREE_RANKS, conditional_rates, default_static_tree, tree_from_rank_probs
from train.loop import eval_window_ids
from train.losses import greedy_target
from train.rescore import heldout_setup

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "The heads' training config (configs/train_medusa.py[:fused]).", lock_config=False
)
_NODES = flags.DEFINE_list("nodes", ["6", "16", "32", "64"], "tree budgets, root included")
_DEPTH = flags.DEFINE_integer("depth", 4, "largest tree depth (at most the number of heads)")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the fit / score split")


def target_ranks(objective, trainable, frozen, windows, n_windows: int, batch: int) -> np.ndarray:
  """[positions, K] rank of the target's greedy token under each head (TREE_RANKS when it is
  not among the head's best TREE_RANKS, or past the document's end), at every held-out position
  whose depth-1 token is scored."""
  params = objective.draft_params(trainable, frozen)
  d2t = jnp.asarray(frozen["d2t"])

  @jax.jit
  def ranks(b):
    logits = medusa_logits(params, b.hidden, b.layers)  # [B, T, K, Vd]
    out, masks = [], []
    for k in range(logits.shape[2]):
      labels, mask = greedy_target(b, k + 2)
      hit = d2t[jax.lax.top_k(logits[:, :, k], TREE_RANKS)[1]] == labels[..., None]
      out.append(jnp.where(hit.any(-1), jnp.argmax(hit, -1), TREE_RANKS))
      masks.append(mask)
    r, m = jnp.stack(out, -1), jnp.stack(masks, -1)
    return jnp.where(m, r, TREE_RANKS), m[..., 0]

  ids = eval_window_ids(windows.n_windows, n_windows)
  rows = []
  for lo in range(0, len(ids), batch):
    r, first = ranks(windows.batch(ids[lo : lo + batch]))
    rows.append(np.asarray(r)[np.asarray(first)])
  return np.concatenate(rows)


def tree_tau(paths, ranks: np.ndarray) -> float:
  """Mean tokens per verification of a static tree (rank paths) over rank rows."""
  chosen = {tuple(p) for p in paths}
  accepted = 0
  for row in ranks.tolist():
    n = 0
    while n < len(row) and tuple(row[: n + 1]) in chosen:
      n += 1
    accepted += n
  return 1.0 + accepted / len(ranks)


def path_tree(ranks: np.ndarray, n_nodes: int, depth: int) -> set[tuple[int, ...]]:
  """The n_nodes - 1 rank paths (prefix-closed) that the most rows follow."""
  counts = collections.Counter()
  for row in ranks[:, :depth].tolist():
    for d in range(depth):
      if row[d] >= TREE_RANKS:
        break
      counts[tuple(row[: d + 1])] += 1
  chosen: set[tuple[int, ...]] = set()
  frontier = {p: c for p, c in counts.items() if len(p) == 1}
  while frontier and len(chosen) < n_nodes - 1:
    best = max(frontier, key=lambda p: (frontier[p], -len(p), [-x for x in p]))
    chosen.add(best)
    del frontier[best]
    frontier.update({p: c for p, c in counts.items() if len(p) == len(best) + 1 and p[:-1] == best})
  return chosen


def main(argv):
  del argv
  s, meta, objective, trainable, frozen, windows = heldout_setup(_CONFIG.value)
  if objective.name != "medusa":
    raise ValueError(
      f"{meta['name']} is a {objective.name!r} drafter; this script ranks Medusa heads"
    )
  depth = _DEPTH.value
  if depth > objective.n_heads:
    raise ValueError(f"--depth={depth} exceeds the {objective.n_heads} heads")
  t = s.train
  ranks = target_ranks(objective, trainable, frozen, windows, t.eval_windows, t.batch_size)
  order = np.random.default_rng(_SEED.value).permutation(len(ranks))
  fit, score = ranks[order[: len(order) // 2]], ranks[order[len(order) // 2 :]]
  chained = [float(np.mean(np.all(fit[:, : d + 1] == 0, 1))) for d in range(depth)]
  conditional = conditional_rates(chained)
  rates = np.asarray([[np.mean(fit[:, d] == r) for r in range(TREE_RANKS)] for d in range(depth)])
  print(f"{meta['name']}: {len(ranks)} held-out positions ({len(fit)} fit, {len(score)} scored)")
  print("per-rank rates (fit half), rank 0 first:")
  for d in range(depth):
    print(f"  depth {d + 1}: " + " ".join(f"{x:.3f}" for x in rates[d]))
  print("\n| nodes | prior | rank rates | rank paths |\n|---:|---:|---:|---:|")
  for n in (int(x) for x in _NODES.value):
    prior = default_static_tree(n, depth, conditional).paths
    fitted = tree_from_rank_probs(rates, n).paths
    best = path_tree(fit, n, depth)
    taus = [tree_tau(p, score[:, :depth]) for p in (prior, fitted, best)]
    print(f"| {n} | " + " | ".join(f"{x:.3f}" for x in taus) + " |", flush=True)


if __name__ == "__main__":
  app.run(main)
