"""float32 tanh and logistic sigmoid as rational polynomials, for the fused scans.

XLA:CPU evaluates ``tanh`` and ``logistic`` at several times the cost of the multiplies
around them (docs/runs/cpu/levers.md), and they are most of a recurrent step's
elementwise work. Here tanh is Eigen's [13/6] minimax rational approximation
(``generic_fast_tanh_float``, XLA:CPU's own), written with multiplies, adds and one
division so that XLA fuses and vectorises it with its neighbours; the sigmoid is
``(1 + tanh(x / 2)) / 2``. Other dtypes (float64, bfloat16) get the exact functions.

The fused scans' one matmul precision rule (:func:`dot`, :func:`einsum`,
:func:`project`): with ``dtype`` set (float32, bfloat16) the inputs are cast to it and
accumulate in float32; with ``dtype=None`` they stay in their own dtype. No
``precision=``: float32 inputs run at the caller's ``jax.default_matmul_precision``
(:mod:`rhnzoo.precision`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Eigen's generic_fast_tanh_float: numerator odd (x, x^3, ..., x^13), denominator even.
_CLAMP = 7.90531110763549805
_NUM = (
    4.89352455891786e-03,
    6.37261928875436e-04,
    1.48572235717979e-05,
    5.12229709037114e-08,
    -8.60467152213735e-11,
    2.00018790482477e-13,
    -2.76076847742355e-16,
)
_DEN = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)


def _horner(coefficients, x2):
    acc = jnp.asarray(coefficients[-1], x2.dtype)
    for c in coefficients[-2::-1]:
        acc = acc * x2 + c
    return acc


def tanh(x: jax.Array) -> jax.Array:
    """``tanh(x)``, elementwise, same shape and dtype; float32 by a rational polynomial
    (max absolute error 2.6e-7 on XLA:CPU, 3.3e-7 on an H100), other dtypes exact. NaN
    in, NaN out."""
    if x.dtype != jnp.float32:
        return jnp.tanh(x)
    x = jnp.clip(x, -_CLAMP, _CLAMP)
    x2 = x * x
    return x * _horner(_NUM, x2) / _horner(_DEN, x2)


def sigmoid(x: jax.Array) -> jax.Array:
    """The logistic sigmoid ``1 / (1 + exp(-x))``, elementwise, same shape and dtype;
    float32 as ``0.5 + 0.5 tanh(x / 2)`` with :func:`tanh` (max absolute error 1.5e-7),
    other dtypes exact."""
    if x.dtype != jnp.float32:
        return jax.nn.sigmoid(x)
    return 0.5 + 0.5 * tanh(0.5 * x)


def cast(a: jax.Array, dtype) -> jax.Array:
    """``a`` as ``dtype``, or unchanged for ``dtype=None``."""
    return a if dtype is None else a.astype(dtype)


def accumulation(dtype):
    """The matmul accumulation dtype for input ``dtype``: float32, or None (the inputs')."""
    return None if dtype is None else jnp.float32


def dot(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``a @ b`` under the precision rule above."""
    return jnp.dot(cast(a, dtype), cast(b, dtype), preferred_element_type=accumulation(dtype))


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``jnp.einsum(spec, a, b)`` under the precision rule above."""
    return jnp.einsum(
        spec, cast(a, dtype), cast(b, dtype), preferred_element_type=accumulation(dtype)
    )


def project(a: jax.Array, w: jax.Array, dtype) -> jax.Array:
    """``a [..., m] @ w [m, k] -> [..., k]`` under the precision rule above (as :func:`dot`),
    and differentiated under it too: the cotangent is cast as well (autodiff of
    :func:`dot` would multiply float32 by the cast operand, in float32), so with
    ``dtype=bfloat16`` both backward products take bfloat16 inputs, accumulating in
    float32. The gradients come back in ``a``'s and ``w``'s dtypes. ``w`` must be 2-D.
    Where nothing is cast it is :func:`dot` under autodiff (the runs of record's
    rounding)."""
    if dtype is None or (jnp.dtype(dtype) == a.dtype and jnp.dtype(dtype) == w.dtype):
        return dot(a, w, dtype)
    return _project(a, w, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project(a: jax.Array, w: jax.Array, dtype) -> jax.Array:
    return dot(a, w, dtype)


def _project_fwd(a, w, dtype):
    return dot(a, w, dtype), (a, w)


def _project_bwd(dtype, residuals, g):
    a, w = residuals
    lead = tuple(range(a.ndim - 1))
    da = jax.lax.dot_general(
        cast(g, dtype),
        cast(w, dtype),
        (((g.ndim - 1,), (1,)), ((), ())),
        preferred_element_type=accumulation(dtype),
    )
    dw = jax.lax.dot_general(
        cast(a, dtype),
        cast(g, dtype),
        ((lead, lead), ((), ())),
        preferred_element_type=accumulation(dtype),
    )
    return da.astype(a.dtype), dw.astype(w.dtype)


_project.defvjp(_project_fwd, _project_bwd)
