"""RHN and HSG cells against a NumPy transcription of the papers' equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    as_jax,
    check_unroll_gradient,
    dropout_mask,
    normal,
    np_tree,
    random_params,
    scan_by_hand,
    shapes,
)

from rhnzoo import cells, dropout

sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))


def numpy_rhn_step(W, R, b, x, s, mask, coupled):
    """Zilly et al. (2017), eqs. 6-9, written out with separate H, T, C blocks per micro-layer."""
    n = s.shape[-1]
    for l in range(R.shape[0]):
        s_in = s * mask
        pre = s_in @ R[l] + b[l] + (x @ W if l == 0 else 0.0)
        h = np.tanh(pre[:, :n])
        t = sigmoid(pre[:, n : 2 * n])
        c = 1.0 - t if coupled else sigmoid(pre[:, 2 * n :])
        s = h * t + s * c
    return s


def numpy_hsg_step(p, x, s_prev, mask, coupled):
    """Shoham & Permuter, eqs. 5-6, around the NumPy RHN."""
    c = p["cell"]
    s_l = numpy_rhn_step(c["W"], c["R"], c["b"], x, s_prev, mask, coupled)
    g = sigmoid(s_prev @ p["W_R"] + s_l @ p["W_F"] + p["b_G"])
    return g * s_prev + (1.0 - g) * s_l


# The fast suite keeps one case per option (depth 3, uncoupled, HSG each once).
FAST_STEP_CASES = {(1, True, False), (3, False, False), (3, True, True), (1, False, True)}


@pytest.mark.parametrize(
    "depth,coupled,hsg",
    [
        pytest.param(d, c, h, marks=[pytest.mark.slow] * ((d, c, h) not in FAST_STEP_CASES))
        for h in (False, True)
        for c in (True, False)
        for d in (1, 3)
    ],
)
def test_step_matches_numpy(depth, coupled, hsg):
    B, m, n, T = 3, 5, 4, 6
    cell = cells.RHN(n, depth, coupled=coupled)
    if hsg:
        cell = cells.HSG(cell)
    rng = np.random.default_rng(depth + 10 * coupled + 100 * hsg)  # NumPy draws
    params = random_params(shapes(cell.init, m), rng)
    xs = normal(rng, (T, B, m))
    s0 = normal(rng, (B, n))
    mask = dropout_mask(rng, (B, n), 0.7)

    carry, ys = jax.jit(lambda *a: cells.unroll(cell, *a))(params, s0, xs, mask)

    p = np_tree(params)
    s = np.asarray(s0, np.float64)
    expected = []
    for t in range(T):
        x = np.asarray(xs[t], np.float64)
        if hsg:
            s = numpy_hsg_step(p, x, s, np.asarray(mask), coupled)
        else:
            s = numpy_rhn_step(p["W"], p["R"], p["b"], x, s, np.asarray(mask), coupled)
        expected.append(s)
    np.testing.assert_allclose(ys, np.stack(expected), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(carry, expected[-1], rtol=2e-5, atol=2e-5)


def test_init_follows_reference():
    cell = cells.RHN(7, 4, init_scale=0.04, init_bias=-2.0)
    p = cell.init(jax.random.PRNGKey(0), 5)
    assert p["W"].shape == (5, 14) and p["R"].shape == (4, 7, 14) and p["b"].shape == (4, 14)
    np.testing.assert_array_equal(p["b"][:, 7:], -2.0)  # T bias
    for w in (p["W"], p["R"], p["b"][:, :7]):
        assert float(jnp.abs(w).max()) <= 0.04 and float(jnp.abs(w).max()) > 0.02
    u = cells.RHN(7, 2, coupled=False, init_bias=-3.0).init(jax.random.PRNGKey(0), 5)
    assert u["R"].shape == (2, 7, 21)
    np.testing.assert_array_equal(u["b"][:, 14:], 3.0)  # C bias starts near 1 - T
    h = cells.HSG(cell).init(jax.random.PRNGKey(0), 5)
    np.testing.assert_array_equal(h["b_G"], -2.5)  # paper's b_G


def test_parameters_and_dropout_masks_are_the_draws_in_their_own_shape():
    """base.uniform and dropout.mask draw flat (faster to compile) and reshape: the
    numbers of ``jax.random`` drawn in the shape itself, so a seed gives the same
    parameters and masks as before the change."""
    for shape in [(3, 5, 10), (2, 4, 5), (7,)]:
        key = jax.random.PRNGKey(sum(shape))
        np.testing.assert_array_equal(
            cells.base.uniform(key, shape, 0.04),
            jax.random.uniform(key, shape, jnp.float32, -0.04, 0.04),
        )
        keep = jax.random.bernoulli(key, 0.75, shape).astype(jnp.float32)
        np.testing.assert_array_equal(dropout.mask(key, shape, 0.25), keep / 0.75)


def test_hsg_closed_gate_is_bare_rhn():
    """b_G -> -inf makes g = 0, so ŝ_t = s_L,t: HSG(RHN) reduces to the RHN."""
    rhn = cells.RHN(6, 3)
    hsg = cells.HSG(rhn)
    params = random_params(shapes(hsg.init, 4), 2)
    params["b_G"] = as_jax(np.full(params["b_G"].shape, -1e4, np.float32))
    xs = normal(3, (5, 2, 4))
    s0 = as_jax(np.ones((2, 6), np.float32))
    ys_hsg, ys_rhn = jax.jit(  # one program
        lambda p, s0, xs: (cells.unroll(hsg, p, s0, xs)[1], cells.unroll(rhn, p["cell"], s0, xs)[1])
    )(params, s0, xs)
    np.testing.assert_allclose(ys_hsg, ys_rhn, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: cells.RHN(8, 1),
        lambda: cells.RHN(8, 4, coupled=False),
        lambda: cells.HSG(cells.RHN(8, 3)),
        lambda: cells.GRU(8, reset_after=True),  # PyTorch's GRU: tests/test_torch_interop.py
    ],
)
def test_cell_in_user_written_scan_under_jit(make):
    """A user's own lax.scan with nothing else from rhnzoo than the cell."""
    cell = make()
    params = cell.init(jax.random.PRNGKey(0), 3)
    xs = normal(1, (7, 2, 3))
    carry, ys = scan_by_hand(cell, params, xs)
    assert ys.shape == (7, 2, 8) and carry.shape == (2, 8)
    ref_carry, ref_ys = cells.unroll(cell, params, cell.initial_carry(2), xs)
    np.testing.assert_allclose(ys, ref_ys, rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(ys).sum()) > 0


@pytest.mark.parametrize("name", [n for n in cells.ALL_NAMES if n != "hrl"])
def test_a_step_keeps_its_carrys_dtype_in_a_users_own_scan(name):
    # Before: RHN, HSG and the DT-RNNs added their float32 bias (and every cell its float32
    # dropout mask) unconverted, so a bfloat16 carry came back float32 and lax.scan refused.
    cell = cells.make(name, 8, **cells.applicable(name, {"depth": 2}))
    params = cell.init(jax.random.PRNGKey(0), 3)
    x_proj = cell.project_inputs(params, normal(1, (4, 2, 3)).astype(jnp.bfloat16))
    mask = jnp.ones((2, 8), jnp.float32)
    step = lambda carry, x_t: cell.step(params, carry, x_t, mask)
    carry, ys = jax.jit(lambda c, x: jax.lax.scan(step, c, x))(
        cell.initial_carry(2, jnp.bfloat16), x_proj
    )
    assert ys.dtype == jnp.bfloat16
    assert all(c.dtype in (jnp.bfloat16, jnp.int32) for c in jax.tree.leaves(carry))


@pytest.mark.parametrize("hsg", [pytest.param(False, marks=pytest.mark.slow), True])
def test_gradient_matches_finite_differences(hsg):
    cell = cells.RHN(4, 3, coupled=not hsg)
    check_unroll_gradient(cells.HSG(cell) if hsg else cell)


def test_invalid_depth_and_size():
    with pytest.raises(ValueError, match="depth"):
        cells.RHN(4, 0)
    with pytest.raises(ValueError, match="hidden_size"):
        cells.RHN(0, 2)
    with pytest.raises(ValueError, match="hidden_size"):  # before: True built an RHN(1)
        cells.RHN(True, 2)
    # before: NumPy integers were refused as "not an integer"
    params = cells.RHN(np.int64(4), np.int32(2)).init(jax.random.PRNGKey(0), 3)
    assert params["R"].shape == (2, 4, 8)


def test_step_with_gates_returns_every_micro_layer():
    cell = cells.RHN(5, 4)
    params = random_params(shapes(cell.init, 3), 1)
    s0 = normal(2, (2, 5))
    x_proj = normal(3, (2, 3))

    @jax.jit  # one program
    def run(params, s0, x):
        x_proj = cell.project_inputs(params, x)
        return x_proj, *cell.step_with_gates(params, s0, x_proj)

    x_proj, s, ts = run(params, s0, x_proj)
    assert ts.shape == (4, 2, 5)
    # Recompute each micro-layer's T gate from the NumPy transcription's pre-activation.
    p = np_tree(params)
    state = np.asarray(s0, np.float64)
    for l in range(4):
        pre = state @ p["R"][l] + p["b"][l] + (np.asarray(x_proj) if l == 0 else 0.0)
        t = sigmoid(pre[:, 5:])
        np.testing.assert_allclose(ts[l], t, rtol=1e-5, atol=1e-6)
        state = state + t * (np.tanh(pre[:, :5]) - state)
    np.testing.assert_allclose(s, state, rtol=1e-5, atol=1e-6)
