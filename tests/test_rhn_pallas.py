"""The RHN micro-layer kernel (rhnzoo.cells.kernels.rhn) against the reference scan
(lax.scan + autodiff, float32) and the fused scan in bfloat16, values and every gradient
(parameters, initial state, inputs), coupled RHN and HSG(RHN) at depths 1, 3 and 12
(12: the micro-layers as a ``lax.scan``); through the dispatcher with ``lengths``; the
kernels lowered for ``cuda`` (an H100's shared memory, TMA boxes and wgmma layouts) at
every batch tile; bad input refused.

On the CPU the kernels run in Pallas's GPU interpret mode; every kernel run is under a
timeout (the interpreter hangs, rather than fails, on a barrier never completed)."""

import re

import jax
import jax.numpy as jnp
import kernel_registers as kr
import numpy as np
import pytest
from helpers import as_jax, dropout_mask, normal, random_params, shapes
from pallas_checks import (
    assert_lm_task_agrees,
    assert_matches_reference,
    assert_no_races,
    assert_stacked_seeds_equal_each_seed,
    deadline,
    kernel_reference_fused,
    lower_for_cuda,
    lower_stacked_for_cuda,
    value_and_grads,
)

from rhnzoo import cells
from rhnzoo.cells import rhn_fused, scan
from rhnzoo.cells.kernels import Options, common, rhn
from rhnzoo.cells.scan import ScanImpl
from rhnzoo.configs import lm as lm_configs

pytestmark = pytest.mark.pallas
bf16 = jnp.bfloat16


def setup(n, B, m, T, depth, hsg, seed=0):
    """The cell, random (not initial) parameters and state, inputs and a target. The
    weights' scale shrinks as 1 / sqrt(n) above n = 8, so that pre-activations (and the
    bfloat16 rounding of what multiplies them) stay the same size at any width. NumPy
    draws (nothing compiled), the parameters' shapes from ``jax.eval_shape``."""
    rng = np.random.default_rng(seed)
    cell = cells.RHN(n, depth)
    cell = cells.HSG(cell) if hsg else cell
    params = random_params(shapes(cell.init, m), rng, scale=0.3 * min(1.0, (8 / n) ** 0.5))
    carry = normal(rng, (B, n), scale=0.5)
    return cell, params, carry, normal(rng, (T, B, m)), normal(rng, (T, B, n))


def recurrent_mask(B, n, seed=7):  # variational recurrent dropout: keep 0.75, scaled by 1 / 0.75
    return dropout_mask(seed, (B, n), 0.75)


CASES = {
    # name: (n, B, m, T, depth, HSG, dropout mask, batch tile)
    "rhn_depth1": (5, 4, 3, 4, 1, False, False, 16),
    "rhn_depth3_masked": (5, 4, 3, 4, 3, False, True, 16),
    "hsg_depth3_masked": (5, 4, 3, 4, 3, True, True, 16),
    "hsg_depth1": (5, 4, 3, 3, 1, True, False, 32),
    "rhn_depth12_masked": (5, 4, 3, 3, 12, False, True, 16),  # the micro-layers as a scan
    "hsg_depth12": (5, 4, 3, 3, 12, True, False, 64),
    # two CTAs of 64 units, two 16-column batch tiles, K over two 64-unit blocks
    "hsg_two_by_two_ctas_masked": (70, 20, 3, 3, 2, True, True, 16),
}


# The fast tier: the coupled RHN with a dropout mask at depth 3 (micro-layers a Python
# loop) and HSG(RHN) at depth 12 (a lax.scan over micro-layers 2..12); the rest in CI.
FAST = {"rhn_depth3_masked"}  # the fast tier: one case; the rest in CI


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=() if c in FAST else pytest.mark.slow) for c in CASES]
)
def test_values_and_gradients_match_the_reference(case):
    n, B, m, T, depth, hsg, masked, bt = CASES[case]
    cell, params, carry, xs, target = setup(n, B, m, T, depth, hsg)
    mask = recurrent_mask(B, n) if masked else None
    got, ref, fused = kernel_reference_fused(
        lambda p, c, x: rhn.unroll(cell, p, c, x, mask, Options(batch_tile=bt)),
        cell,
        params,
        carry,
        xs,
        target,
        mask,
        fused=rhn_fused.unroll,
    )
    # The loss to bfloat16 rounding of the reference, and as close as the fused scan's
    # bfloat16 mode is (the same precision policy and the same backward pass).
    assert_matches_reference(got, ref, fused, fused_rtol=5e-3)


def test_the_dispatcher_runs_it_with_lengths_and_auto_keeps_the_fused_scan():
    """``scan_impl='pallas'`` runs HSG(RHN) here with ``lengths`` (an empty row: its
    carry is the initial one, padded outputs zero), values and gradients as the
    reference scan's; ``auto`` still picks the fused scan for the RHN, on a GPU too (no
    GPU timing of the kernel yet)."""
    cell, params, carry, xs, target = setup(5, 4, 3, 4, 2, True, seed=1)
    lens, mask = as_jax([4, 0, 2, 3], jnp.int32), recurrent_mask(4, 5)
    assert scan.resolve("pallas", cell, batch=4, dtype=bf16, backend="cpu") is ScanImpl.PALLAS
    for backend in ("gpu", "cpu"):
        assert scan.resolve("auto", cell, batch=20, dtype=bf16, backend=backend) is ScanImpl.FUSED
    assert not rhn.fits(cell, 20, bf16, "gpu")
    got, ref, _ = kernel_reference_fused(
        lambda p, c, x: scan.unroll(cell, p, c, x, mask, impl="pallas", lengths=lens, dtype=bf16),
        cell,
        params,
        carry,
        xs,
        target,
        mask,
        lens,
        fused=False,
    )
    assert_matches_reference(got, ref)
    final, ys = scan.unroll(cell, params, carry, xs, mask, impl="pallas", lengths=lens, dtype=bf16)
    np.testing.assert_array_equal(final[1], carry[1])  # the empty row
    np.testing.assert_array_equal(ys[2:, 2], 0.0)


@pytest.mark.slow
def test_stacked_seeds_under_vmap_equal_each_seed_and_lower_for_an_h100():
    """K stacked seeds (``jax.vmap`` over parameters, carries and masks, issue 47) get
    each seed's own values and gradients (to float32 rounding: XLA sums the batched
    backward's reductions in another order); the vmapped value and gradient at the
    ``ptb_sota`` shape lower for ``cuda`` (the kernels' TMA copies gain a dimension)."""
    cell, params, carry, xs, target = setup(5, 4, 3, 3, 2, True, seed=2)
    masks = dropout_mask(3, (2, 4, 5), 0.75)
    with deadline(300):
        assert_stacked_seeds_equal_each_seed(
            lambda p, c, x, mask: rhn.unroll(cell, p, c, x, mask),
            params,
            carry,
            xs,
            target,
            masks,
            rtol=1e-6,
        )
    cell = cells.HSG(cells.RHN(830, 12))
    z = jax.ShapeDtypeStruct
    lower_stacked_for_cuda(
        lambda p, c, x: rhn.unroll(cell, p, c, x, None, Options(interpret=False)),
        jax.eval_shape(lambda: cell.init(jax.random.PRNGKey(0), 830)),
        z((20, 830), jnp.float32),
        as_jax(np.zeros((4, 20, 830), np.float32)),
        as_jax(np.zeros((4, 20, 830), np.float32)),
    )


@pytest.mark.slow
def test_the_lm_task_runs_the_kernel_with_its_dropout_masks():
    """--cell=rhn --hsg --depth=3 --dtype=bfloat16 --scan_impl=pallas in the LM task
    (``window_loss``, all four dropout sites: the recurrent mask reaches the kernel),
    loss and gradients as the fused scan's in bfloat16."""
    cfg = lm_configs.LMConfig(
        cell="rhn",
        hsg=True,
        depth=3,
        hidden_size=8,
        batch_size=3,
        num_steps=5,
        dtype="bfloat16",
        drop_x=0.1,
        drop_i=0.2,
        drop_h=0.2,
        drop_o=0.2,
    )
    assert cfg.model(13).resolved_scan(3) is ScanImpl.FUSED  # auto
    assert_lm_task_agrees(cfg)


def test_no_weights_are_copied_out_of_the_stack():
    """Above depth LOOP_LAYERS_UP_TO the micro-layers are a ``lax.scan``; each kernel
    reads its micro-layer's R_l^T from the stacked weights by index, so the lowered
    forward holds no slice of the stack (a slice in a scan body is a copy of R_l per
    micro-layer and time step: issue 60)."""
    assert 12 > rhn_fused.LOOP_LAYERS_UP_TO
    cell = cells.RHN(830, 12)
    z = jax.ShapeDtypeStruct
    params = jax.eval_shape(lambda: cell.init(jax.random.PRNGKey(0), 830))
    forward = lambda p, c, x: rhn.unroll(cell, p, c, x, None, Options(interpret=False))  # noqa: E731
    text = lower_for_cuda(
        forward, params, z((20, 830), jnp.float32), z((4, 20, 830), jnp.float32)
    ).as_text()
    assert "tensor<12x2x832x832xbf16>" in text  # the stack the kernels index
    slices = [line for line in text.splitlines() if re.search(r"stablehlo\.(dynamic_)?slice", line)]
    assert slices and not [line for line in slices if "832x832" in line or "830x1660" in line]


@pytest.mark.slow
@pytest.mark.parametrize("depth", [2, 12])
def test_under_x64_matches_the_reference(depth):
    """With ``jax_enable_x64`` on (issue 62: an int64 index or a float64 output), the
    micro-layer loop (depth 2) and scan (depth 12): float32 outputs and gradients, values
    and gradients as the reference scan's."""
    with jax.enable_x64(True):
        assert jnp.arange(1).dtype == jnp.int64  # x64 really on
        cell, params, carry, xs, target = setup(5, 4, 3, 3, depth, True)
        final, ys = rhn.unroll(cell, params, carry, xs)
        assert final.dtype == ys.dtype == jnp.float32
        got, ref, _ = kernel_reference_fused(
            lambda p, c, x: rhn.unroll(cell, p, c, x),
            cell,
            params,
            carry,
            xs,
            target,
            fused=False,
        )
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(got[1]))
    assert_matches_reference(got, ref)


def test_refuses_what_it_does_not_compute():
    cell, params, carry, xs, _ = setup(5, 4, 3, 2, 2, False)
    unroll = rhn.unroll
    host = lambda a, index: as_jax(np.asarray(a)[index])  # sliced on the host
    with pytest.raises(ValueError, match="bfloat16"):
        unroll(cell, params, carry, xs, None, Options(dtype=jnp.float32))
    uncoupled = cells.RHN(5, 2, coupled=False)
    with pytest.raises(ValueError, match="coupled RHN or HSG"):
        unroll(uncoupled, random_params(shapes(uncoupled.init, 3), 0), carry, xs)
    with pytest.raises(ValueError, match="coupled RHN or HSG"):
        unroll(cells.LSTM(5), params, carry, xs)
    with pytest.raises(ValueError, match=r"carry \(3, 5\) \(want \(4, 5\)\)"):
        unroll(cell, params, host(carry, np.s_[:3]), xs)
    with pytest.raises(ValueError, match=r"mask \(4, 6\)"):
        unroll(cell, params, carry, xs, as_jax(np.ones((4, 6), np.float32)))
    with pytest.raises(ValueError, match=r"W \(3, 10\) \(want \(2, 10\)\)"):
        unroll(cell, params, carry, host(xs, np.s_[..., :2]))
    with pytest.raises(ValueError, match=r"xs must be \[T, B, m\]"):
        unroll(cell, params, carry, host(xs, 0))
    with pytest.raises(ValueError, match="batch_tile must be None or one of"):
        unroll(cell, params, carry, xs, None, Options(batch_tile=48))
    assert rhn.supports(cell) and rhn.supports(cells.HSG(cell))
    assert not rhn.supports(uncoupled) and not rhn.supports(cells.HSG(uncoupled))
    assert not rhn.supports(cells.LSTM(5))
    tiles = [rhn.default_batch_tile(b) for b in (1, 16, 17, 20, 32, 33, 64, 65, 200)]
    assert tiles == [16, 16, 32, 32, 32, 64, 64, 64, 64]


# ------------------------------------------------------------------ lowering for cuda


@pytest.mark.parametrize("bt", [16, *(pytest.param(b, marks=pytest.mark.slow) for b in (32, 64))])
def test_kernels_lower_for_an_h100(bt):
    """Each kernel (the first micro-layer's, with the input projection; a later one's;
    HSG's gate) lowers for ``cuda`` at batch tile ``bt`` and hidden size 830 (padded to
    832: K over 13 blocks, 13 CTAs of 64 units), from HSG(RHN)'s training step
    (kernel_registers.CONFIGS, whose rows test_kernel_registers.py compiles with ptxas:
    zero spills): its shared memory, TMA boxes and wgmma layouts are what an sm_90 device
    accepts. (Tiles 16 and 32 lower because R_l^T's blocks are swizzled as the state
    operand's are: with a 128-byte swizzle beside a 32- or 64-byte one, JAX 0.11.2's
    layout inference fails with an AssertionError.)"""
    assert rhn.smem_bytes(bt) + 1024 <= common.SMEM_LIMIT
    assert kr.CONFIGS[f"rhn_hsg_bt{bt}"].batch_tile == bt
    assert {"first", "later", "hsg"} <= set(kr.kernel_modules(f"rhn_hsg_bt{bt}"))


@pytest.mark.parametrize("depth, hsg", [(3, True), pytest.param(12, False, marks=pytest.mark.slow)])
def test_the_train_step_lowers_for_an_h100(depth, hsg):
    """The value and every gradient of the compiled (not interpreted) unroll, at the
    ``ptb_sota`` shape (hidden 830, batch 20) and depth 3 (micro-layers a Python loop)
    or 12 (a ``lax.scan``), lower for ``cuda``."""
    cell = cells.RHN(830, depth)
    cell = cells.HSG(cell) if hsg else cell
    z = jax.ShapeDtypeStruct
    params = jax.eval_shape(lambda: cell.init(jax.random.PRNGKey(0), 830))
    T, B = 4, 20
    mask = z((B, 830), jnp.float32)

    def loss(params, carry, xs, mask):
        final, ys = rhn.unroll(cell, params, carry, xs, mask, Options(interpret=False))
        return jnp.sum(final) + jnp.sum(ys)

    lower_for_cuda(
        jax.value_and_grad(loss, argnums=(0, 1, 2)),
        params,
        z((B, 830), jnp.float32),
        z((T, B, 830), jnp.float32),
        mask,
    )


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the race detector is the interpreter's")
def test_no_races_between_threads_tma_and_tensor_cores(monkeypatch, capfd):
    """The interpreter's race detector watches every shared-memory access of the
    kernels (the pipeline's TMA copies and wgmma operands, the epilogue's loads, stores
    and TMA stores): none may race."""
    n, B, m, T, depth, hsg, _, bt = CASES["hsg_two_by_two_ctas_masked"]
    cell, params, carry, xs, target = setup(n, B, m, 2, depth, hsg)
    assert_no_races(
        monkeypatch,
        capfd,
        lambda: value_and_grads(
            lambda p, c, x: rhn.unroll(cell, p, c, x, recurrent_mask(B, n)),
            params,
            carry,
            xs,
            target,
        ),
    )


# ------------------------------------------------------ the backward micro-layer kernels
# The backward kernels are the default (kernel_backward=True): the value and gradient cases
# above (depths 1, 3 and 12, with and without HSG and a dropout mask, two CTAs by two batch
# tiles), the race test and kernel_registers' rhn_hsg rows (ptxas at Bt 16/32/64, run by
# test_kernel_registers) run them. Here: that they are the default, the XLA backward the
# option keeps, and the train step's backward kernels at the ptb_sota shape.


def kernel_launches(fn, *args) -> int:
    """How many Pallas kernel calls ``fn``'s jaxpr holds (a scan body's once): a Mosaic GPU
    ``plgpu.kernel`` is an ``mpmd_map`` in JAX 0.11.2's jaxprs, other kernels ``pallas_call``."""
    return len(re.findall(r"\b(?:pallas_call|mpmd_map)\[", str(jax.make_jaxpr(fn)(*args))))


@pytest.mark.parametrize(
    "case", ["rhn_depth3_masked", pytest.param("hsg_depth12", marks=pytest.mark.slow)]
)
def test_backward_kernels_are_the_default_and_the_xla_backward_matches_the_reference(case):
    """The default gradient calls the backward kernels (L more kernel calls than the
    forward's in the micro-layer loop; 2 with the layer scan: its body's and micro-layer
    1's), as ``kernel_backward=True`` does; with ``kernel_backward=False`` none, and the
    fused scan's XLA backward gives the loss and every gradient of the reference to
    bfloat16 rounding."""
    n, B, m, T, depth, hsg, masked, bt = CASES[case]
    cell, params, carry, xs, target = setup(n, B, m, T, depth, hsg)
    mask = recurrent_mask(B, n) if masked else None

    def kernel(**backward):
        opts = Options(batch_tile=bt, **backward)
        return lambda p, c, x: rhn.unroll(cell, p, c, x, mask, opts)

    def launches(**backward):
        unroll = kernel(**backward)
        return kernel_launches(lambda *a: value_and_grads(unroll, *a), params, carry, xs, target)

    default, on, off = launches(), launches(kernel_backward=True), launches(kernel_backward=False)
    assert default == on == off + (depth if depth <= rhn_fused.LOOP_LAYERS_UP_TO else 2)
    got, ref, fused = kernel_reference_fused(
        kernel(kernel_backward=False), cell, params, carry, xs, target, mask, fused=rhn_fused.unroll
    )
    assert_matches_reference(got, ref, fused, fused_rtol=5e-3)


@pytest.mark.parametrize("depth, hsg", [(3, True), pytest.param(12, False, marks=pytest.mark.slow)])
def test_the_train_step_calls_a_backward_kernel_per_micro_layer(depth, hsg):
    """At the ``ptb_sota`` shape (hidden 830, batch 20) the compiled train step's
    backward, lowered for ``cuda``, calls a kernel per micro-layer (depth 3: three call
    sites; depth 12: the layer scan's and micro-layer 1's) and copies no micro-layer's
    weights out of either stack (R_l^T's, R_l's) nor, in the layer scan, its saved tiles
    out of theirs: each kernel indexes them."""
    cell = cells.RHN(830, depth)
    cell = cells.HSG(cell) if hsg else cell
    z, f32 = jax.ShapeDtypeStruct, jnp.float32
    params = jax.eval_shape(lambda: cell.init(jax.random.PRNGKey(0), 830))
    opts = common.Options(interpret=False)

    def loss(params, carry, xs, mask):
        final, ys = rhn.unroll(cell, params, carry, xs, mask, opts)
        return jnp.sum(final) + jnp.sum(ys)

    B = 20
    lowered = lower_for_cuda(
        jax.value_and_grad(loss, argnums=(0, 1, 2)),
        params,
        z((B, 830), f32),
        z((4, B, 830), f32),
        z((B, 830), f32),
    )
    backward = [module for is_backward, module in kr.mosaic_modules(lowered) if is_backward]
    assert len(backward) == (3 if depth == 3 else 2)
    text = lowered.as_text()
    slices = [line for line in text.splitlines() if re.search(r"stablehlo\.(dynamic_)?slice", line)]
    # A micro-layer's weights: a bf16 [832, 832] block of a kernel stack or an f32 R_l; the
    # padded float32 gradients [832, 832] of HSG's W_R, W_F are cut once per call.
    assert not [line for line in slices if "832x832xbf16" in line or "830x1660" in line]
    # Nor, in the layer scan, a micro-layer's saved h, T, s ([832, 32] tiles of the step's
    # [12, 832, 32] stacks): the backward kernels read them by index too.
    stacks = [
        line for line in slices if re.search(r"dynamic_slice.*tensor<1[12]x832x32xf32>", line)
    ]
    assert not stacks
