"""A fused micro-layer kernel for the coupled RHN and HSG(RHN) (Pallas, Mosaic GPU).

Each micro-layer of the Recurrent Highway Network (Zilly et al., ICML 2017, eqs. 6-8,
coupled carry gate C = 1 - T) is one GEMM followed by elementwise work. The fused scan
(:mod:`rhnzoo.cells.rhn_fused`) runs them as XLA ops: on a GPU a GEMM launch and the
elementwise launches after it, per micro-layer and time step, a launch-bound recurrence
(issue 60). Here one kernel per micro-layer does both, feature-major as the fused scan
(the state transposed, ``s^T [n, B]``):

* **the GEMM, swap-AB**: ``z^T = R_l^T (s m)^T`` with the gates as the GEMM's M and the
  batch as N. Each CTA owns 64 hidden units (one warpgroup's wgmma M) and a tile of Bt
  batch columns (16, 32 or 64: :func:`default_batch_tile`), and holds two float32
  accumulators ``[64, Bt]``, one for the H rows and one for the T rows of its units, so
  that the highway update of its units needs nothing from another CTA. The grid is ``(N / 64,
  Bp / Bt)``: at hidden 830 and batch 20 (``ptb_sota``) 13 CTAs. The contraction over
  the n state units is a TMA pipeline
  (:func:`jax.experimental.pallas.mosaic_gpu.emit_pipeline`) of 64-wide K blocks of
  R_l^T and of the bfloat16 operand (s m)^T, two stages in flight, into ``plgpu.wgmma``
  (bfloat16 inputs, float32 accumulation): shared memory does not grow with n. R_l^T's
  blocks take the operand's swizzle (32, 64 or 128 bytes): a 128-byte swizzle beside a
  narrower one fails JAX 0.11.2's layout inference (an ``AssertionError``) at Bt < 64.
  The kernel reads micro-layer l's weights from the stacked ``[L, 2, N, N]`` array by
  index (a scalar input), so no micro-layer's weights are copied out of the stack, in
  the Python loop over micro-layers or in the ``lax.scan`` over them (above depth
  :data:`~rhnzoo.cells.rhn_fused.LOOP_LAYERS_UP_TO`, as in the fused scan).
* **the highway epilogue, fused**: h = tanh(z_H + b_H (+ [W x_t]_H at l = 1)), T =
  σ(z_T + b_T (+ [W x_t]_T)), s_l = s_{l-1} + T (h - s_{l-1}) (eq. 6 with C = 1 - T),
  in float32 registers; the kernel writes s_l, h and T (float32, what the backward pass
  needs) and the next micro-layer's GEMM operand (s_l m)^T in bfloat16, m the recurrent
  dropout mask (an input, as in the fused scan; ones without dropout). The input
  projection W x_t of all T steps is one GEMM before the time loop, as in the fused
  scan, added in the first micro-layer's epilogue.
* **the HSG gate** (Shoham & Permuter, eqs. 5-6) where the cell is HSG(RHN): the same
  kernel with one accumulator and two operands, ``z^T = W_R^T ŝ_{t-1}^T + W_F^T s_L^T``,
  and the epilogue g = σ(z + b_G), ŝ_t = s_L + g (ŝ_{t-1} - s_L).

**Gradients**: a ``jax.custom_vjp``; the forward runs the kernels and saves every
micro-layer's input state, h and T (and HSG's gate) in the layout of the fused scan's
forward, padded as the kernels wrote them (``[..., Np, Bp]``). The backward pass (eqs.
6-8 differentiated, :func:`_backward`) runs the micro-layers in reverse, one kernel
each, as the forward does:

* **micro-layer l's backward kernel** takes dz_l (bf16, ``[2N, Bp]``: the H and T rows'
  pre-activation cotangents, written by kernel l+1) as its GEMM operand against R_l's H
  and T column blocks (``[L, 2, N, N]``, the forward's stack transposed once per call,
  indexed by layer as there): one accumulator ``R_l dz_l`` for the CTA's 64 units, two
  weight and two operand blocks a pipeline stage. Its epilogue forms the cotangent of
  the micro-layer's input, ds_{l-1} = ds_l (1 - T_l) + m (R_l dz_l) (the carry path,
  C = 1 - T, and the GEMM's, m the dropout mask), written in float32, and from it
  micro-layer l-1's dz_H = ds_{l-1} T (1 - h²) and dz_T = ds_{l-1} (h - s) T (1 - T)
  (its h, T and input s are epilogue tiles), written in bf16 for kernel l-1. Micro-layer
  1's kernel writes ds_0 only. Registers (ptxas, sm_90a): 44-47 at Bt = 16, 130 at Bt
  = 64 (six float32 tiles and the accumulator), no spills
  (docs/runs/kernels/rhn_backward.md).
* **in XLA**: micro-layer L's dz (from ds_L), HSG's gate backward (eqs. 5-6: dz_G and
  the two bf16 products with W_R and W_F), the time-step boundary; after the time loop
  the weight gradients, one GEMM per micro-layer over all T x B positions from the
  kernels' bf16 dz (db sums them in float32), as the fused scan forms them.

``Options(kernel_backward=False)`` runs the fused scan's hand-written backward in XLA instead
(:func:`rhnzoo.cells.rhn_fused.unroll_backward`, bfloat16 matmul inputs; the saved
arrays cut to n and B for it). Values and every gradient agree with
:func:`rhnzoo.cells.unroll` to bfloat16 rounding either way (tests/test_rhn_pallas.py,
GPU interpret mode on the CPU; lowered for ``cuda``).

Precision: the project's bfloat16 policy (``dtype=jnp.bfloat16`` only): bfloat16 GEMM
inputs, float32 accumulation, state, gates and parameters.

Shapes: n is padded to a multiple of 64, the batch to a multiple of Bt; padded units
have zero weights and stay zero, padded batch columns are discarded.

Per time step: L micro-layer kernel launches (and, with HSG, one cast of ŝ_{t-1} and s_L
to bfloat16 and the gate's kernel); nothing else; in the backward pass L kernel launches
and micro-layer L's dz (and HSG's gate) in XLA. Registers (ptxas, sm_90a, counted on
the CPU): 47-48 a thread at Bt = 16, up to 166 at Bt = 64, no spills
(docs/runs/kernels/rhn_micro_layer.md).

Dispatch: ``scan_impl='pallas'`` runs the coupled RHN and HSG(RHN) here
(:mod:`rhnzoo.cells.scan`); :func:`fits` is False everywhere, so ``auto`` keeps picking
the fused scan for the RHN: no GPU timing of this kernel exists yet.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from rhnzoo.cells import fastmath, rhn_fused
from rhnzoo.cells.kernels import common, verified
from rhnzoo.cells.kernels.common import DEFAULT_OPTIONS, Options
from rhnzoo.cells.rhn import HSG, RHN

Array = jax.Array

ROWS = 64  # hidden units per CTA: one warpgroup's wgmma M
BLOCK_K = 64  # state units per K block of the GEMM pipeline (one 128-byte bf16 swizzle)
_STAGES = 2  # K blocks in flight in the GEMM pipeline
_bf16, _f32 = jnp.bfloat16, jnp.float32


# The backend's place in the dispatcher (rhnzoo.cells.scan): its implementation, no remat,
# and what it runs, in the words of a refusal.
IMPL = "pallas"
REMAT = False
RUNS = "the micro-layer kernel: coupled RHN, HSG(RHN)"


def supports(cell: Any) -> bool:
    """Whether :func:`unroll` runs ``cell``: a coupled :class:`~rhnzoo.cells.RHN`, or
    :class:`~rhnzoo.cells.HSG` around one (any hidden size and depth)."""
    inner = cell.cell if isinstance(cell, HSG) else cell
    return isinstance(inner, RHN) and inner.coupled


def fits(
    cell: Any, batch: int, dtype: Any, backend: str | None = None, *, input_size: int = 1
) -> bool:
    """Whether ``auto`` may pick the kernels: a coupled RHN or HSG(RHN)
    (:func:`supports`), bfloat16 matmul inputs, a GPU (``backend`` None: JAX's default
    backend) of compute capability 9.0 (wgmma), **and** an entry of the verified record
    (:func:`rhnzoo.cells.kernels.verified.verified`: this source's digest, this device
    kind, this cell, n, L, ``batch``, ``input_size`` and dtype, errors checked, faster
    than the fused scan). No GPU has timed them (the record is empty), so ``auto`` keeps
    the fused scan for the RHN. The arguments are the dispatcher's signature."""
    if not supports(cell) or dtype is None or jnp.dtype(dtype) != jnp.dtype(_bf16):
        return False
    if (backend or jax.default_backend()) not in ("gpu", "cuda"):
        return False
    if verified.device().compute_capability != "9.0":
        return False
    return verified.fits("rhn", cell, batch, dtype, input_size=input_size)


def default_batch_tile(batch: int) -> int:
    """Bt, the batch columns per CTA (the wgmma N) for ``batch`` rows: the smallest of 16,
    32 and 64 that holds them, else 64. Up to 64 rows one batch tile: each CTA streams
    its units' rows of R_l^T once per micro-layer, the least padding. Not timed."""
    return next((bt for bt in (16, 32) if batch <= bt), 64)


def smem_bytes(bt: int = 64) -> int:
    """Shared memory (bytes) of the largest kernel for batch tile ``bt``, barriers aside:
    the backward kernel of micro-layers l > 1 (two weight and two dz blocks a pipeline
    stage, six epilogue tiles: 192.25 KiB at Bt = 64), larger than the first micro-layer's
    forward (two weight blocks, four epilogue tiles, four outputs) at every Bt.
    Independent of n (the GEMM is pipelined over K)."""
    return max(_smem_bytes(_RHN, 2, 1, 4, bt), _smem_bytes(_RHN_BACKWARD, 2, 2, 6, bt))


def _smem_bytes(kind, G, P, E, bt):
    """A ``kind`` of kernel's shared memory with ``G`` weight and ``P`` operand blocks a
    stage and ``E`` epilogue tiles (:func:`_layer_call`'s scratch): the pipeline's stages,
    the float32 input and output tiles, the next operand's bf16 tiles, the biases."""
    stage = (G * ROWS + P * bt) * BLOCK_K * 2
    tiles = (E + kind.n_out) * ROWS * bt * 4 + max(kind.n_next, 1) * ROWS * bt * 2
    return _STAGES * stage + tiles + (len(kind.pairs) if kind.bias else 1) * ROWS * 4


# ------------------------------------------------------------------------------ the kernel


def _rhn_epilogue(zs, tiles):
    """Eqs. 6-8 with C = 1 - T on one CTA's tile: ``zs`` the H and T pre-activations
    (biases added), ``tiles`` = (s_{l-1}, m) or, in the first micro-layer, (s_{l-1}, m,
    [W x_t]_H, [W x_t]_T). Returns ((s_l, h, T), (s_l m,))."""
    s, m = tiles[:2]
    z_h, z_t = zs
    if len(tiles) == 4:
        z_h, z_t = z_h + tiles[2], z_t + tiles[3]
    h, t = jnp.tanh(z_h), common.sigmoid(z_t)
    s_next = s + t * (h - s)
    return (s_next, h, t), (s_next * m,)


def _hsg_epilogue(zs, tiles):
    """HSG, eqs. 5-6: ``zs`` = (W_R ŝ_{t-1} + W_F s_L + b_G,), ``tiles`` = (ŝ_{t-1}, s_L,
    m). Returns ((ŝ_t, g), (ŝ_t m,))."""
    s_hat, s_l, m = tiles
    g = common.sigmoid(zs[0])
    s_new = s_l + g * (s_hat - s_l)
    return (s_new, g), (s_new * m,)


def _rhn_backward_epilogue(zs, tiles):
    """Eqs. 6-8 (C = 1 - T) differentiated, micro-layer l's backward on one CTA's tile:
    ``zs`` = (R_l dz_l,), the GEMM over micro-layer l's 2N gate rows; ``tiles`` = (ds_l,
    T_l, m) and, for l > 1, micro-layer l-1's (h_{l-1}, T_{l-1}, s_{l-2}). The cotangent
    of micro-layer l's input is ds_{l-1} = ds_l (1 - T_l) + m (R_l dz_l) (the carry path
    and the GEMM's, the mask m on the GEMM's input); from it micro-layer l-1's
    pre-activation cotangents dz_H = ds_{l-1} T (1 - h²) and dz_T = ds_{l-1} (h - s) T (1
    - T) (its H and T rows: the next kernel's GEMM operand). Returns ((ds_{l-1},), (dz_H,
    dz_T)) or, at l = 1, ((ds_0,), ())."""
    ds, t, m = tiles[:3]
    ds = ds * (1 - t) + m * zs[0]
    if len(tiles) == 3:
        return (ds,), ()
    h, t, s = tiles[3:]
    dz_t = ds * t
    return (ds,), (dz_t * (1 - h * h), dz_t * (h - s) * (1 - t))


class _Kind(NamedTuple):
    """What one kernel computes: per accumulator its (weight block, operand) products;
    the epilogue (accumulators, float32 tiles) -> (float32 outputs, next operand's row
    blocks); how many of each; whether each accumulator gets a bias row."""

    pairs: tuple
    epilogue: Any
    n_out: int
    n_next: int
    bias: bool = True


_RHN = _Kind((((0, 0),), ((1, 0),)), _rhn_epilogue, 3, 1)
_HSG = _Kind((((0, 0), (1, 1)),), _hsg_epilogue, 2, 1)
# R_l dz_l over micro-layer l's H and T rows: two weight blocks, two operand blocks, one
# accumulator; micro-layer 1's backward forms no dz.
_RHN_BACKWARD = _Kind((((0, 0), (1, 1)),), _rhn_backward_epilogue, 1, 2, bias=False)
_RHN_BACKWARD_FIRST = _RHN_BACKWARD._replace(n_next=0)


def _layer_call(layer, w, ops, b, tiles, *, kind: _Kind, bt: int, interpret: bool):
    """One micro-layer (``kind`` :data:`_RHN`), HSG gate (:data:`_HSG`) or micro-layer
    backward (:data:`_RHN_BACKWARD`, :data:`_RHN_BACKWARD_FIRST`) kernel.

    Args: ``layer [1]`` int32, which of the stacked weights to use (the kernel's TMA
    copies index the stack: no copy of a layer's weights out of it, in a ``lax.scan``
    over micro-layers either); ``w [Lw, G, N, K]`` bf16, the stacked weight blocks
    (R_l^T's H and T rows; W_R^T and W_F^T; R_l's H and T columns, each [N, N]); ``ops
    [P, K, Bp]`` bf16, the GEMM operands (the masked state; ŝ and s_L; dz_l's H and T
    rows); ``b [Lw, A, N]`` f32, one bias row per accumulator, or None (``kind.bias``
    False); ``tiles``: the epilogue's float32 inputs, each ``[N, Bp]``, or a pair
    ``(stack [Lt, N, Bp], offset)`` read at micro-layer ``layer + offset`` (by index, as
    the weights: no copy of a micro-layer's tile out of the stack). N and K multiples of
    64, Bp of ``bt``. Returns the epilogue's float32 outputs (each ``[N, Bp]``) and, where
    ``kind.n_next``, the next GEMM operand ``[n_next N, Bp]`` bf16 (its row blocks
    stacked)."""
    pl, plgpu = common.plgpu()
    pairs, epilogue, n_out, n_next, bias = kind
    offsets = [t[1] if isinstance(t, tuple) else None for t in tiles]
    tiles = [t[0] if isinstance(t, tuple) else t for t in tiles]
    _, G, N, K = w.shape
    P, _, Bp = ops.shape
    A, E = len(pairs), len(tiles)
    n_bar = E + bias
    lay = plgpu.Layout.WGMMA
    sw = functools.partial(common.swizzled, plgpu)

    def body(layer_ref, w_ref, op_ref, *refs):
        b_ref, refs = (refs[0], refs[1:]) if bias else (None, refs)
        tile_refs, out_refs = refs[:E], refs[E : E + n_out + (n_next > 0)]
        tile_s, out_s, next_s, b_s, bar = refs[E + n_out + (n_next > 0) :]
        rows = pl.ds(pl.multiple_of(lax.axis_index("m") * ROWS, ROWS), ROWS)
        j = lax.axis_index("b")
        cols = pl.ds(pl.multiple_of(j * bt, bt), bt)
        layer = layer_ref[0]
        # The epilogue's inputs arrive while the GEMM runs.
        for e, (ref, offset) in enumerate(zip(tile_refs, offsets)):
            ref = ref if offset is None else ref.at[layer + offset]
            plgpu.copy_gmem_to_smem(ref.at[rows, cols], tile_s.at[e], bar.at[e])
        if bias:
            plgpu.copy_gmem_to_smem(b_ref.at[layer, :, rows], b_s, bar.at[E])
        i = lax.axis_index("m")

        def gemm(*accs):
            def k_block(_, *smem):
                w_s, o_s = smem[:G], smem[G:]
                for acc, products in zip(accs, pairs):
                    for g, p in products:
                        plgpu.wgmma(acc, w_s[g], o_s[p])
                plgpu.wgmma_wait(0)  # this stage's buffers are read: the pipeline refills them

            w_spec = plgpu.BlockSpec((ROWS, BLOCK_K), lambda k: (i, k), transforms=sw(_bf16, bt))
            o_spec = plgpu.BlockSpec((BLOCK_K, bt), lambda k: (k, j), transforms=sw(_bf16, bt))
            plgpu.emit_pipeline(
                k_block,
                grid=(K // BLOCK_K,),
                in_specs=[w_spec] * G + [o_spec] * P,
                max_concurrent_steps=_STAGES,
            )(*[w_ref.at[layer, g] for g in range(G)], *[op_ref.at[p] for p in range(P)])
            return tuple(a[...] for a in accs)

        zs = pl.run_scoped(gemm, *[plgpu.ACC((ROWS, bt), _f32)] * A)
        for e in range(n_bar):
            plgpu.barrier_wait(bar.at[e])
        if bias:
            zs = [
                z
                + lax.broadcast_in_dim(plgpu.load(b_s.at[a], layout=lay.reduce(1)), (ROWS, bt), [0])
                for a, z in enumerate(zs)
            ]
        outs, nexts = epilogue(zs, [plgpu.load(tile_s.at[e], layout=lay) for e in range(E)])
        for k, v in enumerate(outs):
            out_s[k] = v
        for q, v in enumerate(nexts):
            next_s[q] = v.astype(_bf16)
        plgpu.commit_smem()
        for k in range(n_out):
            plgpu.copy_smem_to_gmem(out_s.at[k], out_refs[k].at[rows, cols])
        for q in range(n_next):  # row block q of the next operand: rows q N + (this CTA's)
            q_rows = pl.ds(pl.multiple_of(q * N + lax.axis_index("m") * ROWS, ROWS), ROWS)
            plgpu.copy_smem_to_gmem(next_s.at[q], out_refs[n_out].at[q_rows, cols])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((N, Bp), _f32),) * n_out
        + (jax.ShapeDtypeStruct((n_next * N, Bp), _bf16),) * (n_next > 0),
        scratch_types=(
            plgpu.SMEM((E, ROWS, bt), _f32, transforms=sw(_f32, min(bt, 32))),
            plgpu.SMEM((n_out, ROWS, bt), _f32, transforms=sw(_f32, min(bt, 32))),
            plgpu.SMEM((max(n_next, 1), ROWS, bt), _bf16, transforms=sw(_bf16, bt)),
            plgpu.SMEM((A if bias else 1, ROWS), _f32),
            plgpu.Barrier(num_barriers=n_bar),
        ),
        grid=(N // ROWS, Bp // bt),
        grid_names=("m", "b"),
        interpret=common.interpret_params(interpret),
    )
    return kernel(layer, w, ops, *((b,) if bias else ()), *tiles)


# ------------------------------------------------------------------------------ the unroll


def _kernel_weights(R, b, hsg, Np):
    """The kernels' weights, once per call: ``R [L, n, 2n]`` -> R_l^T's H and T row blocks
    ``[L, 2, Np, Np]`` bf16, ``b [L, 2n]`` -> ``[L, 2, Np]`` f32; HSG's ``(W_R^T | W_F^T
    [1, 2, Np, Np] bf16, b_G [1, 1, Np] f32)`` or None."""
    L, n, _ = R.shape
    RT = jnp.moveaxis(R.reshape(L, n, 2, n), 1, 3)  # [L, 2, n (out), n (in)]
    RT = common.pad_to(RT, (L, 2, Np, Np)).astype(_bf16)
    bk = common.pad_to(b.reshape(L, 2, n), (L, 2, Np)).astype(_f32)
    if hsg is None:
        return RT, bk, None
    W_R, W_F, b_G = hsg
    w = common.pad_to(jnp.stack([W_R.T, W_F.T])[None], (1, 2, Np, Np)).astype(_bf16)
    return RT, bk, (w, common.pad_to(b_G[None, None], (1, 1, Np)).astype(_f32))


def _run(R, b, hsg, s0, x_proj, mask, *, loop: bool, bt: int, interpret: bool, padded=False):
    """The forward recurrence by the kernels, feature-major and unpadded in and out (as
    :mod:`rhnzoo.cells.rhn_fused`'s): ``s0 [n, B]``, ``x_proj [T, 2n, B]``, ``mask [n,
    B]``. Returns ``((s_T, ys [T, n, B]), saved)``, ``saved`` in the fused scan's layout
    (:func:`rhnzoo.cells.rhn_fused.unroll_backward`): with ``loop`` each micro-layer's
    arrays separate (lists of L ``[T, n, B]``), else stacked ``[T, L, n, B]`` (a
    ``lax.scan`` over micro-layers 2..L, compile time independent of L); with ``padded``
    as the kernels wrote them, ``[..., Np, Bp]`` (for :func:`_backward`: no copy out and
    back). Either way each kernel reads its micro-layer's weights from the one stack by
    index."""
    n, B = s0.shape
    T, L = x_proj.shape[0], R.shape[0]
    Np, Bp = -(-n // ROWS) * ROWS, -(-B // bt) * bt
    RT, bk, hsg_k = _kernel_weights(R, b, hsg, Np)
    m = common.pad_to(mask.astype(_f32), (Np, Bp))
    xp = common.pad_to(x_proj.reshape(T, 2, n, B).astype(_f32), (T, 2, Np, Bp))
    s0 = common.pad_to(s0.astype(_f32), (Np, Bp))
    call = functools.partial(_layer_call, bt=bt, interpret=interpret)

    def index(l):  # the kernels' layer argument
        return jnp.full((1,), l, jnp.int32)

    def micro_layer(s, op, l, x=()):  # eqs. 6-8, the input at micro-layer 1 only
        s_next, h, t, op = call(l, RT, op[None], bk, (s, m, *x), kind=_RHN)
        return s_next, op, (s, h, t)

    def step(carry, xp_t):
        s_hat, op = carry
        s, op, first = micro_layer(s_hat, op, index(0), (xp_t[0], xp_t[1]))
        if loop:
            saved = [first]
            for l in range(1, L):
                s, op, out = micro_layer(s, op, index(l))
                saved.append(out)
            S, H, Tg = map(list, zip(*saved))
        else:

            def layer(carry, l):
                s, op, out = micro_layer(*carry, l[None])
                return (s, op), out

            (s, op), rest = lax.scan(layer, (s, op), jnp.arange(1, L, dtype=jnp.int32))
            S, H, Tg = (jnp.concatenate([a[None], r]) for a, r in zip(first, rest))
        s_l = g = s
        if hsg_k is not None:  # HSG, eqs. 5-6: ŝ_t and the next step's operand ŝ_t m
            ops = jnp.stack([s_hat, s_l]).astype(_bf16)
            s, g, op = call(index(0), hsg_k[0], ops, hsg_k[1], (s_hat, s_l, m), kind=_HSG)
        return (s, op), (s, (S, H, Tg, s_l, g))

    op0 = (s0 * m).astype(_bf16)
    (s_T, _), (ys, saved) = lax.scan(step, (s0, op0), xp)

    def cut(a):  # the padding off
        return a[..., :n, :B]

    return (cut(s_T), cut(ys)), saved if padded else jax.tree.map(cut, saved)


def _backward_weights(R, Np):
    """The backward kernels' weights, once per call: ``R [L, n, 2n]`` -> R_l's H and T
    column blocks ``[L, 2, Np (input unit), Np (gate row)]`` bf16 (the forward's R_l^T
    blocks transposed), for ``ds_{l-1} = ... + m (R_l dz_l)``."""
    L, n, _ = R.shape
    Rk = jnp.moveaxis(R.reshape(L, n, 2, n), 2, 1)
    return common.pad_to(Rk, (L, 2, Np, Np)).astype(_bf16)


def _pre_activation_cotangents(ds, h, t, s):
    """dz of one micro-layer (H rows, then T rows; ``[2N, Bp]`` bf16) from the cotangent of
    its output ``ds``, its h and T and its input s: eqs. 6-8 differentiated, as the
    backward kernel's epilogue forms them (:func:`_rhn_backward_epilogue`)."""
    dz_t = ds * t
    return jnp.concatenate([dz_t * (1 - h * h), dz_t * (h - s) * (1 - t)]).astype(_bf16)


def _backward(R, hsg, mask, saved, cotangents, *, loop: bool, bt: int, interpret: bool):
    """The backward recurrence by the kernels: :func:`rhnzoo.cells.rhn_fused.unroll_backward`'s
    time and micro-layer loops, each micro-layer l > 1's ``ds_{l-1}`` and ``dz_{l-1}`` one
    :data:`_RHN_BACKWARD` kernel, micro-layer 1's ``ds_0`` one :data:`_RHN_BACKWARD_FIRST`
    kernel; micro-layer L's dz, HSG's gate backward (eqs. 5-6) and the time-step boundary
    in XLA. Feature-major: ``mask [n, B]``, ``saved`` as :func:`_run` returns it with
    ``padded`` (``[..., Np, Bp]``), ``cotangents`` = ``(ds_T [n, B], dys [T, n, B])``.
    Returns ``(ds_0 [n, B], dZ, dz_G)``, the last two padded: every micro-layer's dz (bf16,
    H rows then T rows; with ``loop`` a list of L ``[T, 2Np, Bp]``, else ``[T, L, 2Np,
    Bp]``) and HSG's gate pre-activation cotangent ``[T, Np, Bp]`` f32 (None without
    HSG). Padded units and batch columns get zero cotangents (zero weights, mask and
    output cotangents there)."""
    n, B = mask.shape
    L = R.shape[0]
    Np, Bp = -(-n // ROWS) * ROWS, -(-B // bt) * bt

    def pad(a):
        return common.pad_to(a, (*a.shape[:-2], Np, Bp))

    Rk, m = _backward_weights(R, Np), pad(mask.astype(_f32))
    S, H, Tg, s_l, g = saved
    if hsg is not None:
        W_R, W_F = (common.pad_to(w, (Np, Np)).astype(_bf16) for w in hsg[:2])
    call = functools.partial(_layer_call, b=None, bt=bt, interpret=interpret)

    def layer_backward(l, ds, dz, tiles):  # micro-layer l's ds_{l-1} (and dz_{l-1}, l > 1)
        kind = _RHN_BACKWARD if len(tiles) > 2 else _RHN_BACKWARD_FIRST
        return call(l, Rk, dz.reshape(2, Np, Bp), tiles=(ds, *tiles), kind=kind)

    def step(ds_hat, inputs):
        dy, S_t, H_t, T_t, s_l_t, g_t = inputs
        ds = ds_hat = ds_hat + dy
        dz_g, ds_direct = None, 0.0
        if hsg is not None:  # eqs. 5-6: ŝ_t = s_L + g (ŝ_{t-1} - s_L)
            dz_g = ds_hat * (S_t[0] - s_l_t) * g_t * (1 - g_t)
            ds = ds_hat * (1 - g_t) + fastmath.dot(W_F, dz_g, _bf16)
            ds_direct = ds_hat * g_t + fastmath.dot(W_R, dz_g, _bf16)
        dz = _pre_activation_cotangents(ds, H_t[L - 1], T_t[L - 1], S_t[L - 1])
        if loop:
            dZ = [None] * (L - 1) + [dz]
            for l in range(L - 1, 0, -1):
                ds, dz = layer_backward(
                    jnp.full((1,), l, jnp.int32),
                    ds,
                    dz,
                    (T_t[l], m, H_t[l - 1], T_t[l - 1], S_t[l - 1]),
                )
                dZ[l - 1] = dz
        else:

            def layer(carry, l):  # T_l, and micro-layer l-1's h, T, s, by index
                tiles = ((T_t, 0), m, (H_t, -1), (T_t, -1), (S_t, -1))
                ds, dz = layer_backward(l[None], *carry, tiles)
                return (ds, dz), dz

            dz_top = dz
            ls = jnp.arange(1, L, dtype=jnp.int32)
            (ds, dz), dZ = lax.scan(layer, (ds, dz), ls, reverse=True)  # dZ[l] = dz_l, l < L - 1
            dZ = jnp.concatenate([dZ, dz_top[None]])
        first = (T_t[0] if loop else (T_t, 0), m)
        (ds,) = layer_backward(jnp.zeros((1,), jnp.int32), ds, dz, first)
        return ds + ds_direct, (dZ, dz_g)

    ds_T, dys = map(pad, cotangents)
    g = None if hsg is None else g  # without HSG g is s_L again: not sliced twice
    ds_0, (dZ, dz_g) = lax.scan(step, ds_T, (dys, S, H, Tg, s_l, g), reverse=True)
    return ds_0[:n, :B], dZ, dz_g


def _weight_gradients(S, dZ, dz_g, s_l, mask, loop):
    """The cotangents of ``(R, b, hsg)`` and of ``x_proj`` from :func:`_backward`'s padded
    dz and dz_G and the padded saved states ``S`` and ``s_l``: one GEMM per micro-layer
    over all T x Bp positions (bf16 inputs, f32 accumulation; padded columns hold zero
    dz), as :func:`rhnzoo.cells.rhn_fused.unroll_backward` forms them; db sums the bf16
    dz in float32. Returns them unpadded (``mask [n, B]`` gives n and B)."""
    n, B = mask.shape
    Np, Bp = s_l.shape[-2:]
    m = common.pad_to(mask.astype(_f32), (Np, Bp))

    def sum_outer(a, dz):  # sum_{t, b} a[t, ..., i, b] dz[t, ..., j, b] -> [..., i, j]
        return fastmath.einsum("t...ib,t...jb->...ij", a, dz, _bf16)

    def gates(a):  # [..., 2Np] (H | T) -> [..., 2n]
        return a.reshape(*a.shape[:-1], 2, Np)[..., :n].reshape(*a.shape[:-1], 2 * n)

    if loop:  # per-layer lists of [T, Np, Bp] / [T, 2Np, Bp]
        dR = jnp.stack([sum_outer(s * m, dz) for s, dz in zip(S, dZ)])
        db = jnp.stack([dz.astype(_f32).sum(axis=(0, 2)) for dz in dZ])
        dz_first, s_prev = dZ[0], S[0]
    else:  # [T, L, Np, Bp] / [T, L, 2Np, Bp]
        dR, db = sum_outer(S * m, dZ), dZ.astype(_f32).sum(axis=(0, 3))
        dz_first, s_prev = dZ[:, 0], S[:, 0]
    d_hsg = None
    if dz_g is not None:
        d_hsg = (
            sum_outer(s_prev, dz_g)[:n, :n],
            sum_outer(s_l, dz_g)[:n, :n],
            dz_g.sum(axis=(0, 2))[:n],
        )
    T = dz_first.shape[0]
    dx_proj = dz_first.reshape(T, 2, Np, Bp)[:, :, :n, :B].reshape(T, 2 * n, B)
    return gates(dR[:, :n]), gates(db), d_hsg, dx_proj.astype(_f32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _unroll(R, b, hsg, s0, x_proj, mask, loop, bt, interpret, kernel_backward):
    del kernel_backward
    return _run(R, b, hsg, s0, x_proj, mask, loop=loop, bt=bt, interpret=interpret)[0]


def _unroll_fwd(R, b, hsg, s0, x_proj, mask, loop, bt, interpret, kernel_backward):
    out, saved = _run(
        R, b, hsg, s0, x_proj, mask, loop=loop, bt=bt, interpret=interpret, padded=kernel_backward
    )
    return out, (R, b, hsg, x_proj, mask, saved)


def _unroll_bwd(loop, bt, interpret, kernel_backward, res, cotangents):
    R, b, hsg, x_proj, mask, saved = res
    if not kernel_backward:
        return rhn_fused.unroll_backward(
            R, b, hsg, x_proj, mask, saved, cotangents, dtype=_bf16, loop=loop
        )
    ds_0, dZ, dz_g = _backward(
        R, hsg, mask, saved, cotangents, loop=loop, bt=bt, interpret=interpret
    )
    dR, db, d_hsg, dx_proj = _weight_gradients(saved[0], dZ, dz_g, saved[3], mask, loop)
    return dR, db, d_hsg, ds_0, dx_proj, jnp.zeros_like(mask)


_unroll.defvjp(_unroll_fwd, _unroll_bwd)


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
    """The coupled RHN or HSG(RHN) over ``xs`` by the micro-layer kernels; the contract
    of :func:`rhnzoo.cells.rhn_fused.unroll` (values, and gradients by its backward pass).

    Args:
      cell: a coupled :class:`~rhnzoo.cells.RHN`, or :class:`~rhnzoo.cells.HSG` around
        one.
      params: the cell's parameters (``cell.init``), float32.
      carry: ``[B, n]`` float32 initial state.
      xs: ``[T, B, m]`` float32 inputs, time-major.
      mask: ``[B, n]`` recurrent dropout mask or None; it multiplies the state entering
        every micro-layer's GEMM (not the highway update), as in the fused scan, and is a
        constant (zero gradient).
      opts: the :class:`~rhnzoo.cells.scan_options.Options`: ``dtype`` bfloat16 (or None),
        the only precision the kernel has; ``outputs`` "all", "last" (the final carry:
        each row's output at its last real step, zeros for a row of length 0) or "none";
        ``interpret``;
        ``batch_tile`` Bt, batch columns per CTA (the wgmma N), 16, 32 or 64 (each lowers
        for an H100; which is fastest is not measured), None: :func:`default_batch_tile`
        of B; ``kernel_backward`` (default True) the backward pass's micro-layers by the
        backward kernels (:func:`_backward`: one kernel per micro-layer and time step, as
        the forward), False: the fused scan's backward in XLA.
      lengths: optional ``[B]`` int real steps per row: every step runs, a row's final
        carry is its output at its last real step and padded outputs are zeros
        (:func:`rhnzoo.cells.rhn_fused.with_lengths`).
      resets: must be None: the kernels have no episode starts.

    Returns:
      ``(carry [B, n], ys [T, B, n], last [B, n] or None)`` float32: the final state and
      every step's output (``opts.outputs``).

    Raises:
      ValueError: for a cell other than a coupled RHN or HSG(RHN); an ``opts.dtype``
        other than bfloat16 (or None), ``opts.remat``, ``resets``
        (:func:`~rhnzoo.cells.kernels.common.check_options`); ``xs`` not ``[T, B, m]``,
        a ``carry`` or ``mask`` not ``[B, n]``, or parameters whose shapes are not the
        cell's for input width m.
    """
    if not supports(cell):
        raise ValueError(f"the RHN micro-layer kernel runs a coupled RHN or HSG(RHN), got {cell!r}")
    common.check_options(opts, cell, resets)
    hsg = None
    if isinstance(cell, HSG):
        hsg = (params["W_R"], params["W_F"], params["b_G"])
        cell, params = cell.cell, params["cell"]
    n, L = cell.hidden_size, cell.depth
    if xs.ndim != 3:
        raise ValueError(f"xs must be [T, B, m], got shape {xs.shape}")
    T, B, m = xs.shape
    want = {"W": (m, 2 * n), "R": (L, n, 2 * n), "b": (L, 2 * n), "carry": (B, n)}
    got = {"W": params["W"].shape, "R": params["R"].shape, "b": params["b"].shape}
    got["carry"] = jnp.shape(carry)
    if mask is not None:
        want["mask"], got["mask"] = (B, n), jnp.shape(mask)
    if hsg is not None:
        want |= {"W_R": (n, n), "W_F": (n, n), "b_G": (n,)}
        got |= {k: v.shape for k, v in zip(("W_R", "W_F", "b_G"), hsg)}
    wrong = [f"{k} {tuple(got[k])} (want {want[k]})" for k in want if tuple(got[k]) != want[k]]
    if wrong:
        raise ValueError(
            f"shapes do not match RHN(n={n}, depth={L}) over xs [T, B, m] = {xs.shape}: "
            + ", ".join(wrong)
        )
    loop = L <= rhn_fused.LOOP_LAYERS_UP_TO
    # The projection of all T steps in one GEMM, its backward under the same rule.
    x_proj = jnp.swapaxes(fastmath.project(xs, params["W"], _bf16), 1, 2)  # [T, 2n, B]
    mask = jnp.ones_like(carry) if mask is None else mask
    bt = opts.batch_tile or default_batch_tile(B)
    s_T, ys = _unroll(
        params["R"],
        params["b"],
        hsg,
        carry.T,
        x_proj,
        mask.T,
        loop,
        bt,
        opts.interpreted(),
        opts.kernel_backward,
    )
    ys = jnp.swapaxes(ys, 1, 2)
    carry_T, ys = rhn_fused.with_lengths(carry, s_T.T, ys, lengths, opts.outputs == "all")
    return carry_T, common.finish(carry_T, ys, opts, lengths)
