"""Mosaic GPU kernels of the recurrences (Pallas), the ``pallas`` implementation of
:mod:`rhnzoo.cells.scan`.

* :mod:`~rhnzoo.cells.kernels.common`: what every kernel shares, and the checks of
  :class:`Options` (:class:`rhnzoo.cells.scan_options.Options`, re-exported: the one options
  record of every scan backend, these and the dispatcher's own).
* :mod:`~rhnzoo.cells.kernels.persistent`: the persistent kernels' common part (the
  forward kernel of every persistent cell, the backward harness, padding, the
  weight-gradient epilogue).
* :mod:`~rhnzoo.cells.kernels.gated`: persistent kernels (the time loop in one launch each
  way) for the LSTM, SC-LSTM and the reset-after GRU.
* :mod:`~rhnzoo.cells.kernels.chained`: persistent kernels for the RRN and Cho et al.'s
  GRU (a second product that waits on the first).
* :mod:`~rhnzoo.cells.kernels.rhn`: one fused GEMM-and-highway kernel per micro-layer for
  the coupled RHN and HSG(RHN).
* :mod:`~rhnzoo.cells.kernels.verified`: the record of the kernel configurations a GPU
  has verified (``verified.json``, package data), without which no backend ``fits``.

The three cell-family modules are **backends**: each implements :class:`Backend`
(``supports``, ``fits``, ``unroll``, as do the dispatcher's other three: the reference
scan and the two fused scans, :data:`rhnzoo.cells.scan.BACKENDS`) and takes one
:class:`Options` record. :data:`BACKENDS` lists them; :func:`backend_of` finds a cell's. A
cell is run by at most one kernel backend (their ``supports`` are disjoint; tested).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from rhnzoo.cells.kernels import chained, gated, rhn
from rhnzoo.cells.scan_options import DEFAULT_OPTIONS, Options

Array = jax.Array

__all__ = ["BACKENDS", "DEFAULT_OPTIONS", "Backend", "Options", "backend_of"]


class Backend(Protocol):
    """A backend the dispatcher (:mod:`rhnzoo.cells.scan`) can run a cell by: these kernel
    families, and the reference and fused scans (:data:`rhnzoo.cells.scan.BACKENDS`).

    Attributes:
      IMPL: the implementation it belongs to (:class:`rhnzoo.cells.scan.ScanImpl`'s
        value: ``'pallas'``, ``'fused'`` or ``'reference'``).
      REMAT: whether it has ``remat``.
      RUNS: (the kernels) what it runs, in the words of the dispatcher's refusal.
    """

    IMPL: str
    REMAT: bool

    def supports(self, cell: Any) -> bool:
        """Whether :meth:`unroll` runs ``cell`` at all (at some shape)."""
        ...

    def fits(
        self,
        cell: Any,
        batch: int,
        dtype: Any,
        backend: str | None = None,
        *,
        input_size: int = 1,
    ) -> bool:
        """Whether ``scan_impl='auto'`` may pick it for ``cell`` at ``batch`` rows, matmul
        input ``dtype``, platform ``backend`` (None: JAX's default) and input width
        ``input_size``. A kernel family: only where the verified record lists it
        (:func:`rhnzoo.cells.kernels.verified.verified`: this source's digest, this
        device kind, errors checked, faster than the fused scan; docs/speed.md)."""
        ...

    def unroll(
        self,
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
        """``cell`` over ``xs [T, B, m]`` from ``carry`` with the recurrent dropout ``mask
        [B, n]`` (or None), ``lengths [B]`` int (or None: every row T steps; padded steps
        keep the carry and output zeros) and ``resets [T, B]`` bool (or None; the
        kernels refuse them): ``(carry_T, ys)`` with ``ys`` by ``opts.outputs``: ``[T, B,
        n]`` ("all"), each row's output at its last real step ``[B, n]`` (zeros for a row
        of length 0; "last") or None ("none"); differentiable (the kernels' values and
        gradients agree with :func:`rhnzoo.cells.unroll` to bfloat16 rounding).

        Raises:
          ValueError: for a cell it does not support, options it does not have, or
            parameters or shapes that are not the cell's.
        """
        ...


# The backends, in the order backend_of asks them.
BACKENDS: tuple[Backend, ...] = (gated, chained, rhn)


def backend_of(cell: Any) -> Backend | None:
    """The backend of :data:`BACKENDS` whose ``supports(cell)`` is true, or None (a
    ``Parallel`` cell has none: the dispatcher runs its parts one by one)."""
    return next((b for b in BACKENDS if b.supports(cell)), None)
