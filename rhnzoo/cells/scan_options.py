"""The one options record of every time-scan backend (:class:`Options`), and the few
helpers they share: the platform they choose for (:func:`platform`, :func:`for_platform`)
and each row's output at its last real step (:func:`last_real`, :func:`gather_last`).

Every backend of :mod:`rhnzoo.cells.scan` takes this record in its one ``unroll``. It
imports nothing of rhnzoo's, so the kernels import it without the dispatcher.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import operator
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array

# What a scan returns besides its final carry: "all" (ys [T, B, n]), "last" (each row's
# output at its last real step, [B, n]) or "none" (None).
OUTPUTS = ("all", "last", "none")
# Bt, the batch columns per CTA of a kernel with the batch on wgmma's N (swap-AB)
BATCH_TILES = (16, 32, 64)
LAYER_LOOPS = (None, "scan", "python")


@dataclasses.dataclass(frozen=True)
class Options:
    """How a scan backend's ``unroll`` runs; validated once, here (a backend refuses the
    options it does not have in its own ``unroll``).

    Attributes:
      dtype: the matmul input dtype, a JAX dtype (any name of one is taken): None, each
        backend's own (the inputs' dtype for the reference and fused scans; the
        kernels' bfloat16); float32; bfloat16 (bfloat16 matmul inputs, float32
        accumulation, state and parameters; the reference scan refuses it).
      unroll: time steps per scan iteration; None: each backend's default (1 for the
        reference and the RHN's fused scan, :func:`rhnzoo.cells.gated_fused.default_unroll`
        of :func:`platform` for the gated one); the kernels have their own loop and
        ignore it.
      remat: recompute time steps in the backward pass (the reference scan and the RHN's
        fused one; the others refuse it).
      outputs: ``"all"``: every step's output ``ys [T, B, n]``; ``"last"``: each row's
        output at its last real step ``[B, n]`` (zeros for a row of length 0), from
        every backend; ``"none"``: None. True and False are taken as ``"all"`` and
        ``"none"``.
      project_per_step: compute the input projection inside the time scan; None: the
        backend's default (the reference scan's False, the gated fused scan's True); the
        RHN's scans and the kernels have their own and ignore it.
      save_matmuls: the reference scan's :func:`rhnzoo.cells.base.save_matmuls_only`
        (ignored by the others).

    Backend options (the other backends ignore them):

    Attributes:
      layer_loop: the RHN's fused scan: how a step runs its micro-layers, ``'scan'``,
        ``'python'`` or None (by depth; :func:`rhnzoo.cells.rhn_fused.unroll`).
      weight_grad_chunk: the gated fused scan: C, the steps whose weight gradients are
        one matmul (a divisor of T, checked by that scan; None: its default,
        :func:`rhnzoo.cells.gated_fused.unroll`).
      interpret: the kernels: run them in Pallas's GPU interpret mode (the CPU); None:
        where :func:`platform` is the CPU (:meth:`interpreted`), compiled on a GPU.
      batch_tile: the kernels: Bt, the batch columns per CTA on wgmma's N of a swap-AB
        kernel (gates on M), 16, 32 or 64. The RHN's micro-layer kernels are always
        swap-AB (None: :func:`rhnzoo.cells.kernels.rhn.default_batch_tile` of B). The
        persistent kernels: None is their 64-row layout; a Bt runs the LSTM's forward by
        :mod:`~rhnzoo.cells.kernels.swap_ab` (only a plain :class:`~rhnzoo.cells.LSTM`;
        the other persistent cells: ValueError). Never set by ``auto``.
      kernel_backward: the RHN's kernels: the backward pass by its backward micro-layer
        kernels (the default); False: the fused scan's hand-written backward in XLA
        (:func:`rhnzoo.cells.rhn_fused.unroll_backward`). The persistent kernels have
        only a kernel backward (False: ValueError).

    Raises:
      ValueError: a ``dtype`` that names no JAX dtype; an ``unroll`` that is not None
        or an integer >= 1; ``outputs`` not one
        of :data:`OUTPUTS` (or a bool); a ``layer_loop`` not one of :data:`LAYER_LOOPS`;
        a ``batch_tile`` other than None and :data:`BATCH_TILES`.
    """

    dtype: Any = None
    unroll: int | None = None
    remat: bool = False
    outputs: str = "all"
    project_per_step: bool | None = None
    save_matmuls: bool = False
    layer_loop: str | None = None
    weight_grad_chunk: int | None = None
    interpret: bool | None = None
    batch_tile: int | None = None
    kernel_backward: bool = True

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
        if self.dtype is not None:
            try:
                dtype = jnp.dtype(self.dtype)
            except TypeError:
                dtype = None
            if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
                raise ValueError(
                    f"dtype must be None, float32 or bfloat16 (a JAX dtype), got {self.dtype!r}"
                )
            set_("dtype", dtype)
        u = self.unroll
        if u is not None and (not isinstance(u, int) or isinstance(u, bool) or u < 1):
            raise ValueError(f"unroll must be None or an integer >= 1, got {u!r}")
        outputs = {True: "all", False: "none"}.get(self.outputs, self.outputs)
        if outputs not in OUTPUTS:
            raise ValueError(
                f"outputs must be 'all', 'last' or 'none' (True: 'all', False: 'none'), "
                f"got {self.outputs!r}"
            )
        set_("outputs", outputs)
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(
                f"layer_loop must be 'scan', 'python' or None, got {self.layer_loop!r}"
            )
        set_("remat", bool(self.remat))
        set_("save_matmuls", bool(self.save_matmuls))
        if self.project_per_step is not None:
            set_("project_per_step", bool(self.project_per_step))
        if self.interpret is not None:
            set_("interpret", bool(self.interpret))
        if self.batch_tile is not None:
            try:
                bt = None if isinstance(self.batch_tile, bool) else operator.index(self.batch_tile)
            except TypeError:
                bt = None
            if bt not in BATCH_TILES:
                raise ValueError(
                    f"batch_tile must be None or one of {BATCH_TILES} (the swap-AB forward's "
                    f"batch columns per CTA), got {self.batch_tile!r}"
                )
            set_("batch_tile", bt)
        set_("kernel_backward", bool(self.kernel_backward))

    def interpreted(self) -> bool:
        """Whether the kernels run in interpret mode: ``interpret``, or (None) whether
        :func:`platform` is the CPU."""
        if self.interpret is None:
            return platform() == "cpu"
        return self.interpret

    def bfloat16(self) -> bool:
        """Whether ``dtype`` is bfloat16."""
        return self.dtype == jnp.dtype(jnp.bfloat16)


# The options an ``unroll`` takes when given none.
DEFAULT_OPTIONS = Options()


# Where the scans run: None (JAX's default backend) or the platform set by for_platform().
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rhnzoo_scan_platform", default=None
)


def platform() -> str:
    """The platform the scans choose for: the one :func:`for_platform` set, else
    ``jax.default_backend()`` (``'cpu'``, ``'gpu'``, ``'tpu'``)."""
    return _PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def for_platform(name: str) -> Iterator[None]:
    """Within it, :func:`rhnzoo.cells.scan.resolve` (``backend`` None) and every scan
    choose as they would on platform ``name`` (``'tpu'``, ``'gpu'``, ``'cpu'``): for
    tracing a step to lower for another platform, e.g. on a CPU host::

      with scan.for_platform("tpu"):
          jax.jit(lambda *a: step(*a)).trace(*args).lower(lowering_platforms=("tpu",))

    JAX caches a function's trace by the function and its arguments, not by this
    setting: trace a function object not traced before (the fresh ``lambda`` above), or
    an earlier trace for another platform is reused.

    Raises:
      ValueError: an empty or non-string ``name``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"for_platform needs a platform name such as 'tpu', got {name!r}")
    token = _PLATFORM.set(name.lower())
    try:
        yield
    finally:
        _PLATFORM.reset(token)


def last_real(last: Array, lengths: Array | None, steps: int | None = None) -> Array:
    """``last [B, n]``, each row's output at its last real step (read from a scan's final
    carry, which stops there), with the rows of length 0 (``lengths [B]``; every row
    where the scan had ``steps`` = 0) zeroed."""
    if steps == 0:
        return jnp.zeros_like(last)
    if lengths is None:
        return last
    return jnp.where((jnp.asarray(lengths) > 0)[:, None], last, jnp.zeros((), last.dtype))


def gather_last(ys: Array, lengths: Array | None) -> Array:
    """Each row's output at its last real step, ``[B, n]``, gathered from ``ys [T, B,
    n]`` (zeros for a row of length 0; ``lengths`` None: every row T steps)."""
    if ys.shape[0] == 0:  # no step: every row has length 0
        return jnp.zeros(ys.shape[1:], ys.dtype)
    if lengths is None:
        return ys[-1]
    lengths = jnp.asarray(lengths)
    last = ys[jnp.maximum(lengths - 1, 0), jnp.arange(ys.shape[1])]
    return last_real(last, lengths)
