"""Tests for rhnzoo.highway (Srivastava et al. 2015, eq. 3) against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo.models.highway import Highway, Plain


def np_sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def np_highway(W, b, x, act, coupled=True):
    """Eq. 3 (eq. 2 if uncoupled), one layer at a time; returns y and the T gates."""
    n = x.shape[-1]
    gates = []
    for l in range(W.shape[0]):
        H = act(x @ W[l][:, :n] + b[l][:n])
        T = np_sigmoid(x @ W[l][:, n : 2 * n] + b[l][n : 2 * n])
        C = 1.0 - T if coupled else np_sigmoid(x @ W[l][:, 2 * n :] + b[l][2 * n :])
        x = H * T + x * C
        gates.append(T)
    return x, np.stack(gates)


def np_plain(W, b, x, act):
    for l in range(W.shape[0]):
        x = act(x @ W[l] + b[l])
    return x


def random_params(seed, depth, n, k):
    rng = np.random.default_rng(seed)
    return {
        "W": rng.normal(0, 1 / np.sqrt(n), (depth, n, k * n)).astype(np.float32),
        "b": rng.normal(0, 1, (depth, k * n)).astype(np.float32),
    }


np_relu = lambda z: np.maximum(z, 0)


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("coupled", [True, False])
def test_highway_matches_numpy(depth, coupled):
    n = 5
    hw = Highway(n, depth=depth, coupled=coupled)
    p = random_params(depth, depth, n, 2 if coupled else 3)
    x = np.random.default_rng(7).normal(size=(2, 3, n)).astype(np.float32)  # extra batch dims
    y, gates = hw.apply_with_gates(p, jnp.asarray(x))
    y_ref, gates_ref = np_highway(p["W"], p["b"], x, np_relu, coupled)
    assert y.shape == (2, 3, n) and gates.shape == (depth, 2, 3, n)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gates, gates_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hw.apply(p, jnp.asarray(x)), y_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depth", [1, 3])
def test_plain_matches_numpy(depth):
    n = 4
    p = random_params(10 + depth, depth, n, 1)
    x = np.random.default_rng(1).normal(size=(6, n)).astype(np.float32)
    y = Plain(n, depth=depth, activation=jnp.tanh).apply(p, jnp.asarray(x))
    np.testing.assert_allclose(y, np_plain(p["W"], p["b"], x, np.tanh), rtol=1e-5, atol=1e-6)


def test_init_shapes_and_values():
    n, depth = 64, 3
    p = Highway(n, depth=depth, init_bias=-1.5).init(jax.random.key(0))
    assert p["W"].shape == (depth, n, 2 * n) and p["b"].shape == (depth, 2 * n)
    assert p["W"].dtype == jnp.float32 and p["b"].dtype == jnp.float32
    np.testing.assert_array_equal(p["b"][:, :n], 0.0)
    np.testing.assert_array_equal(p["b"][:, n:], -1.5)
    # He init: std sqrt(2 / n), per layer (the layer axis is not in the fan-in).
    np.testing.assert_allclose(np.std(p["W"]), np.sqrt(2 / n), rtol=0.05)
    assert not np.allclose(p["W"][0], p["W"][1])
    q = Highway(n, depth=2, coupled=False, init_bias=-3.0).init(jax.random.key(1))
    assert q["W"].shape == (2, n, 3 * n)
    np.testing.assert_array_equal(q["b"][:, n : 2 * n], -3.0)
    np.testing.assert_array_equal(q["b"][:, 2 * n :], 3.0)
    pl = Plain(n, depth=2).init(jax.random.key(2))
    assert pl["W"].shape == (2, n, n) and pl["b"].shape == (2, n)


@pytest.mark.parametrize("coupled", [True, False])
def test_minus_inf_t_bias_is_identity(coupled):
    n = 6
    x = jax.random.normal(jax.random.key(3), (4, n))
    hw = Highway(n, depth=4, init_bias=-jnp.inf, coupled=coupled)
    y, gates = hw.apply_with_gates(hw.init(jax.random.key(4)), x)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(gates, 0.0)
    # Same with random weights and only the T bias block set to -inf.
    p = random_params(5, 4, n, 2)
    p["b"][:, n:] = -np.inf
    np.testing.assert_array_equal(Highway(n, depth=4).apply(p, x), x)


@pytest.mark.parametrize("coupled", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_gradient_matches_finite_differences(coupled):
    n, depth, eps = 4, 3, 1e-6
    hw = Highway(n, depth=depth, activation=jnp.tanh, coupled=coupled)  # smooth, for FD
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        p = jax.tree.map(jnp.asarray, random_params(1, depth, n, 2 if coupled else 3))
        p = jax.tree.map(lambda a: a.astype(jnp.float64), p)
        x = jnp.asarray(rng.normal(size=(3, n)))
        r = jnp.asarray(rng.normal(size=(3, n)))
        loss = lambda p, x: jnp.sum(hw.apply(p, x) * r)
        grads = jax.grad(loss, argnums=(0, 1))(p, x)
        for _ in range(3):  # random directions in (params, x)
            v = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape)), (p, x))
            plus = jax.tree.map(lambda a, d: a + eps * d, (p, x), v)
            minus = jax.tree.map(lambda a, d: a - eps * d, (p, x), v)
            fd = (loss(*plus) - loss(*minus)) / (2 * eps)
            analytic = sum(
                jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(v))
            )
            np.testing.assert_allclose(analytic, fd, rtol=1e-6, atol=1e-8)
        assert all(jnp.all(jnp.isfinite(g)) and jnp.any(g != 0) for g in jax.tree.leaves(grads))


@pytest.mark.slow
def test_jit_and_depth_independent_program():
    n = 8
    x = jax.random.normal(jax.random.key(0), (5, n))
    for model in [Highway(n, depth=3), Plain(n, depth=3)]:
        p = model.init(jax.random.key(1))
        np.testing.assert_allclose(
            jax.jit(model.apply)(p, x), model.apply(p, x), rtol=1e-6, atol=1e-6
        )
        # The model itself as a static argument (hashable frozen dataclass).
        f = jax.jit(lambda m, p, x: m.apply(p, x), static_argnums=0)
        np.testing.assert_allclose(f(model, p, x), model.apply(p, x), rtol=1e-6, atol=1e-6)
    # The depth loop is a scan: the traced program has the same lines for any depth.
    lines = [
        str(jax.make_jaxpr(hw.apply)(hw.init(jax.random.key(0)), x)).count("\n")
        for hw in [Highway(n, depth=2), Highway(n, depth=20)]
    ]
    assert lines[0] == lines[1]


@pytest.mark.parametrize("cls", [Highway, Plain])
@pytest.mark.parametrize("kwargs", [dict(size=0), dict(size=-3), dict(size=4, depth=0)])
def test_invalid_arguments(cls, kwargs):
    with pytest.raises(ValueError):
        cls(**kwargs)
