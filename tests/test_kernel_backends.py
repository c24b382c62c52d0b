"""The kernel package's backend protocol and common part (rhnzoo.cells.kernels, issue 59):
every backend of ``BACKENDS`` has the protocol's signature, each cell has at most one
backend, ``Options`` is validated once, and the persistent kernels' padding and
weight-gradient epilogue compute what their docstrings say. (The kernels' values and
gradients: test_gated_pallas.py, test_chained_pallas.py, test_rhn_pallas.py,
test_swap_ab.py.)"""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.cells import kernels, scan
from rhnzoo.cells.kernels import chained, gated, persistent, rhn


def test_every_backend_has_the_protocols_signature():
    assert kernels.BACKENDS == (gated, chained, rhn)
    for backend in kernels.BACKENDS:
        unroll = inspect.signature(backend.unroll).parameters
        assert list(unroll)[:6] == ["cell", "params", "carry", "xs", "mask", "opts"]
        assert unroll["lengths"].kind is inspect.Parameter.KEYWORD_ONLY
        assert unroll["lengths"].default is None
        assert unroll["resets"].kind is inspect.Parameter.KEYWORD_ONLY
        assert unroll["opts"].default == kernels.Options()
        fits = inspect.signature(backend.fits).parameters
        assert list(fits)[:4] == ["cell", "batch", "dtype", "backend"]
        assert fits["input_size"].kind is inspect.Parameter.KEYWORD_ONLY
        assert list(inspect.signature(backend.supports).parameters) == ["cell"]


CELLS = {
    "lstm": (cells.LSTM(8), gated),
    "sc_lstm": (cells.SCLSTM(8, skip=2), gated),
    "gru_reset_after": (cells.GRU(8, reset_after=True), gated),
    "gru_cho": (cells.GRU(8), chained),
    "rrn": (cells.RRN(8, depth=2), chained),
    "rhn": (cells.RHN(8, 3), rhn),
    "hsg_rhn": (cells.HSG(cells.RHN(8, 3)), rhn),
    "rhn_uncoupled": (cells.RHN(8, 3, coupled=False), None),
    "dtrnn": (cells.DTRNN(8), None),
    "lstm_129": (cells.LSTM(129), None),
    "hrl": (cells.Parallel((cells.LSTM(8), cells.RRN(8, depth=2))), None),
}


@pytest.mark.parametrize("name", list(CELLS))
def test_backend_of_finds_the_one_backend_of_a_cell(name):
    cell, want = CELLS[name]
    assert kernels.backend_of(cell) is want
    assert sum(b.supports(cell) for b in kernels.BACKENDS) == (want is not None)
    # the dispatcher's pallas_supports: a backend, or a Parallel whose parts all have one
    assert scan.pallas_supports(cell) == (want is not None or name == "hrl")


def test_options_are_validated_once():
    """One record for every scan backend (rhnzoo.cells.scan_options, re-exported here):
    dtype None by default (each backend's own; the kernels' bfloat16), any name of a JAX
    dtype taken as one; the kernels refuse any dtype but bfloat16 before building one."""
    from rhnzoo.cells import scan_options

    assert kernels.Options is scan_options.Options is kernels.common.Options
    opts = kernels.Options()
    assert opts.dtype is None and opts.outputs == "all" and opts.interpret is None
    bf16 = kernels.Options(dtype="bfloat16")
    assert bf16 == kernels.Options(dtype=jnp.bfloat16) and bf16.dtype == jnp.dtype(jnp.bfloat16)
    coerced = kernels.Options(outputs=0, interpret=1)
    assert coerced.outputs == "none" and coerced.interpret is True
    assert kernels.Options(outputs=True).outputs == "all"
    # Before: any JAX dtype passed (int32 gave all-zero outputs, bool garbage, float16 was
    # ignored by the reference scan); the record takes the three it documents.
    for bad in ("no such dtype", "int32", "bool", "float16", jnp.float64):
        with pytest.raises(ValueError, match="dtype must be None, float32 or bfloat16"):
            kernels.Options(dtype=bad)
    cell, B, m = cells.LSTM(8), 3, 2
    params, xs = cell.init(jax.random.PRNGKey(0), m), jnp.ones((2, B, m))
    with pytest.raises(ValueError, match="the Pallas kernels compute in bfloat16"):
        gated.unroll(cell, params, cell.initial_carry(B), xs, None, kernels.Options(jnp.float32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.outputs = "none"
    assert opts.interpreted() == (jax.default_backend() == "cpu")
    assert kernels.Options(interpret=False).interpreted() is False


def test_batch_tile_is_none_or_a_swap_ab_tile():
    """``batch_tile`` (the LSTM's swap-AB forward): None by default, 16, 32 or 64 as an
    int (a NumPy integer taken as one); anything else a ValueError naming the tiles."""
    assert kernels.Options().batch_tile is None
    for bt in (16, 32, 64):
        assert kernels.Options(batch_tile=bt).batch_tile == bt
    tile = kernels.Options(batch_tile=np.int64(32)).batch_tile
    assert tile == 32 and type(tile) is int
    for bad in (0, 8, 48, 128, -16, 16.0, "16", True):
        with pytest.raises(ValueError, match=r"batch_tile must be None or one of \(16, 32, 64\)"):
            kernels.Options(batch_tile=bad)


def test_padding_of_the_persistent_kernels():
    pad = persistent.Padding(T=3, B=65, n=100, m=17)
    assert (pad.N, pad.MP, pad.Bp) == (128, 32, 128)
    assert persistent.padded(64, 16) == (64, 16) and persistent.padded(65, 1) == (128, 16)
    a = jnp.arange(65 * 100, dtype=jnp.float32).reshape(65, 100)
    rows = pad.rows(a, jnp.bfloat16)
    assert rows.shape == (128, 128) and rows.dtype == jnp.bfloat16
    np.testing.assert_array_equal(rows[:65, :100], a.astype(jnp.bfloat16))
    assert not rows[65:].any() and not rows[:, 100:].any()
    assert pad.rows(None) is None
    valid = persistent.valid_steps(3, jnp.asarray([3] + [1] * 64))
    assert valid.shape == (3, 65, 1) and bool(valid[2, 0, 0]) and not bool(valid[2, 1, 0])
    dys = jnp.ones((3, 65, 100))
    dy = pad.cotangent(dys, valid, outputs=True)
    assert dy.shape == (3, 128, 128) and dy.dtype == jnp.float32
    assert float(dy.sum()) == 100 * (3 + 64)  # zero on padded steps, rows and units
    assert pad.cotangent(dys, valid, outputs=False) is None
    assert pad.cotangent(None, valid, outputs=True) is None


def _mm(spec, a, b):
    return np.einsum(spec, *(np.asarray(x.astype(jnp.bfloat16), np.float64) for x in (a, b)))


def test_weight_gradients_are_the_matmuls_over_all_positions():
    """dW = x^T dz, dU = src^T dz_u, db = sum dz, dxs = dz W^T (bfloat16 inputs, float32
    accumulation): one source for all blocks, or one per block."""
    T, B, m, n, K = 3, 5, 4, 6, 2
    k = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    xs, W = jax.random.normal(next(k), (T, B, m)), jax.random.normal(next(k), (m, K * n))
    dZ, dZ_u = jax.random.normal(next(k), (T, B, K * n)), jax.random.normal(next(k), (T, B, K * n))
    src = jax.random.normal(next(k), (T, B, n))
    dW, dU, db, dxs = persistent.weight_gradients(xs, W, dZ, src, dZ_u)
    for got, want in (
        (dW, _mm("tbm,tbk->mk", xs, dZ)),
        (dU, _mm("tbn,tbk->nk", src, dZ_u)),
        (dxs, _mm("tbk,mk->tbm", dZ, W)),
        (db, np.asarray(dZ, np.float64).sum(axis=(0, 1))),
    ):
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    srcs = [src, jax.random.normal(next(k), (T, B, n))]
    blocks = [dZ_u[..., :n], dZ_u[..., n:]]
    _, dU, _, _ = persistent.weight_gradients(xs, W, dZ, srcs, blocks)
    want = np.concatenate([_mm("tbn,tbk->nk", s, d) for s, d in zip(srcs, blocks)], axis=-1)
    np.testing.assert_allclose(dU, want, rtol=1e-5, atol=1e-5)
    dh0 = persistent.initial_cotangent(
        jnp.ones((B, n)),
        2 * jnp.ones((B, n)),
        jnp.full((T, B, n), 7.0),
        persistent.valid_steps(T, jnp.asarray([1, 0, 2, 0, 3])),
        direct=jnp.full((B, n), 0.5),
    )
    np.testing.assert_array_equal(dh0[:, 0], [2.5, 7.0, 2.5, 7.0, 2.5])


def test_only_the_rhn_has_an_xla_backward():
    """``kernel_backward=False`` (the RHN's fused XLA backward): coerced to a bool; the
    persistent kernels, whose backward is a kernel only, refuse it before running one."""
    assert kernels.Options().kernel_backward is True
    assert kernels.Options(kernel_backward=0).kernel_backward is False
    opts = kernels.Options(kernel_backward=False)
    B, m = 3, 2
    xs = jnp.ones((2, B, m))
    for cell in (cells.LSTM(8), cells.GRU(8, reset_after=True), cells.RRN(8, depth=2)):
        params = cell.init(jax.random.PRNGKey(0), m)
        with pytest.raises(ValueError, match="kernel_backward=False: the persistent kernels"):
            kernels.backend_of(cell).unroll(cell, params, cell.initial_carry(B), xs, None, opts)
