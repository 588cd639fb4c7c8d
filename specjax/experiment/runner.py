"""Times the AR baseline and speculative methods on the same prompts, resumably.

For every prompt the runner generates with the jitted AR loop (`specjax.generate.generate`) and
then with each method (`specjax.speculative.speculative_generate` for chain drafters,
`specjax.tree_speculative.tree_speculative_generate` for token trees, `specjax.smc.smc_generate` for
SMC-SD), one prompt per call (batch 1),
from the same padded tokens and the same PRNG key. A call is timed only once its shapes are
compiled: the first time a padded prompt width is seen, each loop is run untimed with a budget of
one token (budgets are traced values, so this compiles exactly the program that is then timed).
Prompts are padded to a power of two (at least `min_width`) to keep the number of compiled shapes
small, capped so that the padded prompt, the budget and the widest method's draft slots fit the
target's context (`prompt_width`); whether a prompt fits is decided on its real length.
(`specjax.generate.pad_prompts`'s `bucket` is something else: it pads to a multiple.)

A method whose drafter drafts from earlier outputs (a `DraftsFromOutputs`, e.g. suffix
decoding) gets, before each prompt, draft parameters built from the AR outputs of every prompt this
runner ran before it (not of the prompt itself, nor of prompts finished by an earlier, resumed run).

Multi-turn prompts (MT-bench) ask each user turn after the model's previous answers; the answers
are the AR baseline's, so every method sees the same token ids (at temperature 0 a lossless
method produces the same answer anyway, which `same_as_ar` records). Counts and times are summed
over turns.

One JSON record per prompt is appended to `records.jsonl` as soon as the prompt finishes; a rerun
with the same settings (`settings.json`) and the same weights (`weights.json`: a fingerprint of the
target's and of each method's weights, so that a drafter retrained since is not resumed from its
predecessor's records) skips the prompts already there. A prompt that cannot run (too long for the
context, a chat template error, out of memory) is recorded there too, as
`{"category", "prompt_id", "error"}`, and skipped: the suite goes on, the summary counts it, and a
rerun does not retry it (delete its line to retry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import numpy as np

from specjax.drafters.base import DraftsFromOutputs
from specjax.experiment.methods import Method, Target
from specjax.experiment.settings import SMCSettings
from specjax.experiment.tasks import Prompt, conversation
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.integrity import weights_fingerprint
from specjax.metrics import SpecMetrics, summarize
from specjax.smc import SMCConfig, smc_generate
from specjax.speculative import speculative_generate
from specjax.tree_speculative import tree_speculative_generate

RECORDS = "records.jsonl"
SETTINGS = "settings.json"
WEIGHTS = "weights.json"


class ResumeError(ValueError):
  """A workdir holds a run with other settings or weights than the run asked to resume it."""


# What a prompt that cannot run raises (user-input and resource errors, not programming errors).
SKIPPABLE = (ValueError, RuntimeError, MemoryError)


def run_method(target: Target, method: Method | None, gen: GenerateConfig, prompts, lens, key,
           budget=None):  # fmt: skip
  """Generates from padded prompts [B, Tp] with `method` (None = AR) in the decode loop its
  `loop` names: `generate`, `speculative_generate`, `tree_speculative_generate` or
  `smc_generate`. budget: optional [B] per-row token budgets."""
  t = target
  if method is None:
    return generate(t.params, t.cfg, prompts, lens, gen, key, budget)
  if method.loop == "smc":
    return smc_generate(
      t.params, t.cfg, method.drafter, method.draft_params, prompts, lens,
      smc_config(method.smc, gen), key, budget,
    )  # fmt: skip
  fn = tree_speculative_generate if method.loop == "tree" else speculative_generate
  adaptive = {}
  if method.adaptive is not None:
    costs = method.costs(prompts.shape[1]) if callable(method.costs) else method.costs
    adaptive = {"adaptive": method.adaptive, "costs": costs}
  return fn(
    t.params, t.cfg, method.drafter, method.draft_params, prompts, lens, gen,
    method.rule, key, budget, **adaptive,
  )  # fmt: skip


def prompt_width(n_tokens: int, min_width: int, max_width: int) -> int:
  """Padded prompt width: the next power of two >= n_tokens, at least `min_width`, at most
  `max_width` (what fits the context), and never less than `n_tokens`."""
  pow2 = 1 << max(n_tokens - 1, 0).bit_length()
  return max(n_tokens, min(max(min_width, pow2), max_width))


def draft_slots(method: Method) -> int:
  """Cache slots a method needs past the prompt and budget: one verify block plus drafter slack."""
  d = method.drafter
  block = d.n_nodes if method.loop == "tree" else d.k + 1
  return block + d.capacity_slack()


def prompt_seed(prompt_id: int | str) -> int:
  """The PRNG fold-in value of a prompt: its id if that is a uint32, else a hash of the id."""
  if isinstance(prompt_id, int) and 0 <= prompt_id < 2**32:
    return prompt_id
  return int.from_bytes(hashlib.sha256(str(prompt_id).encode()).digest()[:4], "little")


@dataclasses.dataclass(frozen=True)
class Generation:
  """One timed generation of one prompt.

  Attributes:
    tokens: the generated token ids.
    wall_s: seconds from the call to the result being ready (prefill included).
    metrics: speculative counters (None for AR).
    target_passes: target forward passes after prefill.
    k_trace: adaptive methods: the K chosen at each step (None otherwise).
  """

  tokens: list[int]
  wall_s: float
  metrics: SpecMetrics | None
  target_passes: int
  k_trace: list[int] | None = None


class Runner:
  """Runs and times one prompt with AR and with each method; compiles each new shape first.

  With `repeats` > 1 every turn is timed that many times, AR and the methods round-robin in
  alternating order (so drift on a shared machine hits all alike), and each keeps its median wall
  time; the outputs of the repeats must agree.
  """

  def __init__(
    self,
    target: Target,
    methods: Sequence[Method],
    gen: GenerateConfig,
    seed: int = 0,
    min_width: int = 64,
    log: Callable[[str], None] = print,
    repeats: int = 1,
  ):
    if repeats < 1:
      raise ValueError(f"repeats must be >= 1, got {repeats}")
    self.target, self.methods, self.gen = target, list(methods), gen
    self.seed, self.min_width, self.log, self.repeats = seed, min_width, log, repeats
    self.draft_slots = max((draft_slots(m) for m in self.methods), default=0)
    self._compiled: set[tuple[str, int]] = set()
    self.history: list[list[int]] = []  # AR outputs of the prompts run so far, oldest first

  def _call(self, method: Method | None, prompts, lens, key, budget=None):
    return run_method(self.target, method, self.gen, prompts, lens, key, budget)

  def run(self, method: Method | None, ids: Sequence[int], key: jax.Array) -> Generation:
    """Generates from `ids` with `method` (None = AR), compiling the shape untimed if new."""
    limit, max_new = self.target.cfg.max_position, self.gen.max_new_tokens
    if len(ids) + max_new > limit:
      raise ValueError(
        f"prompt of {len(ids)} tokens + max_new_tokens {max_new} exceeds the {limit}-token "
        f"context of {self.target.name}"
      )
    width = prompt_width(len(ids), self.min_width, limit - max_new - self.draft_slots)
    prompts, lens = pad_prompts([list(ids)], bucket=width)  # a multiple of width >= len: width
    name = "ar" if method is None else method.name
    if (name, width) not in self._compiled:
      t0 = time.perf_counter()
      budget = np.ones((1,), np.int32)
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
    if method.loop == "smc":  # the chosen particle's counters, counted in the loop
      return Generation(tokens, wall, out.metrics, int(out.metrics.target_passes[0]))
    return Generation(
      tokens, wall, out.metrics, int(out.metrics.target_passes[0]), adaptive_trace(out.adaptive)
    )

  def _timed_turn(self, ids: Sequence[int], key: jax.Array) -> dict[str, Generation]:
    """AR and every method on one turn, `repeats` rounds; each keeps its median wall time."""
    order = [None, *(with_history(m, self.history) for m in self.methods)]
    gens: dict[str, list[Generation]] = {}
    for r in range(self.repeats):
      for m in order if r % 2 == 0 else order[::-1]:
        gens.setdefault("ar" if m is None else m.name, []).append(self.run(m, ids, key))
    out = {}
    for name, g in gens.items():
      if any(x.tokens != g[0].tokens for x in g[1:]):
        raise RuntimeError(f"{name}: repeats of the same call generated different tokens")
      out[name] = dataclasses.replace(g[0], wall_s=float(np.median([x.wall_s for x in g])))
    return {"ar": out["ar"], **{m.name: out[m.name] for m in self.methods}}

  def run_prompt(self, prompt: Prompt) -> dict:
    """All turns of `prompt` with AR and every method; returns its JSON record."""
    tok = self.target.tokenizer
    key = jax.random.fold_in(jax.random.PRNGKey(self.seed), prompt_seed(prompt.prompt_id))
    answers: list[str] = []
    prompt_tokens: list[int] = []
    runs: dict[str, list[Generation]] = {"ar": []}
    runs.update({m.name: [] for m in self.methods})
    for turn in range(len(prompt.turns)):
      ids = tok.encode_chat(conversation(prompt.turns[: turn + 1], answers))
      prompt_tokens.append(len(ids))
      turn_key = jax.random.fold_in(key, turn)
      for name, gen in self._timed_turn(ids, turn_key).items():
        runs[name].append(gen)
      answers.append(tok.decode(runs["ar"][-1].tokens))
    self.history.extend(g.tokens for g in runs["ar"])
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


def with_history(method: Method, outputs: Sequence[Sequence[int]]) -> Method:
  """`method` with draft parameters built from earlier outputs, if its drafter drafts from them
  (same shapes every time: no recompilation)."""
  if not isinstance(method.drafter, DraftsFromOutputs):
    return method
  return dataclasses.replace(
    method, draft_params=method.drafter.with_outputs(method.draft_params, outputs)
  )


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


def adaptive_trace(trace) -> list[int] | None:
  """The K of each step of an adaptive loop's `AdaptiveTrace` (batch 1: the row's steps)."""
  if trace is None:
    return None
  ks = np.asarray(trace.ks)
  return ks[np.asarray(trace.choices)[: int(trace.n_steps)]].tolist()


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
  if gens[0].k_trace is not None:  # adaptive: steps per chosen K (over turns) and each turn's Ks
    counts = sorted(Counter(k for g in gens for k in g.k_trace).items())
    out["k_steps"] = {str(k): n for k, n in counts}
    out["k_trace"] = [g.k_trace for g in gens]
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


def _drop_torn_tail(path: str) -> None:
  """Cuts a partial last line (a run killed mid-write, or a full disk) off `path`, in place; a
  whole record that only lacks its newline gets one. Earlier lines are never rewritten."""
  if not os.path.exists(path):
    return
  with open(path, "rb") as f:
    data = f.read()
  if not data or data.endswith(b"\n"):
    return
  cut = data.rfind(b"\n") + 1
  try:
    json.loads(data[cut:])
  except ValueError:
    os.truncate(path, cut)
    return
  with open(path, "ab") as f:
    f.write(b"\n")


def check_settings(workdir: str, settings: dict) -> None:
  """Writes `settings.json`, or checks that a resumed run uses the same settings.

  Cheap, so entry points call it before loading any model.

  Raises:
    ResumeError: if `workdir` holds a run with other settings.
    ValueError: if `workdir` cannot be created or written.
  """
  check_writable(workdir)
  _write_or_compare(workdir, SETTINGS, settings, "settings")


def check_weights(workdir: str, runner: Runner) -> None:
  """Writes `weights.json`, or checks that a resumed run decodes with the same weights.

  The fingerprints (`specjax.integrity.weights_fingerprint`) are of the target's weights and of
  each method's draft parameters: settings name a shipped drafter or a model, not which weights
  that name held when the records were written.

  Raises:
    ResumeError: naming the models whose weights differ from the resumed run's.
  """
  fingerprints = {"target": weights_fingerprint(runner.target.params)}
  fingerprints |= {m.name: weights_fingerprint(m.draft_params) for m in runner.methods}
  _write_or_compare(workdir, WEIGHTS, fingerprints, "weights (a model or drafter changed since)")


def _write_or_compare(workdir: str, name: str, value: dict, what: str) -> None:
  """Writes `value` as JSON to `workdir/name`, or raises if the file there holds another value."""
  path = os.path.join(workdir, name)
  text = json.dumps(value, indent=2, sort_keys=True, default=str)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    new = json.loads(text)
    if old != new:
      diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
      raise ResumeError(
        f"{workdir} holds a run with different {what} (differ in {diff}); "
        "use a new --workdir or delete the old one"
      )
    return
  with open(path, "w") as f:
    f.write(text + "\n")


def check_writable(workdir: str) -> None:
  """Creates `workdir` if needed and checks that files can be written there.

  Raises:
    ValueError: naming the directory and the OS error, if not.
  """
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise ValueError(
      f"--workdir {workdir} is not writable ({e.strerror or e}); choose another directory"
    ) from e


def run_suite(
  runner: Runner,
  prompts: Sequence[Prompt],
  workdir: str,
  settings: dict,
  log: Callable[[str], None] = print,
) -> list[dict]:
  """Runs every prompt not yet in `workdir/records.jsonl`, appending a record after each.

  A prompt that raises one of `SKIPPABLE` gets an error record instead (see the module docstring)
  and the suite goes on; `skipped_records` lists those.

  Raises:
    ResumeError: if `workdir` holds a run with other settings or weights (`check_settings`,
      `check_weights`).

  Returns:
    The records of `prompts` that ran (finished earlier or now), in the order of `prompts`.
  """
  dups = sorted(str(i) for i, n in Counter(p.prompt_id for p in prompts).items() if n > 1)
  if dups:
    raise ValueError(f"prompt ids must be unique; repeated: {', '.join(dups)}")
  check_settings(workdir, settings)
  check_weights(workdir, runner)
  path = os.path.join(workdir, RECORDS)
  finished = read_records(path)
  _drop_torn_tail(path)
  done = {r["prompt_id"]: r for r in finished}
  todo = [p for p in prompts if p.prompt_id not in done]
  if len(todo) < len(prompts):
    n_err = sum("error" in done[p.prompt_id] for p in prompts if p.prompt_id in done)
    errs = f" ({n_err} skipped with an error; delete their lines to retry)" if n_err else ""
    log(f"resuming: {len(prompts) - len(todo)} of {len(prompts)} prompts already in {path}{errs}")
  with open(path, "ab", buffering=0) as f:  # unbuffered: a failed write leaves nothing pending
    for i, p in enumerate(todo, 1):
      try:
        rec = runner.run_prompt(p)
      except SKIPPABLE as e:
        rec = error_record(p, e)
      try:
        _write_all(f, (json.dumps(rec) + "\n").encode())
      except OSError as e:
        raise OSError(
          e.errno,
          f"cannot append to {path} ({e.strerror}); the records before this prompt are kept: "
          "make room and rerun the same command to resume",
        ) from e
      done[p.prompt_id] = rec
      log(f"[{i}/{len(todo)}] {progress_line(rec)}")
  return [done[p.prompt_id] for p in prompts if "error" not in done[p.prompt_id]]


def _write_all(f, data: bytes) -> None:
  """Writes all of `data` to an unbuffered file (a raw write may take only part of it)."""
  view = memoryview(data)
  while view:
    view = view[f.write(view) :]


def error_record(prompt: Prompt, error: BaseException) -> dict:
  """The record of a prompt that could not run."""
  return {
    "category": prompt.category,
    "prompt_id": prompt.prompt_id,
    "turns": len(prompt.turns),
    "error": f"{type(error).__name__}: {error}",
  }


def skipped_records(workdir: str, prompts: Sequence[Prompt]) -> list[dict]:
  """The error records of `prompts` in `workdir/records.jsonl` (prompts that could not run)."""
  ids = {p.prompt_id for p in prompts}
  records = read_records(os.path.join(workdir, RECORDS))
  return [r for r in records if "error" in r and r["prompt_id"] in ids]


def skipped_summary(skipped: Sequence[dict], n_prompts: int) -> str:
  """One line per distinct error: how many prompts were skipped and why ("" if none)."""
  if not skipped:
    return ""
  why: dict[str, list] = {}
  for r in skipped:
    why.setdefault(r["error"], []).append(f"{r['category']} #{r['prompt_id']}")
  lines = [f"skipped {len(skipped)} of {n_prompts} prompts (error records in {RECORDS}):"]
  lines += [f"  {len(ps)}x {err} ({', '.join(ps)})" for err, ps in why.items()]
  return "\n".join(lines)


def progress_line(rec: dict) -> str:
  if "error" in rec:
    return f"{rec['category']} #{rec['prompt_id']}: skipped: {rec['error']}"
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
