"""LSTM, GRU, SC-LSTM, RRN and Parallel (HRL) cells against NumPy transcriptions of
Wang & Tian (2016, eqs. 1, 3-7) and Cho et al. (2014, eqs. 5-8)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import check_gradient_by_finite_differences, np_tree, unroll_loss

from rhnzoo import cells
from rhnzoo.cells.lstm import (
    gru_coefficients,
    gru_reset_after_coefficients,
    gru_reset_after_gates,
    lstm_coefficients,
    lstm_gates,
)
from rhnzoo.cells.residual import rrn_coefficients

sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))

# One jitted unroll for the whole module (the cell is static: frozen dataclasses hash).
UNROLL = jax.jit(cells.unroll, static_argnums=0)

B, M, N = 3, 4, 5  # batch, input size, hidden size

CELLS = {
    "lstm": lambda: cells.LSTM(N),
    "gru": lambda: cells.GRU(N),
    "rrn1": lambda: cells.RRN(N, 1),
    "rrn3": lambda: cells.RRN(N, 3),
    "rrn2_tanh": lambda: cells.RRN(N, 2, activation="tanh"),
    "sclstm_i": lambda: cells.SCLSTM(N, skip=2),
    "sclstm_p": lambda: cells.SCLSTM(N, skip=3, learn_alpha=True),
    "hrl": lambda: cells.Parallel((cells.LSTM(N), cells.RRN(N))),
    "lstm_gru": lambda: cells.Parallel([cells.LSTM(N), cells.GRU(N)]),
}
# The carry-handling tests' fast tier: each kind of carry once (the LSTM's pair, the
# GRU's and RRN's array, SC-LSTM's step counter, a Parallel's tuple); the rest in CI.
CARRIES = [
    n
    if n in ("lstm", "gru", "rrn3", "sclstm_p", "hrl")
    else pytest.param(n, marks=pytest.mark.slow)
    for n in CELLS
]


@functools.partial(jax.jit, static_argnums=0)
def unroll_keeping_carries(cell, params, carry, xs, mask):
    """A plain scan that keeps every step's carry: ``(carries [T, ...], ys [T, B, n])``."""

    def step(carry, x_t):
        carry, y = cell.step(params, carry, x_t, mask)
        return carry, (carry, y)

    return jax.lax.scan(step, carry, cell.project_inputs(params, xs))[1]


# ---------------------------------------------------------------------------------------
# NumPy float64 transcriptions, one gate block at a time.


def blocks(a, k):
    """Splits the last axis of ``a`` into k equal blocks."""
    return np.split(a, k, axis=-1)


def np_lstm_step(p, x, h, c, mask):
    """Wang & Tian eq. 1; blocks i | f | o | c̃."""
    Wi, Wf, Wo, Wc = blocks(p["W"], 4)
    Ui, Uf, Uo, Uc = blocks(p["U"], 4)
    bi, bf, bo, bc = blocks(p["b"], 4)
    hm = h * mask
    i = sigmoid(x @ Wi + hm @ Ui + bi)
    f = sigmoid(x @ Wf + hm @ Uf + bf)
    o = sigmoid(x @ Wo + hm @ Uo + bo)
    c_tilde = np.tanh(x @ Wc + hm @ Uc + bc)
    c = f * c + i * c_tilde
    return o * np.tanh(c), c


def np_gru_step(p, x, h, mask):
    """Cho et al. (2014) eqs. 5-8, h_t = z h_{t-1} + (1 - z) h̃; blocks r | z | h̃."""
    Wr, Wz, Wh = blocks(p["W"], 3)
    Ur, Uz, Uh = blocks(p["U"], 3)
    br, bz, bh = blocks(p["b"], 3)
    hm = h * mask
    r = sigmoid(x @ Wr + hm @ Ur + br)
    z = sigmoid(x @ Wz + hm @ Uz + bz)
    h_tilde = np.tanh(x @ Wh + (r * hm) @ Uh + bh)
    return z * h + (1.0 - z) * h_tilde


def np_rrn_step(p, x, h, mask, act):
    """Wang & Tian eqs. 3-4: h_t = tanh(h_{t-1} + y_K), x_t entering every layer."""
    K = p["U"].shape[0]
    W, b = blocks(p["W"], K), blocks(p["b"], K)
    y = act(x @ W[0] + (h * mask) @ p["U"][0] + b[0])
    for k in range(1, K):
        y = act(x @ W[k] + y @ p["U"][k] + b[k])
    return np.tanh(h + y)


def np_run(cell, p, xs, carry, mask):
    """Runs the NumPy transcription of ``cell`` over ``xs [T, B, m]``.

    Returns (ys [T, B, n], final carry as a tuple of arrays / nested tuples).
    """
    T = xs.shape[0]
    if isinstance(cell, cells.Parallel):
        runs = [np_run(c, pi, xs, ci, mask) for c, pi, ci in zip(cell.cells, p, carry)]
        return np.mean([ys for ys, _ in runs], axis=0), tuple(c for _, c in runs)
    if isinstance(cell, cells.SCLSTM):
        return np_sclstm(p, xs, carry, mask, cell.skip, cell.learn_alpha)
    ys = []
    if isinstance(cell, cells.LSTM):
        h, c = carry
        for t in range(T):
            h, c = np_lstm_step(p, xs[t], h, c, mask)
            ys.append(h)
        return np.stack(ys), (h, c)
    h = carry
    for t in range(T):
        if isinstance(cell, cells.GRU):
            h = np_gru_step(p, xs[t], h, mask)
        else:
            act = sigmoid if cell.activation == "sigmoid" else np.tanh
            h = np_rrn_step(p, xs[t], h, mask, act)
        ys.append(h)
    return np.stack(ys), h


def np_sclstm(p, xs, carry, mask, L, learn_alpha):
    """Wang & Tian eq. 5, written with the full history of h (1-indexed τ):
    h_τ = o_τ tanh(c_τ) + α h_{τ-L} exactly when τ - 1 is a positive multiple of L."""
    alpha = p["alpha"] if learn_alpha else 1.0
    h, c = carry[0], carry[1]
    history = {}  # τ -> h_τ
    for tau in range(1, xs.shape[0] + 1):
        h, c = np_lstm_step(p, xs[tau - 1], h, c, mask)
        if tau > 1 and (tau - 1) % L == 0:
            h = h + alpha * history[tau - L]
        history[tau] = h
    T = xs.shape[0]
    last_anchor = 1 + ((T - 1) // L) * L
    return np.stack([history[t] for t in range(1, T + 1)]), (h, c, history[last_anchor], T)


# ---------------------------------------------------------------------------------------


def abstract_params(cell):
    """``cell.init(key, M)``'s tree of ``jax.ShapeDtypeStruct`` (nothing is computed)."""
    return jax.eval_shape(lambda key: cell.init(key, M), jax.ShapeDtypeStruct((2,), jnp.uint32))


def random_params_np(cell, seed, scale=0.5):
    """Random (non-init) float32 params of ``cell``'s shapes, drawn with NumPy.

    Like ``helpers.random_params``, but without running ``cell.init``: only its shapes
    (``jax.eval_shape``), so that no threefry kernel is compiled per shape.
    """
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(scale * rng.standard_normal(s.shape), s.dtype), abstract_params(cell)
    )


def random_carry(cell, rng, batch=B):
    """The initial carry with every float leaf random (int leaves, SC-LSTM's t, kept)."""

    def fill(leaf):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(rng.standard_normal(leaf.shape), leaf.dtype)
        return leaf

    return jax.tree.map(fill, cell.initial_carry(batch))


def setup(cell, seed, T, with_mask=True):
    """Random params, inputs ``[T, B, M]``, initial carry and dropout mask ``[B, N]``."""
    rng = np.random.default_rng(seed)
    params = random_params_np(cell, seed + 1000)
    xs = jnp.asarray(rng.standard_normal((T, B, M)), jnp.float32)
    carry = random_carry(cell, rng)
    mask = jnp.asarray((rng.random((B, N)) < 0.7) / 0.7, jnp.float32) if with_mask else None
    return params, xs, carry, mask


def assert_tree_close(actual, expected, **kw):
    a, e = jax.tree.leaves(actual), jax.tree.leaves(expected)
    assert len(a) == len(e)
    for x, y in zip(a, e):
        np.testing.assert_allclose(np.asarray(x, np.float64), y, **kw)


@pytest.mark.parametrize("name", list(CELLS))
def test_matches_numpy(name):
    cell = CELLS[name]()
    T = 7
    params, xs, carry0, mask = setup(cell, 1, T)
    carry, ys = UNROLL(cell, params, carry0, xs, mask)
    expected_ys, expected_carry = np_run(
        cell, np_tree(params), np.asarray(xs, np.float64), np_tree(carry0), np.asarray(mask)
    )
    assert ys.shape == (T, B, N)
    np.testing.assert_allclose(ys, expected_ys, rtol=2e-5, atol=2e-5)
    assert_tree_close(carry, expected_carry, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "T, L, learn_alpha",
    [(7, 3, False), (7, 3, True), (6, 3, True), (6, 1, True), (4, 10, False), (9, 2, False)],
)
def test_sclstm_matches_numpy(T, L, learn_alpha):
    """Several T and L (T a multiple of L or not, L = 1, L > T), α fixed and learned."""
    cell = cells.SCLSTM(N, skip=L, learn_alpha=learn_alpha)
    params, xs, carry0, mask = setup(cell, 10 * T + L, T)
    if learn_alpha:  # random_params_np made α ~ N(0, 0.25): make sure it is far from 1
        params["alpha"] = jnp.float32(-0.7)
    carry, ys = UNROLL(cell, params, carry0, xs, mask)
    p = np_tree(params)
    expected_ys, expected_carry = np_sclstm(
        p, np.asarray(xs, np.float64), np_tree(carry0), np.asarray(mask), L, learn_alpha
    )
    np.testing.assert_allclose(ys, expected_ys, rtol=2e-5, atol=2e-5)
    assert_tree_close(carry, expected_carry, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(carry.t, T)


@pytest.mark.parametrize("L", [1, 3])
def test_sclstm_skips_exactly_at_one_plus_kL(L):
    """Same params as a plain LSTM: equal for τ <= L; at τ = L + 1 the SC-LSTM adds
    α h_1 to the LSTM's h_{L+1} (same state up to τ = L, so the same LSTM step), then
    the two differ. α = 0 (learned) is the plain LSTM at every step."""
    T = L + 3
    sc, lstm = cells.SCLSTM(N, skip=L, learn_alpha=True), cells.LSTM(N)
    params, xs, _, _ = setup(sc, L, T, with_mask=False)
    params["alpha"] = jnp.float32(0.6)
    lstm_params = {k: params[k] for k in ("W", "U", "b")}
    _, ys_sc = UNROLL(sc, params, sc.initial_carry(B), xs)
    _, ys_lstm = UNROLL(lstm, lstm_params, lstm.initial_carry(B), xs)
    np.testing.assert_allclose(ys_sc[:L], ys_lstm[:L], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ys_sc[L], ys_lstm[L] + 0.6 * ys_lstm[0], rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(ys_sc[L] - ys_lstm[L]).max()) > 1e-2
    params["alpha"] = jnp.float32(0.0)
    _, ys_zero = UNROLL(sc, params, sc.initial_carry(B), xs)
    np.testing.assert_allclose(ys_zero, ys_lstm, rtol=1e-6, atol=1e-7)


def test_sclstm_carry_resumes_with_the_right_phase():
    """Unrolling T1 then T2 steps from the returned carry equals unrolling T1 + T2."""
    cell = cells.SCLSTM(N, skip=3, learn_alpha=True)
    params, xs, _, mask = setup(cell, 5, 8)
    full, ys = UNROLL(cell, params, cell.initial_carry(B), xs, mask)
    mid, ys1 = UNROLL(cell, params, cell.initial_carry(B), xs[:4], mask)
    end, ys2 = UNROLL(cell, params, mid, xs[4:], mask)
    np.testing.assert_allclose(jnp.concatenate([ys1, ys2]), ys, rtol=1e-6, atol=1e-6)
    assert_tree_close(end, np_tree(full), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", CARRIES)
def test_cell_in_user_written_scan_under_jit(name):
    """A user's own lax.scan with nothing from rhnzoo but the cell equals ``unroll``."""
    cell = CELLS[name]()
    params, xs, carry0, mask = setup(cell, 2, 7)

    @jax.jit
    def run(params, carry, xs, mask):
        x_proj = cell.project_inputs(params, xs)
        step = functools.partial(cell.step, params, mask=mask)
        return jax.lax.scan(step, carry, x_proj)

    carry, ys = run(params, carry0, xs, mask)
    ref_carry, ref_ys = UNROLL(cell, params, carry0, xs, mask)
    assert ys.shape == (7, B, N)
    np.testing.assert_allclose(ys, ref_ys, rtol=1e-6, atol=1e-6)
    assert_tree_close(carry, np_tree(ref_carry), rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(ys).sum()) > 0


@pytest.mark.parametrize("name", CARRIES)
def test_padding_leaves_final_carry_unchanged(name):
    """Row b padded with garbage after lengths[b] steps ends in the carry it has after
    lengths[b] real steps (for SC-LSTM: its step counter too), and outputs zeros there."""
    cell = CELLS[name]()
    T, lengths = 7, jnp.array([7, 2, 5])
    params, xs, carry0, mask = setup(cell, 3, T)
    valid = (jnp.arange(T)[:, None] < lengths[None, :])[..., None]
    padded = jnp.where(valid, xs, 100.0 * xs[::-1] + 3.0)
    carry, ys = UNROLL(cell, params, carry0, padded, mask, lengths=lengths)
    np.testing.assert_array_equal(jnp.where(valid, 0.0, ys), 0.0)
    # Reference: every row unpadded, every step's carry kept.
    ref_carries, ref_ys = unroll_keeping_carries(cell, params, carry0, xs, mask)
    np.testing.assert_allclose(jnp.where(valid, ref_ys, 0.0), ys, rtol=1e-6, atol=1e-6)
    for b, n_b in enumerate(lengths.tolist()):
        row = jax.tree.map(lambda a, b=b: a[b], carry)
        ref = jax.tree.map(lambda a, b=b, t=n_b - 1: a[t, b], ref_carries)
        assert_tree_close(row, np_tree(ref), rtol=1e-6, atol=1e-6)
    if isinstance(cell, cells.SCLSTM):
        np.testing.assert_array_equal(carry.t, lengths)


@pytest.mark.parametrize(  # the LSTM's also inside hrl (LSTM + RRN)
    "name", [pytest.param("lstm", marks=pytest.mark.slow), "gru", "rrn3", "sclstm_p", "hrl"]
)
def test_gradient_matches_finite_differences(name):
    with jax.enable_x64(True):
        cell = CELLS[name]()
        T = 5
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda a: a.astype(jnp.float64), random_params_np(cell, 1))
        xs = jnp.asarray(rng.standard_normal((T, 2, M)))
        mask = jnp.asarray((rng.random((2, N)) < 0.8) / 0.8)
        target = jnp.asarray(rng.standard_normal((T, 2, N)))

        loss, eps = unroll_loss(cell, xs, mask, target), 1e-6
        check_gradient_by_finite_differences(loss, params, eps=eps)
        grads = jax.grad(loss)(params)
        if "alpha" in params:  # SC-LSTM-P: dL/dα on its own (T = 5, L = 3: one skip, τ = 4)
            shifted = lambda e: loss({**params, "alpha": params["alpha"] + e})
            fd = (shifted(eps) - shifted(-eps)) / (2 * eps)
            assert abs(float(grads["alpha"])) > 1e-3
            np.testing.assert_allclose(float(grads["alpha"]), float(fd), rtol=1e-6, atol=1e-8)


def test_init_shapes_biases_and_parameter_counts():
    key = jax.random.PRNGKey(0)
    lstm = jax.jit(cells.LSTM(N, forget_bias=1.5, init_scale=0.1).init, static_argnums=1)(key, M)
    assert lstm["W"].shape == (M, 4 * N) and lstm["U"].shape == (N, 4 * N)
    np.testing.assert_array_equal(lstm["b"][N : 2 * N], 1.5)  # forget gate
    np.testing.assert_array_equal(lstm["b"][:N], 0.0)
    np.testing.assert_array_equal(lstm["b"][2 * N :], 0.0)
    for w in (lstm["W"], lstm["U"]):
        assert w.dtype == jnp.float32 and 0.05 < float(jnp.abs(w).max()) <= 0.1
    sc = jax.jit(cells.SCLSTM(N, learn_alpha=True, init_scale=0.1).init, static_argnums=1)(key, M)
    assert sc["alpha"].shape == () and float(sc["alpha"]) == 1.0  # SC-LSTM-P starts as -I
    np.testing.assert_array_equal(sc["W"], lstm["W"])

    shapes = lambda cell: jax.tree.map(lambda s: s.shape, abstract_params(cell))
    count = lambda cell: sum(int(np.prod(s.shape)) for s in jax.tree.leaves(abstract_params(cell)))

    assert count(cells.LSTM(N)) == 4 * (M * N + N * N + N)
    assert count(cells.GRU(N)) == 3 * (M * N + N * N + N)
    assert shapes(cells.RRN(N, 3)) == {"W": (M, 3 * N), "U": (3, N, N), "b": (3 * N,)}
    assert count(cells.RRN(N, 2)) == 2 * (M * N + N * N + N)  # half an LSTM
    assert "alpha" not in shapes(cells.SCLSTM(N))
    assert count(cells.Parallel((cells.LSTM(N), cells.RRN(N)))) == 6 * (M * N + N * N + N)
    carry = cells.SCLSTM(N).initial_carry(2, jnp.bfloat16)
    assert carry.h.dtype == jnp.bfloat16 and carry.t.dtype == jnp.int32 and carry.t.shape == (2,)


def test_bad_hyperparameters_raise():
    for make, match in [
        (lambda: cells.LSTM(0), "hidden_size"),
        (lambda: cells.GRU(-1), "hidden_size"),
        (lambda: cells.RRN(0), "hidden_size"),
        (lambda: cells.RRN(4, depth=0), "depth"),
        (lambda: cells.RRN(4, activation="relu"), "activation"),
        (lambda: cells.SCLSTM(0), "hidden_size"),
        (lambda: cells.SCLSTM(4, skip=0), "skip"),
        (lambda: cells.SCLSTM(4, skip=2.5), "skip"),
        (lambda: cells.Parallel((cells.LSTM(4), cells.RRN(5))), "same hidden_size"),
        (lambda: cells.Parallel(()), "at least one"),
    ]:
        with pytest.raises(ValueError, match=match):
            make()
    for cell in (
        cells.LSTM(4),
        cells.GRU(4),
        cells.RRN(4),
        cells.SCLSTM(4, learn_alpha=True),
        cells.Parallel((cells.LSTM(4), cells.GRU(4))),
    ):
        with pytest.raises(ValueError, match="input_size"):
            cell.init(jax.random.PRNGKey(0), 0)


def test_parallel_names_are_the_registrys_two_cell_hybrids():
    for name in cells.NAMES:
        built = cells.make(name, 4)
        assert isinstance(built, cells.Parallel) == (name in cells.registry.PARALLEL_NAMES), name
    assert cells.registry.PARALLEL_NAMES == ("hrl", "lstm_gru")


# ---------------------------------------------------------------------------------------
# The gate math and derivative coefficients every implementation shares (rhnzoo.cells.lstm,
# rhnzoo.cells.residual), against NumPy transcriptions of the equations and of their
# derivatives written from the pre-activations: σ'(a) = e^{-a} / (1 + e^{-a})², tanh'(a) =
# 1 / cosh²(a) (not the σ (1 - σ) and 1 - tanh² forms the functions use).

d_sigmoid = lambda a: np.exp(-a) / (1.0 + np.exp(-a)) ** 2
d_tanh = lambda a: 1.0 / np.cosh(a) ** 2


def np_normal(rng, *shape):
    return rng.standard_normal(shape) * 1.5


def assert_fields(actual, expected):
    """Each named field of ``actual`` (a NamedTuple of arrays) against ``expected``."""
    assert actual._fields == tuple(expected), (actual._fields, tuple(expected))
    for name, want in expected.items():
        np.testing.assert_allclose(
            np.asarray(getattr(actual, name)), want, rtol=1e-12, atol=1e-14, err_msg=name
        )


def test_lstm_gates_split_the_blocks_i_f_o_c_in_either_layout():
    rng = np.random.default_rng(0)
    z = np_normal(rng, B, 4 * N)
    zi, zf, zo, zc = blocks(z, 4)
    want = {"i": sigmoid(zi), "f": sigmoid(zf), "o": sigmoid(zo), "c_tilde": np.tanh(zc)}
    with jax.enable_x64(True):
        assert_fields(lstm_gates(jnp.asarray(z)), want)
        feature_major = lstm_gates(jnp.asarray(z.T), axis=0)  # [4n, B]
        assert_fields(feature_major, {k: v.T for k, v in want.items()})
        # each implementation's own σ and tanh are the ones applied
        doubled = lstm_gates(jnp.asarray(z), sigmoid=lambda a: 2 * a, tanh=jnp.sin)
        assert_fields(doubled, {"i": 2 * zi, "f": 2 * zf, "o": 2 * zo, "c_tilde": np.sin(zc)})
    with pytest.raises(ValueError, match="4 gate blocks"):
        lstm_gates(jnp.zeros((B, 4 * N + 1)))


def test_lstm_coefficients_are_eq_1s_derivatives():
    """h_t = o tanh(c_t), c_t = f c_{t-1} + i c̃ (Wang & Tian eq. 1) differentiated by
    c_t and by the pre-activations z_i, z_f, z_c̃, z_o."""
    rng = np.random.default_rng(1)
    zi, zf, zo, zc, c_prev = (np_normal(rng, B, N) for _ in range(5))
    i, f, o, c_tilde = sigmoid(zi), sigmoid(zf), sigmoid(zo), np.tanh(zc)
    c = f * c_prev + i * c_tilde
    want = {
        "dh_dc": o * d_tanh(c),
        "dc_dzi": c_tilde * d_sigmoid(zi),
        "dc_dzf": c_prev * d_sigmoid(zf),
        "dc_dzc": i * d_tanh(zc),
        "dh_dzo": np.tanh(c) * d_sigmoid(zo),
    }
    with jax.enable_x64(True):
        args = [jnp.asarray(a) for a in (i, f, o, c_tilde, c_prev, np.tanh(c))]
        assert_fields(lstm_coefficients(*args), want)


def test_gru_reset_after_gates_apply_r_after_the_recurrent_matmul():
    """r | z = σ(x + h), g = h_h + b_hn, h̃ = tanh(x_h + r g) (PyTorch's nn.GRU)."""
    rng = np.random.default_rng(2)
    x, hU, b_hn = np_normal(rng, B, 3 * N), np_normal(rng, B, 3 * N), np_normal(rng, N)
    (xr, xz, xh), (hr, hz, hh) = blocks(x, 3), blocks(hU, 3)
    r, z, g = sigmoid(xr + hr), sigmoid(xz + hz), hh + b_hn
    want = {"r": r, "z": z, "g": g, "h_tilde": np.tanh(xh + r * g)}
    with jax.enable_x64(True):
        gates = gru_reset_after_gates(jnp.asarray(x), jnp.asarray(hU), jnp.asarray(b_hn))
        assert_fields(gates, want)
        feature_major = gru_reset_after_gates(
            jnp.asarray(x.T), jnp.asarray(hU.T), jnp.asarray(b_hn[:, None]), axis=0
        )
        assert_fields(feature_major, {k: v.T for k, v in want.items()})
    with pytest.raises(ValueError, match="3 gate blocks"):
        gru_reset_after_gates(jnp.zeros((B, 4)), jnp.zeros((B, 4)), jnp.zeros(1))


def test_gru_reset_after_coefficients_are_its_derivatives():
    """h_t = (1 - z) h̃ + z h_{t-1}, h̃ = tanh(a), a = x_h + r g, differentiated by the
    pre-activations of r, z and h̃ (a) and by g."""
    rng = np.random.default_rng(3)
    zr, zz, a_x, g, h_prev = (np_normal(rng, B, N) for _ in range(5))
    r, z = sigmoid(zr), sigmoid(zz)
    a = a_x + r * g
    h_tilde = np.tanh(a)
    want = {
        "dh_dzr": (1 - z) * d_tanh(a) * g * d_sigmoid(zr),
        "dh_dzz": (h_prev - h_tilde) * d_sigmoid(zz),
        "dh_dg": (1 - z) * d_tanh(a) * r,
        "dh_dzh": (1 - z) * d_tanh(a),
    }
    with jax.enable_x64(True):
        args = [jnp.asarray(v) for v in (r, z, g, h_tilde, h_prev)]
        assert_fields(gru_reset_after_coefficients(*args), want)


def test_gru_coefficients_are_cho_et_al_eqs_5_to_8s_derivatives():
    """h_t = z h_{t-1} + (1 - z) h̃ (eq. 7), h̃ = tanh(z_h) (eq. 8), and the reset path
    a = r ⊙ h_{t-1} m into U_h (eq. 5's r), differentiated."""
    rng = np.random.default_rng(4)
    zr, zz, zh, h_prev = (np_normal(rng, B, N) for _ in range(4))
    mask = (rng.random((B, N)) < 0.7) / 0.7
    r, z, h_tilde = sigmoid(zr), sigmoid(zz), np.tanh(zh)
    want = {
        "dh_dzh": (1 - z) * d_tanh(zh),
        "dh_dzz": (h_prev - h_tilde) * d_sigmoid(zz),
        "da_dzr": h_prev * mask * d_sigmoid(zr),
    }
    with jax.enable_x64(True):
        args = [jnp.asarray(v) for v in (r, z, h_tilde, h_prev, h_prev * mask)]
        assert_fields(gru_coefficients(*args), want)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh"])
def test_rrn_coefficients_are_eqs_3_and_4s_derivatives(activation):
    """h_t = tanh(h_{t-1} + y_K) (eq. 3), y_k = σ(z_k) (eq. 4), differentiated by eq. 3's
    pre-activation and by each layer's."""
    rng = np.random.default_rng(5)
    K = 3
    zs, h_prev = [np_normal(rng, B, N) for _ in range(K)], np_normal(rng, B, N)
    act, d_act = (sigmoid, d_sigmoid) if activation == "sigmoid" else (np.tanh, d_tanh)
    ys = [act(zk) for zk in zs]
    s = h_prev + ys[-1]
    with jax.enable_x64(True):
        co = rrn_coefficients(jnp.asarray(np.tanh(s)), [jnp.asarray(y) for y in ys], activation)
    assert co._fields == ("dh_ds", "dy_dz") and len(co.dy_dz) == K
    np.testing.assert_allclose(np.asarray(co.dh_ds), d_tanh(s), rtol=1e-12, atol=1e-14)
    for k in range(K):
        np.testing.assert_allclose(np.asarray(co.dy_dz[k]), d_act(zs[k]), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="activation"):
        rrn_coefficients(jnp.zeros(2), [jnp.zeros(2)], "relu")
