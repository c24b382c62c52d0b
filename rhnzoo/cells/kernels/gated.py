"""Persistent recurrent kernels for the LSTM, SC-LSTM and the reset-after GRU (Pallas,
Mosaic GPU): the time loop inside one kernel, the recurrent weights held in shared
memory for all T steps.

On a GPU the scans of :mod:`rhnzoo.cells.gated_fused` are launch-bound: every time step
launches its small kernels from the host. Here one kernel runs the whole forward
recurrence and a second the whole reverse one, as cuDNN's persistent algorithm does
for small hidden sizes. Each CTA owns a tile of 64 batch rows and loops over time:

* **forward** (Wang & Tian 2016, eq. 1), one warpgroup (128 threads) per 64 hidden
  units: U (``[4, N, N]`` bfloat16, one block per gate i | f | o | c̃) and W are copied
  once into shared memory by TMA; per step the tile's ``x_t`` arrives by TMA
  (double-buffered, the next step's copy in flight), each warpgroup forms its units'
  gate pre-activations ``x_t W + h_{t-1} U + b`` as tensor-core products
  (``plgpu.wgmma``, float32 accumulation; b read from shared memory), the gates and the
  cell state c are float32 in registers, and h_t goes to shared memory twice: as the
  next step's bfloat16 matmul operand and as the float32 output, stored to HBM by TMA;
  the warpgroups meet at a barrier once per step. The kernel
  (:func:`~rhnzoo.cells.kernels.persistent.forward_call`) serves every persistent cell:
  a cell is a :class:`~rhnzoo.cells.kernels.persistent.Step`, its blocks, carries and a
  step function written against the kernel's ``product`` and ``restage`` (here
  :func:`lstm_step` and :data:`GRU_RA_STEP`; the RRN's and Cho's GRU's, whose second
  product waits on the first, in :mod:`~rhnzoo.cells.kernels.chained`).
* **backward**, one warpgroup per 64 hidden units as forward: the reverse recurrence of
  the state cotangents (dh, dc) with U's gate blocks in shared memory; each warpgroup
  carries its units' dh and dc and its own [64, 64] float32 accumulator, reads the
  step's gate coefficients for its units straight from global memory, stages its dz
  (bfloat16) in shared memory and, after one CTA barrier, multiplies the whole dz into
  its units of ``dh_{t-1} = dz U^T`` on the tensor cores (one wait per step); the kernel
  writes dh_t and (the LSTM's) dz_t in bfloat16 as it formed them (:func:`backward_call`,
  built from :mod:`~rhnzoo.cells.kernels.persistent`'s backward harness, which the
  chained cells' backward shares).
* **outside the kernels** (large, parallel XLA ops, as in :mod:`~rhnzoo.cells.gated_fused`):
  the gates and c_t are recomputed from the forward's outputs (one ``[T B, n] x [n, 4n]``
  matmul and an associative scan for c), the coefficients the backward kernel reads
  are formed from them, and the weight gradients dU, dW, db and the input gradient are
  single large matmuls over all T x B positions of the kernel's dz (the reset-after
  GRU's dz re-formed from its dh_t: its candidate's W and U parts differ;
  :func:`~rhnzoo.cells.kernels.persistent.weight_gradients`).

Precision (the project's bfloat16 policy, ``dtype=jnp.bfloat16``): every matmul takes
bfloat16 inputs (x, W, h, U, dz) with float32 accumulation; gates, states, their
cotangents and the forget-gate product along the cell-state path are float32. The
backward kernel reads the LSTM's other five per-step coefficients (o(1 - tanh² c),
c̃ i(1 - i), c_{t-1} f(1 - f), i(1 - c̃²), tanh(c) o(1 - o)) in bfloat16: they only enter
the bfloat16 matmul input dz and an additive term of dc. The weight gradients take the
kernel's bfloat16 dz (b's summed in float32). Values and gradients agree with
:func:`rhnzoo.cells.unroll` to bfloat16 rounding (tested in GPU interpret mode on CPU).

Shapes: hidden n is padded to N = 64 or 128 (n <= 128), the batch to a multiple of 64
rows, the input width m to a multiple of 16; padded units, rows and columns are inert
(zero weights, zero length). What fits one CTA's shared memory (:func:`fits`) is checked
before a kernel is built; lowering for ``cuda`` reports any excess (tested in CI).

The reset-after GRU (``GRU(n, reset_after=True)``: PyTorch's and cuDNN's) runs on the
same two kernels: its forward blocks are r | z | the candidate's input part ``x W_n +
b_n`` | its recurrent part ``h U_n + b_hn`` (n = tanh(third + r fourth), h_t = z h_{t-1} +
(1 - z) n, the carry h float32 in registers); its backward carries dh alone, the
coefficients of its three dz blocks streamed as the LSTM's and z_t (float32) as the
direct path dh_{t-1} += dh_t z_t.

SC-LSTM (Wang & Tian 2016, eq. 5; :class:`~rhnzoo.cells.SCLSTM`, I or P) runs on the
LSTM's kernels with its skip state in registers: its carry keeps only the anchor (h at
the row's last skip point), not L past states, so the forward carries (c, anchor) per
warpgroup and reads each row's step count and α from shared memory; at a step on the
skip grid (count ≡ 0 mod L) h_t += α anchor (count > 0) and h_t becomes the anchor. The
backward carries the anchor's cotangent da beside (dh, dc), in shared memory (registers
are full at N = 128): on the grid dh_t += da and da is reset, and where the step skipped
da += α dh_t. dα and the initial anchor's cotangent are formed outside from the kernel's
dh_t.

The LSTM's forward has a second kernel, chosen by ``Options(batch_tile=Bt)`` (Bt = 16,
32 or 64) only: :mod:`~rhnzoo.cells.kernels.swap_ab`'s, the gates on wgmma's M and Bt
batch columns per CTA on its N (P-MNIST's batch of 100 on 7 CTAs at Bt = 16 instead of
2). The backward is the same (it recomputes the gates from y). SC-LSTM and the GRU
refuse a ``batch_tile`` (ValueError), as do sizes the swap-AB kernel does not fit
(:func:`~rhnzoo.cells.kernels.swap_ab.fits`); it is not picked by :func:`fits`
(``auto``) until a GPU times it.

Supported: :class:`~rhnzoo.cells.LSTM`, :class:`~rhnzoo.cells.SCLSTM` and the
reset-after :class:`~rhnzoo.cells.GRU`, with ``lengths`` (:func:`rhnzoo.cells.unroll`'s
semantics: padded steps keep the carry and output zeros) and the recurrent dropout mask
(a constant multiplying h_{t-1} where it enters U). Cho et al.'s GRU (its candidate's
matmul waits on r) and the RRN (a chain of K products) have theirs in
:mod:`~rhnzoo.cells.kernels.chained`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from rhnzoo.cells.kernels import common, persistent, swap_ab, verified
from rhnzoo.cells.kernels.common import DEFAULT_OPTIONS, Options
from rhnzoo.cells.kernels.persistent import HALF, QUARTER, ROWS, Padding, Step
from rhnzoo.cells.lstm import (
    GRU,
    LSTM,
    SCLSTM,
    SCLSTMState,
    check_params,
    gru_reset_after_coefficients,
    gru_reset_after_gates,
    lstm_coefficients,
    lstm_gates,
)

Array = jax.Array

_bf16, _f32 = jnp.bfloat16, jnp.float32


# The backend's place in the dispatcher (rhnzoo.cells.scan): its implementation, no remat,
# and what it runs, in the words of a refusal.
IMPL = "pallas"
REMAT = False
RUNS = "the persistent kernels: LSTM, SC-LSTM, reset-after GRU, hidden size <= 128"


def supports(cell: Any) -> bool:
    """Whether :func:`unroll` has a kernel for ``cell`` at all: an
    :class:`~rhnzoo.cells.LSTM`, an :class:`~rhnzoo.cells.SCLSTM` (I or P) or a
    reset-after :class:`~rhnzoo.cells.GRU` (PyTorch's and cuDNN's variant) with hidden
    size at most 128."""
    if type(cell) is GRU:
        return cell.reset_after and cell.hidden_size <= 128
    return type(cell) in (LSTM, SCLSTM) and cell.hidden_size <= 128


def smem_bytes(n: int, m: int) -> tuple[int, int]:
    """Shared memory (bytes) of the LSTM's forward and backward kernels for hidden size
    ``n`` and input width ``m``: the scratch buffers listed in the kernels (barriers
    aside). The backward holds U's gate blocks and one step's dz; its inputs and outputs
    go straight between registers and global memory."""
    N, MP = persistent.padded(n, m)
    return persistent.forward_smem_bytes(4, N, MP, 0), 4 * N * N * 2 + 4 * ROWS * N * 2


def fits(
    cell: Any, batch: int, dtype: Any, backend: str | None = None, *, input_size: int = 1
) -> bool:
    """Whether ``auto`` may pick the kernel: an LSTM with hidden size n <= 64, bfloat16
    matmul inputs (``dtype``), a GPU of compute capability 9.0 (``backend`` None: JAX's
    default backend; the device: :func:`~rhnzoo.cells.kernels.verified.device`), both
    kernels within one CTA's shared memory for this ``input_size``, **and** an entry of
    the verified record (:func:`rhnzoo.cells.kernels.verified.verified`: this source's
    digest, this device kind, this cell, n, ``batch``, ``input_size`` and dtype, errors
    checked, faster than the fused scan). The record is empty today, so this is False
    everywhere until a kernel window fills it. At 64 < n <= 128 the kernel runs
    (:func:`supports`) but its backward kernel made the train step slower than the fused
    scan's on an H100 (docs/speed.md, old code), so ``auto`` leaves it there. The swap-AB
    forward (``Options(batch_tile=...)``) plays no part: ``auto`` runs the default
    kernels only."""
    if type(cell) is not LSTM or not supports(cell) or cell.hidden_size > 64:
        return False
    if dtype is None or jnp.dtype(dtype) != jnp.dtype(_bf16):
        return False
    if (backend or jax.default_backend()) not in ("gpu", "cuda"):
        return False
    if verified.device().compute_capability != "9.0":
        return False
    if max(smem_bytes(cell.hidden_size, input_size)) + 1024 > common.SMEM_LIMIT:
        return False
    return verified.fits("gated", cell, batch, dtype, input_size=input_size)


# ------------------------------------------------------------------------------ kernels


def _skip_grid(count, skip: int):
    """SC-LSTM's skip grid for steps whose count τ - 1 is ``count`` (int, any shape):
    ``(on, skipped)``, the steps with τ ≡ 1 (mod L) (h_t becomes the anchor) and those of
    them with τ > 1 (h_t += α anchor). In the kernels and outside them. L takes
    ``count``'s dtype (under ``jax_enable_x64`` a bare Python int is int64, which
    ``lax.rem`` refuses beside an int32 count)."""
    on = lax.rem(count, jnp.asarray(skip, count.dtype)) == 0
    return on, on & (count > 0)


def _lstm_forward(skip, product, restage, carry, m, skips):
    """The LSTM (Wang & Tian 2016, eq. 1; blocks i | f | o | c̃), and SC-LSTM's skip
    (eq. 5) with ``skip`` = L > 0: at a step whose count τ - 1 is a multiple of L,
    h_t += α anchor where τ > 1, and h_t becomes the anchor."""
    del restage, m
    z = product([(k, None) for k in range(4)])
    i, f, o, g = common.sigmoid(z[0]), common.sigmoid(z[1]), common.sigmoid(z[2]), jnp.tanh(z[3])
    c = f * carry[0] + i * g
    h = o * jnp.tanh(c)
    if not skip:
        return h, (c,)
    count, alpha = skips
    on, skipped = (lax.broadcast_in_dim(a, h.shape, [0]) for a in _skip_grid(count, skip))
    h = h + jnp.where(skipped, alpha * carry[1], 0.0)
    return h, (c, jnp.where(on, h, carry[1]))


def _gru_ra_forward(product, restage, carry, m, skips):
    """The reset-after GRU: blocks r | z | the candidate's input part ``x W_n + b_n`` (no
    U) | its recurrent part ``h U_n + b_hn`` (no W); n = tanh(block 2 + r block 3), h_t =
    z h_{t-1} + (1 - z) n, the carry h float32."""
    del restage, m, skips
    z = product([(k, None) for k in range(4)])
    r, u = common.sigmoid(z[0]), common.sigmoid(z[1])
    h = u * carry[0] + (1 - u) * jnp.tanh(z[2] + r * z[3])
    return h, (h,)


def lstm_step(skip: int = 0) -> Step:
    """The LSTM's step for :func:`~rhnzoo.cells.kernels.persistent.forward_call` (blocks
    i | f | o | c̃, the carry c; SC-LSTM's, its anchor a second carry, for ``skip`` = L >
    0)."""
    return Step(4, 0, functools.partial(_lstm_forward, skip))


# The reset-after GRU's step for the forward kernel: blocks r | z | n's input part (no U) |
# n's recurrent part (no W), the carry h.
GRU_RA_STEP = Step(4, 0, _gru_ra_forward, no_w=(3,), no_u=(2,))


def backward_call(
    coef, F, dy, u, lens, dhT, dcT, mask=None, skips=None, *, skip: int = 0, interpret: bool
):
    """The backward kernel: the reverse recurrence of (dh, dc) (the LSTM), or of dh alone
    (the reset-after GRU: ``dcT`` None, ``coef [T, 3, Bp, N]`` the coefficients of its
    three dz blocks, ``F`` = z_t, ``u [3, N, N]``; the kernel then returns ``(DH,)``, and
    dh_{t-1} = mask (dz U^T) + dh_t z_t).

    One warpgroup per 64 hidden units (H = N / 64 per CTA), each carrying its units' dh
    and dc (two quarters of 32 units, float32 in registers) and its own [64, 64] float32
    accumulator. Per step each warpgroup reads its units' coefficients straight from
    global memory (no shared-memory staging, so nothing waits on a TMA refill), forms
    dz (bfloat16) into shared memory and writes dh_t, dc_t to global memory; after one
    CTA barrier (every warpgroup's dz is there) it multiplies the whole dz into its own
    units' ``dh_{t-1} = dz U^T`` on the tensor cores (one wait for all products); with
    two warpgroups a second barrier keeps the next step's dz from overwriting what the
    other warpgroup's products still read.

    Args: ``coef [T, 5, Bp, N]`` bf16, the per-step coefficients A = o(1 - tanh² c_t),
    P = c̃ i(1 - i), Q = c_{t-1} f(1 - f), R = i(1 - c̃²), S = tanh(c_t) o(1 - o);
    ``F [T, Bp, N]`` f32 (f_t); ``dy [T, Bp, N]`` f32 or None (the outputs' cotangents,
    zero on padded steps); ``u [4, N, N]`` bf16 (U's gate blocks); ``lens [Bp]``;
    ``dhT, dcT [Bp, N]`` f32, the final carry's cotangents; ``mask [Bp, N]`` f32 or None
    (dh_{t-1} = mask (dz U^T)). With ``skip`` = L > 0 (SC-LSTM), ``skips`` = ``(t0 [Bp]
    int32, alpha [1] f32, daT [Bp, N] f32)``: the step counts, α and the final anchor's
    cotangent, carried as da (in shared memory): at a step on the skip grid dh_t += da and da = 0,
    and where it skipped da += α dh_t. Returns ``(DH, dZ, dc0)``: ``DH [T, Bp, N]`` f32,
    at step t dh_t = dh_{t+1 -> t} + dy_t (+ da) on real steps, the carried cotangent on
    padded ones; ``dZ [T, 4, Bp, N]`` bf16, the gate blocks' dz_t as the kernel formed
    them (zero on padded steps; dc_t = carried dc + dh_t A_t); ``dc0 [Bp, N]`` f32, the
    initial cell state's cotangent dc_{-1}."""
    pl, plgpu = common.plgpu()
    T, n_co, Bp, N = coef.shape
    k_dz = u.shape[0]  # LSTM: 5 coefficients, 4 blocks; GRU: 3, 3
    H, quarters = N // HALF, N // QUARTER
    has_dy, masked, lstm = dy is not None, mask is not None, dcT is not None
    L = plgpu.Layout.WGMMA
    tile = (ROWS, QUARTER)
    assert (skips is not None) == (skip > 0) and (lstm or not skip)

    def body(*refs):
        refs = list(refs)
        coef_ref, F_ref = refs.pop(0), refs.pop(0)
        dy_ref = refs.pop(0) if has_dy else None
        u_ref, len_ref, dhT_ref = refs.pop(0), refs.pop(0), refs.pop(0)
        dcT_ref = refs.pop(0) if lstm else None
        m_ref = refs.pop(0) if masked else None
        t0_ref, alpha_ref, daT_ref = (refs.pop(0) for _ in range(3)) if skip else (None,) * 3
        DH_ref = refs.pop(0)
        dZ_ref, dc0_ref = (refs.pop(0), refs.pop(0)) if lstm else (None, None)
        u_s, dz_s, da_s, bar_u, bar_step = refs
        rows = pl.ds(lax.axis_index("b") * ROWS, ROWS)
        wg = lax.axis_index("wg")  # this warpgroup's hidden units: 64 wg ... 64 wg + 63

        @pl.when(wg == 0)
        def _load_u():
            persistent.load_u(plgpu, u_ref, u_s, bar_u, k_dz, H)

        cols = [pl.ds(wg * HALF + q * QUARTER, QUARTER) for q in range(2)]  # its quarters

        def tiles(ref, *idx):  # the warpgroup's two [ROWS, 32] quarters of ref[*idx, rows]
            return [plgpu.load(ref.at[(*idx, rows, c)], layout=L, optimized=False) for c in cols]

        dhc, dcc = tiles(dhT_ref), tiles(dcT_ref) if lstm else []
        if skip:  # SC-LSTM's da lives in shared memory (each thread its own elements)
            for q, da in enumerate(tiles(daT_ref)):
                da_s[2 * wg + q] = da
        lens_v = plgpu.load(len_ref.at[rows], layout=L.reduce(1), optimized=False)
        if skip:
            t0_v = plgpu.load(t0_ref.at[rows], layout=L.reduce(1), optimized=False)
        for g in range(k_dz * H):
            plgpu.barrier_wait(bar_u.at[g])

        def step(s, carry):
            t = T - 1 - s
            dhc, dcc = carry
            valid = lax.broadcast_in_dim(t < lens_v, tile, [0])
            if skip:  # τ - 1 = t0 + t on a real step
                on, skipped = (
                    lax.broadcast_in_dim(a, tile, [0]) for a in _skip_grid(t0_v + t, skip)
                )
            new_dc, direct = [], []  # the LSTM's dc_{t-1}; the GRU's dh_t z_t
            for q in range(2):
                co = [
                    plgpu.load(coef_ref.at[t, k, rows, cols[q]], layout=L, optimized=False)
                    for k in range(n_co)
                ]
                co = [c.astype(_f32) for c in co]
                f = plgpu.load(F_ref.at[t, rows, cols[q]], layout=L, optimized=False)
                dh = dhc[q]
                if has_dy:
                    dh = dh + plgpu.load(dy_ref.at[t, rows, cols[q]], layout=L, optimized=False)
                if skip:  # h_t was the anchor: its cotangent joins dh_t's
                    da = plgpu.load(da_s.at[2 * wg + q], layout=L)
                    dh = jnp.where(valid & on, dh + da, dh)
                    alpha = alpha_ref[0]  # α is one scalar (broadcast over the units)
                    none = jnp.zeros_like(dh)  # (a Python 0.0 here is an array constant)
                    new = jnp.where(on, none, da) + jnp.where(skipped, alpha * dh, none)
                    da_s[2 * wg + q] = jnp.where(valid, new, da)
                zero = jnp.zeros_like(dh)
                if lstm:  # LSTM: A, P, Q, R, S; F = f
                    A, P, Q, R, S = co
                    dc = dcc[q] + dh * A
                    dz = (dc * P, dc * Q, dh * S, dc * R)
                    new_dc.append(jnp.where(valid, dc * f, dcc[q]))
                else:  # reset-after GRU: dz = dh (A_r, A_z, A_n); F = z, the direct path
                    dz = tuple(dh * a for a in co)
                    direct.append(jnp.where(valid, dh * f, zero))
                DH_ref[t, rows, cols[q]] = dh
                for g in range(k_dz):
                    dz16 = jnp.where(valid, dz[g], zero).astype(_bf16)
                    dz_s[g, 2 * wg + q] = dz16
                    if lstm:  # the LSTM's dz_t out, as it is (bfloat16)
                        dZ_ref[t, g, rows, cols[q]] = dz16
            # this warpgroup's units of dh_{t-1} = dz U^T, once every dz is in dz_s
            dh_prev = persistent.staged_products(
                pl, plgpu, dz_s, u_s, [(g, g) for g in range(k_dz)], wg=wg, H=H, bar_step=bar_step
            )
            new_dh = []
            for q in range(2):
                d = dh_prev[:, q * QUARTER : (q + 1) * QUARTER]
                if masked:
                    d = d * plgpu.load(m_ref.at[rows, cols[q]], layout=L, optimized=False)
                if not lstm:  # the GRU's direct path
                    d = d + direct[q]
                # a padded step keeps dh: this thread's own dh_t, just written (not
                # kept in registers across the products)
                kept = plgpu.load(DH_ref.at[t, rows, cols[q]], layout=L, optimized=False)
                new_dh.append(jnp.where(valid, d, kept))
            return tuple(new_dh), tuple(new_dc)

        _, dc0 = lax.fori_loop(0, T, step, (tuple(dhc), tuple(dcc)))
        for q, dc in enumerate(dc0):  # the LSTM's dc_{-1}
            dc0_ref[rows, cols[q]] = dc

    sw = functools.partial(common.swizzled, plgpu)
    kernel = persistent.persistent_kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((T, Bp, N), _f32),)
        + (
            (jax.ShapeDtypeStruct((T, k_dz, Bp, N), _bf16), jax.ShapeDtypeStruct((Bp, N), _f32))
            if lstm
            else ()
        ),
        scratch_types=(
            *persistent.backward_smem(plgpu, k_dz, k_dz, N),  # U's blocks, dz
            plgpu.SMEM((quarters,) + tile, _f32, transforms=sw(_f32, QUARTER)) if skip else None,
            plgpu.Barrier(num_barriers=k_dz * H),
            plgpu.Barrier(num_arrivals=H),
        ),
        Bp=Bp,
        H=H,
        interpret=interpret,
    )
    return kernel(
        *(
            (coef, F)
            + ((dy,) if has_dy else ())
            + (u.reshape(k_dz, H, HALF, N), lens, dhT)
            + ((dcT,) if lstm else ())
            + ((mask,) if masked else ())
            + (skips or ())
        )
    )


# ------------------------------------------------------------------------------ the unroll


def _blocks(M: Array, n: int, N: int, k: int = 4) -> Array:
    """``[r, k n] -> [k, r, N]``: the gate blocks of a fused weight matrix, padded."""
    return common.pad_to(jnp.moveaxis(M.reshape(M.shape[0], k, n), 1, 0), (k, M.shape[0], N))


def _recompute(W, U, b, xs, h0, c0, H, valid, mask):
    """The forward's gates and cell states, in parallel over T: ``z = x W + (h_{t-1} m) U
    + b`` (bfloat16 inputs, float32 accumulation, as in the kernel) and c by an
    associative scan of c_t = f c_{t-1} + i c̃ (carried unchanged on padded steps).
    Returns the masked h_{t-1} (what entered U), the gates and c."""
    H_prev = jnp.concatenate([h0[None], H[:-1]])
    if mask is not None:
        H_prev = H_prev * mask
    z = jnp.einsum("tbm,mk->tbk", xs.astype(_bf16), W.astype(_bf16), preferred_element_type=_f32)
    z = (
        z
        + jnp.einsum(
            "tbn,nk->tbk", H_prev.astype(_bf16), U.astype(_bf16), preferred_element_type=_f32
        )
        + b
    )
    i, f, o, g = lstm_gates(z, sigmoid=common.sigmoid)
    v = valid[:, :, None]
    a, d = jnp.where(v, f, 1.0), jnp.where(v, i * g, 0.0)
    d = d.at[0].add(a[0] * c0)

    def combine(left, right):
        return right[0] * left[0], right[0] * left[1] + right[1]

    C = lax.associative_scan(combine, (a, d))[1]
    return H_prev, i, f, o, g, C


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _lstm(outputs: bool, interpret: bool, skip: int, bt, W, U, b, h0, c0, xs, lens, mask, skips):
    return _lstm_fwd(outputs, interpret, skip, bt, W, U, b, h0, c0, xs, lens, mask, skips)[0]


def _anchors(H, a0, on):
    """SC-LSTM's anchor after each step ``[T, B, n]``: h at the row's last step on the
    skip grid (``on [T, B]``, real steps only), or ``a0`` before the first."""
    T = H.shape[0]
    last = lax.cummax(jnp.where(on, jnp.arange(T)[:, None], -1), axis=0)
    A = jnp.take_along_axis(H, jnp.maximum(last, 0)[:, :, None], axis=0)
    return jnp.where((last >= 0)[:, :, None], A, a0[None])


def _grid(skip, t0, T, valid):
    """SC-LSTM's ``(on, skipped)`` ``[T, B]``: the real steps whose count τ - 1 = t0 + t
    is a multiple of L, and those of them with τ > 1 (where the skip adds α anchor)."""
    on, skipped = _skip_grid(t0[None, :] + jnp.arange(T)[:, None], skip)
    return valid & on, valid & skipped


def _lstm_fwd(outputs, interpret, skip, bt, W, U, b, h0, c0, xs, lens, mask, skips):
    """The forward kernel (``bt`` None: 64 rows per CTA; Bt: the swap-AB forward of a
    plain LSTM, ``skip`` 0), then the gates and c recomputed from its y for the backward."""
    T = xs.shape[0]
    n = U.shape[0]
    N = Padding.of(xs, n).N
    carry0, kernel_skips = ((c0, skips[1]), (skips[0], skips[2])) if skip else ((c0,), None)
    if bt is not None:
        swapped = functools.partial(swap_ab.lstm_forward, bt=bt, interpret=interpret)
        y = persistent.one_at_a_time(swapped)(xs, W, U, b, h0, c0, lens, mask)
    else:
        y = persistent.forward(
            xs,
            _blocks(U, n, N),
            _blocks(W, n, N),
            b.reshape(4, n),
            h0,
            carry0,
            lens,
            mask,
            kernel_skips,
            step=lstm_step(skip),
            interpret=interpret,
        )
    H = persistent.carries(y, h0, lens)
    valid = persistent.valid_steps(T, lens)[..., 0]
    H_prev, i, f, o, g, C = _recompute(W, U, b, xs, h0, c0, H, valid, mask)
    A_prev, A_T = None, None
    if skip:
        t0, a0, _ = skips
        A = _anchors(H, a0, _grid(skip, t0, T, valid)[0])
        A_prev, A_T = jnp.concatenate([a0[None], A[:-1]]), A[-1]
    out = ((H[-1], C[-1], A_T), y if outputs else None)
    return out, (W, U, b, xs, h0, c0, lens, mask, skips, H_prev, i, f, o, g, C, A_prev)


def _lstm_bwd(outputs, interpret, skip, bt, res, cotangents):
    del bt  # the same backward after either forward kernel
    W, U, b, xs, h0, c0, lens, mask, skips, H_prev, i, f, o, g, C, A_prev = res
    (dhT, dcT, daT), dys = cotangents
    n = U.shape[0]
    sizes = Padding.of(xs, n)
    T, B, N = sizes.T, sizes.B, sizes.N
    valid = persistent.valid_steps(T, lens)
    C_prev = jnp.concatenate([c0[None], C[:-1]])
    co = lstm_coefficients(i, f, o, g, C_prev, jnp.tanh(C))  # A, P, Q, R, S in this order
    pad = sizes.steps
    coef = jnp.stack([pad(a) for a in co], axis=1).astype(_bf16)
    dy = sizes.cotangent(dys, valid, outputs)
    kernel_skips = None
    if skip:
        t0, _, alpha = skips
        kernel_skips = (sizes.lens(t0), alpha.astype(_f32).reshape(1), sizes.rows(daT))
    call = functools.partial(backward_call, skip=skip, interpret=interpret)
    DH, dZ16, dc0 = persistent.one_at_a_time(call)(
        coef,
        pad(f.astype(_f32)),
        dy,
        common.pad_to(_blocks(U, n, N), (4, N, N)).astype(_bf16),
        sizes.lens(lens),
        sizes.rows(dhT),
        sizes.rows(dcT),
        sizes.rows(mask),
        kernel_skips,
    )
    DH = DH[:, :B, :n]
    dZ16 = jnp.moveaxis(dZ16[:, :, :B, :n], 1, 2).reshape(T, B, 4 * n)  # blocks i | f | o | c̃
    dW, dU, db, dxs = persistent.weight_gradients(xs, W, dZ16, H_prev)
    into_u = persistent.matmul("bk,nk->bn", dZ16[0], U)
    dh0 = persistent.initial_cotangent(into_u, mask, DH, valid)
    dc0 = dc0[:B, :n]
    dmask = None if mask is None else jnp.zeros_like(mask)  # a constant, as in the fused scans
    dskips = None
    if (
        skip
    ):  # DH holds dh_t with the anchor's cotangent in; da_{t-1} = (1 - on) da_t + skipped α dh_t
        t0, a0, alpha = skips
        on, skipped = (x[:, :, None] for x in _grid(skip, t0, T, valid[..., 0]))
        dalpha = jnp.sum(jnp.where(skipped, DH * A_prev, 0.0))
        # da_{-1}: the α dh_t of the skips up to the row's first grid step, and daT if none
        first = jnp.cumsum(on, axis=0) - on == 0  # no grid step before t
        da0 = jnp.sum(jnp.where(first & skipped, alpha * DH, 0.0), axis=0)
        da0 = da0 + jnp.where(first[-1] & ~on[-1], daT, 0.0)
        dskips = (None, da0.astype(a0.dtype), dalpha.astype(alpha.dtype))
    return (
        dW.astype(W.dtype),
        dU.astype(U.dtype),
        db.astype(b.dtype),
        dh0.astype(h0.dtype),
        dc0.astype(c0.dtype),
        dxs.astype(xs.dtype),
        None,
        dmask,
        dskips,
    )


_lstm.defvjp(_lstm_fwd, _lstm_bwd)


# The reset-after GRU (PyTorch's / cuDNN's): the same two kernels, the forward with the
# blocks r | z | n's input part | n's recurrent part, the backward with dh alone.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _gru(outputs: bool, interpret: bool, W, U, b, b_hn, h0, xs, lens, mask):
    return _gru_fwd(outputs, interpret, W, U, b, b_hn, h0, xs, lens, mask)[0]


def _gru_fwd(outputs, interpret, W, U, b, b_hn, h0, xs, lens, mask):
    n = U.shape[0]
    N = Padding.of(xs, n).N
    Wb, Ub = _blocks(W, n, N, 3), _blocks(U, n, N, 3)
    W4 = jnp.concatenate([Wb, jnp.zeros_like(Wb[:1])])  # no W block for n's recurrent part
    U4 = jnp.concatenate([Ub[:2], jnp.zeros_like(Ub[:1]), Ub[2:]])  # nor U for its input part
    b4 = jnp.concatenate([b.reshape(3, n), b_hn.reshape(1, n)])
    y = persistent.forward(
        xs, U4, W4, b4, h0, (h0,), lens, mask, step=GRU_RA_STEP, interpret=interpret
    )
    H_all = persistent.carries(y, h0, lens)
    H_prev = jnp.concatenate([h0[None], H_all[:-1]])
    Hm = H_prev if mask is None else H_prev * mask
    zx = (
        jnp.einsum("tbm,mk->tbk", xs.astype(_bf16), W.astype(_bf16), preferred_element_type=_f32)
        + b
    )
    zh = jnp.einsum("tbn,nk->tbk", Hm.astype(_bf16), U.astype(_bf16), preferred_element_type=_f32)
    r, z, g, cand = gru_reset_after_gates(zx, zh, b_hn, sigmoid=common.sigmoid)
    out = (H_all[-1], y if outputs else None)
    return out, (W, U, b, b_hn, xs, h0, lens, mask, H_prev, Hm, r, z, g, cand)


def _gru_bwd(outputs, interpret, res, cotangents):
    W, U, b, b_hn, xs, h0, lens, mask, H_prev, Hm, r, z, g, cand = res
    dhT, dys = cotangents
    n = U.shape[0]
    sizes = Padding.of(xs, n)
    T, B, N = sizes.T, sizes.B, sizes.N
    valid = persistent.valid_steps(T, lens)
    co = gru_reset_after_coefficients(r, z, g, cand, H_prev)
    Ar, Az, An, dn = co.dh_dzr, co.dh_dzz, co.dh_dg, co.dh_dzh
    pad = sizes.steps
    coef = jnp.stack([pad(a) for a in (Ar, Az, An)], axis=1).astype(_bf16)
    (DH,) = backward_call(
        coef,
        pad(z.astype(_f32)),
        sizes.cotangent(dys, valid, outputs),
        common.pad_to(_blocks(U, n, N, 3), (3, N, N)).astype(_bf16),
        sizes.lens(lens),
        sizes.rows(dhT),
        None,
        sizes.rows(mask),
        interpret=interpret,
    )
    DH = DH[:, :B, :n]
    dr, dz, dn_h, dn_x = (jnp.where(valid, DH * a, 0.0) for a in (Ar, Az, An, dn))
    dZh = jnp.concatenate([dr, dz, dn_h], axis=-1)  # what multiplies U
    dZx = jnp.concatenate([dr, dz, dn_x], axis=-1)  # what multiplies W, and b's gradient
    dW, dU, db, dxs = persistent.weight_gradients(xs, W, dZx, Hm, dZh)
    into_u = persistent.matmul("bk,nk->bn", dZh[0], U)
    dh0 = persistent.initial_cotangent(into_u, mask, DH, valid, DH[0] * z[0])
    dmask = None if mask is None else jnp.zeros_like(mask)
    return (
        dW.astype(W.dtype),
        dU.astype(U.dtype),
        db.astype(b.dtype),
        dn_h.sum(axis=(0, 1)).astype(b_hn.dtype),
        dh0.astype(h0.dtype),
        dxs.astype(xs.dtype),
        None,
        dmask,
    )


_gru.defvjp(_gru_fwd, _gru_bwd)


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
    """The cell over ``xs`` by the persistent kernels; the contract of
    :func:`rhnzoo.cells.gated_fused.unroll` (values and gradients by the custom VJP).

    Args:
      cell: an :class:`~rhnzoo.cells.LSTM`, :class:`~rhnzoo.cells.SCLSTM` or ``GRU(n,
        reset_after=True)``, n <= 128.
      params: the cell's parameters (``cell.init``), float32: ``{'W': [m, 4n], 'U': [n,
        4n], 'b': [4n]}`` (LSTM; SC-LSTM-P also ``'alpha': []``), ``{'W': [m, 3n], 'U':
        [n, 3n], 'b': [3n], 'b_hn': [n]}`` (GRU).
      carry: ``LSTMState(h [B, n], c [B, n])`` (LSTM), ``SCLSTMState(h, c, h_anchor [B,
        n], t [B] int32)`` (SC-LSTM) or h ``[B, n]`` (GRU), float32.
      xs: ``[T, B, m]`` float32, time-major.
      mask: ``[B, n]`` recurrent dropout mask or None; it multiplies h_{t-1} where it
        enters U, and is treated as a constant (zero gradient), as in the fused scans.
      opts: the :class:`~rhnzoo.cells.scan_options.Options` (``dtype`` bfloat16 or None;
        ``outputs``: "all", "last" (h at each row's last real step, the classifier's) or
        "none"; ``interpret``; ``batch_tile`` Bt: the LSTM's forward by the swap-AB
        kernel, module docstring; ``unroll``, ``project_per_step``, ``save_matmuls`` and
        ``layer_loop`` have no effect here).
      lengths: optional ``[B]`` int real steps per row (padded steps keep the carry and
        output zeros).
      resets: must be None: the kernels have no episode starts.

    Returns:
      ``(carry_T, ys [T, B, n] float32)``; ``(carry_T, last [B, n])`` with
      ``outputs="last"``; ``(carry_T, None)`` with ``"none"``.

    Raises:
      ValueError: for a cell without a kernel (see :func:`supports`), parameters that
        are not the cell's (:func:`rhnzoo.cells.lstm.check_params`), an ``opts.dtype``
        other than bfloat16 (or None), ``opts.remat``, ``resets``
        (:func:`~rhnzoo.cells.kernels.common.check_options`), an ``opts.batch_tile``
        for a cell other than a plain LSTM, or for sizes the swap-AB kernel does not
        take (:func:`rhnzoo.cells.kernels.swap_ab.fits`: its shared memory; e.g. n > 64
        with Bt 64 and m > 16).
    """
    if not supports(cell):
        raise ValueError(
            f"no Pallas kernel for {cell!r}: an LSTM, SC-LSTM or a reset-after "
            "GRU with hidden size <= 128 only"
        )
    common.check_options(opts, cell, resets)
    check_params(cell, params, xs.shape[-1])
    if type(cell) is not LSTM:
        common.refuse_batch_tile(opts, cell)
    common.refuse_xla_backward(opts, cell)
    outputs, interpret = opts.outputs == "all", opts.interpreted()
    lens = persistent.step_lengths(xs, lengths)
    if type(cell) is GRU:
        h, ys = _gru(
            outputs,
            interpret,
            params["W"],
            params["U"],
            params["b"],
            params["b_hn"],
            carry,
            xs,
            lens,
            mask,
        )
        return h, common.finish(h, ys, opts, lengths)
    skips, skip = None, 0
    if type(cell) is SCLSTM:
        alpha = params["alpha"] if cell.learn_alpha else jnp.ones((), _f32)
        skips, skip = (carry.t.astype(jnp.int32), carry.h_anchor, alpha), cell.skip
    (h, c, anchor), ys = _lstm(
        outputs,
        interpret,
        skip,
        opts.batch_tile,
        params["W"],
        params["U"],
        params["b"],
        carry.h,
        carry.c,
        xs,
        lens,
        mask,
        skips,
    )
    ys = common.finish(h, ys, opts, lengths)
    if skip:
        return SCLSTMState(h, c, anchor, carry.t + lens.astype(carry.t.dtype)), ys
    return type(carry)(h, c), ys
