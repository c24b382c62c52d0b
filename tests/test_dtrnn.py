"""DT-RNN and DT(S)-RNN cells against a NumPy transcription of Pascanu et al. (2014)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import check_unroll_gradient, normal, np_tree, random_params, scan_by_hand

from rhnzoo import cells


def numpy_dt_step(p, x, h_prev, mask, shortcuts):
    """Pascanu et al., sec. 3.2.3: an L-layer tanh MLP from (x_t, h_{t-1}) to h_t, written
    layer by layer; with ``shortcuts`` every layer l >= 2 also gets S_l h_{t-1}."""
    L = p["R"].shape[0]
    h_in = h_prev * mask
    h = np.tanh(x @ p["W"] + h_in @ p["R"][0] + p["b"][0])
    for l in range(1, L):
        pre = (h * mask) @ p["R"][l] + p["b"][l]
        if shortcuts:
            pre = pre + h_in @ p["S"][l - 1]
        h = np.tanh(pre)
    return h


CELLS = {"dtrnn": (cells.DTRNN, False), "dtsrnn": (cells.DTSRNN, True)}


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("arch", list(CELLS))
@pytest.mark.parametrize("with_mask", [False, True])
def test_step_matches_numpy(depth, arch, with_mask):
    B, m, n, T = 3, 5, 4, 6
    cls, shortcuts = CELLS[arch]
    cell = cls(n, depth)
    kp, kx, ks, km = jax.random.split(jax.random.PRNGKey(depth + 10 * shortcuts), 4)
    params = random_params(cell.init(kp, m), kp)
    xs = normal(kx, (T, B, m))
    h0 = normal(ks, (B, n))
    mask = jax.random.bernoulli(km, 0.7, (B, n)) / 0.7 if with_mask else None

    carry, ys = cells.unroll(cell, params, h0, xs, mask)

    p = np_tree(params)
    np_mask = np.ones((B, n)) if mask is None else np.asarray(mask, np.float64)
    h = np.asarray(h0, np.float64)
    expected = []
    for t in range(T):
        h = numpy_dt_step(p, np.asarray(xs[t], np.float64), h, np_mask, shortcuts)
        expected.append(h)
    np.testing.assert_allclose(ys, np.stack(expected), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(carry, expected[-1], rtol=2e-5, atol=2e-5)


def test_shapes_init_and_parameter_counts():
    m, n, L = 5, 7, 4
    dt = cells.DTRNN(n, L, init_scale=0.1).init(jax.random.PRNGKey(0), m)
    ds = cells.DTSRNN(n, L, init_scale=0.1).init(jax.random.PRNGKey(0), m)
    assert set(dt) == {"W", "R", "b"} and set(ds) == {"W", "R", "b", "S"}
    assert dt["W"].shape == (m, n) and dt["R"].shape == (L, n, n) and dt["b"].shape == (L, n)
    assert ds["S"].shape == (L - 1, n, n)
    for w in jax.tree.leaves(ds):
        assert w.dtype == jnp.float32
        assert 0.05 < float(jnp.abs(w).max()) <= 0.1  # uniform in [-0.1, 0.1]
    count = lambda p: sum(a.size for a in jax.tree.leaves(p))
    assert count(dt) == m * n + L * n * n + L * n
    assert count(ds) == m * n + (2 * L - 1) * n * n + L * n
    assert cells.DTSRNN(n, 1).init(jax.random.PRNGKey(0), m)["S"].shape == (0, n, n)


def test_depth_one_is_plain_tanh_rnn_and_both_cells_agree():
    """L = 1: h_t = tanh(W x_t + R h_{t-1} + b) for both cells (no shortcut exists)."""
    dt, ds = cells.DTRNN(6, 1), cells.DTSRNN(6, 1)
    params = random_params(dt.init(jax.random.PRNGKey(1), 3), jax.random.PRNGKey(2))
    xs = normal(jax.random.PRNGKey(3), (5, 2, 3))
    _, ys_dt = cells.unroll(dt, params, dt.initial_carry(2), xs)
    _, ys_ds = cells.unroll(ds, {**params, "S": jnp.zeros((0, 6, 6))}, ds.initial_carry(2), xs)
    h, expected = np.zeros((2, 6)), []
    p = np_tree(params)
    for t in range(5):
        h = np.tanh(np.asarray(xs[t], np.float64) @ p["W"] + h @ p["R"][0] + p["b"][0])
        expected.append(h)
    np.testing.assert_allclose(ys_dt, np.stack(expected), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ys_ds, ys_dt, rtol=1e-6, atol=1e-6)


def test_zero_shortcuts_reduce_dtsrnn_to_dtrnn():
    ds, dt = cells.DTSRNN(5, 3), cells.DTRNN(5, 3)
    params = random_params(ds.init(jax.random.PRNGKey(4), 3), jax.random.PRNGKey(5))
    xs = normal(jax.random.PRNGKey(6), (4, 2, 3))
    _, ys_zero = cells.unroll(
        ds, {**params, "S": jnp.zeros_like(params["S"])}, ds.initial_carry(2), xs
    )
    _, ys_dt = cells.unroll(dt, {k: params[k] for k in "WRb"}, dt.initial_carry(2), xs)
    np.testing.assert_allclose(ys_zero, ys_dt, rtol=1e-6, atol=1e-6)
    _, ys_ds = cells.unroll(ds, params, ds.initial_carry(2), xs)
    assert float(jnp.abs(ys_ds - ys_dt).max()) > 1e-3  # the shortcuts do something


@pytest.mark.parametrize(
    "make",
    [pytest.param(lambda: cells.DTRNN(8, 4), marks=pytest.mark.slow), lambda: cells.DTSRNN(8, 3)],
)
def test_cell_in_user_written_scan_under_jit(make):
    cell = make()
    params = random_params(cell.init(jax.random.PRNGKey(0), 3), jax.random.PRNGKey(7))
    xs = normal(jax.random.PRNGKey(1), (7, 2, 3))
    carry, ys = scan_by_hand(cell, params, xs)
    assert ys.shape == (7, 2, 8) and carry.shape == (2, 8)
    p = np_tree(params)
    h = np.zeros((2, 8))
    for t in range(7):
        h = numpy_dt_step(p, np.asarray(xs[t], np.float64), h, 1.0, isinstance(cell, cells.DTSRNN))
    np.testing.assert_allclose(carry, h, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.slow) if a == "dtrnn" else a for a in CELLS]
)
def test_gradient_matches_finite_differences(arch):
    check_unroll_gradient(CELLS[arch][0](4, 3))


@pytest.mark.parametrize("cls", [cells.DTRNN, cells.DTSRNN])
def test_invalid_depth_and_size(cls):
    for depth in (0, -1):
        with pytest.raises(ValueError, match="depth"):
            cls(4, depth)
    with pytest.raises(ValueError, match="hidden_size"):
        cls(0, 2)
    with pytest.raises(ValueError, match="input_size"):
        cls(4, 2).init(jax.random.PRNGKey(0), 0)
