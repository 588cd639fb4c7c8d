"""Experiment configuration: the ml_collections base config and the typed settings built from it.

Config files under `configs/` start from `base_config()` and change a few fields; the entry point
turns the (locked, possibly overridden) ConfigDict into an `ExperimentSettings`, and library code
only ever sees that frozen object.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os

import ml_collections

from specjax.drafters.shipped import WEIGHTS_DTYPES
from specjax.experiment import registry
from specjax.experiment.packaged import DEFAULT_CATEGORIES
from specjax.experiment.tasks import SPEC_BENCH_CATEGORIES
from specjax.generate import GenerateConfig
from specjax.sampling import SamplingConfig

SUFFIX_FORMS = ("tree", "chain")
SUITES = ("auto", "spec_bench", "packaged")
TREE_KINDS = ("static", "dynamic", "heads", "eagle")
RULE_NAMES = ("auto", "greedy", "speculative", "typical")
# Integer fields that must be >= 1 (each is checked, and named, on its own).
POSITIVE_FIELDS = (
  "max_new_tokens",
  "data.per_category",
  "drafter.k",
  "smc.n_particles",
  "min_prompt_width",
)


def base_config() -> ml_collections.ConfigDict:
  """Every field an experiment has, with defaults; config files override some of them."""
  c = ml_collections.ConfigDict()
  c.model = "smollm2-135m-instruct"  # registry name, Hugging Face directory or .gguf file
  c.dtype = "float32"
  c.method = "prompt_lookup"  # a registered method (registry.names()); "ar": the baseline alone
  c.rule = "auto"  # auto: greedy at temperature 0, speculative sampling otherwise
  c.drafter = ml_collections.ConfigDict()
  c.drafter.k = 4  # draft length K
  c.drafter.max_ngram = 3  # prompt lookup: longest suffix matched first
  c.drafter.min_ngram = 1  # prompt lookup: shortest suffix tried
  # lookup_first: what copies ("prompt_lookup", or "suffix": suffix decoding's chain with
  # c.suffix's matching and global cache, min_ngram its shortest match)
  c.drafter.copier = "prompt_lookup"
  c.drafter.model = ""  # draft model: registry name, directory or .gguf ("" = the target's spec)
  c.drafter.n_layers = 0  # draft model: keep only its first n layers (0 = all)
  c.drafter.shipped = (
    ""  # shipped: a drafter in specjax/drafters/shipped (e.g. "medusa4-smollm2-135m")
  )
  # shipped drafters: their own matrices in bfloat16 (half the bytes per drafting step: EAGLE-3's
  # c 0.075 -> 0.051 at K = 2 with the same acceptance, benchmarks/RESULTS.md) or float32; the
  # output is the target's either way
  c.drafter.weights_dtype = "bfloat16"
  c.tree = ml_collections.ConfigDict()
  # static / dynamic (EAGLE-2) over a draft model; heads: static over Medusa heads or a parallel
  # drafter's block (pard, peagle); eagle: EAGLE-2 dynamic tree over a shipped EAGLE head
  # (drafter.shipped)
  c.tree.kind = "static"
  c.tree.n_nodes = 16  # N, nodes per tree including the root
  c.tree.depth = 4  # deepest node
  c.tree.top_k = 4  # dynamic: children per expanded node and frontier width
  # suffix decoding (`specjax.drafters.suffix`): chain uses drafter.k, tree tree.n_nodes/depth
  c.suffix = ml_collections.ConfigDict()
  c.suffix.form = "tree"  # "tree" or "chain"
  c.suffix.max_match = 16  # longest context suffix matched
  c.suffix.spec_factor = 1.0  # drafted tokens per matched token (size rule)
  c.suffix.min_prob = 0.1  # smallest continuation frequency drafted
  c.suffix.max_occurrences = 16  # latest occurrences of the matched suffix scored
  c.suffix.global_size = 8192  # tokens of earlier prompts' AR outputs kept (0: the row alone)
  c.smc = ml_collections.ConfigDict()
  c.smc.n_particles = 4
  c.smc.draft_temperature = 0.7
  c.smc.ess_threshold = 0.5
  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 0.0
  c.sampling.top_k = 0
  c.sampling.top_p = 1.0
  c.max_new_tokens = 128
  c.data = ml_collections.ConfigDict()
  c.data.suite = "auto"  # spec_bench (a file), packaged (PyPI data), auto: spec_bench if found
  c.data.categories = ""  # comma-separated; "" = every category of the suite
  c.data.per_category = 80  # first n prompts of each category (Spec-Bench has 80)
  c.data.turns = 2  # MT-bench turns to run (1 or 2)
  # Prompts are padded to a power of two, at least this wide, capped at what fits the context
  # (`specjax.experiment.runner.prompt_width`): few compiled shapes.
  c.min_prompt_width = 64
  c.seed = 0
  # In-loop adaptive speculation (`specjax.adaptive`) for any chain or tree method: each step picks
  # K among adaptive_ks (0 = an AR step; tree methods choose an AR step or the tree) from per-row
  # acceptance estimates and a cost table: "calibrate" (timed once per machine, model and drafter,
  # cached under the specjax cache root) or a JSON file.
  c.adaptive = False
  c.adaptive_ks = "0,2,4"
  c.adaptive_costs = "calibrate"
  c.adaptive_prior = "1,1"  # Beta(a0, b0) prior of each row's acceptance rate
  c.adaptive_decay = 0.99  # evidence kept per step (1: never forget; half-life ~70 steps)
  return c


@dataclasses.dataclass(frozen=True)
class DrafterSettings:
  """How to build the drafter (fields unused by a method are ignored)."""

  k: int = 4
  max_ngram: int = 3
  min_ngram: int = 1
  copier: str = "prompt_lookup"
  model: str = ""
  n_layers: int = 0
  shipped: str = ""
  weights_dtype: str = "bfloat16"


@dataclasses.dataclass(frozen=True)
class TreeSettings:
  """Token-tree drafting (`specjax.tree_speculative`): topology kind and size."""

  kind: str = "static"
  n_nodes: int = 16
  depth: int = 4
  top_k: int = 4


@dataclasses.dataclass(frozen=True)
class SuffixSettings:
  """Suffix decoding (`specjax.drafters.suffix`): form, matching, scoring, size rule, global cache."""

  form: str = "tree"
  max_match: int = 16
  spec_factor: float = 1.0
  min_prob: float = 0.1
  max_occurrences: int = 16
  global_size: int = 8192


@dataclasses.dataclass(frozen=True)
class SMCSettings:
  """SMC-SD (`specjax.smc`): particles per request, draft temperature, resampling threshold."""

  n_particles: int = 4
  draft_temperature: float = 0.7
  ess_threshold: float = 0.5


@dataclasses.dataclass(frozen=True)
class AdaptiveSettings:
  """In-loop adaptive speculation (`specjax.adaptive`); `on` False runs the method's fixed K."""

  on: bool = False
  ks: tuple[int, ...] = (0, 2, 4)
  costs: str = "calibrate"
  prior_a: float = 1.0
  prior_b: float = 1.0
  decay: float = 0.99


@dataclasses.dataclass(frozen=True)
class ExperimentSettings:
  """A validated, immutable experiment description."""

  model: str
  dtype: str
  method: str
  rule: str
  drafter: DrafterSettings
  tree: TreeSettings
  smc: SMCSettings
  sampling: SamplingConfig
  max_new_tokens: int
  suite: str
  categories: tuple[str, ...]
  per_category: int
  turns: int
  min_prompt_width: int
  seed: int
  suffix: SuffixSettings = SuffixSettings()
  adaptive: AdaptiveSettings = AdaptiveSettings()

  def generate_config(self, stop_tokens: tuple[int, ...]) -> GenerateConfig:
    return GenerateConfig(self.max_new_tokens, self.sampling, tuple(stop_tokens))

  def as_dict(self) -> dict:
    d = dataclasses.asdict(self)
    if not self.adaptive.on:  # runs without it keep the settings.json they had before it existed
      d.pop("adaptive")
    if self.drafter.weights_dtype == "float32":  # runs from before the field drafted in float32
      d["drafter"].pop("weights_dtype")
    return d


def settings_from_config(config: ml_collections.ConfigDict) -> ExperimentSettings:
  """Validates a ConfigDict and freezes it into `ExperimentSettings`.

  Raises:
    ValueError: for an unknown method, rule or category, or an out-of-range number.
  """
  method = registry.get(config.method)  # the method's entry (`specjax.experiment.registry`)
  if config.rule not in RULE_NAMES:
    raise ValueError(f"config.rule must be one of {RULE_NAMES}, got {config.rule!r}")
  if config.data.suite not in SUITES:
    raise ValueError(f"config.data.suite must be one of {SUITES}, got {config.data.suite!r}")
  categories = tuple(c.strip() for c in config.data.categories.split(",") if c.strip())
  known = {"spec_bench": SPEC_BENCH_CATEGORIES, "packaged": DEFAULT_CATEGORIES}
  allowed = known.get(config.data.suite, SPEC_BENCH_CATEGORIES + DEFAULT_CATEGORIES)
  unknown = sorted(set(categories) - set(allowed))
  if unknown:
    raise ValueError(
      f"config.data.categories: unknown {unknown}; choose from {','.join(dict.fromkeys(allowed))}"
    )
  for field in POSITIVE_FIELDS:
    value = _get(config, field)
    if value < 1:
      raise ValueError(f"config.{field}={value}: must be >= 1")
  if config.drafter.n_layers < 0:
    raise ValueError(f"config.drafter.n_layers={config.drafter.n_layers}: must be >= 0 (0 = all)")
  if config.tree.kind not in TREE_KINDS:
    raise ValueError(f"config.tree.kind must be one of {TREE_KINDS}, got {config.tree.kind!r}")
  if method.check is not None:  # what the method needs beyond these checks
    method.check(config)
  if config.suffix.form not in SUFFIX_FORMS:
    raise ValueError(
      f"config.suffix.form must be one of {SUFFIX_FORMS}, got {config.suffix.form!r}"
    )
  if config.drafter.weights_dtype not in WEIGHTS_DTYPES:
    raise ValueError(
      f"config.drafter.weights_dtype must be one of {WEIGHTS_DTYPES}, "
      f"got {config.drafter.weights_dtype!r}"
    )
  if config.data.turns not in (1, 2):
    raise ValueError(f"config.data.turns must be 1 or 2, got {config.data.turns}")
  adaptive = adaptive_settings(config)
  s = config.sampling
  return ExperimentSettings(
    model=config.model,
    dtype=config.dtype,
    method=config.method,
    rule=config.rule,
    drafter=DrafterSettings(**config.drafter.to_dict()),
    tree=TreeSettings(**config.tree.to_dict()),
    smc=SMCSettings(**config.smc.to_dict()),
    sampling=SamplingConfig(float(s.temperature), int(s.top_k), float(s.top_p)),
    max_new_tokens=int(config.max_new_tokens),
    suite=config.data.suite,
    categories=categories,
    per_category=int(config.data.per_category),
    turns=int(config.data.turns),
    min_prompt_width=int(config.min_prompt_width),
    seed=int(config.seed),
    suffix=SuffixSettings(**config.suffix.to_dict()),
    adaptive=adaptive,
  )


def adaptive_settings(config: ml_collections.ConfigDict) -> AdaptiveSettings:
  """The adaptive_* fields, checked (they are checked even when `adaptive` is off).

  Raises:
    ValueError: naming the field, for a bad value or a method that cannot adapt.
  """
  try:
    ks = tuple(int(k) for k in str(config.adaptive_ks).split(",") if k.strip())
  except ValueError:
    raise ValueError(
      f"config.adaptive_ks={config.adaptive_ks!r}: comma-separated integers"
    ) from None
  if not ks or ks[0] != 0 or list(ks) != sorted(set(ks)) or len(ks) < 2:
    raise ValueError(
      f"config.adaptive_ks={config.adaptive_ks!r}: distinct ascending K starting at 0 (an AR step) "
      "with at least one K > 0, e.g. 0,2,4"
    )
  try:
    prior_a, prior_b = (float(x) for x in str(config.adaptive_prior).split(","))
  except ValueError:
    raise ValueError(
      f"config.adaptive_prior={config.adaptive_prior!r}: two numbers a0,b0"
    ) from None
  if prior_a <= 0 or prior_b <= 0:
    raise ValueError(f"config.adaptive_prior={config.adaptive_prior!r}: both must be > 0")
  decay = float(config.adaptive_decay)
  if not 0 < decay <= 1:
    raise ValueError(f"config.adaptive_decay={decay}: must be in (0, 1]")
  costs = str(config.adaptive_costs)
  on = bool(config.adaptive)
  if on and costs != "calibrate" and not os.path.isfile(costs):
    raise ValueError(f"config.adaptive_costs={costs!r}: 'calibrate' or an existing JSON file")
  if on and not registry.get(config.method).adapts:
    raise ValueError(f"config.adaptive: method {config.method} has no draft length to adapt")
  return AdaptiveSettings(on, ks, costs, prior_a, prior_b, decay)


VARIANTS = ("", "full", "small")


def apply_variant(config: ml_collections.ConfigDict, arg: str) -> ml_collections.ConfigDict:
  """Applies the size variant named by a config file's argument ("" or "full": all prompts).

  "small": the first 2 prompts of each category and 64 new tokens, a few minutes on 2 CPU cores.
  """
  if arg not in VARIANTS:
    raise ValueError(f"unknown config variant {arg!r}; choose from {VARIANTS[1:]}")
  if arg == "small":
    config.data.per_category = 2
    config.max_new_tokens = 64
  return config


def load_config_file(path: str, arg: str = "") -> ml_collections.ConfigDict:
  """The config a file under `configs/` defines, read as ml_collections' `--config=PATH:ARG` flag
  reads it: `get_config(arg)`, or `get_config()` when there is no argument.

  Raises:
    FileNotFoundError: naming the path, when there is no such file.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no config file {path!r}")
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def parse_method_entry(entry: str) -> tuple[str, dict]:
  """A method named as "FILE[:ARG][@FIELD=VALUE]..." (e.g. "eagle.py:eagle3@drafter.k=2") ->
  (config spec, {field: value}). Each field is checked against the config's fields; a value is
  kept as text for a text field, else read as a Python literal (2, 0.5, True).

  Raises:
    ValueError: for an override without "=", or a field the config does not have.
  """
  spec, *pairs = entry.split("@")
  overrides = {}
  for pair in pairs:
    field, sep, text = pair.partition("=")
    if not sep or not field:
      raise ValueError(f"method {entry!r}: write overrides as @FIELD=VALUE (e.g. @drafter.k=2)")
    if problem := unknown_field_message(field):
      raise ValueError(f"method {entry!r}: {problem}")
    if isinstance(_get(base_config(), field), str):
      overrides[field] = text
      continue
    try:
      overrides[field] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise ValueError(f"method {entry!r}: {field}={text!r} is not a Python literal") from None
  return spec, overrides


def split_arg(arg: str, choices: tuple[str, ...]) -> tuple[str, str]:
  """Splits a config argument "CHOICE" or "CHOICE,VARIANT" (e.g. "eagle3,small").

  The first choice is the default when `arg` is only a size variant ("" or "small").

  Raises:
    ValueError: for an unknown choice.
  """
  head, _, variant = arg.partition(",")
  if head in VARIANTS and not variant:
    return choices[0], head
  if head not in choices:
    raise ValueError(f"unknown config argument {head!r}; choose from {choices} (then ',small')")
  return head, variant


def _get(config: ml_collections.ConfigDict, field: str):
  for key in field.split("."):
    config = config[key]
  return config


def unknown_field_message(field: str, config: ml_collections.ConfigDict | None = None) -> str:
  """Why `field` (a dotted path such as "drafter.kk") is not a config field, or "" if it is one.

  The message names the full path and lists the known fields of the group it points into.
  """
  config = base_config() if config is None else config
  node, seen = config, []
  for key in field.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      return f"config field {'.'.join(seen)!r} is a value, not a group: no {field!r}"
    if key not in node:
      group = ".".join(seen)
      where = f"of {group}" if group else "at the top level"
      return f"unknown config field {field!r}; known fields {where}: {', '.join(sorted(node))}"
    node = node[key]
    seen.append(key)
  return ""


def field_names(config: ml_collections.ConfigDict | None = None, prefix: str = "") -> list[str]:
  """Dotted names of every leaf field, e.g. "drafter.k" (for error messages and docs)."""
  config = base_config() if config is None else config
  names = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      names += field_names(value, f"{prefix}{key}.")
    else:
      names.append(prefix + key)
  return names
