"""Checks shared by the tests of the Pallas kernels (test_gated_pallas.py,
test_chained_pallas.py, test_rhn_pallas.py, test_kernels_x64.py)."""

import contextlib
import signal

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo import cells
from rhnzoo.cells import gated_fused


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
    matmul inputs: relative errors of a few 1e-3 are rounding)."""
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
        scale = float(jnp.max(jnp.abs(b))) + 1e-6
        err = float(jnp.max(jnp.abs(a - b)))
        assert err <= rtol * scale, (
            f"{jax.tree_util.keystr(path)}: {err:.3g} > {rtol} x {scale:.3g}"
        )


def lower_for_cuda(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


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
    """:func:`value_and_grads` of ``kernel(params, carry, xs)`` (under a deadline), of the
    reference scan and of the fused scan in bfloat16 (``fused``: its ``unroll``, e.g.
    :func:`rhnzoo.cells.rhn_fused.unroll` for the RHN, or False for none), with the same
    ``mask`` and ``lengths`` (given to the fused scan only when not None); ``(kernel's,
    reference's, fused's or None)``."""
    with deadline(300):
        got = value_and_grads(kernel, params, carry, xs, target, outputs)
    ref = value_and_grads(
        lambda p, c, x: cells.unroll(cell, p, c, x, mask, lengths=lengths),
        params,
        carry,
        xs,
        target,
        outputs,
    )
    if not fused:
        return got, ref, None
    kwargs = {} if lengths is None else {"lengths": lengths}
    return (
        got,
        ref,
        value_and_grads(
            lambda p, c, x: fused(cell, p, c, x, mask, dtype=jnp.bfloat16, **kwargs),
            params,
            carry,
            xs,
            target,
            outputs,
        ),
    )
