"""rhnzoo.analysis.flow: temporal Jacobians, Gersgorin discs, gradient flow (Zilly et al. 2017,
sec. 3-4, eqs. 2 and 12-15) for every cell of rhnzoo.cells."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import normal, random_params

from rhnzoo import cells
from rhnzoo.analysis import flow

N, M, B = 4, 3, 2
CELLS = {
    "rhn": cells.RHN(N, 2),
    "hsg": cells.HSG(cells.RHN(N, 2)),
    "rhn_uncoupled": cells.RHN(N, 1, coupled=False),
    "dtrnn": cells.DTRNN(N, 2),
    "dtsrnn": cells.DTSRNN(N, 3),
    "lstm": cells.LSTM(N),
    "gru": cells.GRU(N),
    "rrn": cells.RRN(N),
    "sc_lstm": cells.SCLSTM(N, skip=2, learn_alpha=True),
    "hrl": cells.Parallel((cells.LSTM(N), cells.RRN(N))),
}


def state(cell, seed=0, steps=3):
    """Random params and a carry reached by reading a few random inputs (not the zero state)."""
    params = random_params(cell.init(jax.random.PRNGKey(seed), M), jax.random.PRNGKey(seed + 1))
    xs = normal(jax.random.PRNGKey(seed + 2), (steps + 1, B, M))
    carry, _ = cells.unroll(cell, params, cell.initial_carry(B), xs[:steps])
    return params, carry, jax.tree.map(lambda a: a[steps], cell.project_inputs(params, xs))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow)  # variants of the others
        if n in ("rhn_uncoupled", "dtrnn", "sc_lstm")
        else n
        for n in CELLS
    ],
)
def test_jacobian_matches_central_differences(name):
    cell = CELLS[name]
    state32 = jax.tree.map(np.asarray, state(cell))
    with jax.enable_x64(True):
        params, carry, x_proj = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float64) if np.issubdtype(a.dtype, np.floating) else a,
            state32,
        )
        a = np.asarray(flow.temporal_jacobian(cell, params, carry, x_proj))
        s, unflatten = flow.flatten_carry(carry)
        d = s.shape[1]
        assert a.shape == (B, d, d)
        eps = 1e-6
        step = lambda s_: flow.flatten_carry(cell.step(params, unflatten(s_), x_proj)[0])[0]
        # Row j of every A[b]: (step(s + eps e_j) - step(s - eps e_j)) / 2 eps, all j at once.
        diff = jax.jit(jax.vmap(lambda e: (step(s + e) - step(s - e)) / (2 * eps)))
        rows = np.asarray(diff(eps * jnp.eye(d)[:, None, :]))  # [d (j), B, d (i)]
        np.testing.assert_allclose(a, rows.transpose(1, 0, 2), rtol=1e-6, atol=1e-8)


def test_carry_dimension_counts_every_float_part():
    """LSTM: (h, c), d = 2n; SC-LSTM: (h, c, anchor) and an integer step counter left out."""
    assert flow.flatten_carry(cells.LSTM(N).initial_carry(B))[0].shape == (B, 2 * N)
    assert flow.flatten_carry(cells.SCLSTM(N).initial_carry(B))[0].shape == (B, 3 * N)


@pytest.mark.parametrize("depth", [1, 3])
def test_closed_transform_gates_give_the_identity_eq_15(depth):
    """Zilly et al. eq. 15: with t = 0 and c = 1 every disc is centred at 1 with radius 0
    and every eigenvalue is 1 (T bias -> -inf: -1e4 makes sigmoid exactly 0 in float32)."""
    cell = cells.RHN(N, depth)
    params, carry, x_proj = state(cell)
    params["b"] = params["b"].at[:, N:].set(-1e4)
    a = flow.temporal_jacobian(cell, params, carry, x_proj)
    centres, radii = flow.gersgorin_discs(a)
    np.testing.assert_array_equal(centres, 1.0)
    np.testing.assert_array_equal(radii, 0.0)
    np.testing.assert_allclose(flow.eigenvalues(a), 1.0, atol=1e-12)


def test_plain_tanh_rnn_jacobian_is_eq_2():
    """s_t = tanh(x W + s_{t-1} R + b) with row vectors: A = R diag(tanh'(z)), i.e. Zilly et
    al.'s eq. 2, A = Rᵀ diag(f'), with their column-vector R = our Rᵀ."""
    cell = cells.DTRNN(N, 1)
    params, carry, x_proj = state(cell)
    z = x_proj + carry @ params["R"][0] + params["b"][0]
    expected = params["R"][0] @ jax.vmap(jnp.diag)(1 - jnp.tanh(z) ** 2)  # [B, n, n]
    np.testing.assert_allclose(
        flow.temporal_jacobian(cell, params, carry, x_proj), expected, rtol=1e-5, atol=1e-7
    )


def test_every_eigenvalue_lies_in_a_gersgorin_disc():
    for name in ("lstm", "rhn", "hrl"):
        cell = CELLS[name]
        a = flow.temporal_jacobian(cell, *state(cell, seed=5))
        centres, radii = flow.gersgorin_discs(a)
        for b in range(B):
            for lam in flow.eigenvalues(a[b]):
                assert np.any(np.abs(lam - centres[b]) <= radii[b] + 1e-5), (name, lam)
        assert np.all(flow.spectral_radius(a) <= flow.largest_singular_value(a) + 1e-5)


@pytest.mark.parametrize("name", ["rhn", "lstm", "sc_lstm"])
def test_gradient_norms_through_time_equal_products_of_jacobians(name):
    """‖u·(A-chain)‖: the one-pass gradient norms against explicit Jacobian products."""
    cell = CELLS[name]
    params, carry, _ = state(cell, seed=3)
    xs = normal(jax.random.PRNGKey(9), (6, B, M))
    u = normal(jax.random.PRNGKey(4), (flow.flatten_carry(carry)[0].shape[1],))
    u = u / jnp.linalg.norm(u)
    norms = flow.gradient_norms_through_time(cell, params, carry, xs, readout=u)
    a = np.asarray(flow.jacobians_along(cell, params, carry, xs), np.float64)  # [T, B, d, d]
    g = np.broadcast_to(np.asarray(u, np.float64), (B, len(u)))  # ∂L/∂s_T per row
    expected = [1.0]
    for t in reversed(
        range(len(xs))
    ):  # ∂L/∂s_{t} = A_t ∂L/∂s_{t+1}  (A[j, i] = ∂s_{t+1,i}/∂s_{t,j})
        g = np.einsum("bji,bi->bj", a[t], g)
        expected.append(np.linalg.norm(g, axis=-1).mean())
    np.testing.assert_allclose(norms, expected, rtol=1e-4)
    assert norms[0] == pytest.approx(1.0)


def test_layer_gradient_norms_of_a_stack():
    params = {"W": jnp.arange(24.0).reshape(3, 2, 4) / 10, "b": jnp.ones((3, 4))}
    loss = lambda p: jnp.sum(p["W"] ** 2) + jnp.sum(p["b"] * jnp.arange(3.0)[:, None])
    norms = flow.layer_gradient_norms(loss, params, lambda g: g)
    expected = [np.sqrt(np.sum((2 * np.asarray(params["W"][l])) ** 2) + 4 * l**2) for l in range(3)]
    np.testing.assert_allclose(norms, expected, rtol=1e-6)
