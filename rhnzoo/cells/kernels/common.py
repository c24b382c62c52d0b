"""The kernels' common part: what every Mosaic GPU kernel of :mod:`rhnzoo.cells.kernels`
shares (the Pallas module, shared-memory tiling, the one-tanh sigmoid, interpret mode,
padding)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
