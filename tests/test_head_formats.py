"""Published head formats (EAGLE-1/2, EAGLE-3, Medusa-1): strict loading of synthetic checkpoints
written from torch modules laid out like the published ones, and clear errors for wrong files."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file
from toy_models import tiny_config

from specjax.drafters.eagle_published import eagle3_forward, eagle_forward
from specjax.drafters.tree_heads import published_medusa_logits
from specjax.loading.heads import detect_kind, load_eagle, load_eagle3, load_head, load_medusa
from specjax.loading.keymap import CheckpointError

torch = pytest.importorskip("torch")
nn = torch.nn

TARGET = tiny_config(vocab=64, d_model=32, n_layers=6)  # 4 heads x 8, 2 KV heads, FFN 64


def _llama_config(**kw) -> dict:
  c = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": TARGET.vocab_size,
    "hidden_size": TARGET.d_model,
    "num_hidden_layers": 1,
    "num_attention_heads": TARGET.n_heads,
    "num_key_value_heads": TARGET.n_kv_heads,
    "head_dim": TARGET.head_dim,
    "intermediate_size": TARGET.ffn_dim,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
  }
  c.update(kw)
  return c


def _rope(x, pos):  # x [B, T, h, Dh], rotate-half layout, theta 1e4
  Dh = x.shape[-1]
  inv = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2, dtype=torch.float32) / Dh))
  ang = pos[..., None].float() * inv
  cos, sin = torch.cat([ang.cos()] * 2, -1)[:, :, None], torch.cat([ang.sin()] * 2, -1)[:, :, None]
  return x * cos + torch.cat([-x[..., Dh // 2 :], x[..., : Dh // 2]], -1) * sin


class _Attention(nn.Module):
  def __init__(self, d_in, d):
    super().__init__()
    q, kv = TARGET.n_heads * TARGET.head_dim, TARGET.n_kv_heads * TARGET.head_dim
    self.q_proj, self.k_proj = nn.Linear(d_in, q, bias=False), nn.Linear(d_in, kv, bias=False)
    self.v_proj, self.o_proj = nn.Linear(d_in, kv, bias=False), nn.Linear(q, d, bias=False)

  def forward(self, x, pos):
    B, T, _ = x.shape
    H, Hkv, Dh = TARGET.n_heads, TARGET.n_kv_heads, TARGET.head_dim
    q = _rope(self.q_proj(x).view(B, T, H, Dh), pos).transpose(1, 2)
    k = _rope(self.k_proj(x).view(B, T, Hkv, Dh), pos).transpose(1, 2)
    v = self.v_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = (q @ k.transpose(2, 3)) / Dh**0.5
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return self.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * Dh))


class _MLP(nn.Module):
  def __init__(self, d, f):
    super().__init__()
    self.gate_proj, self.up_proj = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
    self.down_proj = nn.Linear(f, d, bias=False)

  def forward(self, x):
    return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Norm(nn.Module):
  def __init__(self, d):
    super().__init__()
    self.weight = nn.Parameter(torch.rand(d))

  def forward(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class _Eagle1Layer(nn.Module):
  def __init__(self, index):
    super().__init__()
    D = TARGET.d_model
    self.self_attn, self.mlp = _Attention(D, D), _MLP(D, TARGET.ffn_dim)
    if index:  # the first layer reads the fc output directly
      self.input_layernorm = _Norm(D)
    self.post_attention_layernorm = _Norm(D)

  def forward(self, x, pos):
    h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
    x = x + self.self_attn(h, pos)
    return x + self.mlp(self.post_attention_layernorm(x))


class _Eagle1(nn.Module):
  def __init__(self, n_layers=1, bias=True, embed=True):
    super().__init__()
    D = TARGET.d_model
    if embed:
      self.embed_tokens = nn.Embedding(TARGET.vocab_size, D)
    self.layers = nn.ModuleList([_Eagle1Layer(i) for i in range(n_layers)])
    self.fc = nn.Linear(2 * D, D, bias=bias)

  def forward(self, embed, tokens, features, pos):
    x = self.fc(torch.cat([embed[tokens], features], -1))
    for layer in self.layers:
      x = layer(x, pos)
    return x


class _Eagle3Layer(nn.Module):
  def __init__(self):
    super().__init__()
    D = TARGET.d_model
    self.self_attn, self.mlp = _Attention(2 * D, D), _MLP(D, TARGET.ffn_dim)
    self.hidden_norm, self.input_layernorm = _Norm(D), _Norm(D)
    self.post_attention_layernorm = _Norm(D)


class _Eagle3(nn.Module):
  def __init__(self, draft_tokens: np.ndarray, n_fused=3):
    super().__init__()
    D, V, Vd = TARGET.d_model, TARGET.vocab_size, len(draft_tokens)
    self.embed_tokens = nn.Embedding(V, D)
    self.lm_head = nn.Linear(D, Vd, bias=False)
    self.midlayer = _Eagle3Layer()
    self.fc = nn.Linear(n_fused * D, D, bias=False)
    self.norm = _Norm(D)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.as_tensor(draft_tokens)] = True
    self.register_buffer("d2t", torch.as_tensor(draft_tokens - np.arange(Vd), dtype=torch.long))
    self.register_buffer("t2d", t2d)

  def forward(self, embed, tokens, features, pos):
    g = self.fc(features)
    m = self.midlayer
    h = torch.cat([m.input_layernorm(embed[tokens]), m.hidden_norm(g)], -1)
    x = g + m.self_attn(h, pos)
    x = x + m.mlp(m.post_attention_layernorm(x))
    return x, self.lm_head(self.norm(x))


class _ResBlock(nn.Module):
  def __init__(self, d):
    super().__init__()
    self.linear = nn.Linear(d, d)

  def forward(self, x):
    return x + nn.functional.silu(self.linear(x))


def _medusa(n_heads=3, n_blocks=2):
  D, V = TARGET.d_model, TARGET.vocab_size
  return nn.ModuleList(
    [
      nn.Sequential(*[_ResBlock(D) for _ in range(n_blocks)], nn.Linear(D, V, bias=False))
      for _ in range(n_heads)
    ]
  )


def _write(directory, config: dict, state: dict, file: str):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  path = os.path.join(directory, file)
  if file.endswith(".safetensors"):
    save_file({k: v.detach().numpy() for k, v in state.items()}, path)
  else:
    torch.save(state, path)
  return str(directory)


def _np(t):
  return t.detach().numpy()


# ---------------------------------------------------------------- EAGLE-1 / EAGLE-2


def test_eagle_round_trip_with_bias(tmp_path):
  torch.manual_seed(0)
  m = _Eagle1(n_layers=2, bias=True)
  d = _write(
    tmp_path / "e",
    _llama_config(num_hidden_layers=2, bias=True),
    m.state_dict(),
    "model.safetensors",
  )
  params, hc = load_eagle(d, TARGET)
  assert hc.kind == "eagle" and hc.fc_bias and hc.layer.n_layers == 2
  np.testing.assert_array_equal(params.w_in, _np(m.fc.weight))
  np.testing.assert_array_equal(params.b_in, _np(m.fc.bias))
  np.testing.assert_array_equal(params.layers.wq[1], _np(m.layers[1].self_attn.q_proj.weight))
  np.testing.assert_array_equal(params.layers.w_down[0], _np(m.layers[0].mlp.down_proj.weight))
  np.testing.assert_array_equal(params.layers.attn_norm[1], _np(m.layers[1].input_layernorm.weight))
  np.testing.assert_array_equal(params.layers.attn_norm[0], np.ones(TARGET.d_model))  # unused row
  np.testing.assert_array_equal(params.embed, _np(m.embed_tokens.weight))
  assert load_head(d, TARGET)[1].kind == "eagle"


def test_eagle_without_bias_safetensors(tmp_path):
  m = _Eagle1(bias=False, embed=False)
  d = _write(tmp_path / "e", _llama_config(bias=False), m.state_dict(), "model.safetensors")
  params, hc = load_eagle(d, TARGET)
  assert params.b_in is None and params.embed is None and not hc.fc_bias
  np.testing.assert_array_equal(params.w_in, _np(m.fc.weight))
  np.testing.assert_array_equal(params.layers.wq[0], _np(m.layers[0].self_attn.q_proj.weight))


def test_eagle_bias_mismatches_are_errors(tmp_path):
  no_bias = _Eagle1(bias=False).state_dict()
  d = _write(tmp_path / "a", _llama_config(), no_bias, "model.safetensors")  # bias defaults to true
  with pytest.raises(CheckpointError, match=r"missing tensor 'fc.bias'.*bias=true"):
    load_eagle(d, TARGET)
  d = _write(
    tmp_path / "b", _llama_config(bias=False), _Eagle1(bias=True).state_dict(), "model.safetensors"
  )
  with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['fc.bias'\].*bias=false"):
    load_eagle(d, TARGET)


def test_eagle_layer0_input_norm_is_unexpected(tmp_path):
  state = _Eagle1().state_dict()
  state["layers.0.input_layernorm.weight"] = torch.ones(TARGET.d_model)
  d = _write(tmp_path / "e", _llama_config(), state, "model.safetensors")
  with pytest.raises(CheckpointError, match="layer 0 has no input norm"):
    load_eagle(d, TARGET)


def test_eagle_shape_and_target_mismatches(tmp_path):
  state = _Eagle1().state_dict()
  state["fc.weight"] = torch.zeros(TARGET.d_model, TARGET.d_model)
  d = _write(tmp_path / "a", _llama_config(), state, "model.safetensors")
  with pytest.raises(
    CheckpointError, match=r"'fc.weight' has shape \(32, 32\), expected \(32, 64\)"
  ):
    load_eagle(d, TARGET)
  d = _write(
    tmp_path / "b", _llama_config(vocab_size=65), _Eagle1().state_dict(), "model.safetensors"
  )
  with pytest.raises(CheckpointError, match="vocab_size 65 != the target's 64"):
    load_eagle(d, TARGET)


# ---------------------------------------------------------------- EAGLE-3


def test_eagle3_round_trip_with_draft_vocabulary(tmp_path):
  torch.manual_seed(1)
  draft_tokens = np.sort(np.random.RandomState(0).choice(64, 40, replace=False))
  m = _Eagle3(draft_tokens)
  config = _llama_config(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=40)
  d = _write(tmp_path / "e", config, m.state_dict(), "model.safetensors")
  params, hc = load_eagle3(d, TARGET)
  assert hc.kind == "eagle3" and hc.draft_vocab_size == 40
  assert hc.target_layers == (1, 2, 2)  # inputs of layers 2, L // 2, L - 3 for L = 6
  np.testing.assert_array_equal(params.d2t, draft_tokens)  # offsets turned into target ids
  np.testing.assert_array_equal(params.fuse, _np(m.fc.weight))
  np.testing.assert_array_equal(params.layer.wq, _np(m.midlayer.self_attn.q_proj.weight))
  np.testing.assert_array_equal(params.layer.attn_norm, _np(m.midlayer.input_layernorm.weight))
  np.testing.assert_array_equal(params.layer.hidden_norm, _np(m.midlayer.hidden_norm.weight))
  np.testing.assert_array_equal(
    params.layer.mlp_norm, _np(m.midlayer.post_attention_layernorm.weight)
  )
  np.testing.assert_array_equal(params.head, _np(m.lm_head.weight))
  np.testing.assert_array_equal(params.norm, _np(m.norm.weight))
  assert params.layer.wq.shape == (32, 64) and params.layer.wk.shape == (16, 64)
  assert load_head(d, TARGET)[1].kind == "eagle3"


def test_eagle3_layer_ids_from_config_and_full_vocabulary(tmp_path):
  state = _Eagle3(np.arange(64)).state_dict()
  del state["d2t"], state["t2d"]  # the reference drops both when Vd == V
  config = _llama_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]})
  d = _write(tmp_path / "e", config, state, "model.safetensors")
  params, hc = load_eagle3(d, TARGET)
  assert hc.target_layers == (0, 2, 5) and hc.draft_vocab_size == 64
  np.testing.assert_array_equal(params.d2t, np.arange(64))


@pytest.mark.parametrize(
  "edit, match",
  [
    (lambda s, c: s.__setitem__("d2t", s["d2t"] - torch.arange(40)), "distinct target ids"),
    (lambda s, c: s.__setitem__("t2d", ~s["t2d"]), "t2d is not the boolean indicator"),
    (lambda s, c: s.pop("t2d"), "has d2t but no t2d"),
    (lambda s, c: s.pop("d2t"), "no d2t but draft_vocab_size 40"),
    (lambda s, c: s.__setitem__("fc.bias", torch.zeros(32)), "an EAGLE-3 fc has no bias"),
    (lambda s, c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [0, 2, 4]), "embedding"),
    (lambda s, c: c.__setitem__("target_hidden_size", 48), "target_hidden_size 48"),
    (lambda s, c: s.pop("midlayer.hidden_norm.weight"), "missing tensor 'midlayer.hidden_norm"),
  ],
)
def test_eagle3_errors(tmp_path, edit, match):
  draft_tokens = np.arange(20, 60)
  state = dict(_Eagle3(draft_tokens).state_dict())
  config = _llama_config(draft_vocab_size=40)
  edit(state, config)
  d = _write(tmp_path / "e", config, state, "model.safetensors")
  with pytest.raises(CheckpointError, match=match):
    load_eagle3(d, TARGET)


# ---------------------------------------------------------------- Medusa


@pytest.mark.parametrize(
  "prefix, file", [("medusa_head.", "model.safetensors"), ("", "medusa_lm_head.safetensors")]
)
def test_medusa_round_trip_and_logits_match_torch(tmp_path, prefix, file):
  torch.manual_seed(2)
  heads = _medusa(n_heads=3, n_blocks=2)
  state = {prefix + k: v for k, v in heads.state_dict().items()}
  assert f"{prefix}1.0.linear.bias" in state and f"{prefix}2.2.weight" in state
  config = {"medusa_num_heads": 3, "medusa_num_layers": 2, "base_model_name_or_path": "tiny"}
  d = _write(tmp_path / "m", config, state, file)
  params, hc = load_medusa(d, TARGET)
  assert (hc.n_heads, hc.n_blocks) == (3, 2) and params.lm_head.shape == (3, 64, 32)
  h = torch.randn(5, TARGET.d_model)
  with torch.no_grad():
    want = torch.stack([head(h) for head in heads], 1).numpy()  # [B, K, V]
  got, d2t = published_medusa_logits(params, jnp.asarray(h.numpy()))
  assert d2t is None
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_medusa_errors(tmp_path):
  state = {"medusa_head." + k: v for k, v in _medusa(3, 1).state_dict().items()}
  d = _write(
    tmp_path / "a", {"medusa_num_heads": 4, "medusa_num_layers": 1}, state, "model.safetensors"
  )
  with pytest.raises(CheckpointError, match="missing tensor 'medusa_head.3.0.linear.weight'"):
    load_medusa(d, TARGET)
  d = _write(
    tmp_path / "b", {"medusa_num_heads": 2, "medusa_num_layers": 1}, state, "model.safetensors"
  )
  with pytest.raises(CheckpointError, match="unexpected.*medusa_num_heads=2"):
    load_medusa(d, TARGET)
  d = _write(tmp_path / "c", {"medusa_num_heads": 3}, state, "model.safetensors")
  with pytest.raises(CheckpointError, match="medusa_num_layers"):
    load_medusa(d, TARGET)
  mixed = dict(state)
  mixed["0.0.linear.weight"] = mixed.pop("medusa_head.0.0.linear.weight")
  d = _write(
    tmp_path / "d", {"medusa_num_heads": 3, "medusa_num_layers": 1}, mixed, "model.safetensors"
  )
  with pytest.raises(CheckpointError, match="mixes names"):
    load_medusa(d, TARGET)


# ---------------------------------------------------------------- wrong kind, wrong files


def test_wrong_kind_is_a_clear_error(tmp_path):
  medusa = {"medusa_head." + k: v for k, v in _medusa(2, 1).state_dict().items()}
  dm = _write(
    tmp_path / "m", {"medusa_num_heads": 2, "medusa_num_layers": 1}, medusa, "model.safetensors"
  )
  de = _write(tmp_path / "e", _llama_config(), _Eagle1().state_dict(), "model.safetensors")
  with pytest.raises(CheckpointError, match="holds a medusa checkpoint.*not eagle3"):
    load_eagle3(dm, TARGET)
  with pytest.raises(CheckpointError, match="holds a eagle checkpoint.*not eagle3"):
    load_eagle3(de, TARGET)
  with pytest.raises(CheckpointError, match="holds a eagle checkpoint.*not medusa"):
    load_head(de, TARGET, kind="medusa")
  assert detect_kind(["lm_head.weight", "model.norm.weight"]) is None


@pytest.mark.parametrize(
  "file, converted",
  [("pytorch_model.bin", "model.safetensors"), ("medusa_lm_head.pt", "medusa_lm_head.safetensors")],
)
def test_pickles_are_refused_with_the_conversion(tmp_path, file, converted):
  """Weights load from safetensors only: a pickle is refused before it is opened, and the error
  gives the one-line conversion to the file name the loader reads."""
  d = _write(tmp_path / "p", _llama_config(), _Eagle1().state_dict(), file)
  with pytest.raises(CheckpointError, match=rf"PyTorch pickle.*safetensors only.*'{converted}'"):
    load_head(d, TARGET)


def test_directory_problems(tmp_path):
  with pytest.raises(CheckpointError, match="no config.json"):
    load_head(str(tmp_path), TARGET)
  d = _write(tmp_path / "two", _llama_config(), _Eagle1().state_dict(), "model.safetensors")
  torch.save(_Eagle1().state_dict(), os.path.join(d, "pytorch_model.bin"))
  with pytest.raises(CheckpointError, match="exactly one of"):
    load_head(d, TARGET)


# ---------------------------------------------------------------- forward parity with torch


def _inputs(width, seed=3):
  g = torch.Generator().manual_seed(seed)
  embed = torch.randn(TARGET.vocab_size, TARGET.d_model, generator=g)
  tokens = torch.randint(0, TARGET.vocab_size, (2, 7), generator=g)
  feats = torch.randn(2, 7, width, generator=g)
  pos = torch.arange(7)[None].repeat(2, 1) + torch.tensor([[3], [11]])
  return embed, tokens, feats, pos


def _j(t):
  return jnp.asarray(t.detach().numpy())


def test_eagle_forward_matches_torch(tmp_path):
  torch.manual_seed(4)
  m = _Eagle1(n_layers=2, bias=True, embed=False)
  d = _write(
    tmp_path / "e", _llama_config(num_hidden_layers=2), m.state_dict(), "model.safetensors"
  )
  params, hc = load_eagle(d, TARGET)
  embed, tokens, feats, pos = _inputs(TARGET.d_model)
  with torch.no_grad():
    want = m(embed, tokens, feats, pos).numpy()
  got = eagle_forward(params, hc.layer, _j(embed), _j(tokens), _j(feats), _j(pos))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_eagle3_forward_matches_torch(tmp_path):
  torch.manual_seed(5)
  m = _Eagle3(np.arange(10, 50))
  d = _write(
    tmp_path / "e", _llama_config(draft_vocab_size=40), m.state_dict(), "model.safetensors"
  )
  params, hc = load_eagle3(d, TARGET)
  embed, tokens, feats, pos = _inputs(3 * TARGET.d_model)
  with torch.no_grad():
    want_x, want_logits = (t.numpy() for t in m(embed, tokens, feats, pos))
  x, logits = eagle3_forward(params, hc.layer, _j(embed), _j(tokens), _j(feats), _j(pos))
  np.testing.assert_allclose(np.asarray(x), want_x, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-4, atol=1e-4)
