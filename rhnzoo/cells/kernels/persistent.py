"""The persistent kernels' common part (Pallas, Mosaic GPU): what the kernels of
:mod:`~rhnzoo.cells.kernels.gated` (LSTM, SC-LSTM, reset-after GRU) and
:mod:`~rhnzoo.cells.kernels.chained` (RRN, Cho et al.'s GRU) share.

A persistent kernel runs the whole time loop in one launch, as cuDNN's persistent
algorithm does for small hidden sizes: each CTA owns a tile of :data:`ROWS` batch rows
and one warpgroup (128 threads) per :data:`HALF` hidden units, the recurrent weights stay
in shared memory (bfloat16) for all T steps, and the warpgroups meet at a CTA barrier
where a step's values cross between them. This module holds:

* **sizes**: :func:`padded` (hidden n to N = 64 or 128, input width m to a multiple of
  16), :class:`Padding` (the batch to Bp, a multiple of :data:`ROWS`, and the padding of
  every array a kernel takes), :func:`forward_smem_bytes`;
* **the forward kernel** of every persistent cell, :func:`forward_call`, a cell being a
  :class:`Step` (its blocks and a step function written against the kernel's ``product``
  and ``restage``), :func:`forward`, the same on unpadded arrays, and :func:`input_slot`,
  its per-step double-buffered x_t prefetch (:mod:`~rhnzoo.cells.kernels.swap_ab`'s too);
* **the backward harness** both backward kernels are built from: :func:`load_u` (U's
  blocks into shared memory by TMA), :func:`backward_smem` (U and the staged dz),
  :func:`staged_products` (one CTA barrier, then each warpgroup's units of ``sum_k dz_k
  U_k^T`` on the tensor cores, one wait), :func:`cta_barrier`, :func:`persistent_kernel`
  (the grid and warpgroups of every persistent kernel);
* **outside the kernels**: :func:`one_at_a_time` (a launch under ``jax.vmap``),
  :func:`step_lengths`, :func:`carries` (the carry h after each step from the outputs),
  :func:`valid_steps`, and the weight-gradient epilogue :func:`weight_gradients` and
  :func:`initial_cotangent` (dU, dW, db, dxs and dh_{-1} as single large matmuls over all
  T x B positions, bfloat16 inputs with float32 accumulation, as cuDNN does).

Precision: bfloat16 matmul inputs with float32 accumulation; states, gates and their
cotangents float32 (:mod:`~rhnzoo.cells.kernels.gated`'s docstring).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from rhnzoo.cells.kernels import common

Array = jax.Array

ROWS = 64  # batch rows per CTA: one warpgroup's wgmma M
HALF = 64  # hidden units per warpgroup (one 128-byte swizzle of bfloat16)
QUARTER = 32  # hidden units per backward tile (a warpgroup holds two)
# tanh.approx.f32 in the kernels (about 2^-11 relative error, under bfloat16 rounding):
# measured faster (docs/speed.md), off until the compiled kernels are checked with it.
APPROX_MATH = False
_bf16, _f32 = jnp.bfloat16, jnp.float32


# ------------------------------------------------------------------------------- sizes


def padded(n: int, m: int) -> tuple[int, int]:
    """``(N, MP)``: hidden size ``n`` (<= 128) padded to 64 or 128, input width ``m`` to a
    multiple of 16."""
    return (64 if n <= 64 else 128), -(-m // 16) * 16


@dataclasses.dataclass(frozen=True)
class Padding:
    """The kernels' padded sizes for ``T`` steps of ``B`` rows, hidden size ``n`` and input
    width ``m``: ``N``, ``MP`` (:func:`padded`) and ``Bp``, B rounded up to a multiple of
    :data:`ROWS`; padded units, rows and columns are zeros (inert: zero weights, zero
    length)."""

    T: int
    B: int
    n: int
    m: int

    @classmethod
    def of(cls, xs: Array, n: int) -> Padding:
        """The padding for ``xs [T, B, m]`` and hidden size ``n``."""
        T, B, m = xs.shape
        return cls(T, B, n, m)

    @property
    def N(self) -> int:
        """Hidden size padded: 64 or 128."""
        return padded(self.n, self.m)[0]

    @property
    def MP(self) -> int:
        """Input width padded to a multiple of 16."""
        return padded(self.n, self.m)[1]

    @property
    def Bp(self) -> int:
        """Batch rows padded to whole CTA tiles of :data:`ROWS`."""
        return -(-self.B // ROWS) * ROWS

    def rows(self, a: Array | None, dtype=_f32) -> Array | None:
        """``a [B, n]`` as ``dtype`` zero-padded to ``[Bp, N]`` (None stays None)."""
        return None if a is None else common.pad_to(a.astype(dtype), (self.Bp, self.N))

    def steps(self, a: Array) -> Array:
        """``a [T, B, n]`` zero-padded to ``[T, Bp, N]`` (its dtype kept)."""
        return common.pad_to(a, (self.T, self.Bp, self.N))

    def lens(self, lens: Array) -> Array:
        """``lens [B]`` int32 zero-padded to ``[Bp]`` (padded rows have no steps)."""
        return common.pad_to(lens, (self.Bp,))

    def cotangent(self, dys: Array | None, valid: Array, outputs: bool) -> Array | None:
        """The outputs' cotangents ``dys [T, B, n]`` as the backward kernels take them:
        float32 ``[T, Bp, N]``, zero on padded steps (``valid [T, B, 1]`` bool); None
        without outputs (``outputs`` False or ``dys`` None)."""
        if not outputs or dys is None:
            return None
        return self.steps(jnp.where(valid, dys, 0.0).astype(_f32))


def forward_smem_bytes(K: int, N: int, MP: int, restages: int) -> int:
    """Shared memory (bytes) of :func:`forward_call` with K blocks and ``restages``
    restaged values per step: the scratch buffers listed there (barriers aside; SC-LSTM's
    step counts and α, under 1 KB, aside)."""
    fwd = K * N * N * 2 + K * N * MP * 2 + 2 * ROWS * MP * 2 + 2 * ROWS * N * 2
    return fwd + min(restages, 2) * ROWS * N * 2 + ROWS * N * 4 + K * N * 4 + ROWS * 4


def persistent_kernel(body: Callable, out_type, scratch_types, *, Bp: int, H: int, interpret):
    """``plgpu.kernel`` of a persistent kernel: a grid of ``Bp / ROWS`` CTAs (axis ``'b'``,
    one tile of :data:`ROWS` batch rows each) of ``H`` warpgroups (axis ``'wg'``, one per
    :data:`HALF` hidden units), :data:`APPROX_MATH`, Pallas's GPU interpret mode where
    ``interpret``."""
    _, plgpu = common.plgpu()
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch_types,
        grid=(Bp // ROWS,),
        grid_names=("b",),
        num_threads=H,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=APPROX_MATH),
        interpret=common.interpret_params(interpret),
    )


# ------------------------------------------------------------------------ the forward


@dataclasses.dataclass(frozen=True)
class Step:
    """A cell's step for the forward kernel (:func:`forward_call`): K blocks ``(W_k, U_k,
    b_k)`` (``no_w`` / ``no_u``: blocks without an input / a recurrent part),
    ``restages`` values put in shared memory per step, and ``forward(product, restage,
    carry, m, skips) -> (h_t, carry_t)``:
    ``product([(k, src), ...])`` forms blocks' pre-activations ``x_t W_k + src U_k + b_k``
    [ROWS, 64] float32 for the warpgroup's units (src None: h_{t-1} m), their
    tensor-core products issued together; ``restage(v)`` puts ``v`` of every warpgroup in
    shared memory (bfloat16) as a later product's src; ``carry`` the tuple of the cell's
    float32 carries [ROWS, 64] (besides h's bfloat16 copy); ``m`` the mask [ROWS, 64] or
    None; ``skips`` SC-LSTM's ``(count [ROWS] int32, α [ROWS, 64])`` or None."""

    blocks: int
    restages: int
    forward: Callable
    no_w: tuple = ()
    no_u: tuple = ()


def input_slot(pl, plgpu, x_ref, x_s, bar_x, t, tile, wg):
    """Inside a persistent kernel's time loop, at step ``t``: the slot ``t mod 2`` of the
    double-buffered ``x_s [2, ...]`` that holds x_t = ``x_ref[t, tile]`` (``x_ref [T,
    ...]``), once its TMA copy has arrived at ``bar_x[slot]``; warpgroup 0 (``wg``) then
    starts the copy of x_{t+1} into the other slot, arriving at ``bar_x[1 - slot]``. Every
    warpgroup must be done with step t - 1's products, which read that slot (past the
    step's last CTA barrier); x_0's copy, into slot 0, is the caller's, before the loop.
    The forward kernels' per-step prefetch (:func:`forward_call` and
    :mod:`~rhnzoo.cells.kernels.swap_ab`'s)."""
    slot = lax.rem(t, 2)
    plgpu.barrier_wait(bar_x.at[slot])

    @pl.when((t + 1 < x_ref.shape[0]) & (wg == 0))
    def _prefetch():
        plgpu.copy_gmem_to_smem(x_ref.at[t + 1, tile], x_s.at[1 - slot], bar_x.at[1 - slot])

    return slot


def forward_call(
    x, u, w, b, h0, carry0, lens, mask=None, skips=None, *, step: Step, interpret: bool
):
    """The forward kernel of every persistent cell: one warpgroup per 64 hidden units
    (H = N / 64 of them per CTA), the cell's step (``step``) written against the kernel's
    primitives.

    Args: ``x [T, Bp, MP]`` bf16; ``u [K, H, N, 64]`` bf16, U's blocks split by output
    columns (``u[k, j, :, c] = U_k[:, 64 j + c]``); ``w [K, H, 64, MP]`` bf16, W's
    likewise, transposed; ``b [K, H, 64]`` f32; ``h0 [H, Bp, 64]`` bf16 (times the mask);
    ``carry0``: C arrays ``[H, Bp, 64]`` f32, the float32 carries (the LSTM's c, SC-LSTM's
    c and anchor, the GRUs' and RRN's h; separate arrays: a TMA copy strides at most five
    dimensions); ``lens [Bp]`` int32; ``mask [H, Bp, 64]`` f32 or
    None, the recurrent dropout mask; ``skips`` SC-LSTM's ``(t0 [Bp] int32, alpha [H, 64]
    f32)`` (each row's step count, α broadcast) or None. Returns ``y [T, H, Bp, 64]``
    f32: h_t on real steps, zeros on padded ones."""
    pl, plgpu = common.plgpu()
    T, Bp, MP = x.shape
    K, H, N = u.shape[0], u.shape[1], u.shape[2]
    C = len(carry0)
    L = plgpu.Layout.WGMMA
    masked, skipping = mask is not None, skips is not None
    uses_w = [k not in step.no_w for k in range(K)]
    uses_u = [k not in step.no_u for k in range(K)]

    def body(x_ref, u_ref, w_ref, b_ref, h0_ref, len_ref, *refs):
        c_refs, refs = refs[:C], refs[C:]
        m_ref = refs[0] if masked else None
        t0_ref, alpha_ref = refs[masked : masked + 2] if skipping else (None, None)
        y_ref, u_s, w_s, x_s, h_s, a_s, y_s, b_s, len_s, sk_s, bar_w, bar_x, bar_init, bar_step = (
            refs[masked + 2 * skipping :]
        )
        rows = pl.ds(lax.axis_index("b") * ROWS, ROWS)
        wg = lax.axis_index("wg")  # this warpgroup's hidden units: 64 wg ... 64 wg + 63

        @pl.when(wg == 0)
        def _load_once():
            for k in range(K):
                for j in range(H):
                    if uses_u[k]:
                        plgpu.copy_gmem_to_smem(u_ref.at[k, j], u_s.at[k, j], bar_w.at[k * H + j])
                    if uses_w[k]:
                        plgpu.copy_gmem_to_smem(
                            w_ref.at[k, j], w_s.at[k, j], bar_w.at[(K + k) * H + j]
                        )
            plgpu.copy_gmem_to_smem(h0_ref.at[:, rows], h_s.at[0], bar_init.at[0])
            plgpu.copy_gmem_to_smem(c_refs[0].at[:, rows], y_s, bar_init.at[1])
            plgpu.copy_gmem_to_smem(b_ref, b_s, bar_init.at[2])
            plgpu.copy_gmem_to_smem(len_ref.at[rows], len_s, bar_init.at[3])
            plgpu.copy_gmem_to_smem(x_ref.at[0, rows], x_s.at[0], bar_x.at[0])
            if skipping:
                plgpu.copy_gmem_to_smem(t0_ref.at[rows], sk_s[0], bar_init.at[5])
                plgpu.copy_gmem_to_smem(alpha_ref, sk_s[1], bar_init.at[6])

        for k in range(K):
            for j in range(H):
                if uses_u[k]:
                    plgpu.barrier_wait(bar_w.at[k * H + j])
                if uses_w[k]:
                    plgpu.barrier_wait(bar_w.at[(K + k) * H + j])
        for k in range(4):
            plgpu.barrier_wait(bar_init.at[k])
        carry = [plgpu.load(y_s.at[wg], layout=L)]
        lens_v = plgpu.load(len_s, layout=L.reduce(1))

        def through_y_s(src, bar):  # once every warpgroup has read y_s
            plgpu.commit_smem()
            plgpu.barrier_arrive(bar_step)
            plgpu.barrier_wait(bar_step)
            pl.when(wg == 0)(lambda: plgpu.copy_gmem_to_smem(src, y_s, bar))
            plgpu.barrier_wait(bar)
            return plgpu.load(y_s.at[wg], layout=L)

        carry += [through_y_s(c_refs[k].at[:, rows], bar_init.at[6 + k]) for k in range(1, C)]
        if skipping:  # the step counts and α stay in SMEM
            for k in (5, 6):
                plgpu.barrier_wait(bar_init.at[k])
            t0_v = plgpu.load(sk_s[0], layout=L.reduce(1))

        def step_t(t, carry):
            # Every warpgroup's products of step t - 1 are done (they passed bar_step).
            slot = input_slot(pl, plgpu, x_ref, x_s, bar_x, t, rows, wg)

            def product(blocks):
                def run(*accs):
                    for acc, (k, src) in zip(accs, blocks):
                        if uses_w[k]:
                            plgpu.wgmma(acc, x_s.at[slot], w_s.at[k, wg].transpose((1, 0)))
                        src = h_s.at[slot] if src is None else src
                        for j in range(H if uses_u[k] else 0):
                            plgpu.wgmma(acc, src.at[j], u_s.at[k, wg, pl.ds(j * HALF, HALF)])
                    return tuple(a[...] for a in accs)

                zs = pl.run_scoped(run, *[plgpu.ACC((ROWS, HALF), _f32)] * len(blocks))
                return [
                    z
                    + lax.broadcast_in_dim(
                        plgpu.load(b_s.at[k, wg], layout=L.reduce(0)), (ROWS, HALF), [1]
                    )
                    for z, (k, _) in zip(zs, blocks)
                ]

            restaged = []

            def restage(v):
                """Two buffers, alternating: the products that read the other one are
                done (their warpgroups passed the last barrier after reading their
                results)."""
                buf = a_s.at[len(restaged) % 2]
                restaged.append(buf)
                buf[wg] = v.astype(_bf16)
                plgpu.commit_smem()
                plgpu.barrier_arrive(bar_step)
                plgpu.barrier_wait(bar_step)
                return buf

            valid = lax.broadcast_in_dim(t < lens_v, (ROWS, HALF), [0])
            # The mask and α are read where they are used, each step (from global memory,
            # shared memory), not held in registers across the loop.
            m = None
            if masked:
                m = plgpu.load(m_ref.at[wg, rows], layout=L, optimized=False)
            skips = None
            if skipping:
                alpha = plgpu.load(sk_s[1].at[wg], layout=L.reduce(0))
                skips = (t0_v + t, lax.broadcast_in_dim(alpha, (ROWS, HALF), [1]))
            h_new, new = step.forward(product, restage, tuple(carry), m, skips)
            kept = plgpu.load(h_s.at[slot, wg], layout=L)
            h_in = h_new if m is None else h_new * m  # what enters U next step
            h_s[1 - slot, wg] = jnp.where(valid, h_in.astype(_bf16), kept)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # y_s[wg] is free again
            y_s[wg] = jnp.where(valid, h_new, 0.0)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(y_s.at[wg], y_ref.at[t, wg, rows])
            plgpu.barrier_arrive(bar_step)  # h_t of every warpgroup is in h_s
            plgpu.barrier_wait(bar_step)
            return [jnp.where(valid, a, c) for a, c in zip(new, carry)]

        lax.fori_loop(0, T, step_t, carry)
        plgpu.wait_smem_to_gmem(0)

    sw = functools.partial(common.swizzled, plgpu)
    buffers = min(step.restages, 2)
    kernel = persistent_kernel(
        body,
        out_type=jax.ShapeDtypeStruct((T, H, Bp, HALF), _f32),
        scratch_types=(
            plgpu.SMEM((K, H, N, HALF), _bf16, transforms=sw(_bf16, HALF)),
            plgpu.SMEM((K, H, HALF, MP), _bf16, transforms=sw(_bf16, MP)),
            plgpu.SMEM((2, ROWS, MP), _bf16, transforms=sw(_bf16, MP)),
            plgpu.SMEM((2, H, ROWS, HALF), _bf16, transforms=sw(_bf16, HALF)),
            plgpu.SMEM((buffers, H, ROWS, HALF), _bf16, transforms=sw(_bf16, HALF))
            if buffers
            else None,
            plgpu.SMEM((H, ROWS, HALF), _f32, transforms=sw(_f32, 32)),
            plgpu.SMEM((K, H, HALF), _f32),
            plgpu.SMEM((ROWS,), jnp.int32),
            (plgpu.SMEM((ROWS,), jnp.int32), plgpu.SMEM((H, HALF), _f32)) if skipping else None,
            plgpu.Barrier(num_barriers=2 * K * H),
            plgpu.Barrier(num_barriers=2),
            plgpu.Barrier(num_barriers=6 + C),
            plgpu.Barrier(num_arrivals=H),
        ),
        Bp=Bp,
        H=H,
        interpret=interpret,
    )
    return kernel(*((x, u, w, b, h0, lens, *carry0) + ((mask,) if masked else ()) + (skips or ())))


# ---------------------------------------------------------------- the backward harness


def cta_barrier(plgpu, bar) -> None:
    """Inside a kernel: wait until every warpgroup of the CTA has arrived at ``bar`` (a
    ``plgpu.Barrier(num_arrivals=H)``)."""
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)


def backward_smem(plgpu, blocks: int, terms: int, N: int) -> tuple:
    """The backward kernels' two shared-memory buffers: U's ``blocks`` gate blocks
    ``[blocks, H, 64, N]`` bfloat16 (each warpgroup's 64 rows of U_k, dh_{t-1}'s units)
    and one stage's dz ``[terms, N / 32, ROWS, 32]`` bfloat16 (every warpgroup's two
    quarters of each of ``terms`` blocks), both in 64-byte swizzled tiles."""
    sw = functools.partial(common.swizzled, plgpu)
    return (
        plgpu.SMEM((blocks, N // HALF, HALF, N), _bf16, transforms=sw(_bf16, QUARTER)),
        plgpu.SMEM((terms, N // QUARTER, ROWS, QUARTER), _bf16, transforms=sw(_bf16, QUARTER)),
    )


def load_u(plgpu, u_ref, u_s, bar_u, blocks: int, H: int) -> None:
    """Inside a kernel (one warpgroup): U's blocks into shared memory by TMA, one copy per
    block and warpgroup (a TMA copy strides at most five dimensions): ``u_ref [blocks, H,
    64, N]`` bf16 to ``u_s`` (:func:`backward_smem`), copy ``(k, j)`` arriving at
    ``bar_u[k H + j]``."""
    for k in range(blocks):
        for j in range(H):
            plgpu.copy_gmem_to_smem(u_ref.at[k, j], u_s.at[k, j], bar_u.at[k * H + j])


def staged_products(pl, plgpu, dz_s, u_s, pairs, *, wg, H: int, bar_step) -> Array:
    """Inside a kernel, once each warpgroup has stored its dz tiles in ``dz_s``: commits
    shared memory, waits at a CTA barrier (every warpgroup's dz is there), then forms
    this warpgroup's (``wg``) units of ``sum_(i, k) dz_i U_k^T`` over ``pairs`` ``[(i,
    k)]`` (dz slot i of ``dz_s``, U block k of ``u_s``: :func:`backward_smem`) on the
    tensor cores in one [ROWS, 64] float32 accumulator, all products issued, one wait;
    with ``H`` > 1 a second barrier keeps the next stage's dz from overwriting what
    another warpgroup's products still read. Returns the [ROWS, 64] float32 sum."""
    plgpu.commit_smem()
    cta_barrier(plgpu, bar_step)  # every warpgroup's dz is in dz_s
    quarters = 2 * H

    def run(acc):  # all products issued, one wait
        for i, k in pairs:
            for p in range(quarters):
                ks = pl.ds(p * QUARTER, QUARTER)
                plgpu.wgmma(acc, dz_s.at[i, p], u_s.at[k, wg, :, ks].transpose((1, 0)))
        return acc[...]

    g = pl.run_scoped(run, plgpu.ACC((ROWS, HALF), _f32))
    if H > 1:
        cta_barrier(plgpu, bar_step)  # every warpgroup's products are done
    return g


# ------------------------------------------------------------------ outside the kernels


def step_lengths(xs: Array, lengths: Array | None) -> Array:
    """Real steps per row ``[B]`` int32 for ``xs [T, B, m]``: ``lengths``, or T for every
    row."""
    T, B, _ = xs.shape
    return jnp.full((B,), T, jnp.int32) if lengths is None else jnp.asarray(lengths, jnp.int32)


def valid_steps(T: int, lens: Array) -> Array:
    """``[T, B, 1]`` bool: whether step t is a real step of row b (t < lens[b])."""
    return (jnp.arange(T)[:, None] < lens[None, :])[:, :, None]


def one_at_a_time(call):
    """``call`` (a kernel launch) that, under ``jax.vmap`` (K stacked seeds: each its own
    U), launches once per mapped index (``lax.map``) instead of by ``pallas_call``'s
    batching rule: that rule adds a dimension to the forward kernel's TMA copies, past
    the five an H100 takes (a lowering error)."""
    mapped_call = jax.custom_batching.custom_vmap(call)

    @mapped_call.def_vmap
    def rule(axis_size, in_batched, *args):
        del axis_size
        flat, tree = jax.tree.flatten(args)
        batched = jax.tree.leaves(in_batched)

        def one(rows):
            rows = iter(rows)
            return call(
                *jax.tree.unflatten(tree, [next(rows) if b else a for a, b in zip(flat, batched)])
            )

        out = lax.map(one, [a for a, b in zip(flat, batched) if b])
        return out, jax.tree.map(lambda _: True, out)

    return mapped_call


def forward(xs, Ub, Wb, bk, h0, carry0, lens, mask, skips=None, *, step: Step, interpret: bool):
    """The forward kernel on unpadded arrays, the forward of every persistent cell.

    Args: ``xs [T, B, m]``; ``Ub [K, n, N]`` and ``Wb [K, m, N]``, the cell's blocks
    (their output columns padded to N); ``bk [K, n]``; ``h0 [B, n]``; ``carry0``: the
    float32 carries, each ``[B, n]``; ``lens [B]`` int32; ``mask [B, n]`` or None;
    SC-LSTM's ``skips`` = ``(t0 [B] int32, alpha [])`` or None; ``step`` the cell's
    :class:`Step`. Pads and splits them into the kernel's layout (:func:`forward_call`,
    under ``jax.vmap`` by :func:`one_at_a_time`). Returns ``y [T, B, n]`` float32: h_t on
    real steps, zeros on padded ones."""
    pad = Padding.of(xs, h0.shape[-1])
    T, B, n = pad.T, pad.B, pad.n
    K, N, MP, Bp = Ub.shape[0], pad.N, pad.MP, pad.Bp
    H = N // HALF
    halves = lambda a: jnp.moveaxis(a.reshape(a.shape[:-1] + (H, HALF)), -2, -3)
    if skips is not None:
        t0, alpha = skips
        skips = (pad.lens(t0), jnp.broadcast_to(alpha.astype(_f32), (H, HALF)))
    y = one_at_a_time(functools.partial(forward_call, step=step, interpret=interpret))(
        common.pad_to(xs.astype(_bf16), (T, Bp, MP)),
        halves(common.pad_to(Ub, (K, N, N))).astype(_bf16),
        jnp.swapaxes(halves(common.pad_to(Wb, (K, MP, N))), -1, -2).astype(_bf16),
        common.pad_to(bk, (K, N)).reshape(K, H, HALF).astype(_f32),
        halves(pad.rows(h0 if mask is None else h0 * mask, _bf16)),
        tuple(halves(pad.rows(c)) for c in carry0),
        pad.lens(lens),
        None if mask is None else halves(pad.rows(mask)),
        skips,
    )
    return jnp.moveaxis(y, 1, 2).reshape(T, Bp, N)[:, :B, :n]


def carries(y: Array, h0: Array, lens: Array) -> Array:
    """H_t, the carry h after each step ``[T, B, n]``: y_t on real steps, the row's last
    real output (or h0) on the padded steps after it."""
    T = y.shape[0]
    last = jnp.clip(jnp.minimum(jnp.arange(T)[:, None], lens[None, :] - 1), 0)  # [T, B]
    H = jnp.take_along_axis(y, last[:, :, None], axis=0)
    return jnp.where((lens > 0)[None, :, None], H, h0[None])


def matmul(spec: str, a: Array, b: Array) -> Array:
    """``jnp.einsum(spec, a, b)`` with bfloat16 inputs and float32 accumulation."""
    return jnp.einsum(spec, a.astype(_bf16), b.astype(_bf16), preferred_element_type=_f32)


def weight_gradients(
    xs: Array, W: Array, dZ: Array, src: Array | Sequence[Array], dZ_u=None
) -> tuple[Array, Array, Array, Array]:
    """The weight-gradient epilogue after a backward kernel: single large matmuls over all
    T x B positions (bfloat16 inputs, float32 accumulation), as cuDNN forms dU after its
    persistent backward.

    Args:
      xs: ``[T, B, m]``, the inputs.
      W: ``[m, k]``, the input weights of the k = K n block columns.
      dZ: ``[T, B, k]`` (bfloat16 or float32), the cotangent of ``x_t W + b``'s blocks
        (zero on padded steps).
      src: what multiplied U ``[n, k]`` in the forward, ``[T, B, n]`` (h_{t-1} m), or a
        sequence of K such arrays, one per block (the chained cells' h_{t-1} m, y_1, ...).
      dZ_u: the cotangent of the blocks' recurrent products, ``[T, B, k]`` (None: ``dZ``),
        or with K sources a sequence of K ``[T, B, n]``, one per block.

    Returns:
      ``(dW [m, k], dU [n, k], db [k], dxs [T, B, m])`` float32; db sums ``dZ`` in
      float32.
    """
    dZ_u = dZ if dZ_u is None else dZ_u
    if isinstance(src, (list, tuple)):
        dU = jnp.concatenate([matmul("tbn,tbk->nk", s, d) for s, d in zip(src, dZ_u)], axis=-1)
    else:
        dU = matmul("tbn,tbk->nk", src, dZ_u)
    dW = matmul("tbm,tbk->mk", xs, dZ)
    db = dZ.astype(_f32).sum(axis=(0, 1))
    dxs = matmul("tbk,mk->tbm", dZ, W)
    return dW, dU, db, dxs


def initial_cotangent(
    into_u: Array, mask: Array | None, DH: Array, valid: Array, direct: Array | None = None
) -> Array:
    """dh_{-1} ``[B, n]`` float32, the backward kernel's step at t = 0 formed outside it:
    on rows with a real first step (``valid [T, B, 1]``) ``into_u`` (the cotangent through
    U, ``[B, n]``: ``dz_0 U^T``) times the recurrent dropout ``mask`` (None: none), plus
    the ``direct`` path (None: none; the GRU's dh_0 z_0); on empty rows the carried
    cotangent ``DH[0]`` (``DH [T, B, n]``, the kernel's dh_t)."""
    if mask is not None:
        into_u = into_u * mask
    if direct is not None:
        into_u = into_u + direct
    return jnp.where(valid[0], into_u, DH[0])
