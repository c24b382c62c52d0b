"""One scan dispatcher: every model runs its cell over time through :func:`unroll`.

Three implementations compute the same function (``lengths`` and the recurrent dropout
mask with :func:`rhnzoo.cells.unroll`'s semantics), and ``auto`` picks one of them by
one rule (:func:`resolve`), as recurrentgemma's ``ScanType`` does:

* ``reference``: :func:`rhnzoo.cells.unroll`, the cell's own ``step`` in a ``lax.scan``,
  differentiated by autodiff; any cell; ``remat``; no bfloat16.
* ``fused``: the hand-written backward scans, :mod:`rhnzoo.cells.gated_fused` for LSTM,
  GRU, SC-LSTM, RRN and ``Parallel`` of these (HRL, LSTM+GRU), and
  :mod:`rhnzoo.cells.rhn_fused` for the coupled RHN and HSG(RHN) (either spelling:
  ``cells.make('hsg_rhn', ...)`` and ``cells.make('rhn', ..., hsg=True)`` build the same
  cell); float32 or bfloat16 matmul inputs; ``remat`` in the RHN's only.
* ``pallas``: the Mosaic GPU kernels of :mod:`rhnzoo.cells.kernels`, each family a
  :class:`~rhnzoo.cells.kernels.Backend` of :data:`~rhnzoo.cells.kernels.BACKENDS`
  (:func:`~rhnzoo.cells.kernels.backend_of` finds a cell's): the persistent kernels of
  :mod:`~rhnzoo.cells.kernels.gated` (LSTM, SC-LSTM, reset-after GRU) and
  :mod:`~rhnzoo.cells.kernels.chained` (RRN, Cho et al.'s GRU), and ``Parallel`` of these
  (HRL, LSTM+GRU), each part by its own kernels; hidden size <= 128; bfloat16 only; no
  ``remat``; and :mod:`~rhnzoo.cells.kernels.rhn` (one fused GEMM-and-highway kernel per
  micro-layer) for the coupled RHN and HSG(RHN), any size.

The cells' own :func:`rhnzoo.cells.unroll` keeps its signature: it is the scan a user
writes, and the ``reference`` implementation here.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells import base, gated_fused, kernels, rhn_fused
from rhnzoo.cells.kernels import verified
from rhnzoo.cells.residual import Parallel
from rhnzoo.cells.rhn import HSG, RHN

Array = jax.Array


class ScanImpl(enum.StrEnum):
    """The time-scan implementations; a plain string (``'fused'``) names one as well."""

    REFERENCE = "reference"
    FUSED = "fused"
    PALLAS = "pallas"
    AUTO = "auto"


# The values of ``--scan_impl`` / ``scan_impl=``, ``auto`` (every task's default) first;
# the configs declare the field (rhnzoo.config.scan_impl_setting).
CHOICES: tuple[str, ...] = ("auto", "reference", "fused", "pallas")
DEFAULT = "auto"

HELP = (
    "Time-scan implementation (rhnzoo.cells.scan): 'reference' (lax.scan + autodiff; "
    "any cell), 'fused' (hand-written backward scans: LSTM, GRU, SC-LSTM, RRN, HRL, "
    "LSTM+GRU, coupled RHN, HSG(RHN)), 'pallas' (Mosaic GPU kernels: persistent ones for "
    "the gated cells, one per micro-layer for the coupled RHN and HSG(RHN); bfloat16) "
    "or 'auto' (pallas where it fits, else fused where the cell has it and "
    "--remat allows, else reference)."
)


# Where the scans run: None (JAX's default backend) or the platform set by for_platform().
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rhnzoo_scan_platform", default=None
)
# The platforms the persistent kernels (Mosaic GPU) run on: an NVIDIA GPU compiled, the
# CPU in Pallas's GPU interpret mode.
PALLAS_PLATFORMS = ("gpu", "cuda", "cpu")


def platform() -> str:
    """The platform :func:`resolve` and :func:`unroll` choose for: the one
    :func:`for_platform` set, else ``jax.default_backend()`` (``'cpu'``, ``'gpu'``,
    ``'tpu'``)."""
    return _PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def for_platform(name: str) -> Iterator[None]:
    """Within it, :func:`resolve` (``backend`` None) and :func:`unroll` choose as they
    would on platform ``name`` (``'tpu'``, ``'gpu'``, ``'cpu'``), whatever this host's
    backend: for tracing a step to lower for another platform, e.g. on a CPU host::

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


def rhn_fused_supports(cell: Any) -> bool:
    """Whether :mod:`rhnzoo.cells.rhn_fused` runs ``cell``: a coupled RHN, or HSG around one."""
    inner = cell.cell if isinstance(cell, HSG) else cell
    return isinstance(inner, RHN) and inner.coupled


def pallas_supports(cell: Any) -> bool:
    """Whether a Pallas kernel runs ``cell``: a backend of
    :data:`~rhnzoo.cells.kernels.BACKENDS` supports it (:func:`~rhnzoo.cells.kernels.
    backend_of`), or it is a ``Parallel`` of such cells."""
    if isinstance(cell, Parallel):
        return all(pallas_supports(c) for c in cell.cells)
    return kernels.backend_of(cell) is not None


def _fused_has_remat(cell: Any) -> bool:
    return rhn_fused_supports(cell)  # gated_fused has no remat


def implementations(cell: Any) -> tuple[ScanImpl, ...]:
    """The implementations that can run ``cell`` (at some size and dtype)."""
    out = [ScanImpl.REFERENCE]
    if gated_fused.supports(cell) or rhn_fused_supports(cell):
        out.append(ScanImpl.FUSED)
    if pallas_supports(cell):
        out.append(ScanImpl.PALLAS)
    return tuple(out)


def describe(cell: Any) -> str:
    """A short name of ``cell`` for messages: ``'LSTM'``, ``'HSG(RHN)'``,
    ``'Parallel(LSTM, RRN)'``, ``'RHN(coupled=False)'``."""
    if isinstance(cell, HSG):
        return f"HSG({describe(cell.cell)})"
    if isinstance(cell, Parallel):
        return f"Parallel({', '.join(describe(c) for c in cell.cells)})"
    if isinstance(cell, RHN) and not cell.coupled:
        return "RHN(coupled=False)"
    return type(cell).__name__


def _bfloat16(dtype: Any) -> bool:
    return dtype is not None and jnp.dtype(dtype) == jnp.bfloat16


def resolve(
    impl: str | ScanImpl,
    cell: Any,
    *,
    batch: int | None = None,
    dtype: Any = None,
    backend: str | None = None,
    remat: bool = False,
    input_size: int | None = None,
) -> ScanImpl:
    """The implementation that runs ``cell``: ``impl`` itself when the cell has it, and
    for ``auto`` the one rule below (never returns ``AUTO``).

    ``auto``, in this order (the measurements behind it: docs/speed.md, "The rule of
    ``auto`` and the figures behind it"):

    1. ``pallas`` where the cell's backend (:func:`~rhnzoo.cells.kernels.backend_of`)
       ``fits(cell, batch, dtype, backend)``, a known ``batch`` and no ``remat``. Every
       backend's ``fits`` needs an entry of the verified record
       (:func:`rhnzoo.cells.kernels.verified.verified`): a GPU window measured this
       kernel source (its digest), on this device kind, at this cell, hidden size, batch,
       input width and dtype, its errors checked and its train step faster than the fused
       scan's. Besides, the gated backend's ``fits`` is a GPU of compute capability 9.0,
       an LSTM with hidden size <= 64 whose shapes fit one CTA's shared memory, and
       bfloat16 matmul inputs; the chained (RRN, Cho's GRU) and RHN backends' a cell they
       run, bfloat16 and compute capability 9.0. The record is empty today, so ``auto``
       never picks ``pallas`` until a kernel window fills it. A ``Parallel`` has no
       backend of its own. Never chosen on a CPU or a TPU.
    2. ``fused`` where the cell has a fused scan (and, with ``remat``, where that scan
       has remat: the RHN's; the gated cells then take ``reference``).
    3. ``reference`` otherwise (every other cell: DT-RNN, DT(S)-RNN, an uncoupled RHN,
       HSG around a gated cell); bfloat16 then has no implementation (a ValueError).

    Args:
      impl: one of :data:`CHOICES` (or a :class:`ScanImpl`).
      cell: the cell to run.
      batch: B, the rows per call (None: unknown; ``auto`` then skips ``pallas``).
      dtype: the matmul input dtype (None or float32; bfloat16 needs fused or pallas).
      backend: the platform to choose for (None: :func:`platform`, JAX's default
        backend unless :func:`for_platform` set another).
      remat: recompute time steps in the backward pass.
      input_size: m, the input width, for the kernels' ``fits`` (None: its default).

    ``pallas`` asked for on a GPU platform (``'gpu'``, ``'cuda'``) with a known ``batch``
    and no entry of the verified record for it logs one absl WARNING line per kernel
    and device kind naming it as not yet checked there, and runs it; on the CPU (Pallas's
    interpret mode, the tests' path) it logs nothing.

    Raises:
      ValueError: (one line naming the cell and its implementations) an unknown
        ``impl``; an implementation the cell does not have; ``pallas`` on a platform
        other than a GPU or the CPU (:data:`PALLAS_PLATFORMS`: a TPU has no Mosaic GPU);
        ``remat`` with a scan that has none; bfloat16 with the reference scan.
    """
    try:
        impl = ScanImpl(impl)
    except ValueError:
        raise ValueError(f"scan_impl must be one of {', '.join(CHOICES)}, got {impl!r}") from None
    have = implementations(cell)
    name, listed = describe(cell), ", ".join(have)
    bf16 = _bfloat16(dtype)
    # The platform only where a choice needs it: asking JAX starts its backend, which a
    # config's check (batch None) must not do before jax.distributed.initialize.
    where = lambda: backend or platform()
    if impl is ScanImpl.AUTO:
        size = {} if input_size is None else {"input_size": input_size}
        family = kernels.backend_of(cell)  # None for a Parallel: auto picks cell by cell
        if (
            ScanImpl.PALLAS in have
            and not remat
            and batch is not None
            and family is not None
            and family.fits(cell, batch, dtype, where(), **size)
        ):
            return ScanImpl.PALLAS
        if ScanImpl.FUSED in have and (not remat or _fused_has_remat(cell)):
            return ScanImpl.FUSED
        impl = ScanImpl.REFERENCE
        if bf16:
            raise ValueError(
                f"dtype=bfloat16 needs the fused or pallas scan, which {name} "
                f"does not have{' with remat' if remat else ''} (its scans: "
                f"{listed})"
            )
    if impl not in have:
        why = (
            ""
            if impl is not ScanImpl.PALLAS
            else " (the persistent kernels: LSTM, SC-LSTM, "
            "either GRU, RRN and Parallel of these, hidden size <= 128 and the weights in "
            "one CTA's shared memory: the RRN up to depth 3 at n = 128; the micro-layer "
            "kernel: coupled RHN, HSG(RHN))"
        )
        raise ValueError(f"scan_impl='{impl}' cannot run {name}; its scans: {listed}{why}")
    if impl is ScanImpl.PALLAS and where() not in PALLAS_PLATFORMS:
        raise ValueError(
            f"scan_impl='pallas' runs Mosaic GPU kernels (an NVIDIA GPU), not on "
            f"platform '{where()}': use scan_impl='fused' (or 'auto', which picks "
            f"it for {name} there)"
        )
    no_remat = impl is ScanImpl.PALLAS or (impl is ScanImpl.FUSED and not _fused_has_remat(cell))
    if remat and no_remat:
        raise ValueError(
            f"remat needs the reference scan (scan_impl='reference'): the {impl} "
            f"scan of {name} has no remat"
        )
    if bf16 and impl is ScanImpl.REFERENCE:
        raise ValueError(
            f"dtype=bfloat16 needs the fused or pallas scan (scan_impl='reference' "
            f"computes in the inputs' dtype); {name}'s scans: {listed}"
        )
    if impl is ScanImpl.PALLAS and where() in GPU_PLATFORMS:
        _warn_unchecked(cell, batch, dtype, input_size)
    return impl


# The platforms on which a kernel runs compiled: the record's device kinds are GPUs'.
GPU_PLATFORMS = ("gpu", "cuda")


def _warn_unchecked(cell: Any, batch: int | None, dtype: Any, input_size: int | None) -> None:
    """One absl WARNING line per kernel (backend, cell kind) and device kind that the
    verified record does not list for this shape
    (:func:`rhnzoo.cells.kernels.verified.warn_unchecked`); a ``Parallel``'s parts each;
    nothing while ``batch`` is unknown (a config's check: the call that runs it knows)."""
    if isinstance(cell, Parallel):
        for part in cell.cells:
            _warn_unchecked(part, batch, dtype, input_size)
        return
    family = kernels.backend_of(cell)
    if family is not None and batch is not None:
        size = {} if input_size is None else {"input_size": input_size}
        verified.warn_unchecked(family, cell, batch, dtype, **size)


def unroll(
    cell: Any,
    params: Any,
    carry: Any,
    xs: Array,
    mask: Array | None = None,
    *,
    impl: str | ScanImpl = "auto",
    lengths: Array | None = None,
    dtype: Any = None,
    unroll: int | None = None,
    remat: bool = False,
    outputs: bool | str = True,
    project_per_step: bool | None = None,
    save_matmuls: bool = False,
    interpret: Any = None,
    resets: Array | None = None,
    layer_loop: str | None = None,
) -> tuple[Any, Array | None]:
    """Runs ``cell`` over ``xs`` with the implementation :func:`resolve` picks; the one
    call every model makes.

    Args:
      cell, params, carry, xs, mask: as :func:`rhnzoo.cells.unroll` (``xs [T, B, m]``
        time-major, ``mask [B, n]`` or None).
      impl: one of :data:`CHOICES`; resolved with B = ``xs.shape[1]`` and m =
        ``xs.shape[2]``.
      lengths: optional ``[B]`` real steps per row: padded steps keep the carry and
        output zeros. The RHN's fused scan runs every step and reads each row's final
        carry from its output at its last real step (the carry is the output), so its
        padded inputs must be finite.
      dtype: matmul input dtype: None (the inputs' own, e.g. float64 in tests), float32
        or bfloat16 (float32 accumulation, state and parameters; fused and pallas only).
        Passed as given to the fused scans.
      unroll: time steps per scan iteration; None: each scan's default (1 for the
        reference and the RHN scan, :func:`rhnzoo.cells.gated_fused.default_unroll` of
        :func:`platform` for the gated ones); the pallas kernel has its own loop and
        ignores it.
      remat: recompute time steps in the backward pass (reference, RHN fused).
      outputs: True: every step's output; False: return ``(carry, None)`` (the gated
        scans then write no outputs); ``"last"``: each row's output at its last real step,
        ``[B, n]`` (zeros for a row of length 0), from every implementation: the
        reference scan gathers it from its outputs, the others read it from the final
        carry (:func:`output_of`) and write no output stack.
      project_per_step: compute the input projection inside the time scan; None: the
        reference scan's default (False) and the gated fused scan's (True); the RHN and
        pallas scans have their own and ignore it.
      save_matmuls: the reference scan's :func:`rhnzoo.cells.base.save_matmuls_only`
        (ignored by the others, whose backward passes are written by hand).
      interpret: passed to the pallas kernel (its GPU interpret mode; None: where
        :func:`platform` is the CPU).
      layer_loop: a backend option of the RHN's fused scan, how a step runs its
        micro-layers (:func:`rhnzoo.cells.rhn_fused.unroll`'s; None: by depth); the other
        scans ignore it.
      resets: optional ``[T, B]`` bool episode starts: where True, the row's carry is
        its row of the initial ``carry`` before the step runs
        (:func:`rhnzoo.cells.unroll`); the reference and fused scans. ``auto`` then
        never picks the pallas kernels, which have no resets.

    Returns:
      ``(carry, ys [T, B, n])``, ``(carry, None)`` with ``outputs=False``, or ``(carry,
      last [B, n])`` with ``outputs="last"``.

    Raises:
      ValueError: what :func:`resolve` raises; with ``pallas`` a ``dtype`` other than
        bfloat16 (:class:`~rhnzoo.cells.kernels.Options`); ``resets`` that are not a
        ``[T, B]`` bool array, or ``resets`` with ``impl='pallas'``.
    """
    which = resolve(
        impl, cell, batch=xs.shape[1], dtype=dtype, remat=remat, input_size=xs.shape[-1]
    )
    if resets is not None:
        resets = base.check_resets(resets, xs)
        if which is ScanImpl.PALLAS and ScanImpl(impl) is ScanImpl.AUTO:  # the next best
            have = implementations(cell)
            which = resolve(
                ScanImpl.FUSED if ScanImpl.FUSED in have else ScanImpl.REFERENCE,
                cell,
                batch=xs.shape[1],
                dtype=dtype,
                remat=remat,
                input_size=xs.shape[-1],
            )
        elif which is ScanImpl.PALLAS:
            raise ValueError(
                f"resets need the reference or fused scan: the pallas kernels of "
                f"{describe(cell)} have no resets (scan_impl='fused' or 'auto')"
            )
    if outputs == "last":
        return _last_outputs(
            which,
            cell,
            params,
            carry,
            xs,
            mask,
            lengths=lengths,
            dtype=dtype,
            unroll=unroll,
            remat=remat,
            project_per_step=project_per_step,
            save_matmuls=save_matmuls,
            interpret=interpret,
            resets=resets,
            layer_loop=layer_loop,
        )
    if outputs not in (True, False):
        raise ValueError(f"outputs must be True, False or 'last', got {outputs!r}")
    if which is ScanImpl.REFERENCE:
        carry, ys = base.unroll(
            cell,
            params,
            carry,
            xs,
            mask,
            lengths=lengths,
            unroll=unroll or 1,
            remat=remat,
            project_per_step=bool(project_per_step),
            save_matmuls=save_matmuls,
            resets=resets,
        )
        return carry, ys if outputs else None
    if which is ScanImpl.PALLAS:
        if interpret is None:
            interpret = platform() == "cpu"
        opts = kernels.Options(dtype=dtype, outputs=outputs, interpret=interpret)
        return _pallas(cell, params, carry, xs, mask, opts, lengths=lengths)
    if gated_fused.supports(cell):
        per_step = True if project_per_step is None else project_per_step
        if unroll is None and not isinstance(cell, Parallel):  # a Parallel's parts: their own
            unroll = gated_fused.default_unroll(cell, platform())
        return gated_fused.unroll(
            cell,
            params,
            carry,
            xs,
            mask,
            lengths=lengths,
            unroll=unroll,
            project_per_step=per_step,
            dtype=dtype,
            outputs=outputs,
            resets=resets,
        )
    if resets is not None and lengths is not None:  # padded steps ignore resets
        resets = resets & (jnp.arange(xs.shape[0])[:, None] < jnp.asarray(lengths)[None, :])
    run = functools.partial(
        rhn_fused.unroll,
        unroll=unroll or 1,
        remat=remat,
        dtype=dtype,
        resets=resets,
        layer_loop=layer_loop,
    )
    return _rhn_scan(run, cell, params, carry, xs, mask, lengths=lengths, outputs=outputs)


def _last_outputs(which, cell, params, carry, xs, mask, *, lengths, **run):
    """:func:`unroll` with ``outputs="last"``: ``(carry, last [B, n])``, each row's output
    at its last real step (zeros for a row of length 0). The reference scan's carry need
    not hold its output (a DT-RNN's does not), so it gathers from its outputs; the fused
    and pallas scans stop each row's carry at its last real step, whose output it holds."""
    T, B = xs.shape[:2]
    lens = jnp.full((B,), T, jnp.int32) if lengths is None else jnp.asarray(lengths)
    if which is ScanImpl.REFERENCE:
        carry, ys = unroll(cell, params, carry, xs, mask, impl=which, lengths=lengths, **run)
        last = ys[jnp.maximum(lens - 1, 0), jnp.arange(B)]
    else:
        carry, _ = unroll(
            cell, params, carry, xs, mask, impl=which, lengths=lengths, outputs=False, **run
        )
        last = output_of(cell, carry)
    return carry, jnp.where((lens > 0)[:, None], last, 0.0)


def _pallas(cell, params, carry, xs, mask, opts, *, lengths):
    """The kernels of ``cell``'s backend (:func:`~rhnzoo.cells.kernels.backend_of`); a
    ``Parallel`` cell part by part (each part's own kernels, the output the mean of
    theirs, as :class:`~rhnzoo.cells.Parallel` defines it)."""
    if isinstance(cell, Parallel):
        parts = [
            _pallas(c, p, h, xs, mask, opts, lengths=lengths)
            for c, p, h in zip(cell.cells, params, carry, strict=True)
        ]
        ys = [y for _, y in parts]
        return tuple(h for h, _ in parts), None if ys[0] is None else sum(ys) / len(ys)
    return kernels.backend_of(cell).unroll(cell, params, carry, xs, mask, opts, lengths=lengths)


def _rhn_scan(run, cell, params, carry, xs, mask, *, lengths, outputs):
    """The RHN's fused scan ``run(cell, params, carry, xs, mask)``
    (:func:`~rhnzoo.cells.rhn_fused.unroll`) with ``lengths``
    (:func:`~rhnzoo.cells.rhn_fused.with_lengths`)."""
    carry_T, ys = run(cell, params, carry, xs, mask)
    return rhn_fused.with_lengths(carry, carry_T, ys, lengths, outputs)


def output_of(cell: Any, carry: Any) -> Array:
    """The output ``[B, n]`` of the step that produced ``carry``, for a cell with a fused
    scan (with ``lengths``, each row's output at its last real step): the gated cells'
    h (:func:`rhnzoo.cells.gated_fused.output_of`; ``Parallel``: the mean of its
    parts'), the RHN's and HSG's state (their carry is their output).

    Raises:
      ValueError: for a cell whose output is not read from its carry here.
    """
    if rhn_fused_supports(cell):
        return carry
    if gated_fused.supports(cell):
        return gated_fused.output_of(cell, carry)
    raise ValueError(f"no output_of for {describe(cell)}: read its outputs from the scan")
