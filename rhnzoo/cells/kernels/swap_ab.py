"""A swap-AB persistent LSTM forward kernel (Pallas, Mosaic GPU): the gates on wgmma's M,
a batch tile on its N, so that a small batch spreads over more SMs (issue 59, "more SMs
per step").

The persistent forward of :mod:`rhnzoo.cells.kernels.gated` puts 64 batch rows on
wgmma's M: P-MNIST's batch of 100 (n = 100, padded to 128) runs on 2 CTAs of an H100's
132 SMs. Here
the recurrence is feature-major, as the RHN's micro-layer kernel
(:mod:`rhnzoo.cells.kernels.rhn`), and each step of the LSTM (Wang & Tian 2016, eq. 1)
is the swapped product

    z_t^T [4N, Bt] = U^T [4N, N] (h_{t-1} m)^T [N, Bt] + W^T [4N, MP] (x_t [Bt, MP])^T + b

with a batch tile of Bt = 16, 32 or 64 columns per CTA (wgmma's N): B = 100 runs on 7
CTAs at Bt = 16. Each CTA loops over all T steps:

* **weights**: all of U^T and W^T (bfloat16) are copied once into shared memory by TMA,
  as gate row blocks ``u [4, H, 64, N]`` and ``w [4, H, 64, MP]`` (gate k, output units
  64 i ... 64 i + 63), H = N / 64. The gate rows are arranged so that each 64-row M
  tile holds ONE gate of 64 units (i | f | o | c̃ of units 0-63, then of 64-127): the
  four accumulators of a unit block have identical register layouts (``WGMMA``), so the
  LSTM epilogue c = f c + i c̃, h = o tanh c is elementwise across them in one thread.
* **one warpgroup per 64 hidden units** (H warpgroups): per step each forms its four
  gate accumulators ``[64, Bt]`` float32 from two ``wgmma`` products each (bfloat16
  inputs, float32 accumulation, all eight issued before one wait): its units' rows of
  U_k^T with the tile's ``(h_{t-1} m)^T`` (shared memory, ``[N, Bt]`` bfloat16: K = N in
  one product) and of W_k^T with ``x_t`` (shared memory, ``[Bt, MP]`` as in HBM, the
  transposed B operand; double-buffered by TMA: the next step's copy in flight); adds
  b (shared memory), applies the gates with c float32 in registers (the tile's lengths
  read from shared memory each step, not held), and writes h_t twice: transposed,
  bfloat16 and times the recurrent dropout mask m (read from global memory where it is
  used), into the other ``h`` buffer as the next step's B operand; float32 into an
  output tile stored to HBM by TMA. The warpgroups meet at one barrier per step.
* **swizzles**: U^T's blocks take the swizzle of the ``[64, Bt]`` bfloat16 operand h^T
  (32, 64 or 128 bytes at Bt = 16, 32, 64): a 128-byte swizzled tile beside a 32- or
  64-byte swizzled one in a ``wgmma`` fails JAX 0.11.2's layout inference (an
  ``AssertionError`` in ``_check_unsatisfiable_divisibility_constraints``), as in the
  RHN's kernel. W^T's blocks and x_t, whose common minor
  dimension is the input width, both take MP's swizzle (m padded to MP = 16, 32 or a
  multiple of 64): one accumulator takes products of both swizzles (lowered for
  ``cuda`` at every Bt).

Lengths (:func:`rhnzoo.cells.unroll`'s semantics): padded steps keep the carry (h m in
shared memory, c in registers) and output zeros; padded batch columns have length 0,
padded units zero weights (they stay zero). Precision: the project's bfloat16 policy
(bfloat16 matmul inputs, float32 accumulation, gates, state and output).

Only the forward: :func:`rhnzoo.cells.kernels.gated.unroll` runs it for a plain LSTM
given ``Options(batch_tile=Bt)`` (never by ``auto``: not timed on a GPU), and its custom
VJP recomputes the gates from y, so the gradients follow from a correct y. Shared
memory: :func:`smem_bytes`; :func:`fits` checks one CTA's limit. Values agree with
:func:`rhnzoo.cells.unroll` to bfloat16 rounding (1.5e-2 of the largest output) and with
the fused scan in bfloat16, the same rounding points, to 2e-3 (about 2e-6 seen)
(tests/test_swap_ab.py, GPU interpret mode on the CPU; lowered for ``cuda`` at each
Bt).
Registers (ptxas, sm_90a, counted on the CPU; docs/runs/kernels/swap_ab_forward.md): at
N = 128 with the mask 126 a thread at Bt = 16, 194 at Bt = 32, no spills; at Bt = 64 all
255 and 36-40 bytes spilled (four ``[64, 64]`` float32 accumulators, c and the mask: 32
registers each). Not timed on a GPU.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
from jax import lax

from rhnzoo.cells.kernels import common, persistent

Array = jax.Array

UNITS = 64  # hidden units per warpgroup: one wgmma M tile (one gate of 64 units)
GATES = 4  # i | f | o | c̃, the order of rhnzoo.cells.LSTM's parameters
BATCH_TILES = common.BATCH_TILES  # Bt, the batch columns per CTA (wgmma's N): 16, 32, 64
_bf16, _f32 = jnp.bfloat16, jnp.float32


def padded(n: int, m: int) -> tuple[int, int]:
    """(N, MP): hidden size n padded to 64 or 128, input width m to 16, 32 or a multiple
    of 64 (a row of MP bfloat16 is one 32-, 64- or 128-byte swizzle: W^T's and x_t's)."""
    MP = 16 if m <= 16 else 32 if m <= 32 else -(-m // 64) * 64
    return (64 if n <= 64 else 128), MP


def smem_bytes(n: int, m: int, bt: int) -> int:
    """Shared memory (bytes) of one CTA of :func:`lstm_forward`'s kernel for hidden size
    ``n``, input width ``m`` and batch tile ``bt``, barriers aside: U^T and W^T
    (bfloat16), two x_t and two h^T buffers (bfloat16), the float32 output tile, b and
    the tile's lengths."""
    N, MP = padded(n, m)
    weights = GATES * N * N * 2 + GATES * N * MP * 2
    return weights + 2 * MP * bt * 2 + 2 * N * bt * 2 + N * bt * 4 + GATES * N * 4 + bt * 4


def fits(n: int, m: int, bt: int) -> bool:
    """Whether the kernel exists for these sizes: n <= 128, Bt in :data:`BATCH_TILES`,
    and :func:`smem_bytes` (plus 1 KB for barriers) within one H100 CTA's shared memory
    (:data:`~rhnzoo.cells.kernels.common.SMEM_LIMIT`). At n > 64, Bt = 64 fits for m <=
    16 only, Bt = 32 for m <= 32."""
    if not 0 < n <= 128 or m < 1 or bt not in BATCH_TILES:
        return False
    return smem_bytes(n, m, bt) + 1024 <= common.SMEM_LIMIT


def _forward_call(x, u, w, b, h0, c0, lens, mask, *, bt: int, interpret: bool):
    """The kernel on padded, feature-major arrays.

    Args: ``x [T, Bp, MP]`` bf16; ``u [4, H, 64, N]`` bf16, ``u[k, i] = U_k^T[64 i:64 i +
    64]``; ``w [4, H, 64, MP]`` bf16, ``w[k, i] = W_k^T[64 i:64 i + 64]``; ``b [4, H, 64]``
    f32; ``h0 [N, Bp]`` bf16, (h0 m)^T; ``c0 [H, 64, Bp]`` f32; ``lens [Bp]`` int32;
    ``mask [H, 64, Bp]`` f32 or None. Bp a multiple of ``bt``. Returns ``y^T [T, H, 64,
    Bp]`` f32: h_t on real steps, zeros on padded ones."""
    pl, plgpu = common.plgpu()
    T, Bp, MP = x.shape
    H = u.shape[1]
    lay = plgpu.Layout.WGMMA
    masked = mask is not None
    op_sw = common.swizzled(plgpu, _bf16, bt)  # U^T's and h^T's (module docstring)
    x_sw = common.swizzled(plgpu, _bf16, MP)  # W^T's and x_t's

    def body(x_ref, u_ref, w_ref, b_ref, h0_ref, c0_ref, len_ref, *refs):
        m_ref = refs[0] if masked else None
        y_ref, u_s, w_s, x_s, h_s, y_s, b_s, len_s, bar_w, bar_x, bar_init, bar_step = refs[masked:]
        cols = pl.ds(pl.multiple_of(lax.axis_index("b") * bt, bt), bt)
        wg = lax.axis_index("wg")  # this warpgroup's hidden units: 64 wg ... 64 wg + 63
        units = pl.ds(pl.multiple_of(wg * UNITS, UNITS), UNITS)

        @pl.when(wg == 0)
        def _load_once():
            # One [64, N] block a copy: a narrow swizzle tiles a block in many pieces, a
            # TMA copy strides at most five dimensions and takes contiguous SMEM only.
            for k, i in itertools.product(range(GATES), range(H)):
                plgpu.copy_gmem_to_smem(u_ref.at[k, i], u_s.at[k, i], bar_w.at[k * H + i])
                plgpu.copy_gmem_to_smem(w_ref.at[k, i], w_s.at[k, i], bar_w.at[(GATES + k) * H + i])
            plgpu.copy_gmem_to_smem(h0_ref.at[:, cols], h_s.at[0], bar_init.at[0])
            plgpu.copy_gmem_to_smem(c0_ref.at[:, :, cols], y_s, bar_init.at[1])
            plgpu.copy_gmem_to_smem(b_ref, b_s, bar_init.at[2])
            plgpu.copy_gmem_to_smem(len_ref.at[cols], len_s, bar_init.at[3])
            plgpu.copy_gmem_to_smem(x_ref.at[0, cols], x_s.at[0], bar_x.at[0])

        for k in range(2 * GATES * H):
            plgpu.barrier_wait(bar_w.at[k])
        for k in range(4):
            plgpu.barrier_wait(bar_init.at[k])
        c = plgpu.load(y_s.at[wg], layout=lay)  # c0^T of this warpgroup's units

        def step_t(t, c):
            # Every warpgroup's products of step t - 1 are done (they passed bar_step).
            slot = persistent.input_slot(pl, plgpu, x_ref, x_s, bar_x, t, cols, wg)

            def gemm(*accs):  # z_k^T = W_k^T x_t^T + U_k^T (h_{t-1} m)^T, the wg's units
                for k, acc in enumerate(accs):
                    plgpu.wgmma(acc, w_s.at[k, wg], x_s.at[slot].transpose((1, 0)))
                    plgpu.wgmma(acc, u_s.at[k, wg], h_s.at[slot])
                return tuple(a[...] for a in accs)

            zs = pl.run_scoped(gemm, *[plgpu.ACC((UNITS, bt), _f32)] * GATES)
            zs = [
                z
                + lax.broadcast_in_dim(
                    plgpu.load(b_s.at[k, wg], layout=lay.reduce(1)), (UNITS, bt), [0]
                )
                for k, z in enumerate(zs)
            ]
            i, f, o = (common.sigmoid(z) for z in zs[:3])
            c_new = f * c + i * jnp.tanh(zs[3])
            h_new = o * jnp.tanh(c_new)
            lens = plgpu.load(len_s, layout=lay.reduce(0))  # read each step, not held
            valid = lax.broadcast_in_dim(t < lens, (UNITS, bt), [1])
            kept = plgpu.load(h_s.at[slot, units], layout=lay)
            h_in = h_new  # what enters U next step: h_t m
            if masked:
                h_in = h_new * plgpu.load(m_ref.at[wg, :, cols], layout=lay, optimized=False)
            h_s[1 - slot, units] = jnp.where(valid, h_in.astype(_bf16), kept)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # y_s[wg] is free again
            y_s[wg] = jnp.where(valid, h_new, 0.0)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(y_s.at[wg], y_ref.at[t, wg, :, cols])
            plgpu.barrier_arrive(bar_step)  # h_t of every warpgroup is in h_s
            plgpu.barrier_wait(bar_step)
            return jnp.where(valid, c_new, c)

        lax.fori_loop(0, T, step_t, c)
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((T, H, UNITS, Bp), _f32),
        scratch_types=(
            plgpu.SMEM((GATES, H, UNITS, H * UNITS), _bf16, transforms=op_sw),
            plgpu.SMEM((GATES, H, UNITS, MP), _bf16, transforms=x_sw),
            plgpu.SMEM((2, bt, MP), _bf16, transforms=x_sw),
            plgpu.SMEM((2, H * UNITS, bt), _bf16, transforms=op_sw),
            plgpu.SMEM((H, UNITS, bt), _f32, transforms=common.swizzled(plgpu, _f32, min(bt, 32))),
            plgpu.SMEM((GATES, H, UNITS), _f32),
            plgpu.SMEM((bt,), jnp.int32),
            plgpu.Barrier(num_barriers=2 * GATES * H),
            plgpu.Barrier(num_barriers=2),
            plgpu.Barrier(num_barriers=4),
            plgpu.Barrier(num_arrivals=H),
        ),
        grid=(Bp // bt,),
        grid_names=("b",),
        num_threads=H,
        thread_name="wg",
        interpret=common.interpret_params(interpret),
    )
    return kernel(x, u, w, b, h0, c0, lens, *((mask,) if masked else ()))


def lstm_forward(
    xs: Array,
    W: Array,
    U: Array,
    b: Array,
    h0: Array,
    c0: Array,
    lens: Array | None,
    mask: Array | None,
    *,
    bt: int,
    interpret: bool,
) -> Array:
    """The LSTM's outputs over ``xs`` by the swap-AB persistent kernel (module docstring).

    Under ``jax.vmap`` (stacked seeds) wrap it in
    :func:`rhnzoo.cells.kernels.persistent.one_at_a_time`: ``pallas_call``'s batching rule
    adds a dimension to the kernel's TMA copies, past the five an H100 takes (a lowering
    error; lowered for ``cuda`` with the wrapper).

    Args:
      xs: ``[T, B, m]`` float32 inputs, time-major.
      W: ``[m, 4n]``, U: ``[n, 4n]``, b: ``[4n]`` float32, the blocks i | f | o | c̃ as in
        :class:`rhnzoo.cells.LSTM`'s parameters.
      h0, c0: ``[B, n]`` float32, the initial carry.
      lens: ``[B]`` int real steps per row (padded steps keep the carry and output
        zeros), or None: every row T steps.
      mask: ``[B, n]`` float32 recurrent dropout mask or None; it multiplies h_{t-1} where
        it enters U.
      bt: Bt, batch columns per CTA (wgmma's N): 16, 32 or 64.
      interpret: run in Pallas's GPU interpret mode (the CPU); False: compiled.

    Returns:
      ``y [T, B, n]`` float32: h_t on real steps, zeros on padded ones (T = 0 or B = 0:
      empty, no kernel launched).

    Raises:
      ValueError: ``xs`` not ``[T, B, m]``; W, U, b, h0, c0, lens or mask of other
        shapes; or no kernel for these sizes (:func:`fits`: n > 128, Bt not 16, 32 or
        64, or shared memory exceeded).
    """
    if xs.ndim != 3:
        raise ValueError(f"xs must be [T, B, m], got shape {xs.shape}")
    T, B, m = xs.shape
    n = U.shape[0]
    want = {"W": (m, 4 * n), "U": (n, 4 * n), "b": (4 * n,), "h0": (B, n), "c0": (B, n)}
    got = {"W": W.shape, "U": U.shape, "b": b.shape, "h0": h0.shape, "c0": c0.shape}
    if lens is not None:
        want["lens"], got["lens"] = (B,), jnp.shape(lens)
    if mask is not None:
        want["mask"], got["mask"] = (B, n), jnp.shape(mask)
    wrong = [f"{k} {tuple(got[k])} (want {want[k]})" for k in want if tuple(got[k]) != want[k]]
    if wrong:
        raise ValueError(
            f"shapes do not match an LSTM(n={n}) over xs {xs.shape}: " + ", ".join(wrong)
        )
    if not fits(n, m, bt):
        raise ValueError(
            f"no swap-AB LSTM kernel for n={n}, m={m}, bt={bt}: n <= 128, bt in {BATCH_TILES} "
            f"and {smem_bytes(n, m, bt) if 0 < n <= 128 else '?'} bytes of shared memory "
            f"within {common.SMEM_LIMIT - 1024}"
        )
    if T == 0 or B == 0:  # nothing to run
        return jnp.zeros((T, B, n), _f32)
    N, MP = padded(n, m)
    H, Bp = N // UNITS, -(-B // bt) * bt
    lens = jnp.full((B,), T, jnp.int32) if lens is None else jnp.asarray(lens, jnp.int32)

    def gate_rows(M):  # [r, 4n] -> [4, H, 64, r]: W_k^T / U_k^T, output units padded to N
        blocks = jnp.moveaxis(M.reshape(M.shape[0], GATES, n), 0, 2)  # [4, n, r]
        return common.pad_to(blocks, (GATES, N, M.shape[0])).reshape(GATES, H, UNITS, -1)

    def units_major(a, dtype):  # [B, n] -> [H, 64, Bp]
        return common.pad_to(a.astype(dtype), (Bp, N)).T.reshape(H, UNITS, Bp)

    u = common.pad_to(gate_rows(U), (GATES, H, UNITS, N))
    y = _forward_call(
        common.pad_to(xs.astype(_bf16), (T, Bp, MP)),
        u.astype(_bf16),
        common.pad_to(gate_rows(W), (GATES, H, UNITS, MP)).astype(_bf16),
        common.pad_to(b.reshape(GATES, n).astype(_f32), (GATES, N)).reshape(GATES, H, UNITS),
        units_major(h0 if mask is None else h0 * mask, _bf16).reshape(N, Bp),
        units_major(c0, _f32),
        common.pad_to(lens, (Bp,)),
        None if mask is None else units_major(mask, _f32),
        bt=bt,
        interpret=interpret,
    )
    return jnp.swapaxes(y.reshape(T, N, Bp), 1, 2)[:, :B, :n]
