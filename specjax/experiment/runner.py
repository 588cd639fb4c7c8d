"""Times the AR baseline and speculative methods on the same prompts, resumably.

For every prompt the runner generates with the jitted AR loop (`specjax.generate.generate`) and
then with each method (`specjax.speculative.speculative_generate` for chain drafters,
`specjax.tree_speculative.tree_speculative_generate` for token trees, `specjax.smc.smc_generate` for
SMC-SD), one prompt per call (batch 1),
from the same padded tokens and the same PRNG key. A call is timed only once its shapes are
compiled: the first time a padded prompt width is seen, each loop is run untimed with a budget of
one token (budgets are traced values, so this compiles exactly the program that is then timed).
Prompts are padded to a power of two (at least `bucket`) to keep the number of compiled shapes small.

Multi-turn prompts (MT-bench) ask each user turn after the model's previous answers; the answers
are the AR baseline's, so every method sees the same token ids (at temperature 0 a lossless
method produces the same answer anyway, which `same_as_ar` records). Counts and times are summed
over turns.

One JSON record per prompt is appended to `records.jsonl` as soon as the prompt finishes; a rerun
with the same settings skips the prompts already there.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.experiment.methods import Method, Target
from specjax.experiment.settings import SMCSettings
from specjax.experiment.tasks import Prompt, conversation
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.metrics import SpecMetrics, summarize
from specjax.smc import SMCConfig, SMCOutput, smc_generate
from specjax.speculative import speculative_generate
from specjax.tree_speculative import tree_speculative_generate

RECORDS = "records.jsonl"
SETTINGS = "settings.json"


def bucket_width(n_tokens: int, bucket: int) -> int:
  """Padded prompt width: the next power of two >= n_tokens, at least `bucket`."""
  return max(bucket, 1 << max(n_tokens - 1, 0).bit_length())


@dataclasses.dataclass(frozen=True)
class Generation:
  """One timed generation of one prompt.

  Attributes:
    tokens: the generated token ids.
    wall_s: seconds from the call to the result being ready (prefill included).
    metrics: speculative counters (None for AR).
    target_passes: target forward passes after prefill.
  """

  tokens: list[int]
  wall_s: float
  metrics: SpecMetrics | None
  target_passes: int


class Runner:
  """Runs and times one prompt with AR and with each method; compiles each new shape first."""

  def __init__(
    self,
    target: Target,
    methods: Sequence[Method],
    gen: GenerateConfig,
    seed: int = 0,
    bucket: int = 64,
    log: Callable[[str], None] = print,
  ):
    self.target, self.methods, self.gen = target, list(methods), gen
    self.seed, self.bucket, self.log = seed, bucket, log
    self._compiled: set[tuple[str, int]] = set()

  def _call(self, method: Method | None, prompts, lens, key, budget=None):
    t = self.target
    if method is None:
      return generate(t.params, t.cfg, prompts, lens, self.gen, key, budget)
    if method.loop == "smc":
      return smc_generate(
        t.params, t.cfg, method.drafter, method.draft_params, prompts, lens,
        smc_config(method.smc, self.gen), key,
      )  # fmt: skip
    fn = tree_speculative_generate if method.loop == "tree" else speculative_generate
    return fn(
      t.params, t.cfg, method.drafter, method.draft_params, prompts, lens, self.gen,
      method.rule, key, budget,
    )  # fmt: skip

  def run(self, method: Method | None, ids: Sequence[int], key: jax.Array) -> Generation:
    """Generates from `ids` with `method` (None = AR), compiling the shape untimed if new."""
    width = bucket_width(len(ids), self.bucket)
    limit = self.target.cfg.max_position
    if width + self.gen.max_new_tokens > limit:
      raise ValueError(f"prompt of {len(ids)} tokens + max_new_tokens exceeds the {limit} context")
    prompts, lens = pad_prompts([list(ids)], bucket=width)
    name = "ar" if method is None else method.name
    if (name, width) not in self._compiled:
      t0 = time.perf_counter()
      budget = np.ones((1,), np.int32)  # SMC-SD has no traced budget: it compiles on a full run
      jax.block_until_ready(self._call(method, prompts, lens, key, budget))
      self.log(f"  compiled {name} for prompt width {width} in {time.perf_counter() - t0:.1f} s")
      self._compiled.add((name, width))
    t0 = time.perf_counter()
    out = jax.block_until_ready(self._call(method, prompts, lens, key))
    wall = time.perf_counter() - t0
    n = int(out.lengths[0])
    tokens = np.asarray(out.tokens[0, :n]).tolist()
    if method is None:
      return Generation(tokens, wall, None, int(out.target_passes[0]))
    if method.loop == "smc":
      metrics = smc_metrics(out, method.drafter.k)
      return Generation(tokens, wall, metrics, int(out.target_passes[0]))
    return Generation(tokens, wall, out.metrics, int(out.metrics.target_passes[0]))

  def run_prompt(self, prompt: Prompt) -> dict:
    """All turns of `prompt` with AR and every method; returns its JSON record."""
    tok = self.target.tokenizer
    key = jax.random.fold_in(jax.random.PRNGKey(self.seed), prompt.prompt_id)
    answers: list[str] = []
    prompt_tokens: list[int] = []
    runs: dict[str, list[Generation]] = {"ar": []}
    runs.update({m.name: [] for m in self.methods})
    for turn in range(len(prompt.turns)):
      ids = tok.encode_chat(conversation(prompt.turns[: turn + 1], answers))
      prompt_tokens.append(len(ids))
      turn_key = jax.random.fold_in(key, turn)
      ar = self.run(None, ids, turn_key)
      runs["ar"].append(ar)
      for m in self.methods:
        runs[m.name].append(self.run(m, ids, turn_key))
      answers.append(tok.decode(ar.tokens))
    record = {
      "category": prompt.category,
      "prompt_id": prompt.prompt_id,
      "turns": len(prompt.turns),
      "prompt_tokens": prompt_tokens,
      "ar": _totals(runs["ar"]),
      "methods": {},
      "answer": answers[-1],
    }
    for m in self.methods:
      r = _totals(runs[m.name])
      r["speedup"] = r["tok_s"] / record["ar"]["tok_s"]
      r["same_as_ar"] = all(a.tokens == b.tokens for a, b in zip(runs["ar"], runs[m.name]))
      record["methods"][m.name] = r
    return record


def smc_config(s: SMCSettings, gen: GenerateConfig) -> SMCConfig:
  """SMC-SD settings for one run: the target samples at the experiment's temperature."""
  return SMCConfig(
    n_particles=s.n_particles,
    draft_temperature=s.draft_temperature,
    target_temperature=gen.sampling.temperature,
    ess_threshold=s.ess_threshold,
    max_new_tokens=gen.max_new_tokens,
    stop_tokens=tuple(gen.stop_tokens),
  )


def smc_metrics(out: SMCOutput, k: int) -> SpecMetrics:
  """SMC-SD's counters in `SpecMetrics` form. SMC-SD rejects nothing: every drafted token of the
  chosen particle is kept, so "accepted" counts kept drafts (emitted tokens less one target token
  per cycle) and every position counts as reached and accepted in every cycle."""
  passes = jnp.asarray(out.target_passes, jnp.int32)
  emitted = jnp.asarray(out.lengths, jnp.int32) - 1
  per_pos = jnp.broadcast_to(passes[:, None], (passes.shape[0], k))
  return SpecMetrics(
    passes, passes * k, jnp.maximum(emitted - passes, 0), emitted, per_pos, per_pos
  )


def _totals(gens: Sequence[Generation]) -> dict:
  new = sum(len(g.tokens) for g in gens)
  wall = sum(g.wall_s for g in gens)
  out = {
    "new_tokens": new,
    "wall_s": wall,
    "tok_s": new / wall,
    "target_passes": sum(g.target_passes for g in gens),
  }
  if gens[0].metrics is not None:
    total = gens[0].metrics
    for g in gens[1:]:
      total = jax.tree.map(operator.add, total, g.metrics)
    out.update(summarize(total))
    out["accepted_at"] = np.asarray(total.accepted_at).sum(0).tolist()  # raw counts, for pooling
    out["reached_at"] = np.asarray(total.reached_at).sum(0).tolist()
  return out


def read_records(path: str) -> list[dict]:
  """Records of a `records.jsonl`; a torn last line (a run killed mid-write) is dropped."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = f.read().splitlines()
  records = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if i != len(lines) - 1:
        raise ValueError(f"{path}:{i + 1}: corrupt record") from None
  return records


def _drop_torn_tail(path: str, records: Sequence[dict]) -> None:
  """Rewrites `path` with just `records` if a killed run left a partial last line."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    text = f.read()
  if text and not text.endswith("\n"):
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in records)


def check_settings(workdir: str, settings: dict) -> None:
  """Writes `settings.json`, or checks that a resumed run uses the same settings."""
  path = os.path.join(workdir, SETTINGS)
  text = json.dumps(settings, indent=2, sort_keys=True, default=str)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    new = json.loads(text)
    if old != new:
      diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
      raise ValueError(
        f"{workdir} holds a run with different settings (differ in {diff}); "
        "use a new --workdir or delete the old one"
      )
    return
  os.makedirs(workdir, exist_ok=True)
  with open(path, "w") as f:
    f.write(text + "\n")


def run_suite(
  runner: Runner,
  prompts: Sequence[Prompt],
  workdir: str,
  settings: dict,
  log: Callable[[str], None] = print,
) -> list[dict]:
  """Runs every prompt not yet in `workdir/records.jsonl`, appending a record after each.

  Returns:
    The records of `prompts` (finished earlier or now), in the order of `prompts`.
  """
  check_settings(workdir, settings)
  path = os.path.join(workdir, RECORDS)
  finished = read_records(path)
  _drop_torn_tail(path, finished)
  done = {r["prompt_id"]: r for r in finished}
  todo = [p for p in prompts if p.prompt_id not in done]
  if len(todo) < len(prompts):
    log(f"resuming: {len(prompts) - len(todo)} of {len(prompts)} prompts already in {path}")
  with open(path, "a") as f:
    for i, p in enumerate(todo, 1):
      rec = runner.run_prompt(p)
      f.write(json.dumps(rec) + "\n")
      f.flush()
      done[p.prompt_id] = rec
      log(f"[{i}/{len(todo)}] {progress_line(rec)}")
  return [done[p.prompt_id] for p in prompts]


def progress_line(rec: dict) -> str:
  ar = rec["ar"]
  parts = [
    f"{rec['category']} #{rec['prompt_id']}: AR {ar['tok_s']:.1f} tok/s "
    f"({ar['new_tokens']} tok, {ar['wall_s']:.2f} s)"
  ]
  for name, m in rec["methods"].items():
    parts.append(
      f"{name} {m['tok_s']:.1f} tok/s, tau {m['tau']:.2f}, acc {m['acceptance_rate']:.2f}, "
      f"speedup {m['speedup']:.2f}x{'' if m['same_as_ar'] else ', output differs from AR'}"
    )
  return " | ".join(parts)
