"""One scan dispatcher: every model runs its cell over time through :func:`unroll`.

Six **backends** compute the same function (``lengths``, ``resets`` and the recurrent
dropout mask with :func:`rhnzoo.cells.unroll`'s semantics), each with ``supports(cell)``,
``fits(cell, batch, dtype, backend, *, input_size)`` and one ``unroll(cell, params,
carry, xs, mask, opts, *, lengths, resets)`` taking one options record,
:class:`~rhnzoo.cells.scan_options.Options` (dtype, unroll, remat, ``outputs`` "all" | "last" |
"none", and backend options). They make up three implementations, :class:`ScanImpl`, and
``auto`` picks one of them by one rule (:func:`resolve`, walking :data:`BACKENDS` in
preference order), as recurrentgemma's ``ScanType`` does:

* ``reference``: :data:`REFERENCE`, :func:`rhnzoo.cells.unroll` (the cell's own
  ``step`` in a ``lax.scan``, autodiff); any cell; ``remat``; no bfloat16.
* ``fused``: the hand-written backward scans, :mod:`rhnzoo.cells.gated_fused` (LSTM,
  GRU, SC-LSTM, RRN, ``Parallel`` of these) and :mod:`rhnzoo.cells.rhn_fused` (coupled
  RHN, HSG(RHN)); float32 or bfloat16 matmul inputs; ``remat`` in the RHN's only.
* ``pallas``: the Mosaic GPU kernel families of :data:`rhnzoo.cells.kernels.BACKENDS`
  (:func:`~rhnzoo.cells.kernels.backend_of` finds a cell's; a ``Parallel`` runs part by
  part); bfloat16 only; no ``remat``.
"""

from __future__ import annotations

import enum
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells import base, gated_fused, kernels, rhn_fused
from rhnzoo.cells.kernels import verified
from rhnzoo.cells.scan_options import DEFAULT_OPTIONS, Options, for_platform, gather_last, platform
from rhnzoo.cells.residual import Parallel
from rhnzoo.cells.rhn import HSG, RHN

Array = jax.Array


class ScanImpl(enum.StrEnum):
    """The time-scan implementations; a plain string (``'fused'``) names one as well."""

    REFERENCE = "reference"
    FUSED = "fused"
    PALLAS = "pallas"
    AUTO = "auto"


# The values of ``--scan_impl`` / ``scan_impl=`` (rhnzoo.config.scan_impl_setting).
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


# The platforms the kernels run on: an NVIDIA GPU compiled, the CPU interpreted.
PALLAS_PLATFORMS = ("gpu", "cuda", "cpu")


class _Reference:
    """The ``reference`` backend: :func:`rhnzoo.cells.unroll` (``lax.scan`` of the cell's
    ``step``, autodiff) under the backends' one ``unroll`` signature."""

    IMPL = "reference"  # the ScanImpl it belongs to
    REMAT = True  # it has remat

    def supports(self, cell: Any) -> bool:
        """Every cell."""
        return True

    def fits(
        self, cell: Any, batch: int, dtype: Any, backend: str | None = None, *, input_size=1
    ) -> bool:
        """Any cell, batch and platform, in the inputs' dtype: not bfloat16."""
        return not _bfloat16(dtype)

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
        """:func:`rhnzoo.cells.unroll` with ``opts``' ``unroll`` (None: 1), ``remat``,
        ``project_per_step`` (None: False) and ``save_matmuls``, in the inputs' dtype;
        ``outputs="last"`` by :func:`~rhnzoo.cells.scan_options.gather_last`.

        Raises:
          ValueError: ``opts.dtype`` bfloat16; what :func:`rhnzoo.cells.unroll` raises.
        """
        if opts.bfloat16():
            raise ValueError(
                f"dtype=bfloat16 needs the fused or pallas scan (scan_impl='reference' "
                f"computes in the inputs' dtype); {describe(cell)}'s scans: "
                f"{', '.join(implementations(cell))}"
            )
        carry, ys = base.unroll(
            cell,
            params,
            carry,
            xs,
            mask,
            lengths=lengths,
            unroll=opts.unroll or 1,
            remat=opts.remat,
            project_per_step=bool(opts.project_per_step),
            save_matmuls=opts.save_matmuls,
            resets=resets,
        )
        if opts.outputs == "last":
            return carry, gather_last(ys, lengths)
        return carry, ys if opts.outputs == "all" else None


REFERENCE = _Reference()

# The backends in the order ``auto`` prefers them (resolve).
BACKENDS: tuple[Any, ...] = (*kernels.BACKENDS, gated_fused, rhn_fused, REFERENCE)


def pallas_supports(cell: Any) -> bool:
    """Whether a Pallas kernel runs ``cell``: a backend of
    :data:`~rhnzoo.cells.kernels.BACKENDS` supports it (:func:`~rhnzoo.cells.kernels.
    backend_of`), or it is a ``Parallel`` of such cells."""
    if isinstance(cell, Parallel):
        return all(pallas_supports(c) for c in cell.cells)
    return kernels.backend_of(cell) is not None


def backend_for(impl: str | ScanImpl, cell: Any) -> Any:
    """The backend of :data:`BACKENDS` that runs ``cell`` for the implementation ``impl``
    (not ``auto``): its first that belongs to ``impl`` and supports ``cell``, or None (a
    ``Parallel`` under ``pallas``: its parts' kernels, one by one)."""
    impl = ScanImpl(impl)
    return next((b for b in BACKENDS if b.IMPL == impl and b.supports(cell)), None)


def implementations(cell: Any) -> tuple[ScanImpl, ...]:
    """The implementations that can run ``cell`` (at some size and dtype)."""
    out = [ScanImpl.REFERENCE]
    if backend_for(ScanImpl.FUSED, cell) is not None:
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
    resets: bool = False,
) -> ScanImpl:
    """The implementation that runs ``cell``: ``impl`` itself when the cell has it, and
    for ``auto`` the one rule below (never returns ``AUTO``).

    ``auto`` walks :data:`BACKENDS` in order and takes the first backend that supports
    the cell, has ``remat`` where asked and ``fits`` (docs/speed.md, "The rule of
    ``auto`` and the figures behind it"):

    1. ``pallas`` at a known ``batch``, without ``remat`` or ``resets``, where the cell's
       kernel backend ``fits``: it needs an entry of the verified record
       (:func:`rhnzoo.cells.kernels.verified.verified`) for this kernel source, device
       kind and shape (empty today, so never yet), besides the backend's own conditions.
       Never on a CPU or a TPU; a ``Parallel`` has no backend of its own.
    2. ``fused`` where the cell has a fused scan (with ``remat``, the RHN's only).
    3. ``reference`` otherwise (DT-RNN, DT(S)-RNN, an uncoupled RHN, HSG around a gated
       cell); bfloat16 then has no implementation (a ValueError).

    Args:
      impl: one of :data:`CHOICES` (or a :class:`ScanImpl`).
      cell: the cell to run.
      batch: B, the rows per call (None: unknown; ``auto`` then skips ``pallas``).
      dtype: the matmul input dtype (None or float32; bfloat16 needs fused or pallas).
      backend: the platform to choose for (None: :func:`platform`, JAX's default
        backend unless :func:`for_platform` set another).
      remat: recompute time steps in the backward pass.
      input_size: m, the input width, for the kernels' ``fits`` (None: its default).
      resets: the call has episode starts (:func:`unroll`'s ``resets``), which the
        kernels do not have: ``auto`` then skips ``pallas``.

    ``pallas`` asked for on a GPU platform with a known ``batch`` and no entry of the
    verified record logs one absl WARNING line per kernel and device kind, and runs it.

    Raises:
      ValueError: (one line naming the cell and its implementations) an unknown
        ``impl``; an implementation the cell does not have; ``pallas`` on a platform
        other than a GPU or the CPU (:data:`PALLAS_PLATFORMS`: a TPU has no Mosaic GPU);
        ``remat`` with a scan that has none; bfloat16 with the reference scan;
        ``resets`` with ``pallas``.
    """
    try:
        impl = ScanImpl(impl)
    except ValueError:
        raise ValueError(f"scan_impl must be one of {', '.join(CHOICES)}, got {impl!r}") from None
    have = implementations(cell)
    name, listed = describe(cell), ", ".join(have)
    # The platform only where a choice needs it: asking JAX starts its backend, which a
    # config's check (batch None) must not do before jax.distributed.initialize.
    where = lambda: backend or platform()
    if impl is ScanImpl.AUTO:
        impl = _auto(cell, batch, dtype, where, remat, input_size, resets)
        if impl is None:  # the reference scan refused bfloat16
            raise ValueError(
                f"dtype=bfloat16 needs the fused or pallas scan, which {name} "
                f"does not have{' with remat' if remat else ''} (its scans: "
                f"{listed})"
            )
    if impl not in have:
        why = ""
        if impl is ScanImpl.PALLAS:  # what the kernels run, in their own words
            why = f" ({'; '.join(b.RUNS for b in kernels.BACKENDS)}; and Parallel of these)"
        raise ValueError(f"scan_impl='{impl}' cannot run {name}; its scans: {listed}{why}")
    if impl is ScanImpl.PALLAS and where() not in PALLAS_PLATFORMS:
        raise ValueError(
            f"scan_impl='pallas' runs Mosaic GPU kernels (an NVIDIA GPU), not on "
            f"platform '{where()}': use scan_impl='fused' (or 'auto', which picks "
            f"it for {name} there)"
        )
    if remat and not all(b.REMAT for b in _backends_of(impl, cell)):
        raise ValueError(
            f"remat needs the reference scan (scan_impl='reference'): the {impl} "
            f"scan of {name} has no remat"
        )
    if resets and impl is ScanImpl.PALLAS:
        raise ValueError(
            f"resets need the reference or fused scan: the pallas kernels of "
            f"{name} have no resets (scan_impl='fused' or 'auto')"
        )
    if _bfloat16(dtype) and impl is ScanImpl.REFERENCE:
        raise ValueError(
            f"dtype=bfloat16 needs the fused or pallas scan (scan_impl='reference' "
            f"computes in the inputs' dtype); {name}'s scans: {listed}"
        )
    if impl is ScanImpl.PALLAS and where() in GPU_PLATFORMS:
        _warn_unchecked(cell, batch, dtype, input_size)
    return impl


def _auto(cell, batch, dtype, where, remat, input_size, resets) -> ScanImpl | None:
    """``auto``'s choice (:func:`resolve`); None where no backend fits (bfloat16 and only
    the reference scan)."""
    size = {} if input_size is None else {"input_size": input_size}
    for b in BACKENDS:
        if not b.supports(cell) or (remat and not b.REMAT):
            continue
        kernel = b.IMPL == ScanImpl.PALLAS
        if kernel and (batch is None or resets):  # a known batch; no episode starts
            continue
        if b.fits(cell, batch, dtype, where() if kernel else None, **size):
            return ScanImpl(b.IMPL)
    return None


def _backends_of(impl: ScanImpl, cell: Any) -> tuple[Any, ...]:
    """The backends that run ``cell`` for ``impl``: one, or a ``Parallel``'s parts' kernels
    under ``pallas``."""
    if impl is ScanImpl.PALLAS and isinstance(cell, Parallel):
        return tuple(b for c in cell.cells for b in _backends_of(impl, c))
    return (backend_for(impl, cell),)


# The platforms on which a kernel runs compiled.
GPU_PLATFORMS = ("gpu", "cuda")


def _warn_unchecked(cell: Any, batch: int | None, dtype: Any, input_size: int | None) -> None:
    """:func:`rhnzoo.cells.kernels.verified.warn_unchecked` for ``cell``'s kernel (a
    ``Parallel``'s parts each); nothing while ``batch`` is unknown."""
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
    resets: Array | None = None,
    **options: Any,
) -> tuple[Any, Array | None]:
    """Runs ``cell`` over ``xs`` by the backend :func:`resolve` picks; the one call every
    model makes.

    Args:
      cell, params, carry, xs, mask: as :func:`rhnzoo.cells.unroll` (``xs [T, B, m]``
        time-major, ``mask [B, n]`` or None). A ``cell`` with an ``unroll`` method of its
        own, a layer such as :class:`~rhnzoo.cells.Bidirectional`, is run by it (which
        runs both its directions through this function; ``mask`` a pair or None).
      impl: one of :data:`CHOICES`; resolved with B = ``xs.shape[1]``, m =
        ``xs.shape[2]`` and the options' ``dtype`` and ``remat``.
      lengths: optional ``[B]`` real steps per row: padded steps keep the carry and
        output zeros. The RHN's fused scan runs every step and reads each row's final
        carry from its output at its last real step (the carry is the output), so its
        padded inputs must be finite.
      resets: optional ``[T, B]`` bool episode starts: where True, the row's carry is
        its row of the initial ``carry`` before the step runs
        (:func:`rhnzoo.cells.unroll`); the reference and fused scans. ``auto`` then
        never picks the pallas kernels, which have no resets.
      **options: the fields of :class:`~rhnzoo.cells.scan_options.Options`, one record
        for whichever backend runs.

    Returns:
      ``(carry, ys [T, B, n])``; ``(carry, last [B, n])`` with ``outputs="last"``, each
      row's output at its last real step (zeros for a row of length 0), from every
      backend; ``(carry, None)`` with ``outputs="none"``.

    Raises:
      ValueError: what :func:`resolve` and :class:`~rhnzoo.cells.scan_options.Options` raise;
        what the backend's ``unroll`` raises; with ``pallas`` a ``dtype`` other than
        bfloat16 (None too: the kernels' one precision is asked for by name); what
        :func:`rhnzoo.cells.base.check_inputs` raises (``xs`` not ``[T, B, m]``, a carry
        not of batch B, ``lengths`` not ``[B]`` int in [0, T], ``resets`` not ``[T, B]``
        bool); ``resets`` with ``impl='pallas'``.
      TypeError: a keyword that is no field of :class:`~rhnzoo.cells.scan_options.Options`.
    """
    if callable(getattr(cell, "unroll", None)):  # a layer with its own time loop
        extra = {} if resets is None else {"resets": resets}  # Bidirectional refuses them
        return cell.unroll(params, carry, xs, mask, impl=impl, lengths=lengths, **extra, **options)
    opts = Options(**options)
    lengths, resets = base.check_inputs(carry, xs, lengths, resets)
    which = resolve(
        impl,
        cell,
        batch=xs.shape[1],
        dtype=opts.dtype,
        remat=opts.remat,
        input_size=xs.shape[-1],
        resets=resets is not None,
    )
    if which is ScanImpl.PALLAS and opts.dtype is None:  # the kernels' one precision, asked
        raise ValueError("the Pallas kernels compute in bfloat16 (dtype=jnp.bfloat16), got None")
    if which is ScanImpl.PALLAS and isinstance(cell, Parallel):
        return _kernels_by_part(cell, params, carry, xs, mask, opts, lengths=lengths)
    run = backend_for(which, cell).unroll
    return run(cell, params, carry, xs, mask, opts, lengths=lengths, resets=resets)


def _kernels_by_part(cell, params, carry, xs, mask, opts, *, lengths):
    """A ``Parallel`` cell under ``pallas``: each part by its own kernels, the output the
    mean of theirs (with ``outputs="last"`` too)."""
    parts = [
        kernels.backend_of(c).unroll(c, p, h, xs, mask, opts, lengths=lengths)
        for c, p, h in zip(cell.cells, params, carry, strict=True)
    ]
    ys = [y for _, y in parts]
    return tuple(h for h, _ in parts), None if ys[0] is None else sum(ys) / len(ys)


def output_of(cell: Any, carry: Any) -> Array:
    """The output ``[B, n]`` of the step that produced ``carry``, for a cell with a fused
    scan (with ``lengths``, each row's output at its last real step): the gated cells'
    h (:func:`rhnzoo.cells.gated_fused.output_of`; ``Parallel``: the mean of its
    parts'), the RHN's and HSG's state (their carry is their output).

    Raises:
      ValueError: for a cell whose output is not read from its carry here.
    """
    if rhn_fused.supports(cell):
        return carry
    if gated_fused.supports(cell):
        return gated_fused.output_of(cell, carry)
    raise ValueError(f"no output_of for {describe(cell)}: read its outputs from the scan")


class ScannedModel:
    """The one ``resolved_scan`` of the models (:class:`rhnzoo.models.SequenceClassifier`,
    :class:`rhnzoo.models.LanguageModel`): a mixin for a model with the fields
    ``cell``, ``scan_impl``, ``dtype`` and ``remat`` and a ``scan_input_size``, the width
    m of the inputs its scan runs over."""

    def resolved_scan(self, batch: int | None = None) -> ScanImpl:
        """The scan that runs a batch of ``batch`` rows (:func:`resolve`; None: any batch,
        so ``auto`` does not consider ``pallas``)."""
        return resolve(
            self.scan_impl,
            self.cell,
            batch=batch,
            dtype=self.dtype,
            remat=self.remat,
            input_size=self.scan_input_size,
        )
