"""Training throughput per drafter objective on SmolLM2-135M, and where a step's time goes.

For each objective of the shipped training configs (`configs/train_*.py`), on one batch of the
configured shape (features drawn at random: the arithmetic does not depend on their values), it
times with warm compiled functions, median of --repeats:
  step:       the optimizer step (loss, gradients, AdamW update), positions per second;
  forward:    the loss alone (no gradients);
  target_p:   the distillation target alone, log_softmax(h @ head[d2t].T) over the draft vocabulary
              (what precomputed top-k target log-probs would replace).

  python benchmarks/train_throughput.py [--kinds=eagle3,medusa] [--repeats=5]

Every figure is printed with the load average (it counts only at <= 2.5 on the 2-core machine).
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from specjax.experiment.costs import median_time  # noqa: E402
from specjax.experiment.settings import load_config_file  # noqa: E402
from specjax.loading.registry import load_model  # noqa: E402
from train import pipeline  # noqa: E402
from train.data import Batch  # noqa: E402
from train.loop import (  # noqa: E402
  TrainState,  # noqa: E402
  make_optimizer,
  make_train_step,
)
from train.losses import target_logp  # noqa: E402

CONFIGS = {
  "eagle3": "train_eagle3",
  "eagle1": "train_eagle",
  "medusa": "train_medusa",
  "draft_lm": "train_draft_lm",
}
_KINDS = flags.DEFINE_list("kinds", list(CONFIGS), "Objectives to time.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per figure (median).")


def random_batch(key, B: int, T: int, D: int, n_layers: int, vocab: int) -> Batch:
  k1, k2, k3 = jax.random.split(key, 3)
  layers = jax.random.normal(k3, (n_layers, B, T, D)) if n_layers else None
  return Batch(
    tokens=jax.random.randint(k1, (B, T), 0, vocab),
    hidden=jax.random.normal(k2, (B, T, D)),
    layers=layers,
    doc=jnp.zeros((B, T), jnp.int32),
    pos=jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
    response=jnp.ones((B, T), bool),
  )


def load() -> str:
  return f"load {os.getloadavg()[0]:.2f}"


def time_kind(kind: str, params, tcfg, repeats: int) -> str:
  """One line: step, forward and distillation-target seconds of `kind`'s configured batch."""
  s = pipeline.settings_from_config(
    load_config_file(os.path.join(REPO, "configs", f"{CONFIGS[kind]}.py"))
  )
  objective = pipeline.make_objective(s.objective, tcfg)
  trainable, frozen = objective.init(
    jax.random.PRNGKey(0), params, tcfg, np.arange(s.data.draft_vocab)
  )
  n_layers = len(getattr(objective, "fuse_layers", ()))
  B, T = s.train.batch_size, s.train.seq_len
  batch = random_batch(jax.random.PRNGKey(1), B, T, tcfg.d_model, n_layers, tcfg.vocab_size)
  optimizer = make_optimizer(s.train)
  step = make_train_step(objective, optimizer)
  trainable = jax.tree.map(lambda x: jnp.array(x, copy=True), trainable)
  state = [TrainState(jnp.zeros((), jnp.int32), trainable, optimizer.init(trainable))]

  def one_step():
    state[0], m = step(state[0], frozen, batch)
    return m

  forward = jax.jit(objective.loss)
  tp = jax.jit(target_logp)
  t_step = median_time(one_step, repeats)
  t_fwd = median_time(lambda: forward(state[0].params, frozen, batch), repeats)
  t_tp = median_time(lambda: tp(batch.hidden, frozen["head"]), repeats)
  return (
    f"{kind:8s} batch {B}x{T}: step {t_step:.2f} s = {B * T / t_step:.0f} positions/s | "
    f"forward {t_fwd:.2f} s ({t_fwd / t_step:.0%} of a step) | target_p {t_tp:.3f} s "
    f"({t_tp / t_step:.0%}) | {load()}"
  )


def main(argv):
  del argv
  params, tcfg, _ = load_model("smollm2-135m-instruct")
  for kind in _KINDS.value:
    print(time_kind(kind, params, tcfg, _REPEATS.value), flush=True)


if __name__ == "__main__":
  app.run(main)
