"""The CPU kernels against plain JAX (shapes, dtypes, stacked weights, gradients, vmap), row by row
against themselves at every row count, and the AMX probe."""

import ctypes
import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax.kernels.cache_attention as attention_mod
import specjax.kernels.projection as linear_mod
from specjax import kernels
from specjax.kernels import amx, build


def _xla(x, w, layer):
  return linear_mod._xla(x, (w,), layer, linear_mod._NONE)


pytestmark = pytest.mark.skipif(
  jax.default_backend() != "cpu" or not kernels.kernel_enabled(1),
  reason=f"CPU kernels unavailable: {kernels.unavailable_reason()}",
)


def _ref(x, w, layer=None):
  wl = (w if layer is None else w[layer]).astype(jnp.float32)
  return jnp.einsum("...d,nd->...n", x.astype(jnp.float32), wl, precision="highest")


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("n,d", [(7, 33), (130, 576)])
def test_matches_einsum_stacked(rows, n, d):
  kx, kw = jax.random.split(jax.random.PRNGKey(rows * 1000 + n + d))
  x = jax.random.normal(kx, (rows, d))
  w = jax.random.normal(kw, (3, n, d))
  for layer in range(3):
    got = jax.jit(kernels.linear)(x, w, jnp.int32(layer))
    np.testing.assert_allclose(got, _ref(x, w, layer), rtol=1e-5, atol=1e-5 * np.sqrt(d))


def test_layer_index_is_traced_and_weights_2d():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 96))
  w = jax.random.normal(jax.random.PRNGKey(1), (5, 40, 96))
  f = jax.jit(lambda x, w, i: kernels.linear(x, w, i))
  np.testing.assert_allclose(f(x, w, 4), _ref(x, w, 4), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(f(x, w, 1), _ref(x, w, 1), rtol=1e-5, atol=1e-4)
  g = jax.jit(kernels.linear)(x, w[2])
  assert g.shape == (2, 4, 40)
  np.testing.assert_allclose(g, _ref(x, w[2]), rtol=1e-5, atol=1e-4)


def test_bfloat16_weights_accumulate_in_float32():
  x = jax.random.normal(jax.random.PRNGKey(2), (3, 576))
  w = jax.random.normal(jax.random.PRNGKey(3), (2, 100, 576)).astype(jnp.bfloat16)
  got = jax.jit(kernels.linear)(x, w, jnp.int32(1))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, _ref(x, w, 1), rtol=1e-5, atol=1e-4)
  xb = x[:, :-7].astype(jnp.bfloat16)  # bf16 x too (K = 569 exercises the tail)
  wb = w[..., :-7]
  got = jax.jit(kernels.linear)(xb, wb, jnp.int32(0))
  np.testing.assert_allclose(got, _ref(xb, wb, 0), rtol=1e-5, atol=1e-4)


def test_kernel_is_used_on_cpu():
  x = jnp.ones((2, 64))
  w = jnp.ones((3, 8, 64))
  hlo = jax.jit(kernels.linear).lower(x, w, jnp.int32(0)).compile().as_text()
  assert "specjax_cpu_linear" in hlo
  big = jnp.ones((kernels.MAX_KERNEL_ROWS + 1, 64))
  hlo = jax.jit(kernels.linear).lower(big, w, jnp.int32(0)).compile().as_text()
  assert "specjax_cpu_linear" not in hlo


def test_multi_and_swiglu_match_einsum():
  x = jax.random.normal(jax.random.PRNGKey(9), (2, 3, 80))
  ws = [
    jax.random.normal(jax.random.PRNGKey(10 + j), (4, n, 80)) for j, n in enumerate((24, 8, 13))
  ]
  f = jax.jit(lambda x, ws, i: kernels.linear_multi(x, ws, i))
  for got, w in zip(f(x, ws, jnp.int32(3)), ws):
    np.testing.assert_allclose(got, _ref(x, w, 3), rtol=1e-5, atol=1e-4)
  wg, wu = ws[0].astype(jnp.bfloat16), ws[0][::-1].astype(jnp.bfloat16)
  got = jax.jit(kernels.swiglu)(x, wg, wu, jnp.int32(1))
  want = jax.nn.silu(_ref(x, wg, 1)) * _ref(x, wu, 1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_gradients_match_plain_jax():
  x = jax.random.normal(jax.random.PRNGKey(4), (3, 48))
  w = jax.random.normal(jax.random.PRNGKey(5), (4, 20, 48))
  c = jax.random.normal(jax.random.PRNGKey(6), (3, 20))

  def loss(f):
    return lambda x, w: jnp.sum(jnp.sin(f(x, w, jnp.int32(2))) * c)

  got = jax.grad(loss(kernels.linear), argnums=(0, 1))(x, w)
  want = jax.grad(loss(_xla), argnums=(0, 1))(x, w)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

  def loss2(x, wg, wu):
    return jnp.sum(kernels.swiglu(x, wg, wu, jnp.int32(1)) * c)

  def loss2_ref(x, wg, wu):
    return jnp.sum(jax.nn.silu(_xla(x, wg, 1)) * _xla(x, wu, 1) * c)

  args = (x, w, w[::-1] * 0.5)
  got = jax.grad(loss2, argnums=(0, 1, 2))(*args)
  want = jax.grad(loss2_ref, argnums=(0, 1, 2))(*args)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_vmap_over_activations():
  x = jax.random.normal(jax.random.PRNGKey(7), (4, 2, 32))
  w = jax.random.normal(jax.random.PRNGKey(8), (2, 16, 32))
  got = jax.vmap(lambda xi: kernels.linear(xi, w, jnp.int32(1)))(x)
  np.testing.assert_allclose(got, _ref(x, w, 1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_layer_matches_dynamic_update_slice(dtype):
  buf = jax.random.normal(jax.random.PRNGKey(11), (4, 3, 10, 2, 5)).astype(dtype)
  new = jax.random.normal(jax.random.PRNGKey(12), (3, 4, 2, 5)).astype(dtype)
  starts = jnp.asarray([0, 6, 3], jnp.int32)
  want = buf
  for b in range(3):
    want = want.at[2, b, int(starts[b]) : int(starts[b]) + 4].set(new[b])
  got = jax.jit(kernels.write_layer, donate_argnums=0)(buf.copy(), jnp.int32(2), new, starts)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  hlo = jax.jit(kernels.write_layer).lower(buf, jnp.int32(2), new, starts).compile().as_text()
  assert "specjax_cpu_cache_write" in hlo


def test_write_layer_gradient():
  buf = jax.random.normal(jax.random.PRNGKey(13), (2, 2, 6, 3))
  new = jax.random.normal(jax.random.PRNGKey(14), (2, 2, 3))
  starts = jnp.asarray([1, 4], jnp.int32)
  c = jax.random.normal(jax.random.PRNGKey(15), buf.shape)

  def ref(buf, layer, new, starts):
    for b in range(2):
      buf = jax.lax.dynamic_update_slice(buf, new[b][None, None], (layer, b, starts[b], 0))
    return buf

  def loss(f):
    return lambda buf, new: jnp.sum(jnp.sin(f(buf, jnp.int32(1), new, starts)) * c)

  got = jax.grad(loss(kernels.write_layer), argnums=(0, 1))(buf, new)
  want = jax.grad(loss(ref), argnums=(0, 1))(buf, new)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_take_rows_moves_bfloat16_rows_without_a_float32_table():
  """Rows by id, bit for bit `table[ids]` (negative ids from the end, others clamped), and inside a
  loop no float32 copy of the whole table (XLA:CPU's gather would make one and hoist it)."""
  V, D = 300, 24
  table = jax.random.normal(jax.random.PRNGKey(16), (V, D)).astype(jnp.bfloat16)
  ids = jnp.asarray([[0, 5, V - 1], [-1, -V, 7]], jnp.int32)
  got = jax.jit(kernels.take_rows)(table, ids)
  assert got.dtype == jnp.bfloat16 and got.shape == (2, 3, D)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(table[ids], np.float32))
  clamped = jax.jit(kernels.take_rows)(table, jnp.asarray([V + 4], jnp.int32))
  np.testing.assert_array_equal(np.asarray(clamped, np.float32), np.asarray(table[-1:], np.float32))

  def walk(take):
    def f(table, tok):
      def step(t, _):
        row = take(table, t).astype(jnp.float32)
        return (t + jnp.argmax(row).astype(jnp.int32)) % V, row.sum()

      return jax.lax.scan(step, tok, None, length=3)[1]

    return jax.jit(f)

  hlo = walk(kernels.take_rows).lower(table, jnp.int32(3)).compile().as_text()
  assert "specjax_cpu_take_rows" in hlo and f"f32[{V},{D}]" not in hlo
  plain = walk(lambda t, i: t[i]).lower(table, jnp.int32(3)).compile().as_text()
  assert f"f32[{V},{D}]" in plain  # negative control: plain indexing makes that copy here
  np.testing.assert_array_equal(
    walk(kernels.take_rows)(table, jnp.int32(3)), walk(lambda t, i: t[i])(table, jnp.int32(3))
  )
  tangent = jnp.ones_like(table)
  _, t_got = jax.jvp(lambda t: kernels.take_rows(t, ids), (table,), (tangent,))
  np.testing.assert_array_equal(np.asarray(t_got, np.float32), np.ones((2, 3, D), np.float32))


def _attention_case(key, B, T, H, Hkv, Dh, S, L=3, dtype=jnp.float32):
  kq, kk, kv, km = jax.random.split(key, 4)
  q = jax.random.normal(kq, (B, T, H, Dh)).astype(dtype)
  k_all = jax.random.normal(kk, (L, B, S, Hkv, Dh)).astype(dtype)
  v_all = jax.random.normal(kv, (L, B, S, Hkv, Dh)).astype(dtype)
  mask = jax.random.bernoulli(km, 0.6, (B, T, S))
  lengths = jax.random.randint(km, (B,), 1, S - T + 1)
  visible = jnp.arange(S)[None, None, :] < (lengths[:, None, None] + jnp.arange(T)[None, :, None])
  mask = (mask & visible).at[:, :, 0].set(True)  # every query sees something; trailing slots unseen
  return q, k_all, v_all, mask


@pytest.mark.parametrize(
  "B,T,H,Hkv,Dh,S", [(1, 1, 9, 3, 64, 40), (2, 5, 4, 2, 16, 23), (3, 3, 2, 2, 32, 9)]
)
def test_attention_matches_reference(B, T, H, Hkv, Dh, S):
  args = _attention_case(jax.random.PRNGKey(B * 100 + T), B, T, H, Hkv, Dh, S)
  q, k_all, v_all, mask = args
  f = jax.jit(kernels.attention)
  hlo = f.lower(q, k_all, v_all, jnp.int32(1), mask).compile().as_text()
  assert "specjax_cpu_attention" in hlo
  for layer in (0, 2):
    got = f(q, k_all, v_all, jnp.int32(layer), mask)
    want = attention_mod.reference(q, k_all, v_all, jnp.int32(layer), mask)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_attention_bfloat16_cache():
  q, k_all, v_all, mask = _attention_case(jax.random.PRNGKey(5), 2, 4, 6, 2, 32, 30)
  kb, vb = k_all.astype(jnp.bfloat16), v_all.astype(jnp.bfloat16)
  got = jax.jit(kernels.attention)(q, kb, vb, jnp.int32(1), mask)
  # Reference in float32 on the same bf16 values (the kernel keeps probabilities in float32).
  want = attention_mod.reference(q, kb.astype(jnp.float32), vb.astype(jnp.float32), 1, mask)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_attention_gradient():
  q, k_all, v_all, mask = _attention_case(jax.random.PRNGKey(6), 2, 3, 4, 2, 16, 12)
  c = jax.random.normal(jax.random.PRNGKey(7), q.shape)

  def loss(f):
    return lambda q, k, v: jnp.sum(f(q, k, v, jnp.int32(2), mask) * c)

  got = jax.grad(loss(kernels.attention), argnums=(0, 1, 2))(q, k_all, v_all)
  want = jax.grad(loss(attention_mod.reference), argnums=(0, 1, 2))(q, k_all, v_all)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# Row counts sampled from 1..64 (every tile remainder of the 4-row blocks, both sides of 16/32/64).
_ROW_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64)
# (x dtype, weight dtype): float32 products, bf16 weights widened to float32, bf16 dot products.
_LINEAR_DTYPES = [
  (jnp.float32, jnp.float32),
  (jnp.float32, jnp.bfloat16),
  (jnp.bfloat16, jnp.bfloat16),
]


def _assert_rows_independent(f, x):
  """f(x[:M])[i][r] == f(x[r:r + 1])[i][0] bitwise for every output i, sampled M and r < M."""
  f = jax.jit(f)
  alone = [np.concatenate(ys) for ys in zip(*(f(x[r : r + 1]) for r in range(x.shape[0])))]
  for m in _ROW_COUNTS:
    for i, got in enumerate(f(x[:m])):
      got = np.asarray(got)
      bad = [r for r in range(m) if not np.array_equal(got[r], alone[i][r])]
      assert not bad, f"output {i}, M={m}: rows {bad} differ from the same rows computed alone"


def _tiles(use: bool, monkeypatch) -> None:
  """Lower the next jitted projections with AMX tiles (bfloat16 products) or without."""
  if use and not linear_mod.amx.amx_available()[0]:
    pytest.skip(f"no AMX here: {linear_mod.amx.amx_available()[1]}")
  monkeypatch.setattr(linear_mod, "USE_AMX", use)


@pytest.mark.parametrize("tiles", [False, True], ids=["vector", "amx"])
@pytest.mark.parametrize("K", [296, 288])
@pytest.mark.parametrize("x_dtype,w_dtype", _LINEAR_DTYPES)
def test_projection_rows_independent_of_row_count(x_dtype, w_dtype, K, tiles, monkeypatch):
  """A verify pass over k tokens gives each token what a pass over that token alone gives.

  K = 296 is not a multiple of 16 or 32 (the scalar tails run, and AMX is never used); K = 288 is
  nine tile steps, so bfloat16 products go through AMX tiles where `tiles` asks for them, with
  N = 70 leaving 6 columns to the vector path.
  """
  if tiles and x_dtype != jnp.bfloat16:
    pytest.skip("AMX tiles take bfloat16 x and weights only")
  _tiles(tiles, monkeypatch)
  assert kernels.kernel_enabled(max(_ROW_COUNTS))
  ks = jax.random.split(jax.random.PRNGKey(21), 5)
  x = jax.random.normal(ks[0], (max(_ROW_COUNTS), K)).astype(x_dtype)
  wa, wb, wc = (
    jax.random.normal(k, (2, n, K)).astype(w_dtype) for k, n in zip(ks[1:], (70, 9, 70))
  )
  i = jnp.int32(1)

  def f(x):  # the three entry points: one weight, two weights, the fused SwiGLU pair
    return (
      kernels.linear(x, wa, i),
      *kernels.linear_multi(x, (wa, wb), i),
      kernels.swiglu(x, wa, wc, i),
    )

  _assert_rows_independent(f, x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_rows_independent_of_token_count(dtype):
  """Query t of a T-token call equals the same query alone (its mask row, T = 1), bitwise."""
  T, ctx, S, H, Hkv, Dh = max(_ROW_COUNTS), 37, 112, 9, 3, 32
  kq, kk, kv, km = jax.random.split(jax.random.PRNGKey(22), 4)
  q = jax.random.normal(kq, (1, T, H, Dh)).astype(dtype)
  k_all = jax.random.normal(kk, (2, 1, S, Hkv, Dh)).astype(dtype)
  v_all = jax.random.normal(kv, (2, 1, S, Hkv, Dh)).astype(dtype)
  # Causal over the new tokens, with random holes (a token tree's ancestor mask): every query's
  # last visible slot differs from its neighbours' in the same 4-query block.
  slot, t = jnp.arange(S)[None, None, :], jnp.arange(T)[None, :, None]
  mask = (slot < ctx + t + 1) & jax.random.bernoulli(km, 0.7, (1, T, S))
  mask = mask.at[:, :, 0].set(True)
  f = jax.jit(lambda q, m: kernels.attention(q, k_all, v_all, jnp.int32(1), m))
  assert "specjax_cpu_attention" in f.lower(q, mask).compile().as_text()
  alone = np.stack(
    [np.asarray(f(q[:, r : r + 1], mask[:, r : r + 1]), np.float32) for r in range(T)]
  )
  for m in _ROW_COUNTS:
    got = np.asarray(f(q[:, :m], mask[:, :m]), np.float32)[0]
    bad = [r for r in range(m) if not np.array_equal(got[r], alone[r, 0, 0])]
    assert not bad, f"T={m}: queries {bad} differ from the same queries computed alone"


def test_amx_tiles_take_bfloat16_projections(monkeypatch):
  """With AMX the bfloat16 projections lower with the tile path asked for, give the reference
  within float32 rounding, and other bits than `vdpbf16ps` (so the tile path really ran)."""
  _tiles(True, monkeypatch)
  ks = jax.random.split(jax.random.PRNGKey(23), 3)
  x = jax.random.normal(ks[0], (8, 576)).astype(jnp.bfloat16)
  w = jax.random.normal(ks[1], (70, 576)).astype(jnp.bfloat16)
  tiled = jax.jit(lambda x: kernels.linear(x, w))
  assert "amx = 1" in tiled.lower(x).as_text()
  got = np.asarray(tiled(x))
  np.testing.assert_allclose(got, _ref(x, w), rtol=1e-4, atol=1e-4)
  monkeypatch.setattr(linear_mod, "USE_AMX", False)
  vector = jax.jit(lambda x: kernels.linear(x, w))
  assert "amx = 0" in vector.lower(x).as_text()
  other = np.asarray(vector(x))
  assert not np.array_equal(got[:, :64], other[:, :64])
  np.testing.assert_array_equal(got[:, 64:], other[:, 64:])  # the 6 tail columns: vector path


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_same_keys_scattered_or_contiguous(dtype):
  """A tree node sees the context and its ancestors scattered through the block; the AR step sees
  the same keys in a row. The same query over the same sequence of visible keys and values gives
  the same bits either way (greedy trees are token-identical to AR only if it does)."""
  ctx, S, H, Hkv, Dh = 37, 112, 9, 3, 32
  kq, kk, kv, kj = jax.random.split(jax.random.PRNGKey(24), 4)
  q = jax.random.normal(kq, (1, 1, H, Dh)).astype(dtype)
  keys = jax.random.normal(kk, (ctx + 6, Hkv, Dh)).astype(dtype)
  vals = jax.random.normal(kv, (ctx + 6, Hkv, Dh)).astype(dtype)
  junk = jax.random.normal(kj, (2, S, Hkv, Dh)).astype(dtype) * 3
  f = jax.jit(lambda k, v, m: kernels.attention(q, k[None, None], v[None, None], jnp.int32(0), m))
  for spots in ([0, 3, 7, 9, 12, 13], [1, 2, 4, 8, 16, 31], [5, 6, 7, 8, 9, 10]):
    slots = np.array(list(range(ctx)) + [ctx + j for j in spots])
    k_tree = junk[0].at[slots].set(keys)
    v_tree = junk[1].at[slots].set(vals)
    m_tree = jnp.zeros((1, 1, S), bool).at[0, 0, slots].set(True)
    k_ar = junk[0].at[: ctx + 6].set(keys)
    v_ar = junk[1].at[: ctx + 6].set(vals)
    m_ar = jnp.zeros((1, 1, S), bool).at[0, 0, : ctx + 6].set(True)
    tree = np.asarray(f(k_tree, v_tree, m_tree), np.float32)
    ar = np.asarray(f(k_ar, v_ar, m_ar), np.float32)
    np.testing.assert_array_equal(tree, ar, err_msg=f"ancestors at block slots {spots}")


def _proc_cpu_flags() -> set[str]:
  return set(build._cpu_flags().partition(":")[2].split())


def test_amx_available_reports_bool_and_reason():
  ok, reason = kernels.amx_available()
  assert isinstance(ok, bool) and isinstance(reason, str) and reason
  if "amx_tile" not in _proc_cpu_flags():
    assert not ok and "no AMX" in reason


def test_cpuid_leaf7_agrees_with_proc_cpuinfo():
  regs = amx.cpuid7(build.library())
  assert regs is not None
  _, ebx, ecx, edx = regs
  bits = {
    "avx512f": ebx >> 16 & 1,
    "avx512bw": ebx >> 30 & 1,
    "avx512_vnni": ecx >> 11 & 1,
    "amx_bf16": edx >> amx.AMX_BF16_BIT & 1,
    "amx_tile": edx >> amx.AMX_TILE_BIT & 1,
    "amx_int8": edx >> amx.AMX_INT8_BIT & 1,
  }
  flags = _proc_cpu_flags()
  for name, bit in bits.items():  # the OS may hide a feature the CPU has, never the reverse
    assert bit or name not in flags, name
  for name in ("avx512f", "avx512bw"):
    assert bool(bits[name]) == (name in flags), name


def test_tile_permission_refused_without_amx():
  if "amx_tile" in _proc_cpu_flags():
    pytest.skip("this CPU has AMX")
  lib = build.library()
  lib.SpecjaxRequestTileData.restype = ctypes.c_long
  assert lib.SpecjaxRequestTileData() != 0


def test_amx_decision_order():
  def refuse():
    raise AssertionError("permission requested although CPU or OS lacks AMX")

  tile, bf16, int8 = (1 << b for b in (amx.AMX_TILE_BIT, amx.AMX_BF16_BIT, amx.AMX_INT8_BIT))
  state = (1 << amx.XTILECFG_BIT) | (1 << amx.XTILEDATA_BIT)
  assert amx.decide(None, state, refuse) == (False, "CPU has no AMX (no amx_tile in cpuid leaf 7)")
  assert not amx.decide(bf16 | int8, state, refuse)[0]
  assert "no AMX-BF16" in amx.decide(tile | int8, state, refuse)[1]
  assert "XCR0" in amx.decide(tile | bf16, None, refuse)[1]
  assert "XCR0" in amx.decide(tile | bf16, 1 << amx.XTILECFG_BIT, refuse)[1]
  ok, reason = amx.decide(tile | bf16, state, lambda: errno.EINVAL)
  assert not ok and os.strerror(errno.EINVAL) in reason
  ok, reason = amx.decide(tile | bf16 | int8, state, lambda: 0)
  assert ok and "AMX-INT8" in reason


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verify_pass_equals_decode_steps_bitwise(dtype):
  """The whole forward: logits of T tokens in one pass == T one-token steps, bit for bit.

  SmolLM2's widths (D = 576, 9 heads over 3 kv heads), two layers, two rows. Before RMSNorm's sum
  of squares went through the kernel, float32 passes of 8 or more tokens differed here.
  """
  from specjax.config import ModelConfig
  from specjax.kv_cache import init_cache
  from specjax.model import forward, init_params

  cfg = ModelConfig(
    vocab_size=1000, d_model=576, n_layers=2, n_heads=9, n_kv_heads=3, head_dim=64,
    ffn_dim=1536, dtype=dtype,
  )  # fmt: skip
  params = jax.jit(init_params, static_argnums=(1, 2))(jax.random.PRNGKey(0), cfg, 0.1)
  f = jax.jit(lambda p, t, c: forward(p, t, c, cfg))
  prompt = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 0, cfg.vocab_size)  # shape of T=32
  cache = f(params, prompt, init_cache(cfg, 2, 80)).cache
  toks = jax.random.randint(jax.random.PRNGKey(2), (2, 32), 0, cfg.vocab_size)
  steps, c = [], cache
  for t in range(toks.shape[1]):
    out = f(params, toks[:, t : t + 1], c)
    steps.append(np.asarray(out.logits[:, 0]))
    c = out.cache
  steps = np.stack(steps, 1)
  for T in (9, 32):
    got = np.asarray(f(params, toks[:, :T], cache).logits)
    bad = [t for t in range(T) if not np.array_equal(got[:, t], steps[:, t])]
    assert not bad, f"T={T}: tokens {bad} differ from the decode steps"
