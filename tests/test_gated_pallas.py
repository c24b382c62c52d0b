"""The persistent Pallas LSTM kernels (rhnzoo.cells.kernels.gated) against the reference
scan (lax.scan + autodiff, float32) and the fused scan in bfloat16, values and every
gradient; and the kernels lowered for ``cuda`` (an H100's shared memory and layouts)
on any host.

On the CPU the kernels run in Pallas's GPU interpret mode; on a GPU backend the same
tests run them compiled. The interpreter hangs, rather than fails, on a wrong barrier
count: every kernel run here is under a timeout."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import as_jax, dropout_mask, filled, normal, random_params, shapes
from pallas_checks import (
    assert_lm_task_agrees,
    assert_matches_reference,
    assert_no_races,
    assert_stacked_seeds_equal_each_seed,
    assert_tasks_agree,
    deadline,
    kernel_reference_fused,
    lower_for_cuda,
    lower_stacked_for_cuda,
    value_and_grads,
)

from rhnzoo import cells
from rhnzoo.cells.kernels import Options, common, persistent
from rhnzoo.cells.kernels import gated as gated_pallas
from rhnzoo.cells.scan import ScanImpl
from rhnzoo.configs import lm as lm_configs
from rhnzoo.configs import rrl as rrl_configs

KINDS = {
    "lstm": cells.LSTM,
    "gru": lambda n: cells.GRU(n, reset_after=True),
    "sc_lstm_p": lambda n: cells.SCLSTM(n, skip=3, learn_alpha=True),
    "sc_lstm_i": lambda n: cells.SCLSTM(n, skip=1),
}


def setup(n, B, m, T, seed=0, kind="lstm"):
    """The cell, random (not initial) parameters and carry, inputs and a target. An
    SC-LSTM's carry is in mid-sequence: each row at its own step count and anchor, α
    not 1. NumPy draws (nothing compiled), the parameters' shapes from ``jax.eval_shape``
    of the cell's init."""
    rng = np.random.default_rng(seed)
    cell = KINDS[kind](n)
    params = random_params(shapes(cell.init, m), rng, scale=0.3)
    carry = normal(rng, (B, n), scale=0.5)
    if kind == "lstm":
        carry = cells.LSTMState(carry, normal(rng, (B, n), scale=0.5))
    if kind.startswith("sc_lstm"):
        counts = as_jax(np.asarray([0, 2, 5, 1] * (B // 4) + [3] * (B % 4), np.int32))
        carry = cells.SCLSTMState(
            carry, normal(rng, (B, n), scale=0.5), normal(rng, (B, n), scale=0.5), counts
        )
        if cell.learn_alpha:
            params["alpha"] = as_jax(np.float32(0.7))
    return cell, params, carry, normal(rng, (T, B, m)), normal(rng, (T, B, n))


CASES = {
    # name: (cell, n, B, m, T, lengths, dropout mask)
    "lstm_padded_rows": ("lstm", 5, 4, 3, 6, np.array([6, 0, 3, 5]), False),  # an empty row
    "lstm_masked": ("lstm", 5, 4, 3, 6, np.array([6, 2, 0, 5]), True),
    "lstm_pmnist_like": ("lstm", 100, 100, 1, 5, None, False),  # n -> 128, B -> 128, m -> 16
    "lstm_two_warpgroups_masked": ("lstm", 100, 4, 3, 4, None, True),
    "gru_padded_rows_masked": ("gru", 5, 4, 3, 6, np.array([6, 0, 3, 5]), True),
    "gru_pmnist_like": ("gru", 100, 70, 1, 4, None, False),  # two CTAs, two warpgroups
    # SC-LSTM: skips at τ = 1 + kL, L = 3 (P) and 1 (I), rows starting mid-sequence
    "sc_lstm_p_padded_rows_masked": ("sc_lstm_p", 5, 4, 3, 9, np.array([9, 0, 4, 7]), True),
    "sc_lstm_i_every_step": ("sc_lstm_i", 5, 4, 3, 6, None, False),
    "sc_lstm_p_two_warpgroups": ("sc_lstm_p", 100, 4, 3, 5, np.array([5, 2, 0, 4]), True),
    # unpadded hidden sizes (every unit real), an odd batch, a long sequence
    "lstm_exact_n64_odd_batch": ("lstm", 64, 5, 3, 4, None, False),
    "lstm_exact_n128_masked": ("lstm", 128, 3, 3, 3, np.array([3, 1, 2]), True),
    "gru_exact_n128": ("gru", 128, 3, 2, 3, None, False),
    "gru_long_sequence": ("gru", 5, 3, 2, 64, np.array([64, 41, 1]), True),
}


# Loss bounds moved with the NumPy draws (issue 69, both cases in CI's slow tier): at
# gru_long_sequence the loss nearly cancels (-0.024, a sum of ~1,000 terms of both signs),
# so 2e-3 of it is no bound (kernel and fused scan both 4.2e-3 off the reference: the
# bound against the fused scan holds); at lstm_pmnist_like (loss 1.47e4) the kernel is
# 0.32 off (2e-5 relative), the fused scan 0.072: 4x plus 1e-3 fails, 1e-5 of the loss
# added holds.
LOSS_BOUNDS = {
    "gru_long_sequence": {"loss_atol": 5e-3},
    "lstm_pmnist_like": {"fused_loss_atol": 0.15},
}


# The fast tier: one small case of the family (the LSTM's kernel), padded rows and a
# dropout mask; the rest (the GRU's and SC-LSTM's kernels, two warpgroups, two CTAs of 64
# rows: slow to interpret) run in CI.
FAST = {"lstm_masked"}
# Shapes only (for the tests below): the LSTM's lengths with an empty row are
# lstm_masked's, its path without a mask lstm_pmnist_like's. (Two CTAs under the SC-LSTM's
# skips: lstm_pmnist_like's CTAs and sc_lstm_p_two_warpgroups' skips.)
SHAPES_ONLY = {"lstm_padded_rows"}
pytestmark = pytest.mark.pallas


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=() if c in FAST else pytest.mark.slow)
        for c in CASES
        if c not in SHAPES_ONLY
    ],
)
def test_values_and_gradients_match_the_reference(case):
    kind, n, B, m, T, lengths, masked = CASES[case]
    cell, params, carry, xs, target = setup(n, B, m, T, kind=kind)
    lens = None if lengths is None else as_jax(lengths)
    mask = None
    if masked:  # variational recurrent dropout: keep 0.75, scaled by 1 / 0.75
        mask = dropout_mask(7, (B, n), 0.75)
    got, ref, fused = kernel_reference_fused(
        lambda p, c, x: gated_pallas.unroll(cell, p, c, x, mask, lengths=lens),
        cell,
        params,
        carry,
        xs,
        target,
        mask,
        lens,
    )
    if "alpha" in params:  # SC-LSTM-P's dα sums terms of both signs over every skip: held,
        # like the loss, to the fused scan's own bfloat16 error (not to a relative bound)
        a, r, f = (float(g[1][0].pop("alpha")) for g in (got, ref, fused))
        assert abs(a - r) <= 4 * abs(f - r) + 1e-3 * abs(r)
    # The loss to bfloat16 rounding of the reference, and as close as the fused scan's
    # bfloat16 mode is (the same precision policy); every other gradient to 1.5e-2.
    assert_matches_reference(got, ref, fused, **LOSS_BOUNDS.get(case, {}))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "sc_lstm_p"])
def test_outputs_false_reads_the_final_carry(kind):
    """outputs=False: no outputs, the final carry and its gradients as the reference's
    (SC-LSTM's step counts exactly: each row's advances by its length)."""
    _, n, B, m, T, lengths, _ = CASES["lstm_padded_rows"]
    cell, params, carry, xs, target = setup(n, B, m, T, seed=1, kind=kind)
    lens = as_jax(lengths)
    final = gated_pallas.unroll(
        cell, params, carry, xs, None, Options(outputs=False), lengths=lens
    )[0]
    want = jax.jit(lambda p, c, x: cells.unroll(cell, p, c, x, lengths=lens)[0])(params, carry, xs)
    assert type(final) is type(want)
    if kind != "lstm":
        np.testing.assert_array_equal(final.t, want.t)
    got, ref, _ = kernel_reference_fused(
        lambda p, c, x: gated_pallas.unroll(
            cell, p, c, x, None, Options(outputs=False), lengths=lens
        ),
        cell,
        params,
        carry,
        xs,
        target,
        lengths=lens,
        outputs=False,
        fused=False,
    )
    without_outputs = lambda p, c, x: gated_pallas.unroll(
        cell, p, c, x, None, Options(outputs=False)
    )
    assert jax.eval_shape(without_outputs, params, carry, xs)[1] is None
    assert_matches_reference(got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "gru", "sc_lstm_p"])
def test_stacked_seeds_under_vmap_equal_each_seed_and_lower_for_an_h100(kind):
    """K stacked seeds (issue 47: ``jax.vmap`` over parameters, masks and carries) get
    each seed's own values and gradients; the vmapped value and gradient lower for
    ``cuda`` at N = 128 (``pallas_call``'s own batching rule gave the forward kernel a
    sixth TMA dimension: "Async copies only support striding up to 5 dimensions")."""
    _, n, B, m, T, lengths, _ = CASES["lstm_masked"]
    cell, params, carry, xs, target = setup(n, B, m, T, seed=2, kind=kind)
    masks = dropout_mask(3, (2, B, n), 0.75)
    lens = as_jax(lengths)
    with deadline(300):
        assert_stacked_seeds_equal_each_seed(
            lambda p, c, x, mask: gated_pallas.unroll(cell, p, c, x, mask, lengths=lens),
            params,
            carry,
            xs,
            target,
            masks,
        )
    cell, params, carry, xs, target = setup(128, 64, 1, 12, kind=kind)
    lower_stacked_for_cuda(
        lambda p, c, x: gated_pallas.unroll(cell, p, c, x, None, Options(interpret=False)),
        params,
        carry,
        xs,
        target,
    )


def test_refuses_what_it_does_not_compute():
    cell, params, carry, xs, _ = setup(5, 4, 3, 2)
    with pytest.raises(ValueError, match="bfloat16"):
        gated_pallas.unroll(cell, params, carry, xs, None, Options(dtype=jnp.float32))
    gru = cells.GRU(5)  # Cho et al.'s: chained_pallas's kernels, not these
    with pytest.raises(ValueError, match="no Pallas kernel"):
        gated_pallas.unroll(gru, filled(shapes(gru.init, 3), 0.1), as_jax(np.zeros((4, 5))), xs)
    assert gated_pallas.supports(cells.LSTM(128)) and not gated_pallas.supports(cells.LSTM(129))
    assert gated_pallas.supports(cells.GRU(128, reset_after=True))
    assert not gated_pallas.supports(gru) and gated_pallas.supports(cells.SCLSTM(128, skip=2))
    assert not gated_pallas.supports(cells.SCLSTM(129)) and not gated_pallas.supports(cells.RRN(8))


def test_auto_never_picks_the_kernel_off_an_h100_class_gpu():
    lstm = cells.LSTM(100)
    assert not gated_pallas.fits(lstm, 100, jnp.float32, "gpu")  # float32: the fused scan
    # not measured on a GPU yet: auto leaves the GRU to the fused scan
    assert not gated_pallas.fits(cells.GRU(64, reset_after=True), 100, jnp.bfloat16, "gpu")
    if jax.default_backend() == "cpu":
        assert not gated_pallas.fits(lstm, 100, jnp.bfloat16)
    assert not gated_pallas.fits(lstm, 100, jnp.bfloat16, "cpu")


# ------------------------------------------------------------------ in the tasks


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_lm_task_runs_the_kernel_with_its_dropout_masks(cell):
    """--cell=... --dtype=bfloat16 --scan_impl=pallas in the LM task (``window_loss``,
    all four dropout sites: the recurrent mask reaches the kernel; Cho's GRU by
    chained_pallas, with the outputs' cotangents, as the RRN's chain) against the fused
    scan in bfloat16."""
    depth = {"depth": 2} if cell == "rrn" else {}  # the LM's default depth is the RHN's 10
    cfg = lm_configs.LMConfig(
        cell=cell,
        hidden_size=8,
        batch_size=3,
        num_steps=5,
        dtype="bfloat16",
        drop_x=0.1,
        drop_i=0.2,
        drop_h=0.2,
        drop_o=0.2,
        **depth,
    )
    assert_lm_task_agrees(cfg)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, reset_after",
    [("lstm", False), ("gru", True), ("sc_lstm_p", False)],
)  # Cho's GRU and the RRN (chained_pallas, outputs=False): the LM above, test_chained_pallas
def test_the_classifier_task_runs_the_kernel(model, reset_after):
    """The RRL task's classifier (embedding, input and output dropout, padded rows with
    an empty one) with --scan_impl=pallas --dtype=bfloat16 (the LSTM, SC-LSTM and
    reset-after GRU kernels; the task's HRL, sized to the LSTM's parameter count, has n >
    128), against the fused scan in bfloat16."""
    cfg = rrl_configs.RRLConfig(
        model=model,
        gru_reset_after=reset_after,
        hidden_size=6,
        embed_size=4,
        drop=0.3,
        input_drop=0.2,
        dtype="bfloat16",
    )
    models = [
        cfg.replace(scan_impl=impl).classifier(3, vocab_size=11) for impl in ("pallas", "fused")
    ]
    assert models[0].resolved_scan(4) is ScanImpl.PALLAS
    params = random_params(shapes(models[1].init), 1, 0.3)
    rng = np.random.default_rng(0)
    tokens = as_jax(rng.integers(0, 11, (4, 6)), jnp.int32)
    lengths, labels = as_jax([6, 0, 3, 5], jnp.int32), as_jax([0, 1, 2, 1], jnp.int32)

    def loss_of(model, params):
        logits = model.logits(params, tokens, lengths, jax.random.PRNGKey(3))
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    assert_tasks_agree(loss_of, models, params)


# ------------------------------------------------------------------ lowering for cuda


def forward_args(T, n, m, B=64):
    N, MP = persistent.padded(n, m)
    z = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
    H = N // 64
    return (
        z((T, B, MP), jnp.bfloat16),
        z((4, H, N, 64), jnp.bfloat16),
        z((4, H, 64, MP), jnp.bfloat16),
        z((4, H, 64), jnp.float32),
        z((H, B, 64), jnp.bfloat16),
        (z((H, B, 64), jnp.float32),),
        z((B,), jnp.int32),
    )


def backward_args(T, n, with_dy, B=64, blocks=4, coefficients=5):
    N, _ = persistent.padded(n, 1)
    z = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
    dy = z((T, B, N), jnp.float32) if with_dy else None
    return (
        z((T, coefficients, B, N), jnp.bfloat16),
        z((T, B, N), jnp.float32),
        dy,
        z((blocks, N, N), jnp.bfloat16),
        z((B,), jnp.int32),
        z((B, N), jnp.float32),
        z((B, N), jnp.float32),
    )


@pytest.mark.parametrize("kind", ["lstm", pytest.param("gru", marks=pytest.mark.slow)])
@pytest.mark.parametrize("n", [64, pytest.param(128, marks=pytest.mark.slow)])  # fast: LSTM, 64
def test_kernels_lower_for_an_h100(n, kind):
    """Every kernel configuration (N = 64 or 128, a 1-wide input, a dropout mask or none;
    backward with and without output cotangents) lowers for ``cuda``: its shared memory,
    TMA boxes and wgmma layouts are what an sm_90 device accepts."""
    gru = kind == "gru"
    fargs = forward_args(12, n, 1)
    step = gated_pallas.GRU_RA_STEP if gru else gated_pallas.lstm_step()
    fwd = lambda *a: persistent.forward_call(*a, step=step, interpret=False)
    lower_for_cuda(fwd, *fargs)
    lower_for_cuda(fwd, *fargs, jax.ShapeDtypeStruct(fargs[4].shape, jnp.float32))  # a mask
    args = backward_args(12, n, with_dy=True, blocks=3 if gru else 4, coefficients=3 if gru else 5)
    if gru:  # no dc carry
        bwd = lambda c, f, dy, u, lens, dh, m: gated_pallas.backward_call(
            c, f, dy, u, lens, dh, None, m, interpret=False
        )
        lower_for_cuda(bwd, *args[:6], args[5])  # with a mask
        without_dy = lambda c, f, u, lens, dh: gated_pallas.backward_call(
            c, f, None, u, lens, dh, None, interpret=False
        )
        lower_for_cuda(without_dy, *(args[:2] + args[3:6]))
        return
    lower_for_cuda(lambda *a: gated_pallas.backward_call(*a, interpret=False), *args)
    lower_for_cuda(lambda *a: gated_pallas.backward_call(*a, interpret=False), *args, args[5])
    without_dy = lambda c, f, *a: gated_pallas.backward_call(c, f, None, *a, interpret=False)
    lower_for_cuda(without_dy, *(args[:2] + args[3:]))


@pytest.mark.slow  # the LSTM kernels' configurations: the fast tier lowers the LSTM's
@pytest.mark.parametrize("n", [64, 128])
def test_sc_lstm_kernels_lower_for_an_h100(n):
    """The LSTM kernels with SC-LSTM's skips (step counts, anchor, α; its anchor's
    cotangent backward), masked or not, with and without output cotangents."""
    z, B = jax.ShapeDtypeStruct, 64
    N, H = (64, 1) if n <= 64 else (128, 2)
    fargs = list(forward_args(12, n, 1))
    fargs[5] = (z((H, B, 64), jnp.float32),) * 2  # c and the anchor
    skips = (z((B,), jnp.int32), z((H, 64), jnp.float32))
    step = gated_pallas.lstm_step(20)
    fwd = lambda *a: persistent.forward_call(*a[:8], skips=a[8:], step=step, interpret=False)
    lower_for_cuda(fwd, *fargs, None, *skips)
    lower_for_cuda(fwd, *fargs, z(fargs[4].shape, jnp.float32), *skips)  # a mask
    args = backward_args(12, n, with_dy=True)
    skips = (z((B,), jnp.int32), z((1,), jnp.float32), z((B, N), jnp.float32))
    bwd = lambda *a: gated_pallas.backward_call(*a[:8], skips=a[8:], skip=20, interpret=False)
    lower_for_cuda(bwd, *args, None, *skips)
    lower_for_cuda(bwd, *args, args[5], *skips)  # a mask
    lower_for_cuda(bwd, *args[:2], None, *args[3:], None, *skips)  # no output cotangents


def test_shared_memory_estimate_matches_the_lowering():
    """``smem_bytes`` (what ``fits`` reads) predicts the lowering's verdict: a 64-wide
    input at n = 128 needs more than an H100 CTA has, and the lowering says so."""
    fwd_bytes, _ = gated_pallas.smem_bytes(128, 64)
    assert fwd_bytes > common.SMEM_LIMIT
    assert max(gated_pallas.smem_bytes(128, 16)) + 1024 <= common.SMEM_LIMIT
    fwd = lambda *a: persistent.forward_call(*a, step=gated_pallas.lstm_step(), interpret=False)
    with pytest.raises(Exception, match="exceeds available shared memory"):
        lower_for_cuda(fwd, *forward_args(4, 128, 64))


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the race detector is the interpreter's")
@pytest.mark.parametrize("kind", ["lstm", "gru", "sc_lstm_p"])
@pytest.mark.parametrize("n, outputs", [(100, True), (5, False)])  # two warpgroups forward,
def test_no_races_between_threads_tma_and_tensor_cores(
    monkeypatch, capfd, n, outputs, kind
):  # 1 and 2 slots back
    """The interpreter's race detector watches every shared-memory access of the
    kernels (threads' loads and stores, TMA copies, wgmma operands): none may race. It
    reports a removed ``commit_smem`` before a TMA refill (checked by hand)."""
    cell, params, carry, xs, target = setup(n, 4, 3, 3, kind=kind)
    mask = dropout_mask(7, (4, n), 0.75)
    assert_no_races(
        monkeypatch,
        capfd,
        lambda: value_and_grads(
            lambda p, c, x: gated_pallas.unroll(cell, p, c, x, mask, Options(outputs=outputs)),
            params,
            carry,
            xs,
            target,
            outputs=outputs,
        ),
    )
