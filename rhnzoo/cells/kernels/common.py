"""The kernels' common part: what every Mosaic GPU kernel of :mod:`rhnzoo.cells.kernels`
shares (the Pallas module, shared-memory tiling, the one-tanh sigmoid, interpret mode,
padding), the options checks every kernel backend makes, and (re-exported)
:class:`~rhnzoo.cells.scan_options.Options`, the one options record every scan backend's
``unroll`` takes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# BATCH_TILES, DEFAULT_OPTIONS and Options are rhnzoo.cells.scan_options's, re-exported here.
from rhnzoo.cells.scan_options import BATCH_TILES, DEFAULT_OPTIONS, Options, last_real

Array = jax.Array


SMEM_LIMIT = 232_448  # bytes of shared memory one CTA may use on an H100 (sm_90)


def plgpu():
    """``(pl, plgpu)``: Pallas and its Mosaic GPU module, imported on first use (they load
    MLIR bindings)."""
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as mgpu

    return pl, mgpu


def swizzled(mgpu, dtype, minor: int):
    """Tiling and swizzle transforms for a shared-memory tile whose minor dimension holds
    ``minor`` elements of ``dtype`` (up to 128 bytes per swizzle)."""
    size = jnp.dtype(dtype).itemsize
    swizzle = min(128, minor * size)
    return mgpu.TilingTransform((8, swizzle // size)), mgpu.SwizzleTransform(swizzle)


def sigmoid(x):
    """σ(x) as one tanh: the form every kernel and its XLA recompute share."""
    return 0.5 * jnp.tanh(0.5 * x) + 0.5


def interpret_params(interpret: bool):
    """``compiler_params`` for a ``pallas_call``: Mosaic GPU's interpret mode (the CPU) or
    None (compiled)."""
    _, mgpu = plgpu()
    return mgpu.InterpretGPUParams() if interpret else None


def pad_to(a: Array, shape: tuple[int, ...]) -> Array:
    """``a`` zero-padded at the end of each axis to ``shape`` (each dimension >= a's)."""
    return jnp.pad(a, [(0, s - d) for s, d in zip(shape, a.shape, strict=True)])


def check_options(opts: Options, cell: Any, resets: Array | None) -> None:
    """What every kernel backend's ``unroll`` refuses before building a kernel: a
    ``dtype`` other than None and bfloat16 (their only precision: bfloat16 matmul inputs,
    float32 accumulation, state and gates; None is taken as bfloat16), ``remat`` (they
    write their own backward pass) and ``resets`` (they have no episode starts).

    Raises:
      ValueError: (one line) for each of these.
    """
    if opts.dtype is not None and not opts.bfloat16():
        raise ValueError(
            f"the Pallas kernels compute in bfloat16 (dtype=jnp.bfloat16), got {opts.dtype!r}"
        )
    if opts.remat:
        raise ValueError(
            f"remat needs the reference scan (scan_impl='reference'): the pallas kernels "
            f"of {cell!r} have no remat"
        )
    if resets is not None:
        raise ValueError(
            f"resets need the reference or fused scan: the pallas kernels of {cell!r} have "
            "no resets (scan_impl='fused' or 'auto')"
        )


def finish(cell_output: Array, ys: Array | None, opts: Options, lengths: Array | None):
    """The ``ys`` a kernel backend returns for ``opts.outputs``: ``ys [T, B, n]``
    ("all"), ``cell_output [B, n]``, the output of the step that produced the final
    carry, with the rows of length 0 zeroed ("last"), or None ("none")."""
    if opts.outputs == "last":
        return last_real(cell_output, lengths)
    return ys if opts.outputs == "all" else None


def refuse_batch_tile(opts: Options, cell: Any) -> None:
    """For a persistent backend's ``unroll`` whose ``cell`` the swap-AB forward does not
    run (any but a plain LSTM): raises ValueError if ``opts.batch_tile`` is set, or if
    ``opts.kernel_backward`` is False (the persistent kernels have no XLA backward)."""
    if opts.batch_tile is not None:
        raise ValueError(
            f"batch_tile={opts.batch_tile}: the swap-AB forward runs a plain LSTM only, not "
            f"{cell!r} (batch_tile=None runs its kernels)"
        )
    refuse_xla_backward(opts, cell)


def refuse_xla_backward(opts: Options, cell: Any) -> None:
    """Raises ValueError if ``opts.kernel_backward`` is False for a persistent kernel's
    ``cell`` (its backward is a kernel only)."""
    if not opts.kernel_backward:
        raise ValueError(
            f"kernel_backward=False: the persistent kernels of {cell!r} have no XLA backward "
            "(the RHN's kernels only)"
        )
