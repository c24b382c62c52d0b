"""The kernels' common part: what every Mosaic GPU kernel of :mod:`rhnzoo.cells.kernels`
shares (the Pallas module, shared-memory tiling, the one-tanh sigmoid, interpret mode,
padding) and :class:`Options`, the one options record every backend's ``unroll`` takes."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

SMEM_LIMIT = 232_448  # bytes of shared memory one CTA may use on an H100 (sm_90)
# Bt, the batch columns per CTA of a kernel with the batch on wgmma's N (swap-AB)
BATCH_TILES = (16, 32, 64)


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
      batch_tile: Bt, the batch columns per CTA on wgmma's N of a swap-AB kernel (gates
        on M), 16, 32 or 64. The RHN's micro-layer kernels are always swap-AB (None:
        :func:`rhnzoo.cells.kernels.rhn.default_batch_tile` of B). The persistent kernels:
        None is their 64-row layout (batch rows on wgmma's M); a Bt runs the LSTM's forward
        by :mod:`~rhnzoo.cells.kernels.swap_ab` (a small batch spread over more SMs; issue
        59), its backward as with None; only a plain :class:`~rhnzoo.cells.LSTM` runs it
        (the other persistent cells: ValueError). Never set by the dispatcher nor ``auto``:
        not yet timed on a GPU (docs/runs/gpu/kernel_probe.py's ``pallas_bt16``, ``_bt32``).
      kernel_backward: the RHN's backward pass by its backward micro-layer kernels (the
        default); False: the fused scan's hand-written backward in XLA
        (:func:`rhnzoo.cells.rhn_fused.unroll_backward`). The persistent kernels have only a
        kernel backward (False: ValueError).

    Raises:
      ValueError: a ``dtype`` other than bfloat16; a ``batch_tile`` other than None and
        :data:`BATCH_TILES`.
    """

    dtype: Any = jnp.bfloat16
    outputs: bool = True
    interpret: bool | None = None
    batch_tile: int | None = None
    kernel_backward: bool = True

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
        if self.batch_tile is not None:
            try:
                bt = operator.index(self.batch_tile)
            except TypeError:
                bt = None
            if bt not in BATCH_TILES:
                raise ValueError(
                    f"batch_tile must be None or one of {BATCH_TILES} (the swap-AB forward's "
                    f"batch columns per CTA), got {self.batch_tile!r}"
                )
            object.__setattr__(self, "batch_tile", bt)
        object.__setattr__(self, "kernel_backward", bool(self.kernel_backward))

    def interpreted(self) -> bool:
        """Whether the kernels run in interpret mode: ``interpret``, or (None) whether JAX's
        default backend is the CPU."""
        if self.interpret is None:
            return jax.default_backend() == "cpu"
        return self.interpret


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


# The options an ``unroll`` takes when given none: bfloat16, outputs, interpret on the CPU.
DEFAULT_OPTIONS = Options()
