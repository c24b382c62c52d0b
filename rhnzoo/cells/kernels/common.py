"""The kernels' common part: what every Mosaic GPU kernel of :mod:`rhnzoo.cells.kernels`
shares (the Pallas module, shared-memory tiling, the one-tanh sigmoid, interpret mode,
padding) and :class:`Options`, the one options record every backend's ``unroll`` takes."""

from __future__ import annotations

import dataclasses
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class Options:
    """How a kernel backend's ``unroll`` runs (:class:`rhnzoo.cells.kernels.Backend`),
    validated once, here.

    Attributes:
      dtype: the matmul input dtype, a JAX dtype: ``jnp.bfloat16``, the only precision the
        kernels have (bfloat16 matmul inputs, float32 accumulation, state and gates).
      outputs: False: ``unroll`` returns ``ys`` None (the classifier reads the final
        carry); the RHN's kernel forms its outputs anyway (its carry is its output).
      interpret: run the kernels in Pallas's GPU interpret mode (the CPU); None: where
        JAX's default backend is the CPU (:meth:`interpreted`), compiled on a GPU.

    Raises:
      ValueError: a ``dtype`` other than bfloat16.
    """

    dtype: Any = jnp.bfloat16
    outputs: bool = True
    interpret: bool | None = None

    def __post_init__(self):
        try:
            dtype = None if self.dtype is None else jnp.dtype(self.dtype)
        except TypeError:
            dtype = None
        if dtype != jnp.dtype(jnp.bfloat16):
            raise ValueError(
                f"the Pallas kernels compute in bfloat16 (dtype=jnp.bfloat16), got {self.dtype!r}"
            )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "outputs", bool(self.outputs))
        if self.interpret is not None:
            object.__setattr__(self, "interpret", bool(self.interpret))

    def interpreted(self) -> bool:
        """Whether the kernels run in interpret mode: ``interpret``, or (None) whether JAX's
        default backend is the CPU."""
        if self.interpret is None:
            return jax.default_backend() == "cpu"
        return self.interpret


# The options an ``unroll`` takes when given none: bfloat16, outputs, interpret on the CPU.
DEFAULT_OPTIONS = Options()
