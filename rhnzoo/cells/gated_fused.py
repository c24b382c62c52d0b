"""Fast unrolls of the gated cells (LSTM, SC-LSTM, GRU, RRN, Parallel) with a
hand-written backward pass.

Same mathematics as the cells' ``step`` functions (:mod:`rhnzoo.cells.lstm`,
:mod:`rhnzoo.cells.residual`) run by :func:`rhnzoo.cells.unroll`, tested against them
(values and gradients, with and without ``lengths``), but faster to train, as
:mod:`rhnzoo.cells.rhn_fused` is for the RHN. Under plain autodiff of ``lax.scan``
every time step adds a rank-B outer product into the recurrent weight gradient
(``dU += h_{t-1}^T dz_t``), streaming the ``[n, k n]`` accumulator through memory T
times. Here the forward scan keeps what the backward pass needs (the state entering
each step and the gate values), the backward scan runs the recurrence once in reverse
for the state cotangents only and emits the pre-activation gradients dz_t, and the
weight gradients are formed afterwards as one large matmul over all T x B positions::

    dU = sum_t (h_{t-1} m)^T dz_t        one [n, T B] x [T B, k n] matmul
    db = sum_t sum_b dz_t                one reduction
    dW = sum_t x_t^T dz_t                one matmul (or autodiff of x W outside the scan)

(Wang & Tian 2016, eqs. 1, 3-5 and Cho et al. 2014, eqs. 5-8, differentiated; the
derivatives are written out in each kernel below.)

Variable-length batches follow :func:`rhnzoo.cells.unroll`'s ``lengths`` semantics
exactly: padded steps keep the carry and output zeros (their cotangents pass through
unchanged and contribute nothing to the weight gradients). The recurrent dropout mask
is a constant here: it receives a zero gradient.

Options: ``project_per_step=True`` computes W x_t inside the scan (for 1-wide inputs,
an outer product: no ``[T, B, k n]`` projection is written in the forward pass);
``weight_grads_in_scan=True`` sums the weight gradients inside the reverse scan instead
(rank-B updates, as autodiff does: faster for small n, whose accumulator stays in cache;
by default chosen with ``project_per_step``, except for the GRU, measured in
BUILD_NOTES.md issue 17);
``dtype=jnp.bfloat16`` runs every matmul with bfloat16 inputs and float32 accumulation
(``preferred_element_type``), keeping parameters, state and gate arithmetic in
float32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells.lstm import GRU, LSTM, SCLSTM, SCLSTMState
from rhnzoo.cells.residual import RRN, Parallel

Array = jax.Array


def _dot(a: Array, b: Array, dtype: Any) -> Array:
    """``a @ b``; with ``dtype`` set, inputs cast to it and float32 accumulation."""
    if dtype is None:
        return a @ b
    return jnp.dot(a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _outer_sum(a: Array, b: Array, dtype: Any) -> Array:
    """``sum_{t,b} a[t,b,:]^T b[t,b,:]``: ``[T, B, i] x [T, B, j] -> [i, j]``, one matmul
    over all T x B positions."""
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return _dot(a2.T, b2, dtype).astype(b.dtype)


def _masked(h: Array, mask: Array | None) -> Array:
    return h if mask is None else h * mask


# ------------------------------------------------------------------------------ kernels
#
# A kernel is a static (hashable) description of one cell's time step:
#   forward(w, carry, xp, aux_t, mask) -> (new carry, output y, saved)
#   backward(w, dcarry, dy, saved, aux_t, mask) -> (dcarry_prev, dz, extra)
#   weight_grads(w, saved [T, ...], dZ [T, B, k], extra [T, ...], mask) -> dw
# where xp is the step's input projection W x_t ([B, k]) and dz its cotangent. The
# driver (_scan) applies the padding masks around both.


@dataclasses.dataclass(frozen=True)
class _LSTMKernel:
    """LSTM (Wang & Tian eq. 1), optionally with SC-LSTM skips (eq. 5).

    Carry ``(h, c)`` or, with skips, ``(h, c, h_anchor)`` (the step counter is turned
    into the per-step ``aux`` flags ``on_grid`` / ``skipped`` outside the scan).
    Saved per step: h_{t-1}, c_{t-1}, the gates i | f | o | c̃ (and h_anchor when α is
    learned).
    """

    n: int
    dtype: Any
    skip: bool = False
    learn_alpha: bool = False

    def forward(self, w, carry, xp, aux, mask):
        n = self.n
        h, c = carry[0], carry[1]
        z = xp + _dot(_masked(h, mask), w["U"], self.dtype) + w["b"]
        sig = jax.nn.sigmoid(z[:, : 3 * n])
        i, f, o = (sig[:, k * n : (k + 1) * n] for k in range(3))
        g = jnp.tanh(z[:, 3 * n :])
        c_new = f * c + i * g
        h_new = o * jnp.tanh(c_new)
        saved = {"h": h, "c": c, "i": i, "f": f, "o": o, "g": g}
        if not self.skip:
            return (h_new, c_new), h_new, saved
        anchor = carry[2]
        alpha = w["alpha"] if self.learn_alpha else 1.0
        h_new = jnp.where(aux["skipped"][:, None], h_new + alpha * anchor, h_new)
        anchor_new = jnp.where(aux["on_grid"][:, None], h_new, anchor)
        if self.learn_alpha:
            saved["anchor"] = anchor
        return (h_new, c_new, anchor_new), h_new, saved

    def backward(self, w, dcarry, dy, saved, aux, mask):
        n = self.n
        dh, dc = dcarry[0] + dy, dcarry[1]
        extra = None
        if self.skip:
            # anchor' = on_grid ? h' : anchor;  h' = h_lstm + skipped α anchor.
            on_grid, skipped = aux["on_grid"][:, None], aux["skipped"][:, None]
            danchor = dcarry[2]
            dh = dh + jnp.where(on_grid, danchor, 0.0)
            alpha = w["alpha"] if self.learn_alpha else 1.0
            danchor_prev = jnp.where(on_grid, 0.0, danchor) + jnp.where(skipped, alpha * dh, 0.0)
            if self.learn_alpha:
                extra = jnp.where(skipped, dh * saved["anchor"], 0.0).sum(axis=-1)  # [B]
        h, c, i, f, o, g = (saved[k] for k in "h c i f o g".split())
        tc = jnp.tanh(f * c + i * g)
        dc = dc + dh * o * (1 - tc * tc)
        dz = jnp.concatenate(
            [dc * g * i * (1 - i), dc * c * f * (1 - f), dh * tc * o * (1 - o), dc * i * (1 - g * g)],
            axis=-1,
        )
        dh_prev = _masked(_dot(dz, w["U"].T, self.dtype).astype(dh.dtype), mask)
        dcarry_prev = (dh_prev, dc * f) + ((danchor_prev,) if self.skip else ())
        return dcarry_prev, dz, extra

    def weight_grads(self, w, saved, dZ, extra, mask):
        dw = {"U": _outer_sum(_masked(saved["h"], mask), dZ, self.dtype), "b": dZ.sum(axis=(0, 1))}
        if self.learn_alpha:
            dw["alpha"] = extra.sum().astype(w["alpha"].dtype)
        return dw


@dataclasses.dataclass(frozen=True)
class _GRUKernel:
    """GRU (Cho et al. 2014, eqs. 5-8). Saved per step: h_{t-1}, r | z, h̃."""

    n: int
    dtype: Any

    def forward(self, w, h, xp, aux, mask):
        n, U = self.n, w["U"]
        xp = xp + w["b"]
        hm = _masked(h, mask)
        rz = jax.nn.sigmoid(xp[:, : 2 * n] + _dot(hm, U[:, : 2 * n], self.dtype))
        r, z = rz[:, :n], rz[:, n:]
        ht = jnp.tanh(xp[:, 2 * n :] + _dot(r * hm, U[:, 2 * n :], self.dtype))
        h_new = ht + z * (h - ht)
        return h_new, h_new, {"h": h, "r": r, "z": z, "ht": ht}

    def backward(self, w, dh, dy, saved, aux, mask):
        n, U = self.n, w["U"]
        h, r, z, ht = saved["h"], saved["r"], saved["z"], saved["ht"]
        hm = _masked(h, mask)
        dh = dh + dy
        dp_h = dh * (1 - z) * (1 - ht * ht)  # eq. 8's pre-activation
        da = _dot(dp_h, U[:, 2 * n :].T, self.dtype).astype(dh.dtype)  # a = r ⊙ h m
        dp_rz = jnp.concatenate([da * hm * r * (1 - r), dh * (h - ht) * z * (1 - z)], axis=-1)
        dhm = da * r + _dot(dp_rz, U[:, : 2 * n].T, self.dtype).astype(dh.dtype)
        dh_prev = dh * z + _masked(dhm, mask)
        return dh_prev, jnp.concatenate([dp_rz, dp_h], axis=-1), None

    def weight_grads(self, w, saved, dZ, extra, mask):
        n = self.n
        hm = _masked(saved["h"], mask)
        dU_rz = _outer_sum(hm, dZ[..., : 2 * n], self.dtype)
        dU_h = _outer_sum(saved["r"] * hm, dZ[..., 2 * n :], self.dtype)
        return {"U": jnp.concatenate([dU_rz, dU_h], axis=-1), "b": dZ.sum(axis=(0, 1))}


@dataclasses.dataclass(frozen=True)
class _RRNKernel:
    """RRN (Wang & Tian eqs. 3-4), K layers. Saved per step: h_{t-1} and y_1..y_K."""

    n: int
    depth: int
    activation: str
    dtype: Any

    def _act(self, x):
        return jax.nn.sigmoid(x) if self.activation == "sigmoid" else jnp.tanh(x)

    def _dact(self, y):  # the activation's derivative from its output
        return y * (1 - y) if self.activation == "sigmoid" else 1 - y * y

    def forward(self, w, h, xp, aux, mask):
        n, U = self.n, w["U"]
        xp = xp + w["b"]
        y = self._act(xp[:, :n] + _dot(_masked(h, mask), U[0], self.dtype))
        ys = [y]
        for k in range(1, self.depth):
            y = self._act(xp[:, k * n : (k + 1) * n] + _dot(y, U[k], self.dtype))
            ys.append(y)
        h_new = jnp.tanh(h + y)
        return h_new, h_new, {"h": h, "y": jnp.stack(ys)}

    def backward(self, w, dh, dy, saved, aux, mask):
        U, Y = w["U"], saved["y"]
        h_new = jnp.tanh(saved["h"] + Y[-1])
        dpre = (dh + dy) * (1 - h_new * h_new)  # eq. 3's pre-activation
        dys, dzs = dpre, []
        for k in range(self.depth - 1, -1, -1):
            dz = dys * self._dact(Y[k])
            dzs.append(dz)
            dys = _dot(dz, U[k].T, self.dtype).astype(dpre.dtype)
        return dpre + _masked(dys, mask), jnp.concatenate(dzs[::-1], axis=-1), None

    def weight_grads(self, w, saved, dZ, extra, mask):
        n, K = self.n, self.depth
        ins = [_masked(saved["h"], mask)] + [saved["y"][:, k] for k in range(K - 1)]
        dU = jnp.stack([_outer_sum(ins[k], dZ[..., k * n : (k + 1) * n], self.dtype)
                        for k in range(K)])  # fmt: skip
        return {"U": dU, "b": dZ.sum(axis=(0, 1))}


# ------------------------------------------------------------------------------ driver


def _project_step(W, x_t, dtype):
    """W x_t for one step: an outer product for a 1-wide input (no matmul)."""
    if W.shape[0] == 1:
        return x_t * W[0]
    return _dot(x_t, W, dtype).astype(x_t.dtype)


def _run(kern, unroll, w, W, carry0, xs, aux, mask):
    def step(carry, inputs):
        x_t, aux_t = inputs
        xp = x_t if W is None else _project_step(W, x_t, kern.dtype)
        new, y, saved = kern.forward(w, carry, xp, aux_t, mask)
        v = aux_t.get("valid")
        if v is not None:
            v = v[:, None]
            new = jax.tree.map(lambda a, b: jnp.where(v, a, b), new, carry)
            y = jnp.where(v, y, 0.0)
        return new, (y, saved)

    carry_T, (ys, saved) = jax.lax.scan(step, carry0, (xs, aux), unroll=unroll)
    return (carry_T, ys), saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _scan(kern, unroll, in_scan, w, W, carry0, xs, aux, mask):
    return _run(kern, unroll, w, W, carry0, xs, aux, mask)[0]


def _scan_fwd(kern, unroll, in_scan, w, W, carry0, xs, aux, mask):
    out, saved = _run(kern, unroll, w, W, carry0, xs, aux, mask)
    return out, (w, W, xs, aux, mask, saved)


def _scan_bwd(kern, unroll, in_scan, res, cotangents):
    w, W, xs, aux, mask, saved = res
    dcarry_T, dys = cotangents
    if in_scan:
        return _scan_bwd_accumulating(kern, unroll, w, W, xs, aux, mask, saved, dcarry_T, dys)

    def step(dcarry, inputs):
        dy, saved_t, aux_t = inputs
        dprev, dz, extra = kern.backward(w, dcarry, dy, saved_t, aux_t, mask)
        v = aux_t.get("valid")
        if v is not None:  # padded steps: the carry's cotangent passes through
            dprev = jax.tree.map(lambda a, b: jnp.where(v[:, None], a, b), dprev, dcarry)
            dz = jnp.where(v[:, None], dz, 0.0)
            extra = None if extra is None else jnp.where(v, extra, 0.0)
        return dprev, (dz, extra)

    dcarry0, (dZ, extra) = jax.lax.scan(step, dcarry_T, (dys, saved, aux), reverse=True,
                                        unroll=unroll)  # fmt: skip
    dw = kern.weight_grads(w, saved, dZ, extra, mask)
    if W is None:
        dW, dxs = None, dZ
    elif W.shape[0] == 1:
        dW = jnp.einsum("tbo,tbk->ok", xs, dZ)
        dxs = jnp.einsum("tbk,ok->tbo", dZ, W)
    else:
        dW = _outer_sum(xs, dZ, kern.dtype).astype(W.dtype)
        dxs = _dot(dZ, W.T, kern.dtype).astype(xs.dtype)
    dmask = None if mask is None else jnp.zeros_like(mask)
    return dw, dW, dcarry0, dxs, None, dmask


def _scan_bwd_accumulating(kern, unroll, w, W, xs, aux, mask, saved, dcarry_T, dys):
    """The backward pass with the weight gradients summed inside the reverse scan (a
    rank-B update per step, as autodiff does) and no ``[T, B, k n]`` cotangent written:
    for small n (with ``W`` None, the projection's cotangent dz is still written)."""
    first = lambda t: jax.tree.map(lambda a: a[None], t)

    def step(carry, inputs):
        dcarry, dw, dW = carry
        dy, saved_t, aux_t, x_t = inputs
        dprev, dz, extra = kern.backward(w, dcarry, dy, saved_t, aux_t, mask)
        v = aux_t.get("valid")
        if v is not None:
            dprev = jax.tree.map(lambda a, b: jnp.where(v[:, None], a, b), dprev, dcarry)
            dz = jnp.where(v[:, None], dz, 0.0)
            extra = None if extra is None else jnp.where(v, extra, 0.0)
        dw_t = kern.weight_grads(w, first(saved_t), dz[None], None if extra is None else
                                 extra[None], mask)  # fmt: skip
        dw = jax.tree.map(jnp.add, dw, dw_t)
        if W is None:  # the projection was done before the scan: its cotangent is dz
            dx = dz
        elif W.shape[0] == 1:
            dW, dx = dW + jnp.sum(x_t * dz, axis=0, keepdims=True), dz @ W[0][:, None]
        else:
            dW = dW + _dot(x_t.T, dz, kern.dtype).astype(W.dtype)
            dx = _dot(dz, W.T, kern.dtype).astype(x_t.dtype)
        return (dprev, dw, dW), dx

    zeros = (dcarry_T, jax.tree.map(jnp.zeros_like, w), None if W is None else jnp.zeros_like(W))
    (dcarry0, dw, dW), dxs = jax.lax.scan(step, zeros, (dys, saved, aux, xs), reverse=True,
                                          unroll=unroll)  # fmt: skip
    return dw, dW, dcarry0, dxs, None, None if mask is None else jnp.zeros_like(mask)


_scan.defvjp(_scan_fwd, _scan_bwd)


def supports(cell: Any) -> bool:
    """Whether :func:`unroll` has a fused path for ``cell``: LSTM, GRU, SC-LSTM, RRN,
    and Parallel of those."""
    if isinstance(cell, Parallel):
        return all(supports(c) for c in cell.cells)
    return isinstance(cell, (LSTM, GRU, SCLSTM, RRN))


def unroll(
    cell: Any,
    params: Any,
    carry: Any,
    xs: Array,
    mask: Array | None = None,
    *,
    lengths: Array | None = None,
    unroll: int = 1,
    project_per_step: bool = False,
    dtype: Any = None,
    weight_grads_in_scan: bool | None = None,
) -> tuple[Any, Array]:
    """Drop-in replacement for :func:`rhnzoo.cells.unroll` for the gated cells.

    Args:
      cell: :class:`~rhnzoo.cells.LSTM`, :class:`~rhnzoo.cells.GRU`,
        :class:`~rhnzoo.cells.SCLSTM` (I or P), :class:`~rhnzoo.cells.RRN` (any depth
        and activation), or :class:`~rhnzoo.cells.Parallel` of these (each part is
        unrolled by its own fused scan; the output is their mean, HRL eq. 7).
      params: the cell's parameters (``cell.init``).
      carry: the initial carry (``cell.initial_carry(B)``), float32 or float64.
      xs: ``[T, B, m]`` float inputs, time-major.
      mask: ``[B, n]`` recurrent dropout mask or ``None``; treated as a constant (zero
        gradient).
      lengths: optional ``[B]`` int real steps per row: padded steps keep the carry and
        output zeros (as :func:`rhnzoo.cells.unroll`).
      unroll: time steps per scan iteration, forward and backward.
      project_per_step: compute W x_t inside the scan (an outer product when m = 1)
        instead of one ``[T, B, k n]`` projection before it.
      dtype: ``None`` (matmuls in the carry's dtype) or ``jnp.bfloat16`` (bf16 matmul
        inputs, float32 accumulation; state, parameters and gates stay float32).
      weight_grads_in_scan: sum the recurrent weight gradients inside the reverse scan
        (a rank-B update per step, like autodiff) instead of forming them as one matmul
        over all positions afterwards: faster for small n, where the accumulator stays
        in cache; with ``project_per_step`` no ``[T, B, k n]`` cotangent is written.
        ``None`` (default): in the scan when ``project_per_step``, except for the GRU
        (whose per-step update of two weight blocks measured slower than one matmul).

    Returns:
      ``(carry, ys [T, B, n])``, as :func:`rhnzoo.cells.unroll`.

    Raises:
      ValueError: for a cell without a fused path (see :func:`supports`).
    """
    kw = dict(lengths=lengths, unroll=unroll, project_per_step=project_per_step, dtype=dtype,
              weight_grads_in_scan=weight_grads_in_scan)  # fmt: skip
    if isinstance(cell, Parallel):
        outs = [globals()["unroll"](c, p, k, xs, mask, **kw)
                for c, p, k in zip(cell.cells, params, carry)]  # fmt: skip
        return tuple(o[0] for o in outs), sum(o[1] for o in outs) / len(outs)
    if not supports(cell):
        raise ValueError(f"no fused unroll for {cell!r}; use rhnzoo.cells.unroll")
    T = xs.shape[0]
    n = cell.hidden_size
    cdt = (carry.h if isinstance(cell, SCLSTM) else jax.tree.leaves(carry)[0]).dtype
    w = {k: v.astype(cdt) for k, v in params.items() if k != "W"}
    xs = xs.astype(cdt)
    aux = {}
    if lengths is not None:
        aux["valid"] = jnp.arange(T)[:, None] < jnp.asarray(lengths)[None, :]
    if isinstance(cell, SCLSTM):
        kern = _LSTMKernel(n, dtype, skip=True, learn_alpha=cell.learn_alpha)
        # τ - 1 of every row at every step; padded steps (after the row's end) are masked.
        t = carry.t[None, :] + jnp.arange(T, dtype=carry.t.dtype)[:, None]
        on_grid = t % cell.skip == 0
        if lengths is not None:
            on_grid = on_grid & aux["valid"]
        aux.update(on_grid=on_grid, skipped=on_grid & (t > 0))
        carry0 = (carry.h, carry.c, carry.h_anchor)
    elif isinstance(cell, LSTM):
        kern, carry0 = _LSTMKernel(n, dtype), tuple(carry)
    elif isinstance(cell, GRU):
        kern, carry0 = _GRUKernel(n, dtype), carry
    else:
        kern, carry0 = _RRNKernel(n, cell.depth, cell.activation, dtype), carry
    W = params["W"].astype(cdt)
    if project_per_step:
        x_in = xs
    else:
        x_in, W = _dot(xs, W, dtype).astype(cdt), None
    if weight_grads_in_scan is None:  # measured at P-MNIST's shape (BUILD_NOTES issue 17)
        weight_grads_in_scan = project_per_step and not isinstance(kern, _GRUKernel)
    in_scan = bool(weight_grads_in_scan)
    carry_T, ys = _scan(kern, unroll, in_scan, w, W, carry0, x_in, aux, mask)
    if isinstance(cell, SCLSTM):
        steps = T if lengths is None else jnp.sum(aux["valid"], axis=0).astype(carry.t.dtype)
        carry_T = SCLSTMState(*carry_T, carry.t + steps)
    elif isinstance(cell, LSTM):
        carry_T = type(carry)(*carry_T)
    return carry_T, ys
