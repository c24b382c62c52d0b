"""Checks shared by the tests of the Pallas kernels (test_gated_pallas.py,
test_chained_pallas.py, test_rhn_pallas.py, test_swap_ab.py, test_kernels_x64.py)."""

import contextlib
import signal

import jax
import jax.numpy as jnp
import numpy as np
from helpers import as_jax, random_params, shapes

from rhnzoo import cells
from rhnzoo.cells import gated_fused
from rhnzoo.cells.kernels import common
from rhnzoo.cells.scan import ScanImpl
from rhnzoo.cells.scan_options import Options
from rhnzoo.tasks import lm as lm_training


@contextlib.contextmanager
def deadline(seconds: int):
    """Fails the test instead of hanging (the interpreter waits forever on a barrier
    that is never completed)."""

    def expired(*_):
        raise TimeoutError(f"kernel still running after {seconds} s: a barrier never completed?")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def value_and_grads(unroll, params, carry, xs, target, outputs=True):
    """A loss on every output and every float leaf of the final carry, and its gradients
    with respect to the parameters, the initial carry and the inputs (an integer leaf,
    SC-LSTM's step count, gets a float0 gradient)."""

    def loss(params, carry, xs):
        carry, ys = unroll(params, carry, xs)
        out = jnp.sum(jnp.sin(ys) * target) if outputs else 0.0
        floats = [a for a in jax.tree.leaves(carry) if jnp.issubdtype(a.dtype, jnp.floating)]
        return out + sum(jnp.sum(jnp.cos(leaf + k)) for k, leaf in enumerate(floats))

    return jax.value_and_grad(loss, argnums=(0, 1, 2), allow_int=True)(params, carry, xs)


def assert_close(got, want, rtol):
    """Every leaf within ``rtol`` of the largest magnitude of ``want``'s leaf (bfloat16
    matmul inputs: relative errors of a few 1e-3 are rounding). (In NumPy, in the leaves'
    dtypes: no program compiled per leaf.)"""
    for path, a in jax.tree_util.tree_flatten_with_path(got)[0]:
        if a.dtype == jax.dtypes.float0:  # an integer input's
            continue
        b = want
        for k in path:
            b = (
                b[k.key]
                if hasattr(k, "key")
                else b[k.idx]
                if hasattr(k, "idx")
                else getattr(b, k.name)
            )
        a, b = np.asarray(a), np.asarray(b)
        scale = float(np.max(np.abs(b))) + 1e-6
        err = float(np.max(np.abs(a - b)))
        assert err <= rtol * scale, (
            f"{jax.tree_util.keystr(path)}: {err:.3g} > {rtol} x {scale:.3g}"
        )


def assert_matches_reference(
    got, ref, fused=None, rtol=1.5e-2, fused_rtol=None, loss_atol=0.0, fused_loss_atol=1e-3
):
    """:func:`value_and_grads` results ``(loss, gradients)`` of a kernel (``got``), of the
    reference scan (``ref``) and, optionally, of the fused scan in bfloat16 (``fused``):
    the kernel's loss within 2e-3 of the reference's, relative (bfloat16 rounding), plus
    ``loss_atol``, and with ``fused`` within 4 times the fused scan's own error plus
    ``fused_loss_atol`` (the same precision policy); every gradient within ``rtol`` of the
    reference's and within ``fused_rtol`` (None: ``rtol``) of the fused scan's
    (:func:`assert_close`)."""
    err = abs(float(got[0]) - float(ref[0]))
    assert err <= 2e-3 * abs(float(ref[0])) + loss_atol
    if fused is not None:
        assert err <= 4 * abs(float(fused[0]) - float(ref[0])) + fused_loss_atol
    assert_close(got[1], ref[1], rtol=rtol)
    if fused is not None:
        assert_close(got[1], fused[1], rtol=rtol if fused_rtol is None else fused_rtol)


def assert_no_races(monkeypatch, capfd, run):
    """``run()`` (kernels in Pallas's GPU interpret mode) under a deadline, with the
    interpreter's race detector watching every shared-memory access (threads' loads and
    stores, TMA copies, wgmma operands; :func:`rhnzoo.cells.kernels.common.interpret_params`
    patched): it may report no race."""
    _, plgpu = common.plgpu()
    monkeypatch.setattr(
        common, "interpret_params", lambda interpret: plgpu.InterpretGPUParams(detect_races=True)
    )
    with deadline(300):
        jax.block_until_ready(run())
    out, err = capfd.readouterr()
    assert "RACE DETECTED" not in out + err


def lower_for_cuda(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


# The kernels run eagerly in the checks below, the references and fused scans jit-compiled
# (one program, not one per eager operation). A kernel run inside a jit-compiled program
# can hang on a 2-core host: XLA:CPU runs the interpreter's callback on its thread pool and
# the interpreted threads starve at a barrier (seen: test_gated_pallas.py's
# lstm_pmnist_like, test_swap_ab.py's n128_bt16_three_ctas beside the reference).


def assert_stacked_seeds_equal_each_seed(unroll, params, carry, xs, target, masks, rtol=None):
    """Two seeds' parameters and carries (``a``, ``0.8 a``) and masks ``[2, B, n]``
    stacked: ``jax.vmap`` over them gives each seed's own value and gradients, bit for
    bit, or with ``rtol`` to :func:`assert_close`'s tolerance (``unroll(params, carry, xs,
    mask) -> (carry, ys)``)."""
    stacked = jax.tree.map(lambda a: jnp.stack([a, 0.8 * a]), (params, carry))
    one = lambda p, c, mask: value_and_grads(
        lambda p, c, x: unroll(p, c, x, mask), p, c, xs, target
    )
    got = jax.vmap(one)(*stacked, masks)
    for k in range(2):
        want = one(*jax.tree.map(lambda a, k=k: a[k], stacked), masks[k])
        if rtol is not None:
            assert_close(jax.tree.map(lambda a, k=k: a[k], got), want, rtol)
            continue
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b))


def lower_stacked_for_cuda(unroll, params, carry, xs, target, outputs=True):
    """Two stacked seeds' value and gradients (``jax.vmap`` of :func:`value_and_grads`
    of ``unroll(params, carry, xs)``) lowered for ``cuda``."""
    z = lambda a: jax.ShapeDtypeStruct((2, *a.shape), a.dtype)
    many = jax.vmap(lambda p, c: value_and_grads(unroll, p, c, xs, target, outputs))
    lower_for_cuda(many, *jax.tree.map(z, (params, carry)))


def kernel_reference_fused(
    kernel,
    cell,
    params,
    carry,
    xs,
    target,
    mask=None,
    lengths=None,
    outputs=True,
    fused=gated_fused.unroll,
):
    """:func:`value_and_grads` of ``kernel(params, carry, xs)``, of the reference scan and
    of the fused scan in bfloat16 (``fused``: its ``unroll``, e.g.
    :func:`rhnzoo.cells.rhn_fused.unroll` for the RHN, or False for none), with the same
    ``mask`` and ``lengths`` (given to the fused scan only when not None); ``(kernel's,
    reference's, fused's or None)``. The kernel eagerly, under a deadline; the reference
    and the fused scan in one jit-compiled program."""
    with deadline(300):
        got = value_and_grads(kernel, params, carry, xs, target, outputs)
    kwargs = {} if lengths is None else {"lengths": lengths}
    scans = [lambda p, c, x: cells.unroll(cell, p, c, x, mask, lengths=lengths)]
    if fused:
        bf16 = Options(dtype=jnp.bfloat16)
        scans.append(lambda p, c, x: fused(cell, p, c, x, mask, bf16, **kwargs))
    ref, *rest = jax.jit(lambda *a: [value_and_grads(f, *a, outputs) for f in scans])(
        params, carry, xs, target
    )
    return got, ref, rest[0] if fused else None


def assert_tasks_agree(loss_of, models, params):
    """The same loss (to 2e-3 of it) and gradients (:func:`assert_close`, ``rtol`` 2e-2:
    bfloat16 rounding) of ``loss_of(model, params)`` from ``models[0]`` (under
    ``scan_impl='pallas'``, run eagerly under a deadline) and ``models[1]`` (under 'fused',
    jit-compiled), both in bfloat16."""
    with deadline(300):
        got = jax.value_and_grad(lambda p: loss_of(models[0], p))(params)
    want = jax.jit(jax.value_and_grad(lambda p: loss_of(models[1], p)))(params)
    assert abs(float(got[0]) - float(want[0])) <= 2e-3 * abs(float(want[0]))
    assert_close(got[1], want[1], rtol=2e-2)


def assert_lm_task_agrees(cfg, vocab=13):
    """The LM task (:func:`rhnzoo.tasks.lm.window_loss`, every dropout site ``cfg`` sets)
    of an ``LMConfig`` in bfloat16 under ``scan_impl='pallas'`` (which it must resolve
    to) and 'fused': :func:`assert_tasks_agree` on the window's loss plus the sum of the
    final carry, from the same random parameters, a carry of 0.1 and random tokens
    ``[cfg.batch_size, 40]``."""
    B = cfg.batch_size
    rows = as_jax(np.random.default_rng(0).integers(0, vocab, (B, 40)), jnp.int32)
    models = [cfg.replace(scan_impl=impl).model(vocab) for impl in ("pallas", "fused")]
    assert models[0].resolved_scan(B) is ScanImpl.PALLAS
    params = random_params(shapes(models[1].init), 1, 0.3)
    carry = jax.tree.map(
        lambda a: as_jax(np.full(a.shape, 0.1), a.dtype),
        jax.eval_shape(lambda: models[1].initial_carry(B)),
    )

    def loss_of(model, params):
        loss, (_, carry_out) = lm_training.window_loss(
            model, cfg, params, (rows, jnp.int32(1)), jax.random.PRNGKey(2), carry
        )
        return loss + sum(jnp.sum(c) for c in jax.tree.leaves(carry_out))

    assert_tasks_agree(loss_of, models, params)
