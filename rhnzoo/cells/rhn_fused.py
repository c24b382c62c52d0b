"""Fast RHN and HSG-RHN unrolls with a hand-written backward pass.

Same mathematics as :class:`rhnzoo.cells.RHN` (coupled gates) and
:class:`rhnzoo.cells.HSG` around it, tested against them (values and gradients),
but faster to train. The forward pass saves every micro-layer's input state and gate
values, the backward scan propagates only the state gradient and emits the
pre-activation gradients dz, and each recurrent weight gradient is one matmul over all
T x B positions instead of a rank-B update per step:

    dR_l = sum_t (s_l,t * m)^T dz_l,t        (Zilly et al. 2017, eqs. 6-8 differentiated)

Feature-major inside the scans (as :mod:`rhnzoo.cells.gated_fused`), with
:mod:`rhnzoo.cells.fastmath`'s nonlinearities; design and measurements: BUILD_NOTES.md,
"RHN fused scan". ``remat=True`` saves only the per-step carries (memory O(T B n)
instead of O(T L B n)).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells import fastmath
from rhnzoo.cells.base import check_resets
from rhnzoo.cells.scan_options import DEFAULT_OPTIONS, Options, last_real
from rhnzoo.cells.rhn import HSG, RHN

Array = jax.Array

# Depths up to which the micro-layers are a Python loop over per-layer weights by
# default (``layer_loop=None``); a ``lax.scan`` over the stacked weights above. Why: the
# scan copies R_l out of the stack every micro-layer and time step (faster loop at depth
# 10), the loop compiles slower at depth 40 (docs/runs/cpu/levers.md).
LOOP_LAYERS_UP_TO = 10

# The backend's place in the dispatcher (rhnzoo.cells.scan).
IMPL = "fused"
REMAT = True


def supports(cell: Any) -> bool:
    """Whether :func:`unroll` runs ``cell``: a coupled :class:`~rhnzoo.cells.RHN`, or
    :class:`~rhnzoo.cells.HSG` around one."""
    inner = cell.cell if isinstance(cell, HSG) else cell
    return isinstance(inner, RHN) and inner.coupled


def fits(
    cell: Any, batch: int | None, dtype: Any, backend: str | None = None, *, input_size: int = 1
) -> bool:
    """Whether ``auto`` may pick this scan: for any cell it runs (:func:`supports`), at any
    batch, dtype, platform and input width."""
    return supports(cell)


_dot = fastmath.dot  # the fused scans' one precision rule

# Feature-major, ``[n, B]``: the state s^T, the pre-activations z^T = R_l^T (s m)^T + b_l
# as H | T row blocks (the weight matrix on the left: see gated_fused's kernels).


def _layer_scan(layer, carry, xs, reverse=False):
    """``lax.scan`` over the micro-layers (outputs stacked, ``[L, ...]``), or a Python loop
    when the weights (``xs[0]``) are a list of per-layer arrays; the loop's outputs stay
    lists of L arrays (a tuple of lists): stacking them would copy every output once
    more per time step."""
    if not isinstance(xs[0], list):
        return jax.lax.scan(layer, carry, xs, reverse=reverse)
    L = len(xs[0])
    outs = [None] * L
    for l in range(L - 1, -1, -1) if reverse else range(L):
        carry, outs[l] = layer(carry, tuple(x[l] for x in xs))
    return carry, tuple(map(list, zip(*outs))) if isinstance(outs[0], tuple) else outs


def _forward_step(RT, b, hsg, s_hat, xp, m, dtype):
    """One time step, feature-major: ``RT [L, 2n, n]`` (or a list of L ``[2n, n]``),
    ``b [L, 2n, 1]``, ``s_hat [n, B]``, ``xp [2n, B]``, ``m [n, B]``; returns the new state
    and what the backward pass needs (the micro-layers' inputs, H and T: ``[L, n, B]``, or
    lists of L ``[n, B]`` with the weights)."""
    n = s_hat.shape[0]
    first = (jnp.arange(len(RT)) == 0).astype(xp.dtype)

    def layer(s, RTbf):  # eqs. 6-8, C = 1 - T; the input enters micro-layer 1 only
        RT_l, b_l, f = RTbf
        z = _dot(RT_l, s * m, dtype) + b_l + f * xp
        h, t = fastmath.tanh(z[:n]), fastmath.sigmoid(z[n:])
        return s + t * (h - s), (s, h, t)

    s_l, (S, H, Tg) = _layer_scan(layer, s_hat, (RT, b, first))
    if hsg is None:
        return s_l, (S, H, Tg, s_l, s_l)
    W_RT, W_FT, b_G = hsg  # HSG eqs. 5-6
    g = fastmath.sigmoid(_dot(W_RT, s_hat, dtype) + _dot(W_FT, s_l, dtype) + b_G)
    return s_l + g * (s_hat - s_l), (S, H, Tg, s_l, g)


def _runtime_one(mask: Array) -> Array:
    """Exactly 1.0, computed at run time from the (finite, >= 0) dropout mask so that XLA
    cannot fold it. The Python layer loop's backward divides each micro-layer's ds and dz
    by it, so XLA:CPU computes each once: otherwise its fusion pass duplicates ds_l into
    both consumers, recursively (work quadratic in L per time step;
    ``lax.optimization_barrier`` is removed before fusion). float32, so that dividing by
    it never promotes the state gradient's dtype."""
    a = mask[0, 0].astype(jnp.float32) + 1.0
    return a / a


def _backward_step(R, hsg, ds_hat, saved, m, dtype, one):
    """Backpropagates one time step (feature-major): returns (d carry in [n, B],
    dz [L, 2n, B] (a list of L [2n, B] with per-layer weights), dz_G [n, B]).
    ``one``: :func:`_runtime_one`."""
    S, H, Tg, s_l, g = saved
    if hsg is None:
        ds, dzg = ds_hat, jnp.zeros_like(ds_hat)
        ds_direct = jnp.zeros_like(ds_hat)
    else:
        W_R, W_F = hsg
        s_prev = S[0]
        dzg = ds_hat * (s_prev - s_l) * g * (1 - g)
        ds = ds_hat * (1 - g) + _dot(W_F, dzg, dtype)
        ds_direct = ds_hat * g + _dot(W_R, dzg, dtype)

    def layer(ds, inputs):
        R_l, s, h, t = inputs
        dz = jnp.concatenate([ds * t * (1 - h * h), ds * (h - s) * t * (1 - t)], axis=0) / one
        return (ds * (1 - t) + _dot(R_l, dz, dtype) * m) / one, dz

    ds0, dZ = _layer_scan(layer, ds, (R, S, H, Tg), reverse=True)
    return ds0 + ds_direct, dZ, dzg


def _weights(R, b, hsg, loop):
    """The weights as the steps use them: ``(R, R^T, b [L, 2n, 1], HSG's transposed,
    HSG's W_R, W_F)``, R and R^T as lists of per-layer arrays when ``loop``."""
    RT = jnp.swapaxes(R, 1, 2)
    if loop:
        # Slices of the transposed stack: one transposing copy per layer (``R[l].T``: two).
        R, RT = list(R), list(RT)
    bT = b[..., None]
    hsgT = None if hsg is None else (hsg[0].T, hsg[1].T, hsg[2][:, None])
    return R, RT, bT, hsgT, None if hsg is None else hsg[:2]


def _run(R, b, hsg, s0, x_proj, mask, resets, *, remat, unroll, dtype, loop):
    _, RT, bT, hsgT, _ = _weights(R, b, hsg, loop)

    def step(s, inputs):
        xp, reset = inputs
        if reset is not None:  # an episode starts: the step runs from the initial state
            s = jnp.where(reset[None, :], s0, s)
        s_new, saved = _forward_step(RT, bT, hsgT, s, xp, mask, dtype)
        return s_new, (s_new, s if remat else saved)

    s_T, (ys, saved) = jax.lax.scan(step, s0, (x_proj, resets), unroll=unroll)
    return (s_T, ys), saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _unroll(R, b, hsg, s0, x_proj, mask, resets, remat, unroll, dtype, loop):
    """Feature-major: ``s0 [n, B]``, ``x_proj [T, 2n, B]``, ``mask [n, B]``, ``resets
    [T, B]`` bool or None; returns ``(s_T [n, B], ys [T, n, B])``."""
    return _run(
        R, b, hsg, s0, x_proj, mask, resets, remat=remat, unroll=unroll, dtype=dtype, loop=loop
    )[0]


def _unroll_fwd(R, b, hsg, s0, x_proj, mask, resets, remat, unroll, dtype, loop):
    out, saved = _run(
        R, b, hsg, s0, x_proj, mask, resets, remat=remat, unroll=unroll, dtype=dtype, loop=loop
    )
    return out, (R, b, hsg, x_proj, mask, saved, resets)


def _unroll_bwd(remat, unroll, dtype, loop, res, cotangents):
    return _backward(remat, unroll, dtype, loop, res, cotangents) + (None,)  # resets: none


def _backward(remat, unroll, dtype, loop, res, cotangents):
    """The cotangents of ``(R, b, hsg, s0, x_proj, mask)``; ``res`` = ``(R, b, hsg,
    x_proj, mask, saved[, resets])``."""
    R, b, hsg, x_proj, mask, saved = res[:6]
    resets = res[6] if len(res) > 6 else None
    ds_T, dys = cotangents
    Rl, RT, bT, hsgT, hsgW = _weights(R, b, hsg, loop)
    one = _runtime_one(mask) if loop else 1.0  # a layer scan computes each ds once anyway

    def step(carry, inputs):
        ds_hat, ds0_restarts = carry
        dy, xp, saved_t, reset = inputs
        if remat:
            saved_t = _forward_step(RT, bT, hsgT, saved_t, xp, mask, dtype)[1]
        ds_prev, dZ, dzg = _backward_step(Rl, hsgW, ds_hat + dy, saved_t, mask, dtype, one)
        if reset is not None:  # an episode's start: its state's cotangent goes to s0's
            ds0_restarts = ds0_restarts + jnp.where(reset[None, :], ds_prev, 0.0)
            ds_prev = jnp.where(reset[None, :], 0.0, ds_prev)
        s_in, s_prev, s_l = saved_t[0], saved_t[0][0], saved_t[3]
        return (ds_prev, ds0_restarts), (dZ, dzg, s_in, s_prev, s_l)

    restarts0 = None if resets is None else jnp.zeros_like(ds_T)
    (ds0, ds0_restarts), (dZ, dzg, S, s_prev, s_l) = jax.lax.scan(
        step, (ds_T, restarts0), (dys, x_proj, saved, resets), reverse=True, unroll=unroll
    )
    if ds0_restarts is not None:
        ds0 = ds0 + ds0_restarts

    # Weight gradients: one matmul per micro-layer over all T x B positions.
    def sum_outer(a, dz):  # sum_{t, b} a[t, ..., i, b] dz[t, ..., j, b] -> [..., i, j]
        return fastmath.einsum("t...ib,t...jb->...ij", a, dz, dtype)

    if loop:  # per-layer lists of [T, n, B] / [T, 2n, B]
        dR = jnp.stack([sum_outer(s * mask, dz) for s, dz in zip(S, dZ)])
        db, dz_first = jnp.stack([dz.sum(axis=(0, 2)) for dz in dZ]), dZ[0]
    else:  # [T, L, n, B] / [T, L, 2n, B]
        dR, db, dz_first = sum_outer(S * mask, dZ), dZ.sum(axis=(0, 3)), dZ[:, 0]
    d_hsg = None
    if hsg is not None:
        d_hsg = (sum_outer(s_prev, dzg), sum_outer(s_l, dzg), dzg.sum(axis=(0, 2)))
    return dR, db, d_hsg, ds0, dz_first, jnp.zeros_like(mask)


_unroll.defvjp(_unroll_fwd, _unroll_bwd)


def unroll_backward(R, b, hsg, x_proj, mask, saved, cotangents, *, dtype, loop, unroll=1):
    """This scan's hand-written backward pass (without remat) for a forward pass run
    elsewhere that saved what :func:`unroll`'s saves: the micro-layer kernels of
    :mod:`rhnzoo.cells.kernels.rhn`.

    Feature-major, as inside the scans: ``R [L, n, 2n]``, ``b [L, 2n]``, ``hsg`` = ``(W_R
    [n, n], W_F [n, n], b_G [n])`` or None, ``x_proj [T, 2n, B]``, ``mask [n, B]``;
    ``saved`` = ``(S, H, T, s_L, g)``: every micro-layer's input state, h and T gate (with
    ``loop`` lists of L ``[T, n, B]``, else ``[T, L, n, B]``), the RHN's output s_L and the
    HSG gate g, each ``[T, n, B]`` (without HSG, g is s_L again); ``cotangents`` =
    ``(ds_T [n, B], dys [T, n, B])``. ``dtype``: the matmul input dtype. Returns the
    cotangents of ``(R, b, hsg, s0 [n, B], x_proj, mask)`` (the mask's zero)."""
    return _backward(False, unroll, dtype, loop, (R, b, hsg, x_proj, mask, saved), cotangents)


def unroll(
    cell: Any,
    params: Any,
    carry: Array,
    xs: Array,
    mask: Array | None = None,
    opts: Options = DEFAULT_OPTIONS,
    *,
    lengths: Array | None = None,
    resets: Array | None = None,
) -> tuple[Array, Array | None]:
    """Drop-in replacement for :func:`rhnzoo.cells.unroll` for RHN and HSG(RHN); the
    dispatcher's ``fused`` backend for them (:mod:`rhnzoo.cells.scan`).

    Args:
      cell: a coupled :class:`~rhnzoo.cells.RHN`, or :class:`~rhnzoo.cells.HSG`
        around one.
      params: the cell's parameters.
      carry: ``[B, n]`` float32 initial state.
      xs: ``[T, B, m]`` inputs.
      mask: ``[B, n]`` recurrent dropout mask or ``None``.
      opts: the :class:`~rhnzoo.cells.scan_options.Options`:

        * ``dtype``: matmul input dtype (float32 or bfloat16); accumulation is float32.
          None: the inputs' own dtype throughout (float64 for exact comparisons).
        * ``unroll``: time steps per scan iteration (None: 1).
        * ``remat``: recompute each step's micro-layers in the backward pass.
        * ``outputs``: "all" (``ys [T, B, n]``), "last" (each row's output at its last
          real step, ``[B, n]``: the final carry, zeros for a row of length 0) or
          "none".
        * ``layer_loop`` (this scan's backend option): how a time step runs its L
          micro-layers: ``'scan'`` (``lax.scan`` over the stacked weights: compiles in
          about the same time at any depth), ``'python'`` (a loop over per-layer weights
          sliced once per call: faster steps at moderate depth, compile time growing
          with L); ``None`` (default): ``'python'`` up to depth
          :data:`LOOP_LAYERS_UP_TO`, ``'scan'`` above.

        The other fields have no effect here.
      lengths: optional ``[B]`` int real steps per row: every step runs, a row's final
        carry is its output at its last real step (its initial carry for a row of
        length 0) and padded outputs are zeros (:func:`with_lengths`; padded inputs must
        be finite).
      resets: optional ``[T, B]`` bool episode starts: where True, the row's state is
        its row of the initial ``carry`` before the step runs (as
        :func:`rhnzoo.cells.unroll`; padded steps ignore them).

    Returns:
      ``(carry [B, n], ys [T, B, n])``; ``(carry, last [B, n])`` with
      ``outputs="last"``; ``(carry, None)`` with ``outputs="none"``.

    Raises:
      ValueError: for an uncoupled RHN or any other cell, parameters not the cell's
        (:meth:`~rhnzoo.cells.RHN.check_params`), or ``resets`` that are not a ``[T, B]``
        bool array.
    """
    if resets is not None:
        resets = check_resets(resets, xs)
        if lengths is not None:  # padded steps ignore resets
            resets = resets & (jnp.arange(xs.shape[0])[:, None] < jnp.asarray(lengths)[None, :])
    carry_T, ys = _unroll_all(
        cell,
        params,
        carry,
        xs,
        mask,
        opts.unroll or 1,
        opts.remat,
        opts.dtype,
        opts.layer_loop,
        resets,
    )
    carry_T, ys = with_lengths(carry, carry_T, ys, lengths, opts.outputs == "all")
    return carry_T, last_real(carry_T, lengths, xs.shape[0]) if opts.outputs == "last" else ys


def _unroll_all(cell, params, carry, xs, mask, unroll, remat, dtype, layer_loop, resets):
    """Every step of ``xs`` (no lengths): ``(carry [B, n], ys [T, B, n])``."""
    hsg = None
    if isinstance(cell, HSG):
        hsg = (params["W_R"], params["W_F"], params["b_G"])
        cell, params = cell.cell, params["cell"]
    if not isinstance(cell, RHN) or not cell.coupled:
        raise ValueError(f"the fused unroll supports coupled RHN and HSG(RHN) cells, got {cell}")
    cell.check_params(params, xs.shape[-1])
    loop = layer_loop == "python" or (layer_loop is None and cell.depth <= LOOP_LAYERS_UP_TO)
    # The projection's backward under the same rule (bfloat16 inputs where the forward's are).
    x_proj = jnp.swapaxes(fastmath.project(xs, params["W"], dtype), 1, 2)  # [T, 2n, B]
    mask = jnp.ones_like(carry) if mask is None else mask
    s_T, ys = _unroll(
        params["R"], params["b"], hsg, carry.T, x_proj, mask.T, resets, remat, unroll, dtype, loop
    )
    return s_T.T, jnp.swapaxes(ys, 1, 2)


def with_lengths(
    carry0: Array, carry_T: Array, ys: Array, lengths: Array | None, outputs: bool = True
) -> tuple[Array, Array | None]:
    """An RHN scan's result ``(carry_T [B, n], ys [T, B, n])`` (this module's
    :func:`unroll`, :func:`rhnzoo.cells.kernels.rhn.unroll`: every step run) with
    ``lengths [B]`` int real steps per row (None: all T): the RHN's carry is its output,
    so a row's final carry is its output at its last real step (``carry0 [B, n]``, the
    initial carry, for an empty row) and padded outputs are zeros; the padded steps get
    zero cotangents. With ``outputs`` False ``ys`` is None."""
    if lengths is None:
        return carry_T, ys if outputs else None
    T, B = ys.shape[:2]
    lengths = jnp.asarray(lengths)
    last = ys[jnp.clip(lengths - 1, 0, T - 1), jnp.arange(B)]
    carry_T = jnp.where((lengths > 0)[:, None], last, carry0).astype(carry_T.dtype)
    if not outputs:
        return carry_T, None
    valid = jnp.arange(T)[:, None] < lengths[None, :]
    return carry_T, jnp.where(valid[..., None], ys, jnp.zeros((), ys.dtype))
