"""Fast RHN and HSG-RHN unrolls with a hand-written backward pass.

Same mathematics as :class:`rhnzoo.cells.RHN` (coupled gates) and
:class:`rhnzoo.cells.HSG` around it, tested against them (values and gradients),
but faster to train. Under plain autodiff of ``lax.scan`` every time step adds
a rank-B outer product into each recurrent weight gradient (``dR += s^T dz``):
B is small (20 for PTB), so the backward pass streams the whole gradient
accumulator through memory once per step and micro-layer. Here the forward pass
saves every micro-layer's input state and gate values, the backward scan only
propagates the state gradient and emits the pre-activation gradients dz, and the
weight gradients are formed afterwards as one large matmul per micro-layer with
the contraction over all T x B positions:

    dR_l = sum_t (s_l,t * m)^T dz_l,t        (Zilly et al. 2017, eqs. 6-8 differentiated)

Options: ``remat=True`` saves only the per-step carries and recomputes a step's
micro-layers in the backward pass (memory O(T B n) instead of O(T L B n));
``dtype=jnp.bfloat16`` runs the matmuls in bfloat16 with float32 accumulation,
keeping parameters and the recurrent state in float32.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells.rhn import HSG, RHN

Array = jax.Array


def _dot(a: Array, b: Array, dtype: Any) -> Array:
    return jnp.dot(a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _forward_step(R, b, hsg, s_hat, xp, m, dtype):
    """One time step; returns the new carry and what the backward pass needs."""
    n = s_hat.shape[-1]
    first = (jnp.arange(R.shape[0]) == 0).astype(jnp.float32)

    def layer(s, Rbf):
        R_l, b_l, f = Rbf
        z = _dot(s * m, R_l, dtype) + b_l + f * xp
        h, t = jnp.tanh(z[:, :n]), jax.nn.sigmoid(z[:, n:])
        return s + t * (h - s), (s, h, t)

    s_l, (S, H, Tg) = jax.lax.scan(layer, s_hat, (R, b, first))
    if hsg is None:
        return s_l, (S, H, Tg, s_l, s_l)
    W_R, W_F, b_G = hsg
    g = jax.nn.sigmoid(_dot(s_hat, W_R, dtype) + _dot(s_l, W_F, dtype) + b_G)
    return s_l + g * (s_hat - s_l), (S, H, Tg, s_l, g)


def _backward_step(R, hsg, ds_hat, saved, m, dtype):
    """Backpropagates one time step: returns (d carry in, dz [L, B, 2n], dz_G [B, n])."""
    S, H, Tg, s_l, g = saved
    if hsg is None:
        ds, dzg = ds_hat, jnp.zeros_like(ds_hat)
        ds_direct = jnp.zeros_like(ds_hat)
    else:
        W_R, W_F, _ = hsg
        s_prev = S[0]
        dzg = ds_hat * (s_prev - s_l) * g * (1 - g)
        ds = ds_hat * (1 - g) + _dot(dzg, W_F.T, dtype)
        ds_direct = ds_hat * g + _dot(dzg, W_R.T, dtype)

    def layer(ds, inputs):
        R_l, s, h, t = inputs
        dz = jnp.concatenate([ds * t * (1 - h * h), ds * (h - s) * t * (1 - t)], axis=-1)
        return ds * (1 - t) + _dot(dz, R_l.T, dtype) * m, dz

    ds0, dZ = jax.lax.scan(layer, ds, (R, S, H, Tg), reverse=True)
    return ds0 + ds_direct, dZ, dzg


def _run(R, b, hsg, s0, x_proj, mask, *, remat, unroll, dtype):
    def step(s, xp):
        s_new, saved = _forward_step(R, b, hsg, s, xp, mask, dtype)
        return s_new, (s_new, s if remat else saved)

    s_T, (ys, saved) = jax.lax.scan(step, s0, x_proj, unroll=unroll)
    return (s_T, ys), saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _unroll(R, b, hsg, s0, x_proj, mask, remat, unroll, dtype):
    return _run(R, b, hsg, s0, x_proj, mask, remat=remat, unroll=unroll, dtype=dtype)[0]


def _unroll_fwd(R, b, hsg, s0, x_proj, mask, remat, unroll, dtype):
    out, saved = _run(R, b, hsg, s0, x_proj, mask, remat=remat, unroll=unroll, dtype=dtype)
    return out, (R, b, hsg, x_proj, mask, saved)


def _unroll_bwd(remat, unroll, dtype, res, cotangents):
    R, b, hsg, x_proj, mask, saved = res
    ds_T, dys = cotangents

    def step(ds_hat, inputs):
        dy, xp, saved_t = inputs
        if remat:
            saved_t = _forward_step(R, b, hsg, saved_t, xp, mask, dtype)[1]
        ds_prev, dZ, dzg = _backward_step(R, hsg, ds_hat + dy, saved_t, mask, dtype)
        s_in, s_prev, s_l = saved_t[0], saved_t[0][0], saved_t[3]
        return ds_prev, (dZ, dzg, s_in, s_prev, s_l)

    ds0, (dZ, dzg, S, s_prev, s_l) = jax.lax.scan(
        step, ds_T, (dys, x_proj, saved), reverse=True, unroll=unroll
    )
    # Weight gradients: one matmul per micro-layer over all T x B positions.
    dR = jnp.einsum("tlbi,tlbj->lij", (S * mask).astype(dtype), dZ.astype(dtype),
                    preferred_element_type=jnp.float32)  # fmt: skip
    db = dZ.sum(axis=(0, 2))
    d_hsg = None
    if hsg is not None:
        dW = lambda a: jnp.einsum("tbi,tbj->ij", a.astype(dtype), dzg.astype(dtype),
                                  preferred_element_type=jnp.float32)  # fmt: skip
        d_hsg = (dW(s_prev), dW(s_l), dzg.sum(axis=(0, 1)))
    return dR, db, d_hsg, ds0, dZ[:, 0], jnp.zeros_like(mask)


_unroll.defvjp(_unroll_fwd, _unroll_bwd)


def unroll(
    cell: Any,
    params: Any,
    carry: Array,
    xs: Array,
    mask: Array | None = None,
    *,
    unroll: int = 1,
    remat: bool = False,
    dtype: Any = jnp.float32,
) -> tuple[Array, Array]:
    """Drop-in replacement for :func:`rhnzoo.cells.unroll` for RHN and HSG(RHN).

    Args:
      cell: a coupled :class:`~rhnzoo.cells.RHN`, or :class:`~rhnzoo.cells.HSG`
        around one.
      params: the cell's parameters.
      carry: ``[B, n]`` float32 initial state.
      xs: ``[T, B, m]`` inputs.
      mask: ``[B, n]`` recurrent dropout mask or ``None``.
      unroll: time steps per scan iteration.
      remat: recompute each step's micro-layers in the backward pass.
      dtype: matmul input dtype (float32 or bfloat16); accumulation is float32.

    Returns:
      ``(carry [B, n], ys [T, B, n])`` float32.

    Raises:
      ValueError: for an uncoupled RHN or any other cell.
    """
    hsg = None
    if isinstance(cell, HSG):
        hsg = (params["W_R"], params["W_F"], params["b_G"])
        cell, params = cell.cell, params["cell"]
    if not isinstance(cell, RHN) or not cell.coupled:
        raise ValueError(f"the fused unroll supports coupled RHN and HSG(RHN) cells, got {cell}")
    x_proj = _dot(xs, params["W"], dtype)
    mask = jnp.ones_like(carry) if mask is None else mask
    return _unroll(params["R"], params["b"], hsg, carry, x_proj, mask, remat, unroll, dtype)
