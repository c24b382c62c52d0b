"""Persistent recurrent kernels for cells whose step is a chain of dependent products
(Pallas, Mosaic GPU): the recurrent residual network (Wang & Tian 2016, eqs. 3-4,
:class:`~rhnzoo.cells.RRN`) and Cho et al.'s GRU (2014, eqs. 5-8, the reset gate before
the matmul, :class:`~rhnzoo.cells.GRU`). As in :mod:`rhnzoo.cells.kernels.gated` (read
that module first: the tiling, TMA, barriers and precision policy are the same), the
time loop runs inside one kernel and the recurrent matrices stay in shared memory for
all T steps; unlike there, a step's second product waits on its first::

  RRN:  y_1 = σ(x_t W_1 + (h_{t-1} m) U_1 + b_1),  y_k = σ(x_t W_k + y_{k-1} U_k + b_k),
        h_t = tanh(h_{t-1} + y_K)
  GRU:  r, z = σ(x_t W_{r,z} + (h_{t-1} m) U_{r,z} + b_{r,z}),
        h̃ = tanh(x_t W_h + (r ⊙ h_{t-1} m) U_h + b_h),  h_t = h̃ + z (h_{t-1} - h̃)

A cell is K blocks ``(W_k [m, n], U_k [n, n], b_k [n])`` and two step functions written
against the kernels' primitives (its :class:`Chain`, :func:`chain_of`):

* **forward**: :func:`rhnzoo.cells.kernels.persistent.forward_call`, the forward kernel
  of every persistent cell (one warpgroup per 64 hidden units, W and U in shared memory): the
  step asks for ``product([(k, src)])``, block k's pre-activation ``x_t W_k + src U_k +
  b_k`` on the tensor cores, src the step's h_{t-1} m or a value ``restage(v)`` put in
  shared memory in bfloat16 for every warpgroup to read after a barrier (two buffers,
  alternating). The state h is float32 in registers.
* **backward**, one warpgroup per 64 hidden units as forward: the reverse recurrence of
  dh. The cell's per-step coefficients (float32 where they scale dh's direct path,
  bfloat16 where they only form a matmul input) are read straight from global memory;
  ``stage(terms)`` forms the warpgroup's dz of each term, stages it in shared memory in
  bfloat16 and, after one CTA barrier, accumulates its units of ``dz U_k^T`` on the
  tensor cores in its own [64, 64] float32 accumulator
  (:func:`~rhnzoo.cells.kernels.persistent.staged_products`, the gated cells' as well).
  The kernel writes dh_t (:func:`backward_call`).
* **outside the kernels**: the blocks' values are recomputed from the forward's h in
  parallel over T, the dz of every block is re-formed in float32 from the kernel's dh_t
  (the RRN's chain and the GRU's ``(dz_h U_h^T)`` by large matmuls), and dU, dW, db and
  the input gradient are single large matmuls over all T x B positions
  (:func:`~rhnzoo.cells.kernels.persistent.weight_gradients`).

Precision: bfloat16 matmul inputs with float32 accumulation; states, gates, their
cotangents and dh's direct paths (the RRN's residual 1 - h_t², the GRU's z) float32.
Shapes as :mod:`~rhnzoo.cells.kernels.gated`: n padded to 64 or 128, the batch to 64-row
tiles, m to a multiple of 16; padded units are inert (zero rows of every U_k).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from rhnzoo.cells.kernels import common, persistent, verified
from rhnzoo.cells.kernels.common import DEFAULT_OPTIONS, Options
from rhnzoo.cells.kernels.persistent import HALF, QUARTER, ROWS, Padding, Step
from rhnzoo.cells.lstm import GRU, check_params, gru_coefficients
from rhnzoo.cells.residual import RRN, rrn_coefficients

Array = jax.Array
_bf16, _f32 = jnp.bfloat16, jnp.float32
_mm = persistent.matmul

# The RRN's inner σ (its derivative: rhnzoo.cells.residual.rrn_coefficients).
_ACT = {"sigmoid": common.sigmoid, "tanh": jnp.tanh}


def _quarter(a, q):
    return a[:, q * QUARTER : (q + 1) * QUARTER]


def _masked(a, ms, q):
    return a if ms is None else a * ms[q]


# ------------------------------------------------------------------------- the cells


def _rrn_forward(K, activation, product, restage, carry, m, skips):
    act = _ACT[activation]
    y = act(product([(0, None)])[0])
    for k in range(1, K):
        y = act(product([(k, restage(y))])[0])
    h = jnp.tanh(carry[0] + y)
    return h, (h,)


def _rrn_backward(K, co32, co16, dh, stage, ms):
    """co32: 1 - h_t²; co16: σ'(z_k), k = 1..K. dh_{t-1} = ds + m (dz_1 U_1^T) with
    ds = dh (1 - h_t²), dz_K = ds σ'(z_K), dz_k = (dz_{k+1} U_{k+1}^T) σ'(z_k)."""
    quarters = range(len(dh))
    ds = [dh[q] * co32(0, q) for q in quarters]
    g = stage([(K - 1, lambda q: ds[q] * co16(K - 1, q))])
    for k in range(K - 2, -1, -1):
        g = stage([(k, lambda q, g=g, k=k: _quarter(g, q) * co16(k, q))])
    return [ds[q] + _masked(_quarter(g, q), ms, q) for q in quarters]


def _gru_forward(product, restage, carry, m, skips):
    (h,) = carry
    r, z = (common.sigmoid(a) for a in product([(0, None), (1, None)]))
    hm = h if m is None else h * m
    h_tilde = jnp.tanh(product([(2, restage(r * hm))])[0])
    h = h_tilde + z * (h - h_tilde)
    return h, (h,)


def _gru_backward(co32, co16, dh, stage, ms):
    """co32: z; co16: r, (1 - z)(1 - h̃²), (h_{t-1} - h̃) z(1 - z), h_{t-1} m r(1 - r).
    g = dz_h U_h^T (the cotangent of r ⊙ h m); dh_{t-1} = dh z + m (r g + dz_r U_r^T +
    dz_z U_z^T)."""
    quarters = range(len(dh))
    g = stage([(2, lambda q: dh[q] * co16(1, q))])
    a = stage([(0, lambda q: _quarter(g, q) * co16(3, q)), (1, lambda q: dh[q] * co16(2, q))])
    return [
        dh[q] * co32(0, q) + _masked(co16(0, q) * _quarter(g, q) + _quarter(a, q), ms, q)
        for q in quarters
    ]


@dataclasses.dataclass(frozen=True)
class Chain:
    """What the kernels need of a chained cell: its forward step
    (:class:`~rhnzoo.cells.kernels.persistent.Step`: K blocks, one float32 carry h, the
    values it restages), the number of its backward coefficients (``co32`` float32,
    ``co16`` bfloat16), the most dz terms of one stage (``terms``), and its backward step
    ``backward(co32, co16, dh quarters, stage, mask quarters) -> dh_{t-1} quarters``
    (each quarter [ROWS, 32] float32)."""

    step: Step
    co32: int
    co16: int
    terms: int
    backward: Callable


def chain_of(cell: Any) -> Chain:
    """The :class:`Chain` of an :class:`~rhnzoo.cells.RRN` (K = depth blocks, K - 1
    restaged values) or Cho et al.'s :class:`~rhnzoo.cells.GRU` (r | z | h̃, r ⊙ h
    restaged)."""
    if type(cell) is RRN:
        K = cell.depth
        forward = functools.partial(_rrn_forward, K, cell.activation)
        return Chain(Step(K, K - 1, forward), 1, K, 1, functools.partial(_rrn_backward, K))
    return Chain(Step(3, 1, _gru_forward), 1, 4, 2, _gru_backward)


def smem_bytes(cell: Any, m: int) -> tuple[int, int]:
    """Shared memory (bytes) of the forward and backward kernels for ``cell`` (an RRN or
    Cho's GRU) and input width ``m``: the scratch buffers listed in the kernels
    (barriers aside)."""
    s = chain_of(cell)
    N, MP = persistent.padded(cell.hidden_size, m)
    K = s.step.blocks
    bwd = K * N * N * 2 + s.terms * ROWS * N * 2  # U and one stage's dz; inputs from HBM
    return persistent.forward_smem_bytes(K, N, MP, s.step.restages), bwd


def _fits(cell: Any, m: int) -> bool:
    return max(smem_bytes(cell, m)) + 1024 <= common.SMEM_LIMIT


# The backend's place in the dispatcher (rhnzoo.cells.scan): its implementation, no remat,
# and what it runs, in the words of a refusal.
IMPL = "pallas"
REMAT = False
RUNS = (
    "the chained persistent kernels: RRN, Cho's GRU, hidden size <= 128 and the "
    "weights in one CTA's shared memory: the RRN up to depth 3 at n = 128"
)


def supports(cell: Any) -> bool:
    """Whether :func:`unroll` has a kernel for ``cell``: an :class:`~rhnzoo.cells.RRN` or
    Cho et al.'s :class:`~rhnzoo.cells.GRU` (``reset_after=False``) with hidden size at
    most 128 whose kernels fit one CTA's shared memory with a 1-wide input (the RRN:
    K <= 3 at n = 128)."""
    if type(cell) is GRU and cell.reset_after or type(cell) not in (RRN, GRU):
        return False
    return cell.hidden_size <= 128 and _fits(cell, 1)


def fits(
    cell: Any, batch: int, dtype: Any, backend: str | None = None, *, input_size: int = 1
) -> bool:
    """Whether ``auto`` may pick these kernels: a cell they run (:func:`supports`) whose
    kernels fit one CTA's shared memory for this ``input_size``, bfloat16 matmul inputs,
    a GPU (``backend`` None: JAX's default backend) of compute capability 9.0 (wgmma),
    **and** an entry of the verified record
    (:func:`rhnzoo.cells.kernels.verified.verified`: this source's digest, this device
    kind, this cell, n, K, ``batch``, ``input_size`` and dtype, errors checked, faster
    than the fused scan). No GPU has timed them (the record is empty), so ``auto`` leaves
    these cells to the fused scan. The signature is
    :func:`rhnzoo.cells.kernels.gated.fits`'s."""
    if not supports(cell) or not _fits(cell, input_size):
        return False
    if dtype is None or jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
        return False
    if (backend or jax.default_backend()) not in ("gpu", "cuda"):
        return False
    if verified.device().compute_capability != "9.0":
        return False
    return verified.fits("chained", cell, batch, dtype, input_size=input_size)


# ------------------------------------------------------------------------------ kernels


def backward_call(co32, co16, dy, u, lens, dhT, mask=None, *, spec: Chain, interpret: bool):
    """The backward kernel: the reverse recurrence of dh, one warpgroup per 64 hidden
    units (H = N / 64 per CTA), as :mod:`~rhnzoo.cells.kernels.gated`'s: each warpgroup
    carries its units' dh (two quarters of 32, float32), reads its units' coefficients
    straight from global memory and writes dh_t there; each stage of the cell's chain
    stages the warpgroup's dz terms (bfloat16) in shared memory and, after one CTA
    barrier, multiplies the whole dz into the warpgroup's units of ``sum_k dz_k U_k^T``
    in its own [64, 64] float32 accumulator (one wait per stage); with two warpgroups a
    second barrier keeps the next stage's dz from overwriting what the other's products
    still read.

    Args: ``co32 [T, I, Bp, N]`` f32 and ``co16 [T, J, Bp, N]`` bf16, the cell's per-step
    coefficients (``spec``); ``dy [T, Bp, N]`` f32 or None (the outputs' cotangents, zero
    on padded steps); ``u [K, N, N]`` bf16 (U_k); ``lens [Bp]``; ``dhT [Bp, N]`` f32, the
    final carry's cotangent; ``mask [Bp, N]`` f32 or None. Returns ``DH [T, Bp, N]`` f32:
    dh_t = dh_{t+1 -> t} + dy_t on real steps, the carried cotangent on padded ones."""
    pl, plgpu = common.plgpu()
    T, _, Bp, N = co32.shape
    K = u.shape[0]
    H = N // HALF
    has_dy, masked = dy is not None, mask is not None
    L = plgpu.Layout.WGMMA
    tile = (ROWS, QUARTER)

    def body(*refs):
        refs = list(refs)
        c32_ref, c16_ref = refs.pop(0), refs.pop(0)
        dy_ref = refs.pop(0) if has_dy else None
        u_ref, len_ref, dhT_ref = refs.pop(0), refs.pop(0), refs.pop(0)
        m_ref = refs.pop(0) if masked else None
        DH_ref, u_s, dz_s, bar_u, bar_step = refs
        rows = pl.ds(lax.axis_index("b") * ROWS, ROWS)
        wg = lax.axis_index("wg")  # this warpgroup's hidden units: 64 wg ... 64 wg + 63

        @pl.when(wg == 0)
        def _load_u():
            persistent.load_u(plgpu, u_ref, u_s, bar_u, K, H)

        cols = [pl.ds(wg * HALF + q * QUARTER, QUARTER) for q in range(2)]  # its quarters

        def load(ref, *idx, q):  # the warpgroup's quarter q of ref[*idx, rows], from HBM
            return plgpu.load(ref.at[(*idx, rows, cols[q])], layout=L, optimized=False)

        dhc = tuple(load(dhT_ref, q=q) for q in range(2))
        lens_v = plgpu.load(len_ref.at[rows], layout=L.reduce(1), optimized=False)
        for k in range(K * H):
            plgpu.barrier_wait(bar_u.at[k])

        def step(s, dhc):
            t = T - 1 - s
            valid = lax.broadcast_in_dim(t < lens_v, tile, [0])
            zero = jnp.zeros(tile, _f32)
            dh = []
            for q in range(2):  # dh_t, written out
                dh.append(dhc[q] + load(dy_ref, t, q=q) if has_dy else dhc[q])
                DH_ref[t, rows, cols[q]] = dh[q]
            co32 = lambda i, q: load(c32_ref, t, i, q=q)
            co16 = lambda i, q: load(c16_ref, t, i, q=q).astype(_f32)
            ms = [load(m_ref, q=q) for q in range(2)] if masked else None

            def stage(terms):
                """``sum_k dz_k U_k^T`` [ROWS, 64] for the warpgroup's units, for
                ``terms`` ``[(k, dz_k(q))]`` (each warpgroup's quarters q of dz_k, zero on
                padded steps) through dz_s."""
                for q in range(2):
                    for i, (_, dz) in enumerate(terms):
                        dz_s[i, 2 * wg + q] = jnp.where(valid, dz(q), zero).astype(_bf16)
                pairs = [(i, k) for i, (k, _) in enumerate(terms)]  # dz slot i times U_k^T
                return persistent.staged_products(
                    pl, plgpu, dz_s, u_s, pairs, wg=wg, H=H, bar_step=bar_step
                )

            new = spec.backward(co32, co16, dh, stage, ms)
            # a padded step keeps dh: this thread's own dh_t, just written
            return tuple(jnp.where(valid, a, load(DH_ref, t, q=q)) for q, a in enumerate(new))

        lax.fori_loop(0, T, step, dhc)

    kernel = persistent.persistent_kernel(
        body,
        out_type=jax.ShapeDtypeStruct((T, Bp, N), _f32),
        scratch_types=(
            *persistent.backward_smem(plgpu, K, spec.terms, N),  # U's blocks, dz
            plgpu.Barrier(num_barriers=K * H),
            plgpu.Barrier(num_arrivals=H),
        ),
        Bp=Bp,
        H=H,
        interpret=interpret,
    )
    u = u.reshape(K, H, HALF, N)  # U_k's rows (dh_{t-1}'s units) split by warpgroup
    return kernel(
        *((co32, co16) + ((dy,) if has_dy else ()) + (u, lens, dhT) + ((mask,) if masked else ()))
    )


# ------------------------------------------------------------------------------ the unroll


def _recompute(cell, W, U, b, xs, Hm):
    """The values of every step in parallel over T, as the kernel forms them: the RRN's
    ``[y_1, ..., y_K]``, the GRU's ``[r, z, h̃]`` (each ``[T, B, n]`` float32)."""
    zx = _mm("tbm,kmn->ktbn", xs, W) + b[:, None, None, :]
    if type(cell) is RRN:
        act = _ACT[cell.activation]
        ys, src = [], Hm
        for k in range(cell.depth):
            ys.append(act(zx[k] + _mm("tbi,ij->tbj", src, U[k])))
            src = ys[-1]
        return ys
    r, z = (common.sigmoid(zx[k] + _mm("tbi,ij->tbj", Hm, U[k])) for k in (0, 1))
    return [r, z, jnp.tanh(zx[2] + _mm("tbi,ij->tbj", r * Hm, U[2]))]


def _coefficients(cell, vals, H_all, H_prev, Hm):
    """The backward kernel's ``(co32, co16)`` lists (see :func:`_rrn_backward`,
    :func:`_gru_backward`)."""
    if type(cell) is RRN:
        co = rrn_coefficients(H_all, vals, cell.activation)
        return [co.dh_ds], list(co.dy_dz)
    r, z, ht = vals
    co = gru_coefficients(r, z, ht, H_prev, Hm)
    return [z], [r, co.dh_dzh, co.dh_dzz, co.da_dzr]


def _block_grads(cell, U, DH, valid, vals, Hm, co32, co16):
    """``(dz, srcs)``: every block's pre-activation cotangent ``[T, B, n]`` float32 (zero
    on padded steps) from the kernel's dh_t, and what multiplied U_k in the forward."""
    if type(cell) is RRN:
        K = cell.depth
        ds = jnp.where(valid, DH * co32[0], 0.0)
        dz = [None] * K
        dz[K - 1] = ds * co16[K - 1]
        for k in range(K - 1, 0, -1):
            dz[k - 1] = _mm("tbj,ij->tbi", dz[k], U[k]) * co16[k - 1]
        return dz, [Hm] + vals[:-1]
    dz_h = jnp.where(valid, DH * co16[1], 0.0)
    g = _mm("tbj,ij->tbi", dz_h, U[2])
    return [g * co16[3], jnp.where(valid, DH * co16[2], 0.0), dz_h], [Hm, Hm, vals[0] * Hm]


def _initial_cotangent(cell, U, DH, valid, co32, co16, dz, mask):
    """dh_{-1}: the kernel's step at t = 0 (the carried cotangent on an empty row)."""
    if type(cell) is RRN:
        direct, into_U = DH[0] * co32[0][0], _mm("bj,ij->bi", dz[0][0], U[0])
    else:
        g = _mm("bj,ij->bi", dz[2][0], U[2])
        direct = DH[0] * co32[0][0]
        into_U = (
            co16[0][0] * g + _mm("bj,ij->bi", dz[0][0], U[0]) + _mm("bj,ij->bi", dz[1][0], U[1])
        )
    return persistent.initial_cotangent(into_U, mask, DH, valid, direct)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _chain(cell, outputs: bool, interpret: bool, W, U, b, h0, xs, lens, mask):
    return _chain_fwd(cell, outputs, interpret, W, U, b, h0, xs, lens, mask)[0]


def _chain_fwd(cell, outputs, interpret, W, U, b, h0, xs, lens, mask):
    """``W [K, m, n]``, ``U [K, n, n]``, ``b [K, n]``: the cell's blocks."""
    N = Padding.of(xs, U.shape[1]).N
    y = persistent.forward(
        xs,
        common.pad_to(U, U.shape[:2] + (N,)),
        common.pad_to(W, W.shape[:2] + (N,)),
        b,
        h0,
        (h0,),
        lens,
        mask,
        step=chain_of(cell).step,
        interpret=interpret,
    )
    H_all = persistent.carries(y, h0, lens)
    H_prev = jnp.concatenate([h0[None], H_all[:-1]])
    Hm = H_prev if mask is None else H_prev * mask
    vals = _recompute(cell, W, U, b, xs, Hm)
    out = (H_all[-1], y if outputs else None)
    return out, (W, U, xs, h0, lens, mask, H_all, H_prev, Hm, vals)


def _chain_bwd(cell, outputs, interpret, res, cotangents):
    W, U, xs, h0, lens, mask, H_all, H_prev, Hm, vals = res
    dhT, dys = cotangents
    K, n = U.shape[0], U.shape[1]
    sizes = Padding.of(xs, n)
    T, B, m, N = sizes.T, sizes.B, sizes.m, sizes.N
    valid = persistent.valid_steps(T, lens)
    co32, co16 = _coefficients(cell, vals, H_all, H_prev, Hm)
    pad = sizes.steps
    call = functools.partial(backward_call, spec=chain_of(cell), interpret=interpret)
    DH = persistent.one_at_a_time(call)(
        jnp.stack([pad(a) for a in co32], axis=1).astype(_f32),
        jnp.stack([pad(a) for a in co16], axis=1).astype(_bf16),
        sizes.cotangent(dys, valid, outputs),
        common.pad_to(U, (K, N, N)).astype(_bf16),
        sizes.lens(lens),
        sizes.rows(dhT),
        sizes.rows(mask),
    )[:, :B, :n]
    dz, srcs = _block_grads(cell, U, DH, valid, vals, Hm, co32, co16)
    # the blocks side by side ([m, K n], [T, B, K n]) for the epilogue, and back
    W_cols = jnp.moveaxis(W, 0, 1).reshape(m, K * n)
    dW, dU, db, dxs = persistent.weight_gradients(
        xs, W_cols, jnp.concatenate(dz, axis=-1), srcs, dz
    )
    dW, dU = (jnp.moveaxis(a.reshape(a.shape[0], K, n), 1, 0) for a in (dW, dU))
    dh0 = _initial_cotangent(cell, U, DH, valid, co32, co16, dz, mask)
    dmask = None if mask is None else jnp.zeros_like(mask)  # a constant, as in the fused scans
    return (
        dW.astype(W.dtype),
        dU.astype(U.dtype),
        db.reshape(K, n).astype(W.dtype),
        dh0.astype(h0.dtype),
        dxs.astype(xs.dtype),
        None,
        dmask,
    )


_chain.defvjp(_chain_fwd, _chain_bwd)


def _blocks_of(cell, params) -> tuple[Array, Array, Array]:
    """The cell's parameters as K blocks: ``W [K, m, n]``, ``U [K, n, n]``, ``b [K, n]``
    (the RRN's layers; the GRU's r | z | h̃)."""
    W, U, b = params["W"], params["U"], params["b"]
    n = cell.hidden_size
    K = U.shape[0] if U.ndim == 3 else U.shape[1] // n
    W = jnp.moveaxis(W.reshape(W.shape[0], K, n), 1, 0)
    if U.ndim == 2:
        U = jnp.moveaxis(U.reshape(n, K, n), 1, 0)
    return W, U, b.reshape(K, n)


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
    """An RRN or Cho et al.'s GRU over ``xs`` by the persistent kernels; the contract of
    :func:`rhnzoo.cells.gated_fused.unroll` (values and gradients by the custom VJP).

    Args:
      cell: an :class:`~rhnzoo.cells.RRN` or ``GRU(n)`` (``reset_after=False``) of
        :func:`supports` (n <= 128).
      params: ``cell.init``'s, float32: the RRN's ``{'W': [m, K n], 'U': [K, n, n], 'b':
        [K n]}``, the GRU's ``{'W': [m, 3n], 'U': [n, 3n], 'b': [3n]}``.
      carry: h ``[B, n]`` float32.
      xs: ``[T, B, m]`` float32, time-major.
      mask: ``[B, n]`` recurrent dropout mask or None; it multiplies h_{t-1} where it
        enters U (the RRN's U_1, the GRU's U; the residual and the GRU's interpolation
        use h_{t-1} itself) and is a constant (zero gradient), as in the fused scans.
      opts: the :class:`~rhnzoo.cells.scan_options.Options` (``dtype`` bfloat16 or None;
        ``outputs`` "all", "last" or "none"; ``interpret``; the others have no effect
        here).
      lengths: optional ``[B]`` int real steps per row (padded steps keep the carry and
        output zeros).
      resets: must be None: the kernels have no episode starts.

    Returns:
      ``(h_T [B, n] float32, ys [T, B, n] float32)``; ``last [B, n]`` for ``ys`` with
      ``outputs="last"``, None with ``"none"``.

    Raises:
      ValueError: for a cell without a kernel (:func:`supports`), an ``opts.dtype``
        other than bfloat16 (or None), ``opts.remat``, ``resets``
        (:func:`~rhnzoo.cells.kernels.common.check_options`), shapes whose kernels
        exceed one CTA's shared memory (a wide input), the GRU's parameters not the
        cell's (:func:`rhnzoo.cells.lstm.check_params`), or an ``opts.batch_tile`` (the
        swap-AB forward is the LSTM's).
    """
    if not supports(cell):
        raise ValueError(
            f"no Pallas kernel for {cell!r}: an RRN or Cho's GRU with hidden "
            "size <= 128 whose matrices fit one CTA's shared memory only"
        )
    common.check_options(opts, cell, resets)
    common.refuse_batch_tile(opts, cell)
    if isinstance(cell, GRU):
        check_params(cell, params, xs.shape[-1])
    lens = persistent.step_lengths(xs, lengths)
    m = xs.shape[2]
    if not _fits(cell, m):
        need = max(smem_bytes(cell, m))
        raise ValueError(
            f"the {type(cell).__name__} kernels need {need} B of shared memory at "
            f"input width {m} (one CTA has "
            f"{common.SMEM_LIMIT}): use scan_impl='fused'"
        )
    W, U, b = _blocks_of(cell, params)
    outputs = opts.outputs == "all"
    h, ys = _chain(cell, outputs, opts.interpreted(), W, U, b, carry, xs, lens, mask)
    return h, common.finish(h, ys, opts, lengths)
