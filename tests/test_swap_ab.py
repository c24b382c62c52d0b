"""The swap-AB persistent LSTM forward kernel (rhnzoo.cells.kernels.swap_ab) against the
reference scan (lax.scan, float32) and the fused scan in bfloat16: outputs y at hidden
sizes 64 and 128 (and padded ones), batch tiles 16 and 32 (and 64), with lengths, a
recurrent dropout mask and odd batches; the kernel lowered for ``cuda`` at each batch
tile; its registers and spills counted by ptxas on the CPU (tests/kernel_registers.py);
its size checks and bad input refused. And the LSTM's unroll with
``Options(batch_tile=Bt)`` (rhnzoo.cells.kernels.gated: this forward, the persistent
backward): the loss and every gradient against the reference scan, its train step
lowered for ``cuda``, a batch tile refused by the cells it does not run.

On the CPU the kernel runs in Pallas's GPU interpret mode, every run under a timeout
(the interpreter hangs, rather than fails, on a barrier never completed); on a GPU
backend (measure.sh's ``pallas`` part) the same tests run it compiled."""

import jax
import jax.numpy as jnp
import kernel_registers as kr
import numpy as np
import pytest
from helpers import as_jax, dropout_mask, filled, normal, random_params, shapes
from pallas_checks import (
    assert_close,
    assert_matches_reference,
    assert_no_races,
    deadline,
    kernel_reference_fused,
    lower_for_cuda,
    lower_stacked_for_cuda,
    value_and_grads,
)

from rhnzoo import cells
from rhnzoo.cells import gated_fused
from rhnzoo.cells.kernels import Options, chained, common, gated, persistent, swap_ab

pytestmark = pytest.mark.pallas
INTERPRET = jax.default_backend() == "cpu"  # the kernel's GPU interpret mode on the CPU


def setup(n, B, m, T, masked, seed=0):
    """The LSTM's random (not initial) parameters, carry and inputs, and a dropout mask
    (keep 0.75, scaled by 1 / 0.75) or None: NumPy draws (nothing compiled), the
    parameters' shapes from ``jax.eval_shape`` of the cell's init."""
    rng = np.random.default_rng(seed)
    cell = cells.LSTM(n)
    params = random_params(shapes(cell.init, m), rng, scale=0.3)
    h0, c0 = normal(rng, (B, n), scale=0.5), normal(rng, (B, n), scale=0.5)
    xs = normal(rng, (T, B, m))
    mask = dropout_mask(rng, (B, n), 0.75) if masked else None
    return cell, params, h0, c0, xs, mask


CASES = {
    # name: (n, B, m, T, batch tile, lengths, dropout mask)
    "n64_bt16_odd_batch_lengths_masked": (64, 5, 3, 5, 16, [5, 0, 2, 4, 1], True),
    "n128_bt32_two_ctas_lengths_masked": (128, 37, 3, 4, 32, [4, 1, 0] * 12 + [3], True),
    "n128_bt16_three_ctas": (128, 35, 2, 3, 16, None, False),
    "n64_bt32_odd_batch": (64, 7, 5, 4, 32, None, False),
    "n100_bt16_pmnist_like_lengths": (100, 19, 1, 4, 16, [4, 3] * 9 + [2], False),
    "n5_bt32_padded_units_masked": (5, 3, 3, 4, 32, [4, 0, 2], True),
    "n64_bt64_masked": (64, 9, 3, 3, 64, [3, 1, 2] * 3, True),
    "n128_bt64_two_ctas_masked": (128, 70, 16, 3, 64, [3, 1, 2, 0, 3] * 14, True),
    "n64_bt16_wide_input": (64, 6, 40, 3, 16, None, False),  # m -> 64: a 128-byte swizzle
    "n5_bt16_long_sequence": (5, 4, 2, 33, 16, [33, 17, 1, 32], True),  # x_t's buffers cycle
}


@pytest.mark.parametrize("case", CASES)
def test_outputs_match_the_reference(case):
    """y of every step agrees with the reference scan to bfloat16 rounding, and with the
    fused scan in bfloat16 (the same rounding points: x, W, h m and U rounded to
    bfloat16, float32 accumulation) more tightly; padded steps output zeros. (The
    reference and the fused scan: one jit-compiled program.)"""
    n, B, m, T, bt, lengths, masked = CASES[case]
    cell, params, h0, c0, xs, mask = setup(n, B, m, T, masked)
    # pre-activations of the same size at any input width (scaled on the host)
    xs = as_jax(np.asarray(xs) * np.float32(min(1.0, (3 / m) ** 0.5)))
    lens = None if lengths is None else as_jax(lengths, jnp.int32)

    with deadline(300):  # the kernel eagerly (see pallas_checks.py), under a deadline
        y = swap_ab.lstm_forward(
            xs,
            params["W"],
            params["U"],
            params["b"],
            h0,
            c0,
            lens,
            mask,
            bt=bt,
            interpret=INTERPRET,
        )
        y = jax.block_until_ready(y)

    @jax.jit
    def reference_and_fused(params, h0, c0, xs):
        carry = cells.LSTMState(h0, c0)
        _, ref = cells.unroll(cell, params, carry, xs, mask, lengths=lens)
        # The projection before the scan: x W with bfloat16 inputs at m = 1 too, as the
        # kernel's (per step, the fused scan takes a 1-wide input's outer product in float32).
        opts = Options(dtype=jnp.bfloat16, project_per_step=False)
        _, fused = gated_fused.unroll(cell, params, carry, xs, mask, opts, lengths=lens)
        return ref, fused

    ref, fused = reference_and_fused(params, h0, c0, xs)
    assert y.shape == (T, B, n) and y.dtype == jnp.float32
    assert_close(y, ref, rtol=1.5e-2)
    assert_close(y, fused, rtol=2e-3)
    if lens is not None:
        padded = np.arange(T)[:, None] >= np.asarray(lens)[None, :]
        assert padded.any()
        np.testing.assert_array_equal(np.asarray(y)[padded], 0.0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the race detector is the interpreter's")
@pytest.mark.parametrize("n, bt", [(100, 16), pytest.param(64, 32, marks=pytest.mark.slow)])
def test_no_races_between_threads_tma_and_tensor_cores(monkeypatch, capfd, n, bt):
    """The interpreter's race detector watches every shared-memory access of the kernel
    (the warpgroups' loads and stores of h^T and the output tile, x_t's TMA refills, the
    wgmma operands) over two CTAs and four steps, with lengths and the mask: none may
    race."""
    B, T = bt + 3, 4
    _, params, h0, c0, xs, mask = setup(n, B, 3, T, True)
    lens = as_jax(np.arange(B) % (T + 1), jnp.int32)
    assert_no_races(
        monkeypatch,
        capfd,
        lambda: swap_ab.lstm_forward(
            xs, params["W"], params["U"], params["b"], h0, c0, lens, mask, bt=bt, interpret=True
        ),
    )


def lowered(n, bt, masked, B=100, m=1, T=8):
    """The compiled (not interpreted) kernel at P-MNIST's batch and input width, lowered
    for ``cuda``."""
    z = jax.ShapeDtypeStruct
    f32 = jnp.float32
    args = (z((T, B, m), f32), z((m, 4 * n), f32), z((n, 4 * n), f32), z((4 * n,), f32))
    args += (z((B, n), f32), z((B, n), f32), z((B,), jnp.int32), z((B, n), f32) if masked else None)

    def forward(xs, W, U, b, h0, c0, lens, mask):
        return swap_ab.lstm_forward(xs, W, U, b, h0, c0, lens, mask, bt=bt, interpret=False)

    return lower_for_cuda(forward, *args)


@pytest.mark.parametrize("bt", swap_ab.BATCH_TILES)
def test_lowers_for_an_h100(bt):
    """The kernel at P-MNIST's shape (n = 100, padded to 128: two warpgroups), with and
    without a mask, lowers for ``cuda`` (an sm_90 device's shared memory, TMA boxes and
    wgmma layouts) at each batch tile: at Bt < 64 because U^T's blocks take h^T's 32- or
    64-byte swizzle (with a 128-byte one, JAX 0.11.2's layout inference fails)."""
    assert swap_ab.fits(100, 1, bt)
    for masked in (False, True):
        assert "mosaic_gpu" in lowered(100, bt, masked).as_text()


def stacked_seeds(n, B, m, T):
    """Two seeds' parameters, carries and masks stacked (``a``, ``0.8 a``, float32, in
    NumPy) and one seed's inputs."""
    _, params, h0, c0, xs, mask = setup(n, B, m, T, True)
    stack = lambda a: as_jax(np.stack([np.asarray(a), np.float32(0.8) * np.asarray(a)]))
    return jax.tree.map(stack, (params, h0, c0, mask)), xs


def seed_forward(xs, lens, bt, interpret):
    """``(params, h0, c0, mask) -> y`` of one seed."""
    return lambda p, h, c, mask: swap_ab.lstm_forward(
        xs, p["W"], p["U"], p["b"], h, c, lens, mask, bt=bt, interpret=interpret
    )


def test_stacked_seeds_one_at_a_time():
    """Under ``jax.vmap`` over two seeds' weights, carries and masks, wrapped in
    :func:`~rhnzoo.cells.kernels.persistent.one_at_a_time` (the docstring's advice): each
    seed's own y, bit for bit; and at n = 100 (two warpgroups) the mapped kernel lowers
    for ``cuda``, where unwrapped it does not (a sixth TMA dimension)."""
    seeds, xs = stacked_seeds(8, 5, 3, 3)
    lens = as_jax(np.asarray([3, 0, 2, 1, 3], np.int32))
    one = persistent.one_at_a_time(seed_forward(xs, lens, 16, INTERPRET))
    with deadline(300):
        got = jax.vmap(one)(*seeds)
        for k in range(2):
            want = one(*jax.tree.map(lambda a, k=k: as_jax(np.asarray(a)[k]), seeds))
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want))
    seeds, xs = stacked_seeds(100, 40, 1, 3)
    forward = seed_forward(xs, as_jax(np.full((40,), 3, np.int32)), 16, False)
    stacked = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), seeds)
    mapped = lower_for_cuda(jax.vmap(persistent.one_at_a_time(forward)), *stacked)
    assert "mosaic_gpu" in mapped.as_text()
    with pytest.raises(ValueError, match="striding up to 5 dimensions"):
        lower_for_cuda(jax.vmap(forward), *stacked)


def mosaic_module(lowering) -> bytes:
    """The serialised Mosaic GPU module of the lowered kernel (its one ``mosaic_gpu_v2``
    custom call), for :func:`kernel_registers.ptxas_counts`."""
    ((_, module),) = kr.mosaic_modules(lowering)
    return module


def test_compiles_for_an_h100_without_spills(record_property):
    """At P-MNIST's shape (n = 100, padded to 128: two warpgroups), with the mask, the
    kernel compiled for sm_90a by the CUDA plugin's pipeline and ptxas on this host
    (tests/kernel_registers.py) at Bt 16 and 32: zero spill bytes, at most 255 registers
    a thread (the counts: docs/runs/kernels/swap_ab_forward.md; at Bt = 64 it spills)."""
    why = kr.missing_tools()
    if why:
        pytest.skip(why)
    modules = {f"bt{bt}": mosaic_module(lowered(100, bt, True)) for bt in (16, 32)}
    for name, (counts, log) in kr.ptxas_counts(modules).items():
        record_property(f"{name}_registers", counts.registers)
        print(f"{name} ({kr.ARCH}, {kr.ptxas_version()}): {counts}")
        assert counts.registers <= 255
        assert (counts.spill_stores, counts.spill_loads) == (0, 0), log


def test_fits_one_ctas_shared_memory():
    """:func:`fits` takes n <= 128 and Bt 16, 32, 64 where the buffers fit an H100 CTA:
    at n = 128 (U^T alone 128 KiB) Bt = 64 with m <= 16 (not 32), Bt = 32 with m <= 32
    (not 64: W^T [4 x 128, 64])."""
    for bt in swap_ab.BATCH_TILES:
        assert swap_ab.fits(128, 1, bt) and swap_ab.fits(64, 100, bt)
        assert swap_ab.smem_bytes(128, 16, bt) + 1024 <= common.SMEM_LIMIT
    assert swap_ab.fits(128, 32, 32) and not swap_ab.fits(128, 33, 32)
    assert not swap_ab.fits(128, 17, 64)
    assert swap_ab.smem_bytes(128, 17, 64) + 1024 > common.SMEM_LIMIT
    assert not swap_ab.fits(129, 1, 16)
    assert not swap_ab.fits(64, 1, 8)
    assert not swap_ab.fits(64, 1, 48)
    # U^T's bfloat16 blocks alone: 4 gates x 128 x 128 units
    assert swap_ab.smem_bytes(128, 1, 16) > 4 * 128 * 128 * 2
    assert swap_ab.padded(100, 1) == (128, 16)
    assert swap_ab.padded(5, 20) == (64, 32)
    assert swap_ab.padded(64, 65) == (64, 128)


def test_bad_input_is_refused():
    """Shapes that are not an LSTM's, a batch tile other than 16, 32 or 64 and a hidden
    size over 128 raise ValueError naming the problem. (The bad arrays made on the host.)"""
    _, params, h0, c0, xs, _ = setup(8, 3, 2, 2, False)
    W, U, b = params["W"], params["U"], params["b"]
    call = lambda *a, bt=16: swap_ab.lstm_forward(*a, bt=bt, interpret=True)
    ones = lambda shape, dtype=jnp.float32: as_jax(np.ones(shape), dtype)
    with pytest.raises(ValueError, match="xs must be"):
        call(as_jax(np.asarray(xs)[0]), W, U, b, h0, c0, None, None)
    with pytest.raises(ValueError, match=r"W \(3, 32\)"):
        call(xs, ones((3, 32)), U, b, h0, c0, None, None)
    with pytest.raises(ValueError, match="h0"):
        call(xs, W, U, b, as_jax(np.asarray(h0)[:2]), c0, None, None)
    with pytest.raises(ValueError, match="lens"):
        call(xs, W, U, b, h0, c0, ones((4,), jnp.int32), None)
    with pytest.raises(ValueError, match="mask"):
        call(xs, W, U, b, h0, c0, None, ones((3, 9)))
    with pytest.raises(ValueError, match="bt=8"):
        call(xs, W, U, b, h0, c0, None, None, bt=8)
    _, big, h, c, x, _ = setup(130, 3, 2, 2, False)
    with pytest.raises(ValueError, match="n=130"):
        call(x, big["W"], big["U"], big["b"], h, c, None, None)


def test_empty_sequence_or_batch():
    """T = 0 or B = 0: an empty float32 y of shape [T, B, n], no kernel launched."""
    _, params, h0, c0, xs, _ = setup(8, 3, 2, 2, False)
    W, U, b = params["W"], params["U"], params["b"]
    xs, h0, c0 = np.asarray(xs), np.asarray(h0), np.asarray(c0)  # sliced on the host
    y = swap_ab.lstm_forward(
        as_jax(xs[:0]), W, U, b, as_jax(h0), as_jax(c0), None, None, bt=16, interpret=True
    )
    assert y.shape == (0, 3, 8) and y.dtype == jnp.float32
    empty = [as_jax(a) for a in (xs[:, :0], h0[:0], c0[:0])]
    y = swap_ab.lstm_forward(empty[0], W, U, b, *empty[1:], None, None, bt=32, interpret=True)
    assert y.shape == (2, 0, 8) and y.dtype == jnp.float32


# ------------------------------------------- the LSTM's unroll with Options(batch_tile=Bt)

UNROLL_CASES = {
    # name: (n, B, m, T, batch tile, lengths, dropout mask, outputs)
    "n5_bt16_odd_batch_lengths_masked": (5, 5, 3, 5, 16, [5, 0, 2, 4, 1], True, True),
    "n100_bt32_two_ctas_lengths_masked": (100, 37, 1, 4, 32, [4, 1, 0] * 12 + [3], True, True),
    "n64_bt64_lengths_no_outputs": (64, 9, 3, 3, 64, [3, 1, 2] * 3, False, False),
}
FAST_UNROLL = {"n5_bt16_odd_batch_lengths_masked"}  # the rest: slow to interpret


@pytest.fixture
def forward_kernels(monkeypatch):
    """``{'swap_ab': k, 'persistent': k}``: how often the LSTM's unroll called each
    forward kernel's wrapper (:func:`swap_ab.lstm_forward`, :func:`persistent.forward`)."""
    calls = {"swap_ab": 0, "persistent": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(swap_ab, "lstm_forward", counted("swap_ab", swap_ab.lstm_forward))
    monkeypatch.setattr(persistent, "forward", counted("persistent", persistent.forward))
    return calls


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=() if c in FAST_UNROLL else pytest.mark.slow) for c in UNROLL_CASES],
)
def test_lstm_unroll_with_a_batch_tile_matches_the_reference(case, forward_kernels):
    """``gated.unroll`` with ``Options(batch_tile=Bt)`` runs this forward (not the 64-row
    one) and the persistent backward: the loss and every gradient (W, U, b, h0, c0, xs),
    with lengths and a mask or without outputs, agree with the reference scan to bfloat16
    rounding and with the fused bfloat16 scan as the 64-row kernels do
    (:func:`pallas_checks.assert_matches_reference`, test_gated_pallas.py's bounds)."""
    n, B, m, T, bt, lengths, masked, outputs = UNROLL_CASES[case]
    cell, params, h0, c0, xs, mask = setup(n, B, m, T, masked)
    target = normal(9, (T, B, n))
    lens = as_jax(lengths, jnp.int32)
    opts = Options(outputs=outputs, batch_tile=bt)
    got, ref, fused = kernel_reference_fused(
        lambda p, c, x: gated.unroll(cell, p, c, x, mask, opts, lengths=lens),
        cell,
        params,
        cells.LSTMState(h0, c0),
        xs,
        target,
        mask,
        lens,
        outputs=outputs,
    )
    assert forward_kernels == {"swap_ab": 1, "persistent": 0}
    assert_matches_reference(got, ref, fused)


def test_train_step_with_a_batch_tile_lowers_for_an_h100(forward_kernels):
    """The train step (the loss and every gradient through ``gated.unroll``,
    ``Options(batch_tile=16)``, compiled) at P-MNIST's shape (n = 100, B = 100, m = 1)
    with the mask lowers for ``cuda`` as two Mosaic GPU kernels, this forward and the
    persistent backward; two stacked seeds under ``jax.vmap`` lower too (the forward
    launched one seed at a time)."""
    n, B, m, T = 100, 100, 1, 8
    cell, params, h0, c0, xs, mask = setup(n, B, m, T, True)
    target = normal(9, (T, B, n))
    opts = Options(interpret=False, batch_tile=16)
    unroll = lambda p, c, x: gated.unroll(cell, p, c, x, mask, opts)
    step = lower_for_cuda(
        lambda p, c, x: value_and_grads(unroll, p, c, x, target),
        params,
        cells.LSTMState(h0, c0),
        xs,
    )
    assert [backward for backward, _ in kr.mosaic_modules(step)] == [False, True]
    assert forward_kernels == {"swap_ab": 1, "persistent": 0}
    lower_stacked_for_cuda(unroll, params, cells.LSTMState(h0, c0), xs, target)
    assert forward_kernels["persistent"] == 0  # (custom_vmap traces swap_ab's twice)


def test_a_batch_tile_is_refused_where_no_swap_ab_forward_runs():
    """``Options(batch_tile=16)`` for SC-LSTM, the reset-after GRU (gated backend), the
    RRN and Cho's GRU (chained backend) raises ValueError naming the plain LSTM; an
    LSTM whose sizes :func:`swap_ab.fits` rejects (n = 128, m = 17 at Bt 64) raises its
    ValueError; no kernel runs."""
    opts = Options(batch_tile=16)
    B, m = 3, 2
    xs = filled(jax.ShapeDtypeStruct((2, B, m), jnp.float32), 1.0)
    for cell, backend in (
        (cells.SCLSTM(8, skip=2), gated),
        (cells.GRU(8, reset_after=True), gated),
        (cells.RRN(8, depth=2), chained),
        (cells.GRU(8), chained),
    ):
        params = filled(shapes(cell.init, m), 0.1)  # only the shapes are read
        carry = filled(jax.eval_shape(lambda cell=cell: cell.initial_carry(B)))
        with pytest.raises(
            ValueError, match="batch_tile=16: the swap-AB forward runs a plain LSTM"
        ):
            backend.unroll(cell, params, carry, xs, None, opts)
    cell = cells.LSTM(128)
    x = filled(jax.ShapeDtypeStruct((2, B, 17), jnp.float32), 1.0)
    with pytest.raises(ValueError, match="no swap-AB LSTM kernel for n=128, m=17, bt=64"):
        gated.unroll(
            cell,
            filled(shapes(cell.init, 17), 0.1),
            filled(jax.eval_shape(lambda: cell.initial_carry(B))),
            x,
            None,
            Options(batch_tile=64),
        )
