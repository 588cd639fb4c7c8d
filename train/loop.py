"""The training loop: optax updates of the trainable pytree only, resumable from orbax checkpoints.

`train` is deterministic given its inputs: batch s is a pure function of (seed, data_start + s) and
nothing else is random, so a run stopped at any moment (even by SIGKILL) and restarted in the same
work directory restores the last checkpoint and reproduces the loss curve an uninterrupted run
would have drawn.
Per-step metrics go to `metrics.jsonl` (one JSON object per line); a resumed run first cuts the file
back to the restored step (the steps after it are redone, so each step keeps one record) and then
appends. A progress line (step, loss, tokens/s, ETA) is logged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.integrity import write_json_atomic
from specjax.trees import conditional_rates
from train.checkpoint import Checkpointer
from train.data import Windows, step_windows


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Optimisation and bookkeeping.

  Attributes:
    steps: optimizer steps.
    batch_size: windows per step.
    seq_len: positions per window.
    lr: peak learning rate (AdamW).
    warmup: linear warm-up steps.
    min_lr_ratio: cosine decay floor, as a fraction of lr.
    weight_decay: AdamW decay.
    clip: global gradient-norm clip.
    seed: data-order seed.
    data_start: the step of the data order that this run's step 0 reads. A run that continues a
      trained head (`objective.init_from`) sets it past the steps that head trained on, so that it
      reads windows the head has not seen.
    log_every: steps between progress lines.
    eval_every: steps between held-out evaluations (0: only at the end).
    save_every: steps between checkpoints.
    eval_windows: held-out windows evaluated, spread over the held-out stream (0: no evaluation).
    eval_first: also score the same windows on each response's first N tokens alone (metrics
      `first_top1*` and `first_simulated_tau`; 0: not). The kept state is still chosen by the
      metric over every response position.
    first_weight: loss weight of each response's first `eval_first` tokens against 1 for later
      ones (1.0: every response token alike); the logged per-step KL terms are weighted alike.
    time_budget_s: > 0: stop (checkpoint, held-out evaluation, best state kept) after the step
      during which this many seconds of this process's training loop have passed, even if fewer
      than `steps` are done (a time-boxed run on a lent machine); the learning-rate schedule
      still spans `steps`. 0: no limit.
    score_start: with held-out windows, also evaluate the starting state (step 0) and keep it
      unless a later evaluation beats it; the pipeline then ships nothing (a continuation of a
      shipped drafter that made it worse leaves it as it was).
  """

  steps: int = 1000
  batch_size: int = 8
  seq_len: int = 256
  lr: float = 1e-3
  warmup: int = 50
  min_lr_ratio: float = 0.1
  weight_decay: float = 0.0
  clip: float = 1.0
  seed: int = 0
  data_start: int = 0
  log_every: int = 10
  eval_every: int = 0
  save_every: int = 100
  eval_windows: int = 16
  eval_first: int = 0
  first_weight: float = 1.0
  time_budget_s: float = 0.0
  score_start: bool = False

  def __post_init__(self):
    if self.data_start < 0:
      raise ValueError(f"train.data_start must be >= 0, got {self.data_start}")
    if self.first_weight != 1.0 and self.eval_first <= 0:
      raise ValueError(
        "train.first_weight weights each response's first train.eval_first tokens; set "
        "train.eval_first > 0 (64 in the corpus configs) or train.first_weight = 1.0"
      )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """step: scalar int32; params: the trainable pytree; opt_state: optax state of params only."""

  step: jax.Array
  params: Any
  opt_state: Any


def make_optimizer(s: TrainSettings) -> optax.GradientTransformation:
  decay_steps = max(s.steps - s.warmup, 1)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, s.lr, max(s.warmup, 1), s.warmup + decay_steps, s.lr * s.min_lr_ratio
  )
  return optax.chain(
    optax.clip_by_global_norm(s.clip), optax.adamw(schedule, weight_decay=s.weight_decay)
  )


def make_train_step(objective, optimizer: optax.GradientTransformation) -> Callable:
  """jit(state, frozen, batch) -> (state, metrics); `frozen` is never differentiated."""

  def step(state: TrainState, frozen, batch):
    grad_fn = jax.value_and_grad(objective.loss, has_aux=True)
    (loss, aux), grads = grad_fn(state.params, frozen, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
    return TrainState(state.step + 1, params, opt_state), metrics

  return jax.jit(step, donate_argnums=(0,))


def eval_window_ids(n_stream: int, n_windows: int) -> np.ndarray:
  """The held-out windows `evaluate` scores: n_windows of the stream's n_stream, spread evenly."""
  n = min(n_windows, n_stream)
  return np.unique(np.linspace(0, n_stream - 1, n).round().astype(np.int64))


def positions_read(
  settings: TrainSettings, train_windows: Windows, eval_windows: Windows
) -> np.ndarray:
  """[documents] int64: how many positions of each document, from its start, a run with
  `settings` needs features of: those of the windows of steps data_start .. data_start + steps - 1
  and of the held-out windows it evaluates (they must be in the cache before it starts)."""
  n = train_windows.n_windows
  steps = range(settings.data_start, settings.data_start + settings.steps)
  ids = [step_windows(n, settings.batch_size, settings.seed, s) for s in steps]
  need = train_windows.positions_needed(np.concatenate(ids) if ids else [])
  if settings.eval_windows:
    evaluated = eval_window_ids(eval_windows.n_windows, settings.eval_windows)
    need = np.maximum(need, eval_windows.positions_needed(evaluated))
  return need


def evaluate(
  objective, params, frozen, windows: Windows, n_windows: int, batch_size: int, first: int = 0
) -> dict:
  """Held-out agreement: {metric: hits / count} over n_windows windows spread evenly over the
  held-out stream (all of them when it has no more), so every held-out source is sampled, and
  "simulated_tau". first > 0 adds the same over each response's first `first` tokens
  (`first_`-prefixed keys)."""
  fn = jax.jit(objective.evaluate)
  ids = eval_window_ids(windows.n_windows, n_windows)

  def agreement(w: Windows) -> dict:
    sums: dict[str, np.ndarray] = {}
    for lo in range(0, len(ids), batch_size):
      out = fn(params, frozen, w.batch(ids[lo : lo + batch_size]))
      for k, (hits, count) in out.items():
        sums[k] = sums.get(k, np.zeros(2)) + np.asarray([hits, count], np.float64)
    result = {k: float(h / max(c, 1)) for k, (h, c) in sums.items()}
    result["eval_positions"] = int(max((c for _, c in sums.values()), default=0))
    result["simulated_tau"] = simulated_tau(result)
    return result

  result = agreement(windows)
  if first:
    result.update(
      {f"first_{k}": v for k, v in agreement(windows.first_response_tokens(first)).items()}
    )
  return result


_POSITION_KEY = re.compile(r"top1(?:_(?:step|head)(\d+))?$")
_PREFIX_KEY = re.compile(r"prefix_step(\d+)$")
_RANK_KEY = re.compile(r"(?:^|_)rank\d+_")


def shown(ev: dict) -> str:
  """An evaluation's log line: every metric but the per-rank rates (`losses.rank_agreement`),
  which go to metrics.jsonl only."""
  return " ".join(f"{k} {v:.4f}" for k, v in ev.items() if not _RANK_KEY.search(k))


def simulated_tau(ev: dict, k: int = 4) -> float:
  """Expected tokens per verification of a greedy K-token chain from held-out agreement.

  With `prefix_step{j}` (`losses.depth_agreement`: drafts at depths 1..j all right), that is the
  chain's acceptance of j drafts, so tau = 1 + sum_{j <= K} prefix_j, exact on the held-out
  positions; depths past the measured ones keep the last measured ratio prefix_j / prefix_{j-1}.
  Without it (a draft LM's single next-token rate, records written before it existed), drafted
  position i counts as accepted with its own rate a_i (EAGLE's step i, Medusa's head i - 1; the
  last rate for positions past the measured ones), independently: tau = 1 + sum_i prod_{j <= i}
  a_j, an estimate.
  """
  prefix = sorted((int(m.group(1)), v) for key, v in ev.items() if (m := _PREFIX_KEY.match(key)))
  if prefix:
    rates = conditional_rates([v for _, v in prefix])
  else:
    found = sorted(
      (int(m.group(1) or 0), v) for key, v in ev.items() if (m := _POSITION_KEY.match(key))
    )
    if not found:
      raise ValueError(f"no per-position agreement (top1*) among held-out metrics {sorted(ev)}")
    rates = [v for _, v in found]
  rates = rates[:k] + [rates[-1]] * (k - len(rates))
  tau, run = 1.0, 1.0
  for a in rates:
    run *= a
    tau += run
  return tau


class BestCheckpoint:
  """The training state with the highest held-out `simulated_tau` so far, in `workdir/best`.

  Its step and score are kept in `workdir/best/best.json` (written after the state), so a resumed
  run keeps comparing against it.
  """

  def __init__(self, workdir: str, k: int = 4):
    self.dir, self.k = os.path.join(workdir, "best"), k
    self._meta_path = os.path.join(self.dir, "best.json")
    self.step, self.tau, self.eval = None, -1.0, {}
    if os.path.exists(self._meta_path):
      with open(self._meta_path) as f:
        meta = json.load(f)
      self.step, self.tau, self.eval = meta["step"], meta["simulated_tau"], meta["eval"]
    self._ckpt = Checkpointer(os.path.join(self.dir, "state"), max_to_keep=1)

  def offer(self, step: int, ev: dict, state) -> bool:
    """Keeps `state` if its held-out simulated tau beats the best; returns whether it did."""
    tau = simulated_tau(ev, self.k)
    if tau <= self.tau:
      return False
    if self.step != step:
      self._ckpt.save(step, state)
    self.step, self.tau, self.eval = step, tau, ev
    write_json_atomic(self._meta_path, {"step": step, "simulated_tau": tau, "eval": ev})
    return True

  def restore(self, abstract_state):
    return self._ckpt.restore(abstract_state, self.step)

  def close(self) -> None:
    self._ckpt.close()


class MetricsLog:
  """Append-only JSONL of metrics; each line is flushed as soon as it is written."""

  def __init__(self, path: str):
    self.path = path
    self._f = open(path, "a")

  def write(self, record: dict) -> None:
    self._f.write(json.dumps(record) + "\n")
    self._f.flush()

  def close(self) -> None:
    self._f.close()


def read_metrics(path: str) -> list[dict]:
  """Records of a metrics JSONL, skipping a torn last line (a killed writer)."""
  out = []
  with open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def truncate_metrics(path: str, step: int) -> int:
  """Keeps the records of steps <= `step` (a checkpoint's) and drops the rest: the steps after the
  checkpoint are about to be redone, and a final evaluation is written again. Rewrites the file
  atomically (a torn last line goes too). Returns how many records were dropped."""
  if not os.path.exists(path):
    return 0
  records = read_metrics(path)
  keep = [r for r in records if r.get("step", 0) <= step and not r.get("final")]
  dropped = len(records) - len(keep)
  tmp = path + ".tmp"
  try:
    with open(tmp, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in keep)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return dropped


def _to_float(tree) -> dict:
  return {k: float(v) for k, v in jax.device_get(tree).items()}


def train(
  objective,
  trainable,
  frozen,
  train_windows: Windows,
  eval_windows: Windows | None,
  settings: TrainSettings,
  workdir: str,
  log: Callable[[str], None] = print,
  stop_after: int | None = None,
) -> tuple[Any, dict]:
  """Trains (or resumes training) and returns (trainable params, their held-out metrics).

  With held-out windows, the params returned are those of the evaluation (of the starting state
  with `score_start`, every `eval_every` steps and at the end) with the highest `simulated_tau`
  (kept in `workdir/best`), and the metrics theirs, with "step" (0: no step beat the start) and
  "simulated_tau" added; the last state stays in checkpoints/.

  Args:
    objective: a `train.objectives` objective.
    trainable: initial trainable pytree (ignored when a checkpoint exists in workdir).
    frozen: frozen pytree (target arrays, draft vocabulary).
    train_windows: training stream.
    eval_windows: held-out stream, or None.
    settings: optimisation settings.
    workdir: checkpoints and metrics.jsonl.
    log: progress sink.
    stop_after: stop (with a checkpoint) once this many steps are done; for tests and budgets.
  """
  os.makedirs(workdir, exist_ok=True)
  optimizer = make_optimizer(settings)
  # The step donates the state; trainable arrays may alias frozen ones (a head initialised from the
  # target's embedding, say), so the state gets buffers of its own.
  trainable = jax.tree.map(lambda x: jnp.array(x, copy=True), trainable)
  state = TrainState(jnp.zeros((), jnp.int32), trainable, optimizer.init(trainable))
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  if not settings.eval_windows:
    eval_windows = None  # no held-out evaluation
  best = BestCheckpoint(workdir) if eval_windows is not None else None
  if ckpt.latest_step() is not None:
    state = ckpt.restore(jax.eval_shape(lambda: state))
    log(f"resumed from step {int(state.step)}")
  step_fn = make_train_step(objective, optimizer)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  dropped = truncate_metrics(metrics_path, int(state.step))
  if dropped:
    log(f"metrics.jsonl: dropped {dropped} record(s) past step {int(state.step)} (redone now)")
  metrics = MetricsLog(metrics_path)
  last = settings.steps if stop_after is None else min(settings.steps, stop_after)
  start = int(state.step)

  def score(params):  # held-out metrics of `params`
    return evaluate(
      objective, params, frozen, eval_windows, settings.eval_windows, 8, settings.eval_first
    )

  try:
    if settings.score_start and eval_windows is not None and start == 0 < last:
      # The starting state is a candidate too (with no steps, the final evaluation scores it).
      ev = score(state.params)
      metrics.write({"step": 0, "eval": ev})
      best.offer(0, ev, state)
      log("eval step 0: " + shown(ev))
    t0, tokens_seen = time.time(), 0
    t_loop = t0  # the time budget counts from here: it is for the steps
    for s in range(start, last):
      ids = step_windows(
        train_windows.n_windows, settings.batch_size, settings.seed, settings.data_start + s
      )
      batch = train_windows.batch(ids)
      t_step = time.time()
      state, m = step_fn(state, frozen, batch)
      m = _to_float(m)
      done = s + 1
      if s == start:  # the first step compiles; rates count from the end of it
        t0 = time.time()
      else:
        tokens_seen += int((np.asarray(batch.doc) >= 0).sum())
      rate = tokens_seen / max(time.time() - t0, 1e-9)
      metrics.write({"step": done, **m, "tokens_per_s": rate, "step_s": time.time() - t_step})
      out_of_time = 0 < settings.time_budget_s <= time.time() - t_loop
      if out_of_time and done < last:
        log(f"time budget of {settings.time_budget_s:.0f} s spent at step {done}/{last}; stopping")
        last = done
      if done % settings.log_every == 0 or done == last:
        eta = (last - done) * (time.time() - t0) / max(done - start - 1, 1) / 60
        extra = " ".join(f"{k} {v:.3f}" for k, v in m.items() if k != "loss")
        log(
          f"step {done}/{settings.steps} loss {m['loss']:.4f} {extra} | {rate:.0f} tok/s | "
          f"ETA {eta:.1f} min"
        )
      if done % settings.save_every == 0 or done == last:
        ckpt.save(done, state)
      if eval_windows is not None and settings.eval_every and done % settings.eval_every == 0:
        ev = score(state.params)
        metrics.write({"step": done, "eval": ev})
        kept = best.offer(done, ev, state)
        log(f"eval step {done}: " + shown(ev) + (" (best)" if kept else ""))
      if done == last:
        break
    final, params = {}, state.params
    if eval_windows is not None:
      final = score(state.params)
      metrics.write({"step": int(state.step), "eval": final, "final": True})
      log("held-out: " + " ".join(f"{k} {v:.4f}" for k, v in final.items()))
      best.offer(int(state.step), final, state)
      if best.step != int(state.step):
        params, final = best.restore(jax.eval_shape(lambda: state)).params, best.eval
        log(f"keeping step {best.step} (held-out simulated tau {best.tau:.3f})")
      final = {**final, "step": best.step}
  finally:
    metrics.close()
    ckpt.close()
    if best is not None:
      best.close()
  return params, final
