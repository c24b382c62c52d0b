"""Episode resets inside the scan, ``unroll(..., resets=[T, B] bool)`` (issue 71): for
every registered cell under the reference scan and every fused scan it has, the
outputs, the final carry and every gradient (parameters, initial carry, inputs) equal
running each episode on its own from the initial carry (float64); with and without
``lengths``; the one-line refusals (a bad ``resets``, the pallas kernels)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.cells import base, gated_fused, rhn_fused, scan
from rhnzoo.cells.kernels import gated
from rhnzoo.cells.scan import ScanImpl

T, B, M, N = 7, 4, 3, 4
SETTINGS = dict(depth=2, init_scale=0.1, init_bias=-1.0, skip=2)
FLOAT64 = dict(rtol=1e-10, atol=1e-12)
LENGTHS = np.array([7, 5, 0, 3], np.int32)  # full, padded, empty, padded
# Episode starts: row 0 twice (one at step 0, a no-op), row 1 at its step 2 and on a
# padded step (ignored), row 2 (empty) on a padded step, row 3 at its last real step.
RESETS = np.zeros((T, B), bool)
RESETS[[0, 3, 4], 0] = True
RESETS[[2, 6], 1] = True
RESETS[1, 2] = True
RESETS[2, 3] = True


def build(name):
    return cells.make(name, N, **cells.applicable(name, SETTINGS))


def problem(cell, seed=0, dtype=jnp.float64):
    """float64 random (not initial) parameters and carry (an integer leaf, the SC-LSTM's
    step counter: a random phase), inputs, a dropout mask and a target, drawn by NumPy."""
    rng = np.random.default_rng(seed)
    like = lambda a, scale: jnp.asarray(rng.normal(size=a.shape) * scale, dtype)
    params = jax.tree.map(lambda a: like(a, 0.5), cell.init(jax.random.PRNGKey(0), M))

    def carry_leaf(a):
        if jnp.issubdtype(a.dtype, jnp.integer):
            return jnp.asarray(rng.integers(0, 5, a.shape), a.dtype)
        return like(a, 0.5)

    carry = jax.tree.map(carry_leaf, cell.initial_carry(B, dtype))
    xs = jnp.asarray(rng.normal(size=(T, B, M)), dtype)
    mask = jnp.asarray((rng.random((B, N)) < 0.8) / 0.8, dtype)
    return params, carry, xs, mask, jnp.asarray(rng.normal(size=(T, B, N)), dtype)


def episodes(resets, lengths):
    """``[(row, start, end)]``: each row's real steps cut at its resets; a row without
    real steps has one empty episode (its final carry is the initial one)."""
    lengths = np.full(resets.shape[1], resets.shape[0]) if lengths is None else lengths
    out = []
    for b, length in enumerate(lengths):
        starts = sorted({0} | {t for t in range(length) if resets[t, b]})
        ends = starts[1:] + [length]
        out += [(b, s, e) for s, e in zip(starts, ends)]
    return out


def by_episode(cell, resets, lengths, mask, params, carry, xs):
    """Each episode a row of its own (inputs from its start, its row of the initial
    carry and dropout mask), run by the reference scan with lengths; the outputs put
    back in place and each row's final carry its last episode's."""
    eps = episodes(resets, lengths)
    rows = np.array([b for b, _, _ in eps])
    starts = np.array([s for _, s, _ in eps])
    ep_len = np.array([e - s for _, s, e in eps], np.int32)
    src = np.minimum(starts[None, :] + np.arange(T)[:, None], T - 1)  # [T, E]
    xs_ep = xs[src, rows[None, :]]
    carry_ep = jax.tree.map(lambda a: a[rows], carry)
    carry_T, ys_ep = cells.unroll(cell, params, carry_ep, xs_ep, mask[rows], lengths=ep_len)
    owner = np.zeros((T, B), int)  # the episode that runs step t of row b
    for e, (b, s, end) in enumerate(eps):
        owner[s:end, b] = e
    offset = np.arange(T)[:, None] - starts[owner]
    real = np.arange(T)[:, None] < (np.full(B, T) if lengths is None else lengths)[None, :]
    ys = jnp.where(real[..., None], ys_ep[np.where(real, offset, 0), owner], 0.0)
    last = np.array([max(e for e, ep in enumerate(eps) if ep[0] == b) for b in range(B)])
    return jax.tree.map(lambda a: a[last], carry_T), ys


def loss(run, target, params, carry, xs):
    """Depends on every output and every float leaf of the final carry."""
    carry, ys = run(params, carry, xs)
    floats = [c for c in jax.tree.leaves(carry) if jnp.issubdtype(c.dtype, jnp.floating)]
    return jnp.sum(jnp.sin(ys) * target) + sum(jnp.sum(jnp.cos(c) * c) for c in floats)


def assert_trees_close(got, want, **tol):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if a.dtype == jax.dtypes.float0:  # the SC-LSTM step counter's "gradient"
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, **tol)


def cases():
    """(name, impl, padded) for every registered cell and each of its scans but pallas;
    in the fast tier each kind of scan once padded (reference: a step counter and a
    Parallel; gated fused: LSTM, Parallel; the RHN's and HSG(RHN)'s) and one unpadded."""
    fast = {
        ("sc_lstm_p", "reference", True),
        ("hsg_gru", "reference", True),
        ("lstm", "fused", True),
        ("hrl", "fused", True),
        ("sc_lstm_i", "fused", True),
        ("hsg_rhn", "fused", True),
        ("rhn", "fused", False),
        ("gru", "fused", False),
    }
    out = []
    for name in cells.ALL_NAMES:
        for impl in scan.implementations(build(name)):
            if impl is ScanImpl.PALLAS:
                continue
            for padded in (True, False):
                key = (name, str(impl), padded)
                marks = () if key in fast else pytest.mark.slow
                out.append(pytest.param(*key, marks=marks, id="-".join(map(str, key))))
    return out


@pytest.mark.parametrize("name,impl,padded", cases())
def test_resets_equal_running_each_episode_alone(name, impl, padded):
    """float64: outputs, final carry and the gradients of a loss on both by (params,
    initial carry, inputs) equal each episode run alone from the initial carry, with
    the recurrent dropout mask; resets on padded steps change nothing."""
    cell = build(name)
    lengths = LENGTHS if padded else None
    with jax.enable_x64(True):
        params, carry, xs, mask, target = problem(cell)
        run = functools.partial(
            scan.unroll, cell, mask=mask, impl=impl, lengths=lengths, resets=RESETS
        )
        want = functools.partial(by_episode, cell, RESETS, lengths, mask)
        assert_trees_close(jax.jit(run)(params, carry, xs), want(params, carry, xs), **FLOAT64)
        grad = jax.grad(loss, argnums=(2, 3, 4), allow_int=True)
        g_run = jax.jit(grad, static_argnums=0)(run, target, params, carry, xs)
        g_want = jax.jit(grad, static_argnums=0)(want, target, params, carry, xs)
        assert_trees_close(g_run, g_want, **FLOAT64)
        # ... not vacuously: the initial carry gets gradient from later episodes too
        d_carry = jax.tree.leaves(g_run[1])[0]
        assert float(jnp.abs(d_carry[0]).max()) > 0


def test_episodes_cover_what_the_test_assumes():
    eps = episodes(RESETS, LENGTHS)
    assert [e for e in eps if e[0] == 0] == [(0, 0, 3), (0, 3, 4), (0, 4, 7)]
    assert [e for e in eps if e[0] == 1] == [(1, 0, 2), (1, 2, 5)]  # step 6 is padding
    assert [e for e in eps if e[0] == 2] == [(2, 0, 0)]
    assert [e for e in eps if e[0] == 3] == [(3, 0, 2), (3, 2, 3)]


def test_no_resets_is_the_plain_unroll_and_all_false_changes_nothing():
    """All-False resets give the unroll without them, bit for bit in the reference scan."""
    cell = build("lstm")
    params, carry, xs, mask, _ = problem(cell, dtype=jnp.float32)
    none = np.zeros((T, B), bool)
    for impl in ("reference", "fused"):
        got = scan.unroll(cell, params, carry, xs, mask, impl=impl, resets=none)
        want = scan.unroll(cell, params, carry, xs, mask, impl=impl)
        tol = dict(rtol=0, atol=0) if impl == "reference" else dict(rtol=1e-6, atol=1e-6)
        assert_trees_close(got, want, **tol)


def test_reset_before_step_in_your_own_scan():
    """The public wrapper, in a user's own ``lax.scan``: the reference unroll's result."""
    cell = build("gru")
    with jax.enable_x64(True):
        params, carry, xs, _, _ = problem(cell)
        step = base.reset_before_step(functools.partial(cell.step, params), carry)
        got = jax.lax.scan(step, carry, (cell.project_inputs(params, xs), RESETS))
        want = cells.unroll(cell, params, carry, xs, resets=RESETS)
        assert_trees_close(got, want, rtol=0, atol=0)


BAD = [
    (np.zeros((T, B), np.int32), "dtype int32"),
    (np.zeros((T, B + 1), bool), r"shape \[7, 5\]"),
    (np.zeros((B, T), bool), r"shape \[4, 7\]"),
    (np.zeros((T,), bool), r"shape \[7\]"),
]


@pytest.mark.parametrize("resets,why", BAD, ids=["int", "wide", "transposed", "1d"])
def test_a_bad_resets_is_one_line(resets, why):
    """Every entry point (the dispatcher with each scan, the cells' unroll, the fused
    scans' own) refuses a ``resets`` that is not ``[T, B]`` bool, with one line."""
    calls = [
        lambda c, p, k, x: scan.unroll(c, p, k, x, impl="reference", resets=resets),
        lambda c, p, k, x: scan.unroll(c, p, k, x, impl="fused", resets=resets),
        lambda c, p, k, x: cells.unroll(c, p, k, x, resets=resets),
    ]
    for name, own in (("lstm", gated_fused.unroll), ("rhn", rhn_fused.unroll)):
        cell = build(name)
        params = cell.init(jax.random.PRNGKey(0), M)
        carry, xs = cell.initial_carry(B), jnp.zeros((T, B, M))
        for call in calls + [lambda c, p, k, x, own=own: own(c, p, k, x, None, resets=resets)]:
            with pytest.raises(ValueError, match=r"resets must be a \[T, B\] = \[7, 4\] bool") as e:
                call(cell, params, carry, xs)
            assert why.replace("\\", "") in str(e.value) and "\n" not in str(e.value)


def test_pallas_refuses_resets_and_auto_steps_around_it(monkeypatch):
    """``impl='pallas'`` with resets: one line naming the cell. ``auto``, where it would
    pick the kernel, runs the fused scan instead (forced here: the CPU never picks it)."""
    cell = build("lstm")
    params = cell.init(jax.random.PRNGKey(0), M)
    carry, xs = cell.initial_carry(B), jnp.zeros((T, B, M))
    resets = np.zeros((T, B), bool)
    with pytest.raises(ValueError, match="pallas kernels of LSTM have no resets") as e:
        scan.unroll(cell, params, carry, xs, impl="pallas", resets=resets)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(gated, "fits", lambda *a, **k: True)  # the CPU never picks it
    assert scan.resolve("auto", cell, batch=B) is ScanImpl.PALLAS
    assert scan.resolve("auto", cell, batch=B, resets=True) is ScanImpl.FUSED
    got = scan.unroll(cell, params, carry, xs, resets=resets)
    want = scan.unroll(cell, params, carry, xs, impl="fused")
    assert_trees_close(got, want, rtol=0, atol=0)
