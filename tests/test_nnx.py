"""Tests for rhnzoo.nnx, the Flax NNX adapter around the functional cells."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import normal
from flax import nnx

from rhnzoo import cells
from rhnzoo.nnx import Recurrent

T, B, M, N = 5, 3, 4, 6
CELLS = {
    "rhn3": cells.RHN(N, depth=3),
    "hsg_rhn2": cells.HSG(cells.RHN(N, depth=2)),
}
# The numerical tests' fast tier: HSG(RHN) (an RHN inside); the bare RHN in CI.
SAMPLED = [pytest.param("rhn3", marks=pytest.mark.slow), "hsg_rhn2"]


def random_params(cell, seed):
    """Params of the right structure but random values, independent of cell.init."""
    like = jax.eval_shape(lambda: cell.init(jax.random.key(0), M))
    leaves, treedef = jax.tree.flatten(like)
    rng = np.random.default_rng(seed)
    return treedef.unflatten(
        [jnp.asarray(rng.normal(0, 0.5, l.shape), jnp.float32) for l in leaves]
    )


def xs_data(seed=0):
    return normal(jax.random.key(seed), (T, B, M))


@pytest.mark.parametrize("name", SAMPLED)
def test_matches_functional_unroll(name):
    cell = CELLS[name]
    rnn = Recurrent(cell, M, rngs=nnx.Rngs(0))
    # Initialisation: exactly cell.init with the key that nnx.Rngs(0).params() yields.
    expected = cell.init(nnx.Rngs(0).params(), M)
    jax.tree.map(np.testing.assert_array_equal, rnn.cell_params(), expected)

    xs = xs_data()
    mask = jax.random.bernoulli(jax.random.key(1), 0.7, (B, N)) / 0.7
    carry0 = normal(jax.random.key(2), (B, N))
    for carry, m in [(None, None), (carry0, mask)]:
        c_ref = cell.initial_carry(B) if carry is None else carry
        want = cells.unroll(cell, expected, c_ref, xs, m)
        got = rnn(xs, carry, m)
        jax.tree.map(np.testing.assert_array_equal, got, want)
        jitted = nnx.jit(lambda model, xs, c, m: model(xs, c, m))(rnn, xs, carry, m)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), jitted, want
        )

    # Wrapping existing (random, not cell.init) params gives the functional outputs too.
    p = random_params(cell, 3)
    want = cells.unroll(cell, p, cell.initial_carry(B), xs)
    jax.tree.map(np.testing.assert_array_equal, Recurrent(cell, M, params=p)(xs), want)
    rnn.set_cell_params(p)
    jax.tree.map(np.testing.assert_array_equal, rnn(xs), want)


@pytest.mark.parametrize("name", CELLS)
def test_split_merge_and_state_paths(name):
    cell = CELLS[name]
    p = random_params(cell, 4)
    rnn = Recurrent(cell, M, params=p)
    graphdef, state = nnx.split(rnn)
    # One Param per functional leaf, at the same path under 'params'.
    want_paths = {tuple(k.key for k in path) for path, _ in jax.tree.flatten_with_path(p)[0]}
    got = nnx.to_flat_state(nnx.state(rnn, nnx.Param))
    assert {path[1:] for path, _ in got} == want_paths
    assert all(path[0] == "params" for path, _ in got)
    merged = nnx.merge(graphdef, state)
    assert merged.cell == cell
    xs = xs_data(5)
    jax.tree.map(np.testing.assert_array_equal, merged(xs), rnn(xs))


@pytest.mark.parametrize("name", SAMPLED)
def test_grads_match_functional_and_are_nonzero(name):
    cell = CELLS[name]
    rnn = Recurrent(cell, M, rngs=nnx.Rngs(7))
    xs, target = xs_data(8), normal(jax.random.key(9), (T, B, N))
    loss_fn = lambda ys: jnp.mean((ys - target) ** 2)
    grads = nnx.grad(lambda model: loss_fn(model(xs)[1]))(rnn)
    grads = nnx.to_pure_dict(grads)["params"]
    want = jax.grad(lambda p: loss_fn(cells.unroll(cell, p, cell.initial_carry(B), xs)[1]))(
        rnn.cell_params()
    )
    assert jax.tree.structure(grads) == jax.tree.structure(want)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), grads, want)
    for path, g in jax.tree.flatten_with_path(grads)[0]:
        assert np.all(np.isfinite(g)), path
        # Every leaf, and every layer of stacked leaves, receives gradient.
        assert np.all(np.abs(np.asarray(g)).reshape(g.shape[0], -1).max(axis=1) > 0), path


class Model(nnx.Module):
    def __init__(self, cell, rngs):
        self.rnn = Recurrent(cell, M, rngs=rngs)
        self.head = nnx.Linear(N, 1, rngs=rngs)

    def __call__(self, xs):
        return self.head(self.rnn(xs)[1])


@pytest.mark.parametrize("name", SAMPLED)
def test_trains_with_nnx_optimizer(name):
    model = Model(CELLS[name], nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    xs = normal(jax.random.key(1), (T, 16, M))
    target = jnp.cumsum(xs[..., :1], axis=0) / jnp.sqrt(jnp.arange(1, T + 1))[:, None, None]

    @nnx.jit
    def train_step(model, optimizer, xs, target):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(xs) - target) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    before = jax.tree.map(jnp.copy, model.rnn.cell_params())
    losses = [float(train_step(model, optimizer, xs, target)) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses
    # The optimizer updated the cell's own params, not only the head.
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(model.rnn.cell_params())):
        assert not np.allclose(a, b)


def test_errors():
    with pytest.raises(ValueError):
        Recurrent(cells.RHN(N), M)  # neither rngs nor params
    rnn = Recurrent(cells.RHN(N), M, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError):
        rnn.set_cell_params({"W": jnp.zeros((M, 2 * N))})
    with pytest.raises(ValueError, match=r"\[T, B, m\] with m = 4, got shape \(5, 3, 6\)"):
        rnn(jnp.zeros((T, B, N)))  # the wrong input width
    with pytest.raises(ValueError, match="got shape"):
        rnn(jnp.zeros((T * B, M)))  # no batch axis


def test_batch_major_module_is_the_time_major_one_transposed():
    """``time_major=False`` takes and gives ``[B, T, ...]`` (Flax ``nnx.RNN``'s default
    layout): the same numbers as the time-major module on the transposed input."""
    cell = CELLS["rhn3"]
    xs = xs_data()
    tm = Recurrent(cell, M, rngs=nnx.Rngs(0))
    bm = Recurrent(cell, M, rngs=nnx.Rngs(0), time_major=False)
    carry_tm, ys_tm = tm(xs)
    carry_bm, ys_bm = bm(jnp.swapaxes(xs, 0, 1))
    assert ys_bm.shape == (B, T, N)
    np.testing.assert_array_equal(ys_bm, jnp.swapaxes(ys_tm, 0, 1))
    jax.tree.map(np.testing.assert_array_equal, carry_bm, carry_tm)
