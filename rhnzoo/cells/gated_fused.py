"""Fast unrolls of the gated cells (LSTM, SC-LSTM, GRU in both variants, RRN,
Parallel) with a hand-written backward pass.

Same mathematics as the cells' ``step`` functions (:mod:`rhnzoo.cells.lstm`,
:mod:`rhnzoo.cells.residual`) run by :func:`rhnzoo.cells.unroll`, tested against them
(values and gradients, with ``lengths`` and ``resets``), but faster to train, as
:mod:`rhnzoo.cells.rhn_fused` is for the RHN. The forward scan saves each step's
entering state and gate values; the reverse scan carries only the state cotangents and
emits the pre-activation gradients dz_t; the weight gradients are large matmuls over
many T x B positions at once::

    dU = sum_t (h_{t-1} m)^T dz_t        one [n, C B] x [C B, k n] matmul per chunk
    db = sum_t sum_b dz_t                one reduction
    dW = sum_t x_t^T dz_t                likewise (or autodiff of x W outside the scan)

a chunk being C consecutive steps (``weight_grad_chunk``). The gate math and derivative
coefficients (Wang & Tian 2016, eqs. 1, 3-5; Cho et al. 2014, eqs. 5-8; the reset-after
GRU) are the cells' modules' (:func:`rhnzoo.cells.lstm.lstm_coefficients` and the like),
shared with the Pallas kernels; σ and tanh are :mod:`rhnzoo.cells.fastmath`'s. Inside
the scans every per-step array is feature-major, ``[features, B]``; :func:`unroll`
takes and returns batch-major arrays. The recurrent dropout mask is a constant (zero
gradient). Design and measurements: BUILD_NOTES.md, "Gated fused scans"; docs/speed.md,
"The fused scans".
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from rhnzoo.cells import base, fastmath
from rhnzoo.cells.scan_options import DEFAULT_OPTIONS, Options, last_real, platform
from rhnzoo.cells.lstm import (
    GRU,
    LSTM,
    SCLSTM,
    SCLSTMState,
    check_params,
    gru_coefficients,
    gru_reset_after_coefficients,
    gru_reset_after_gates,
    lstm_coefficients,
    lstm_gates,
)
from rhnzoo.cells.residual import RRN, Parallel, rrn_coefficients

Array = jax.Array


# Every matmul below: with ``dtype`` set (bfloat16), inputs cast to it (_cast) and float32
# accumulation (_acc); with None, in the inputs' own dtype (:mod:`rhnzoo.cells.fastmath`).
_cast, _acc, _dot, _einsum = fastmath.cast, fastmath.accumulation, fastmath.dot, fastmath.einsum


def _masked(h: Array, mask: Array | None) -> Array:
    return h if mask is None else h * mask


# The GRU and RRN scans pad B to a multiple of 8 columns (AVX2's float32 width; a
# kernel's ``lanes``) where that adds at most B / 16, so each elementwise pass vectorises
# without a remainder (measured: docs/runs/cpu/levers.md; the LSTMs were not faster).
# The extra columns are inert: zero inputs and carry, and no cotangent reaches them.


def _pad(a: Array, extra: int, axis: int) -> Array:
    """``a`` with ``extra`` zero (False) entries appended along ``axis``."""
    if not extra:
        return a
    return jnp.pad(a, [(0, extra if i == axis else 0) for i in range(a.ndim)])


# ------------------------------------------------------------------------------ kernels
#
# Feature-major: the carry is h^T, the pre-activations z^T = U^T h^T + W^T x_t^T + b,
# the gate blocks contiguous row blocks. Why: XLA:CPU's matmul library re-packs its
# right-hand operand on every call, which with the batch on the left (h U) is the whole
# [n, k n] weight matrix, every step (docs/runs/cpu/levers.md).
#
# A kernel is a static (hashable) description of one cell's time step:
#   prepare(w) -> p: the weights as the step uses them (transposed once per call)
#   forward(p, carry, xp, aux_t, mask) -> (new carry, output y, saved)
#   backward(p, dcarry, dy, saved, aux_t, mask) -> (dcarry_prev, dz, extra)
#   weight_grads(w, saved [C, ...], dZ [k n + e, C B], extra [C, ...], mask) -> dw, the
#     weight gradients of C consecutive steps (a chunk, see _scan_bwd)
#   lanes: the batch columns are padded to a multiple of this, where cheap (see _pad)
#   extra_dz_rows: e, rows of dz after xp's cotangent (0 but for the reset-after GRU)
# where xp is the step's input projection W^T x_t^T ([k n, B]) and dz's first k n rows
# its cotangent (any e further rows are the kernel's own, for its weight gradients);
# ``aux_t`` holds [B] per-row flags and ``mask`` is [n, B]. The driver (_scan) applies
# the padding masks around both.


def _outer_sum(a: Array, dZ: Array, dtype: Any) -> Array:
    """``sum_{t,b} a[t,:,b] dZ[:,t B + b]^T``: ``[C, i, B] x [j, C B] -> [i, j]``, one
    matmul over all C x B positions (``a``, the smaller operand, is transposed)."""
    a = jnp.swapaxes(a, 0, 1).reshape(a.shape[1], -1)
    out = jax.lax.dot_general(
        _cast(a, dtype),
        _cast(dZ, dtype),
        (((1,), (1,)), ((), ())),
        preferred_element_type=_acc(dtype),
    )
    return out.astype(dZ.dtype)


def _rows(blocks: list[Array]) -> Array:
    """Row blocks ``[n_i, B]`` -> one ``[sum n_i, B]`` array, written block by block
    (``dynamic_update_slice``): XLA:CPU fuses a ``jnp.concatenate``'s elementwise inputs
    into it unvectorised, several times slower (docs/runs/cpu/levers.md)."""
    out = jnp.zeros((sum(b.shape[0] for b in blocks),) + blocks[0].shape[1:], blocks[0].dtype)
    start = 0
    for b in blocks:
        out = jax.lax.dynamic_update_slice_in_dim(out, b, start, axis=0)
        start += b.shape[0]
    return out


def _plus(d: Array, dy: Array | None) -> Array:
    return d if dy is None else d + dy


def _bias(b: Array) -> Array:
    return b[:, None]  # [k n] -> [k n, 1], broadcast over the batch columns


@dataclasses.dataclass(frozen=True)
class _LSTMKernel:
    """LSTM (Wang & Tian eq. 1), optionally with SC-LSTM skips (eq. 5).

    Carry ``(h, c)`` or, with skips, ``(h, c, h_anchor)`` (the step counter becomes the
    ``aux`` flags ``on_grid`` / ``skipped`` outside the scan). Saved per step: h_{t-1},
    c_{t-1} and i, f, o, c̃, each its own [n, B] stack (one [4n, B] stack measured
    slower), and h_anchor when α is learned.
    """

    n: int
    dtype: Any
    skip: bool = False
    learn_alpha: bool = False
    lanes: ClassVar[int] = 1
    extra_dz_rows: ClassVar[int] = 0

    def prepare(self, w):  # matmul weights cast once per call, not once per step
        U = _cast(w["U"], self.dtype)
        p = {"UT": U.T, "U": U, "b": _bias(w["b"])}
        if self.learn_alpha:
            p["alpha"] = w["alpha"]
        return p

    def forward(self, p, carry, xp, aux, mask):
        h, c = carry[0], carry[1]
        z = xp + _dot(p["UT"], _masked(h, mask), self.dtype) + p["b"]
        i, f, o, g = lstm_gates(z, axis=0, sigmoid=fastmath.sigmoid, tanh=fastmath.tanh)
        c_new = f * c + i * g
        h_new = o * fastmath.tanh(c_new)
        saved = {"h": h, "c": c, "i": i, "f": f, "o": o, "g": g}
        if not self.skip:
            return (h_new, c_new), h_new, saved
        anchor = carry[2]
        alpha = p["alpha"] if self.learn_alpha else 1.0
        h_new = jnp.where(aux["skipped"][None, :], h_new + alpha * anchor, h_new)
        anchor_new = jnp.where(aux["on_grid"][None, :], h_new, anchor)
        if self.learn_alpha:
            saved["anchor"] = anchor
        return (h_new, c_new, anchor_new), h_new, saved

    def backward(self, p, dcarry, dy, saved, aux, mask):
        dh, dc = _plus(dcarry[0], dy), dcarry[1]
        extra = None
        if self.skip:
            # anchor' = on_grid ? h' : anchor;  h' = h_lstm + skipped α anchor.
            on_grid, skipped = aux["on_grid"][None, :], aux["skipped"][None, :]
            danchor = dcarry[2]
            dh = dh + jnp.where(on_grid, danchor, 0.0)
            alpha = p["alpha"] if self.learn_alpha else 1.0
            danchor_prev = jnp.where(on_grid, 0.0, danchor) + jnp.where(skipped, alpha * dh, 0.0)
            if self.learn_alpha:
                extra = jnp.where(skipped, dh * saved["anchor"], 0.0).sum(axis=0)  # [B]
        c, i, f, o, g = (saved[k] for k in "c i f o g".split())
        co = lstm_coefficients(i, f, o, g, c, fastmath.tanh(f * c + i * g))
        dc = dc + dh * co.dh_dc
        dz = _rows([dc * co.dc_dzi, dc * co.dc_dzf, dh * co.dh_dzo, dc * co.dc_dzc])
        dh_prev = _masked(_dot(p["U"], dz, self.dtype).astype(dh.dtype), mask)
        dcarry_prev = (dh_prev, dc * f) + ((danchor_prev,) if self.skip else ())
        return dcarry_prev, dz, extra

    def weight_grads(self, w, saved, dZ, extra, mask):
        dw = {"U": _outer_sum(_masked(saved["h"], mask), dZ, self.dtype), "b": dZ.sum(axis=1)}
        if self.learn_alpha:
            dw["alpha"] = extra.sum().astype(w["alpha"].dtype)
        return dw


@dataclasses.dataclass(frozen=True)
class _GRUKernel:
    """GRU (Cho et al. 2014, eqs. 5-8). Saved per step: h_{t-1}, r | z, h̃."""

    n: int
    dtype: Any
    lanes: ClassVar[int] = 8
    extra_dz_rows: ClassVar[int] = 0

    def prepare(self, w):
        U, n = _cast(w["U"], self.dtype), self.n
        U_rz, U_h = U[:, : 2 * n], U[:, 2 * n :]
        return {"UT_rz": U_rz.T, "UT_h": U_h.T, "U_rz": U_rz, "U_h": U_h, "b": _bias(w["b"])}

    def forward(self, p, h, xp, aux, mask):
        n = self.n
        xp = xp + p["b"]
        hm = _masked(h, mask)
        rz = fastmath.sigmoid(xp[: 2 * n] + _dot(p["UT_rz"], hm, self.dtype))
        r, z = rz[:n], rz[n:]
        ht = fastmath.tanh(xp[2 * n :] + _dot(p["UT_h"], r * hm, self.dtype))
        h_new = ht + z * (h - ht)
        return h_new, h_new, {"h": h, "rz": rz, "ht": ht}

    def backward(self, p, dh, dy, saved, aux, mask):
        n = self.n
        h, rz, ht = saved["h"], saved["rz"], saved["ht"]
        r, z = rz[:n], rz[n:]
        hm = _masked(h, mask)
        dh = _plus(dh, dy)
        co = gru_coefficients(r, z, ht, h, hm)
        dp_h = dh * co.dh_dzh  # eq. 8's pre-activation
        da = _dot(p["U_h"], dp_h, self.dtype).astype(dh.dtype)  # a = r ⊙ h m
        dp_rz = _rows([da * co.da_dzr, dh * co.dh_dzz])
        dhm = da * r + _dot(p["U_rz"], dp_rz, self.dtype).astype(dh.dtype)
        dh_prev = dh * z + _masked(dhm, mask)
        return dh_prev, _rows([dp_rz, dp_h]), None

    def weight_grads(self, w, saved, dZ, extra, mask):
        n = self.n
        hm = _masked(saved["h"], mask)
        dU_rz = _outer_sum(hm, dZ[: 2 * n], self.dtype)
        dU_h = _outer_sum(saved["rz"][:, :n] * hm, dZ[2 * n :], self.dtype)
        return {"U": jnp.concatenate([dU_rz, dU_h], axis=-1), "b": dZ.sum(axis=1)}


@dataclasses.dataclass(frozen=True)
class _GRUResetAfterKernel:
    """The reset-after GRU (``GRU(reset_after=True)``; one [3n, n] x [n, B] matmul per
    step): :func:`~rhnzoo.cells.lstm.gru_reset_after_gates` and
    :class:`~rhnzoo.cells.lstm.GRUResetAfterCoefficients`. xp's (and b's) cotangent is
    [dz_r; dz_z; dz_h̃], U's and b_hn's [dz_r; dz_z; dg], so dz carries both,
    ``[dz_r; dz_z; dz_h̃; dg]`` (``extra_dz_rows`` = n). Saved per step: h_{t-1}, r, z,
    h̃ and g.
    """

    n: int
    dtype: Any
    lanes: ClassVar[int] = 8

    @property
    def extra_dz_rows(self) -> int:
        return self.n

    def prepare(self, w):
        U, n = _cast(w["U"], self.dtype), self.n
        return {
            "UT": U.T,
            "U_rz": U[:, : 2 * n],
            "U_h": U[:, 2 * n :],
            "b": _bias(w["b"]),
            "b_hn": _bias(w["b_hn"]),
        }

    def forward(self, p, h, xp, aux, mask):
        xp = xp + p["b"]
        a = _dot(p["UT"], _masked(h, mask), self.dtype).astype(h.dtype)
        r, z, g, ht = gru_reset_after_gates(
            xp, a, p["b_hn"], axis=0, sigmoid=fastmath.sigmoid, tanh=fastmath.tanh
        )
        h_new = ht + z * (h - ht)
        return h_new, h_new, {"h": h, "r": r, "z": z, "ht": ht, "g": g}

    def backward(self, p, dh, dy, saved, aux, mask):
        n = self.n
        h, r, z, ht, g = saved["h"], saved["r"], saved["z"], saved["ht"], saved["g"]
        dh = _plus(dh, dy)
        co = gru_reset_after_coefficients(r, z, g, ht, h)
        dg = dh * co.dh_dg
        dz = _rows([dh * co.dh_dzr, dh * co.dh_dzz, dh * co.dh_dzh, dg])
        dhm = _dot(p["U_rz"], dz[: 2 * n], self.dtype) + _dot(p["U_h"], dg, self.dtype)
        return dh * z + _masked(dhm.astype(dh.dtype), mask), dz, None

    def weight_grads(self, w, saved, dZ, extra, mask):
        n = self.n
        hm = _masked(saved["h"], mask)
        dU_rz = _outer_sum(hm, dZ[: 2 * n], self.dtype)
        dU_h = _outer_sum(hm, dZ[3 * n :], self.dtype)
        return {
            "U": jnp.concatenate([dU_rz, dU_h], axis=-1),
            "b": dZ[: 3 * n].sum(axis=1),
            "b_hn": dZ[3 * n :].sum(axis=1),
        }


@dataclasses.dataclass(frozen=True)
class _RRNKernel:
    """RRN (Wang & Tian eqs. 3-4), K layers. Saved per step: h_{t-1} and y_1..y_K (one
    [K n, B] block)."""

    n: int
    depth: int
    activation: str
    dtype: Any
    lanes: ClassVar[int] = 8
    extra_dz_rows: ClassVar[int] = 0

    def _act(self, x):
        return fastmath.sigmoid(x) if self.activation == "sigmoid" else fastmath.tanh(x)

    def prepare(self, w):
        U = _cast(w["U"], self.dtype)
        return {"UT": jnp.swapaxes(U, 1, 2), "U": U, "b": _bias(w["b"])}

    def forward(self, p, h, xp, aux, mask):
        n, UT = self.n, p["UT"]
        xp = xp + p["b"]
        y = self._act(xp[:n] + _dot(UT[0], _masked(h, mask), self.dtype))
        ys = [y]
        for k in range(1, self.depth):
            y = self._act(xp[k * n : (k + 1) * n] + _dot(UT[k], y, self.dtype))
            ys.append(y)
        h_new = fastmath.tanh(h + y)
        return h_new, h_new, {"h": h, "y": _rows(ys)}

    def backward(self, p, dh, dy, saved, aux, mask):
        n, U, Y = self.n, p["U"], saved["y"]
        ys = [Y[k * n : (k + 1) * n] for k in range(self.depth)]
        co = rrn_coefficients(fastmath.tanh(saved["h"] + ys[-1]), ys, self.activation)
        dpre = _plus(dh, dy) * co.dh_ds  # eq. 3's pre-activation
        dys, dzs = dpre, []
        for k in range(self.depth - 1, -1, -1):
            dz = dys * co.dy_dz[k]
            dzs.append(dz)
            dys = _dot(U[k], dz, self.dtype).astype(dpre.dtype)
        return dpre + _masked(dys, mask), _rows(dzs[::-1]), None

    def weight_grads(self, w, saved, dZ, extra, mask):
        n, K = self.n, self.depth
        ins = [_masked(saved["h"], mask)] + [
            saved["y"][:, k * n : (k + 1) * n] for k in range(K - 1)
        ]
        dU = jnp.stack([_outer_sum(ins[k], dZ[k * n : (k + 1) * n], self.dtype) for k in range(K)])
        return {"U": dU, "b": dZ.sum(axis=1)}


# ------------------------------------------------------------------------------ driver


def _project_step(WT, x_t, dtype):
    """W^T x_t^T for one step, ``[k n, m] x [m, B]``: an outer product for a 1-wide
    input (no matmul)."""
    if WT.shape[1] == 1:
        return WT * x_t
    return _dot(WT, x_t, dtype).astype(x_t.dtype)


def _select(cols, a, b):
    """Per column (a batch row): ``a``'s where ``cols [B]`` is True, else ``b``'s."""
    return jax.tree.map(lambda x, y: jnp.where(cols[None, :], x, y), a, b)


def _first(carry):
    """h, the first leaf of a carry (LSTM / SC-LSTM state tuples included): the cells'
    output."""
    return carry[0] if isinstance(carry, tuple) else carry


def _run(kern, unroll, outputs, w, W, carry0, xs, aux, mask):
    """The forward scan. With padding (``aux['valid']``) the outputs are y_t (zero on
    padded steps); without, they are the saved h_{t-1} (``_unroll`` shifts them by one
    step: one [T, n, B] stack fewer to write). ``outputs=False``: None."""
    p, WT = kern.prepare(w), None
    if W is not None:  # a 1-wide input's outer product stays in the carry's dtype
        WT = (W if W.shape[0] == 1 else _cast(W, kern.dtype)).T

    def step(carry, inputs):
        x_t, aux_t = inputs
        if "reset" in aux_t:  # the step runs from the initial carry where an episode starts
            carry = _select(aux_t["reset"], carry0, carry)
        xp = x_t if W is None else _project_step(WT, x_t, kern.dtype)
        new, y, saved = kern.forward(p, carry, xp, aux_t, mask)
        v = aux_t.get("valid")
        if v is None:
            return new, (None, saved)
        y = jnp.where(v[None, :], y, 0.0) if outputs else None
        return _select(v, new, carry), (y, saved)

    carry_T, (ys, saved) = jax.lax.scan(step, carry0, (xs, aux), unroll=unroll)
    if not outputs:
        return (carry_T, None), saved
    return (carry_T, saved["h"] if ys is None else ys), saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _scan(kern, unroll, chunk, outputs, w, W, carry0, xs, aux, mask):
    return _run(kern, unroll, outputs, w, W, carry0, xs, aux, mask)[0]


def _scan_fwd(kern, unroll, chunk, outputs, w, W, carry0, xs, aux, mask):
    out, saved = _run(kern, unroll, outputs, w, W, carry0, xs, aux, mask)
    return out, (w, W, xs, aux, mask, saved)


def _backward_step(kern, p, mask, dcarry, dy, saved_t, aux_t):
    """One reverse step: the carry's cotangent, dz and the per-row extra term. ``dy`` is
    the cotangent of the step's output y_t (padded) or of h_{t-1} (see :func:`_run`), or
    ``None`` (no outputs)."""
    v = aux_t.get("valid")
    dprev, dz, extra = kern.backward(p, dcarry, None if v is None else dy, saved_t, aux_t, mask)
    if v is not None:  # padded steps: the carry's cotangent passes through
        dprev, dz = _select(v, dprev, dcarry), jnp.where(v[None, :], dz, 0.0)
        return dprev, dz, None if extra is None else jnp.where(v, extra, 0.0)
    if dy is not None:  # the cotangent of h_{t-1}, the step's input state
        h = _first(dprev) + dy
        dprev = (h,) + dprev[1:] if isinstance(dprev, tuple) else h
    return dprev, dz, extra


def _scan_bwd(kern, unroll, chunk, outputs, res, cotangents):
    """The reverse scan in chunks of ``chunk`` steps: an inner scan writes the chunk's dz
    into a ``[k n, chunk, B]`` buffer (read as ``[k n, chunk B]``, the weight-gradient
    matmul's layout, without a transposed copy), then one matmul per chunk."""
    w, W, xs, aux, mask, saved = res
    dcarry_T, dys = cotangents
    p, (T, _, B) = kern.prepare(w), saved["h"].shape
    kx = w["b"].shape[0]  # rows of xp's cotangent: the gate pre-activations
    kn = kx + kern.extra_dz_rows  # rows of dz
    Wc = None if W is None else _cast(W, kern.dtype)
    chunks = lambda tree: jax.tree.map(lambda a: a.reshape((T // chunk, chunk) + a.shape[1:]), tree)

    def step(carry, inputs):  # dz is written into the chunk's [k n, chunk, B] buffer
        dcarry, dZ, dcarry0 = carry
        t, inputs = inputs
        dprev, dz, extra = _backward_step(kern, p, mask, dcarry, *inputs)
        reset = inputs[2].get("reset")
        if reset is not None:  # an episode's start: its carry's cotangent goes to carry0's
            zero = jax.tree.map(jnp.zeros_like, dprev)
            dcarry0 = jax.tree.map(jnp.add, dcarry0, _select(reset, dprev, zero))
            dprev = _select(reset, zero, dprev)
        dZ = jax.lax.dynamic_update_slice_in_dim(dZ, dz[:, None], t, axis=1)
        return (dprev, dZ, dcarry0), extra

    def chunk_step(carry, inputs):
        # dZ_buf: the previous chunk's dz buffer, every column of which this chunk
        # overwrites (carried rather than zero-filled anew per chunk).
        dcarry, dw, dW, dZ_buf, dcarry0 = carry
        dys_c, saved_c, aux_c, xs_c = inputs
        (dcarry, dZ_buf, dcarry0), extra = jax.lax.scan(
            step,
            (dcarry, dZ_buf, dcarry0),
            (jnp.arange(chunk), (dys_c, saved_c, aux_c)),
            reverse=True,
            unroll=unroll,
        )
        dZ = dZ_buf.reshape(kn, chunk * B)  # columns t B + b: a free reshape
        dw = jax.tree.map(jnp.add, dw, kern.weight_grads(w, saved_c, dZ, extra, mask))
        dZx = dZ if kn == kx else dZ[:kx]  # xp's cotangent
        if W is None:  # the projection was done before the scan: its cotangent is dZx
            dZx_buf = dZ_buf if kn == kx else dZ_buf[:kx]
            return (dcarry, dw, dW, dZ_buf, dcarry0), jnp.swapaxes(dZx_buf, 0, 1)
        dW = dW + _outer_sum(xs_c, dZx, kern.dtype).astype(W.dtype)
        dx = _dot(Wc, dZx, kern.dtype).astype(xs_c.dtype).reshape(-1, chunk, B)
        return (dcarry, dw, dW, dZ_buf, dcarry0), jnp.swapaxes(dx, 0, 1)

    zeros = (
        dcarry_T,
        jax.tree.map(jnp.zeros_like, w),
        None if W is None else jnp.zeros_like(W),
        jnp.zeros((kn, chunk, B), saved["h"].dtype),
        # the initial carry's cotangent from episodes that start from it (resets)
        jax.tree.map(jnp.zeros_like, dcarry_T) if "reset" in aux else None,
    )
    (dcarry0, dw, dW, _, d_restarts), dxs = jax.lax.scan(
        chunk_step, zeros, chunks((dys, saved, aux, None if W is None else xs)), reverse=True
    )
    if d_restarts is not None:
        dcarry0 = jax.tree.map(jnp.add, dcarry0, d_restarts)
    dmask = None if mask is None else jnp.zeros_like(mask)
    return dw, dW, dcarry0, dxs.reshape((T,) + dxs.shape[2:]), None, dmask


_scan.defvjp(_scan_fwd, _scan_bwd)


# The backend's place in the dispatcher (rhnzoo.cells.scan).
IMPL = "fused"
REMAT = False


def supports(cell: Any) -> bool:
    """Whether :func:`unroll` has a fused path for ``cell``: LSTM, GRU (Cho et al.'s and
    ``reset_after``), SC-LSTM, RRN, and Parallel of those."""
    if isinstance(cell, Parallel):
        return all(supports(c) for c in cell.cells)
    return isinstance(cell, (LSTM, GRU, SCLSTM, RRN))


def fits(
    cell: Any, batch: int | None, dtype: Any, backend: str | None = None, *, input_size: int = 1
) -> bool:
    """Whether ``auto`` may pick this scan: for any cell it runs (:func:`supports`), at any
    batch, dtype, platform and input width."""
    return supports(cell)


def default_unroll(cell: Any, backend: str | None = None) -> int:
    """The time steps per scan iteration :func:`unroll` takes for ``unroll=None`` on
    ``backend`` (default: :func:`rhnzoo.cells.scan_options.platform`), as measured
    (docs/speed.md): 8 on a GPU (launch-bound), else 2 for the RRN and 1 otherwise."""
    if (backend or platform()) in ("gpu", "cuda", "rocm"):
        return 8
    return 2 if isinstance(cell, RRN) else 1


def output_of(cell: Any, carry: Any) -> Array:
    """The output ``[B, n]`` of the step that produced ``carry``: every fused cell outputs
    its new h (:class:`~rhnzoo.cells.Parallel`: the mean of its parts', HRL eq. 7). With
    ``unroll(..., lengths=...)`` the final carry gives each row's output at its last
    real step. Raises ValueError for a cell without a fused path."""
    if isinstance(cell, Parallel):
        return sum(output_of(c, k) for c, k in zip(cell.cells, carry)) / len(cell.cells)
    if not supports(cell):
        raise ValueError(f"no fused unroll for {cell!r}; use rhnzoo.cells.unroll")
    return _first(carry)


def unroll(
    cell: Any,
    params: Any,
    carry: Any,
    xs: Array,
    mask: Array | None = None,
    opts: Options = DEFAULT_OPTIONS,
    *,
    lengths: Array | None = None,
    resets: Array | None = None,
) -> tuple[Any, Array | None]:
    """Drop-in replacement for :func:`rhnzoo.cells.unroll` for the gated cells; the
    dispatcher's ``fused`` backend for them (:mod:`rhnzoo.cells.scan`).

    Args:
      cell: :class:`~rhnzoo.cells.LSTM`, :class:`~rhnzoo.cells.GRU` (either
        ``reset_after``), :class:`~rhnzoo.cells.SCLSTM` (I or P),
        :class:`~rhnzoo.cells.RRN` (any depth and activation), or
        :class:`~rhnzoo.cells.Parallel` of these (each part is unrolled by its own fused
        scan; the output is their mean, HRL eq. 7).
      params: the cell's parameters (``cell.init``).
      carry: the initial carry (``cell.initial_carry(B)``), float32 or float64.
      xs: ``[T, B, m]`` float inputs, time-major.
      mask: ``[B, n]`` recurrent dropout mask or ``None``; treated as a constant (zero
        gradient).
      opts: the :class:`~rhnzoo.cells.scan_options.Options`:

        * ``dtype``: None (matmuls in the carry's dtype), float32 or bfloat16 (bf16
          matmul inputs, float32 accumulation; state, parameters and gates stay
          float32).
        * ``unroll``: time steps per scan iteration, forward and backward; None:
          :func:`default_unroll`.
        * ``outputs``: "all" (``ys [T, B, n]``); "last" (each row's output at its last
          real step, ``[B, n]``, from the final carry by :func:`output_of`, zeros for a
          row of length 0) and "none" (None) write no output stack.
        * ``project_per_step``: compute W^T x_t^T inside the scan, one ``[k n, m] x [m,
          B]`` matmul per step (an outer product when m = 1; None or True, the
          default), instead of one ``[T, B, k n]`` projection before it (False).
        * ``weight_grad_chunk`` (this scan's backend option): C, the number of
          consecutive steps whose weight gradients are one matmul over their C x B
          positions: T, 1 (a rank-B update per step, as autodiff does) or any divisor of
          T. ``None`` (default): the largest divisor of T up to 16 with
          ``project_per_step``, T otherwise.
        * ``remat``: must be False (the backward pass is written by hand); the other
          fields have no effect here.
      lengths: optional ``[B]`` int real steps per row: padded steps keep the carry and
        output zeros (as :func:`rhnzoo.cells.unroll`).
      resets: optional ``[T, B]`` bool episode starts: where True, the row's carry is
        its row of the initial ``carry`` before the step runs (as
        :func:`rhnzoo.cells.unroll`; padded steps ignore it; the SC-LSTM's step counter
        restarts too).

    Returns:
      ``(carry, ys [T, B, n])``, as :func:`rhnzoo.cells.unroll`; ``(carry, last [B,
      n])`` with ``outputs="last"``; ``(carry, None)`` with ``outputs="none"``.

    Raises:
      ValueError: for a cell without a fused path (see :func:`supports`), ``remat``, a
        ``weight_grad_chunk`` that does not divide T, (LSTM, SC-LSTM, GRU) parameters
        that are not the cell's (:func:`rhnzoo.cells.lstm.check_params`), or ``resets``
        that are not a ``[T, B]`` bool array.
    """
    if opts.remat:
        raise ValueError(
            f"remat needs the reference scan (scan_impl='reference'): the fused scan of "
            f"{cell!r} has no remat"
        )
    carry_T, ys = _unroll(cell, params, carry, xs, mask, opts, lengths, resets)
    if opts.outputs == "last":
        return carry_T, last_real(output_of(cell, carry_T), lengths, xs.shape[0])
    return carry_T, ys


def _unroll(cell, params, carry, xs, mask, opts, lengths, resets):
    """:func:`unroll` but ``outputs="last"``, which it runs as "none"."""
    if resets is not None:
        resets = base.check_resets(resets, xs)
    outputs, dtype, unroll = opts.outputs == "all", opts.dtype, opts.unroll
    project_per_step = opts.project_per_step is not False
    if isinstance(cell, Parallel):
        outs = [
            _unroll(c, p, k, xs, mask, opts, lengths, resets)
            for c, p, k in zip(cell.cells, params, carry)
        ]
        ys = sum(o[1] for o in outs) / len(outs) if outputs else None
        return tuple(o[0] for o in outs), ys
    if not supports(cell):
        raise ValueError(f"no fused unroll for {cell!r}; use rhnzoo.cells.unroll")
    if isinstance(cell, RRN):
        cell.check_params(params, xs.shape[-1])
    else:
        check_params(cell, params, xs.shape[-1])
    T = xs.shape[0]
    n = cell.hidden_size
    cdt = (carry.h if isinstance(cell, SCLSTM) else jax.tree.leaves(carry)[0]).dtype
    w = {k: v.astype(cdt) for k, v in params.items() if k != "W"}
    xs = xs.astype(cdt)
    aux = {}
    steps = jnp.arange(T, dtype=jnp.int32)[:, None]
    if lengths is not None:
        aux["valid"] = steps < jnp.asarray(lengths)[None, :]
    if resets is not None:
        # With resets the scan writes its outputs (the state entering a step is no longer
        # the previous step's output): every step counts as real where no lengths are given.
        aux.setdefault("valid", jnp.ones(resets.shape, bool))
        aux["reset"] = resets & aux["valid"]
    if isinstance(cell, SCLSTM):
        kern = _LSTMKernel(n, dtype, skip=True, learn_alpha=cell.learn_alpha)
        # τ - 1 of every row at every step; padded steps (after the row's end) are masked.
        # With resets, the steps since the row's last episode start (its counter restarts).
        start = 0 if resets is None else jax.lax.cummax(jnp.where(aux["reset"], steps, 0), axis=0)
        t = carry.t[None, :] + (steps - start).astype(carry.t.dtype)
        on_grid = t % cell.skip == 0
        if lengths is not None:
            on_grid = on_grid & aux["valid"]
        aux.update(on_grid=on_grid, skipped=on_grid & (t > 0))
        carry0 = (carry.h, carry.c, carry.h_anchor)
    elif isinstance(cell, LSTM):
        kern, carry0 = _LSTMKernel(n, dtype), tuple(carry)
    elif isinstance(cell, GRU):
        kern = (_GRUResetAfterKernel if cell.reset_after else _GRUKernel)(n, dtype)
        carry0 = carry
    else:
        kern, carry0 = _RRNKernel(n, cell.depth, cell.activation, dtype), carry
    if unroll is None:
        unroll = default_unroll(cell, platform())
    # Feature-major: [B, n] -> [n, B], padded with inert columns (see _pad).
    B = xs.shape[1]  # symbolic under jax.export: then unpadded (the padding is for speed)
    extra = -B % kern.lanes if isinstance(B, int) else 0
    extra = extra if extra * 16 <= B else 0
    carry0 = jax.tree.map(lambda a: _pad(a.T, extra, 1), carry0)
    mask_fm = None if mask is None else _pad(mask.astype(cdt).T, extra, 1)
    aux = {k: _pad(v, extra, 1) for k, v in aux.items()}
    xs = _pad(xs, extra, 1)
    W = params["W"].astype(cdt)
    if project_per_step:
        x_in = jnp.swapaxes(xs, 1, 2)  # [T, m, B]
    else:
        # [T B, m] x [m, k n], then [T, B, k n] -> [T, k n, B] (as one einsum, XLA:CPU has
        # no bfloat16 kernel for it)
        x_in = _dot(xs.reshape(-1, xs.shape[-1]), W, dtype).astype(cdt).reshape(T, -1, W.shape[1])
        x_in, W = jnp.swapaxes(x_in, 1, 2), None
    chunk = opts.weight_grad_chunk
    if chunk is None:  # measured: docs/runs/cpu/levers.md
        chunk = max(c for c in range(1, 17) if T % c == 0) if project_per_step else T
    elif not (isinstance(chunk, int) and chunk >= 1 and T % chunk == 0):
        raise ValueError(
            f"weight_grad_chunk must be a divisor of the {T} time steps, got {chunk!r}"
        )
    carry_T, ys = _scan(kern, unroll, chunk, outputs, w, W, carry0, x_in, aux, mask_fm)
    if outputs and "valid" not in aux and T:  # ys holds h_{t-1}: shift it by one step
        ys = jnp.concatenate([ys[1:], _first(carry_T)[None]])
    carry_T = jax.tree.map(lambda a: a[:, :B].T, carry_T)
    ys = jnp.swapaxes(ys[..., :B], 1, 2) if outputs else None
    if isinstance(cell, SCLSTM):
        if resets is not None:  # the real steps from the row's last episode start on
            valid = aux["valid"][:, :B]
            last = jnp.max(jnp.where(aux["reset"][:, :B], steps, 0), axis=0)
            taken = jnp.sum(valid & (steps >= last[None, :]), axis=0).astype(carry.t.dtype)
            carry_T = SCLSTMState(*carry_T, carry.t + taken)
        else:
            taken = T if lengths is None else jnp.sum(aux["valid"][:, :B], axis=0)
            carry_T = SCLSTMState(*carry_T, carry.t + jnp.asarray(taken).astype(carry.t.dtype))
    elif isinstance(cell, LSTM):
        carry_T = type(carry)(*carry_T)
    return carry_T, ys
