"""The record of what a GPU has verified: ``scan_impl='auto'`` runs a kernel only where
it is listed (issue 68).

``verified.json`` (package data beside this module, read at run time) is a JSON list of
:class:`Entry` objects: one kernel configuration (backend, cell, sizes, dtype, kernel
options) measured by a GPU window, with the digest of the kernel source it ran
(:func:`digest`), the device kind, date and commit, the worst error against the float32
reference scan (loss and gradients) and the train step's time beside the fused scan's.
Each backend's ``fits`` (and so :func:`rhnzoo.cells.scan.resolve`'s ``auto``) is true only
where its own size, dtype and device conditions hold **and** :func:`verified` finds an
entry: the current digest, this device kind, errors recorded and within
:data:`MAX_REL_ERROR`, and the kernel faster than the fused scan. An edit to any source
file of a backend (docstrings and comments included: the digest is of the bytes)
unlists it until a window measures it again. An empty record (``[]``) makes ``auto``
pick the fused scan everywhere.

For tests, and for choosing on one host as on another: :func:`stand_in` sets the device
kind and compute capability the backends see, :func:`using` the record they read.

This module only reads the record. A window's result files become entries, appended to
the checkout's ``verified.json``, by a tool of the project beside the package (issue 70):
``python -m tools.kernel_record OUT_DIR [--dry]`` at the repository root
(``tools/kernel_record.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import importlib.resources
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

RECORD = "verified.json"  # package data of rhnzoo.cells.kernels

# The source files each backend's kernels are built from, the backend's module first; the
# package's __init__ (the protocol) and the cells' own modules are not kernel code.
SOURCES: dict[str, tuple[str, ...]] = {
    "gated": ("gated.py", "persistent.py", "swap_ab.py", "common.py"),
    "chained": ("chained.py", "persistent.py", "common.py"),
    "rhn": ("rhn.py", "common.py"),
}

# The worst relative error (loss or any gradient, against the float32 reference scan)
# a verified entry may have. A guard against wrong numbers (a layout or synchronisation
# error gives errors of order 1), not a statement of bfloat16's precision, which the
# entry records as measured.
MAX_REL_ERROR = 0.05

# A stand-in for tests: an H100's device kind, as jax.devices()[0].device_kind has it.
H100 = "NVIDIA H100 80GB HBM3"


# ------------------------------------------------------------------------------ digest


def source(name: str) -> bytes:
    """The bytes of ``name``, a module file of :mod:`rhnzoo.cells.kernels` (package data
    read through importlib.resources)."""
    return importlib.resources.files(__package__).joinpath(name).read_bytes()


def backend_name(backend: Any) -> str:
    """``'gated'``, ``'chained'`` or ``'rhn'`` for a backend module or its name.

    Raises:
      ValueError: a backend not in :data:`SOURCES`.
    """
    name = backend if isinstance(backend, str) else backend.__name__.rsplit(".", 1)[-1]
    if name not in SOURCES:
        raise ValueError(f"no kernel backend {name!r}; the backends: {', '.join(SOURCES)}")
    return name


def digest(backend: Any, read: Callable[[str], bytes] | None = None) -> str:
    """sha256 (64 hex digits) of the backend's source files (:data:`SOURCES`), each its
    name, a NUL and its bytes, in that order. ``read``: a file's bytes by name
    (None: :func:`source`, this package's files).

    Raises:
      ValueError: an unknown backend.
    """
    read = read or source
    h = hashlib.sha256()
    for name in SOURCES[backend_name(backend)]:
        data = read(name)
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


# ------------------------------------------------------------------------------ entries


@dataclasses.dataclass(frozen=True)
class Entry:
    """One kernel configuration a GPU window measured.

    Attributes:
      backend: ``'gated'``, ``'chained'`` or ``'rhn'``.
      cell: :func:`cell_name` of the cell (``'LSTM'``, ``'GRU(reset_after)'``, ...).
      hidden_size: n.
      depth: the RRN's K or the RHN's L (None for the other cells).
      input_size: m, the input width.
      batch: B, the rows of the timed step.
      length: T, the time steps of the timed step.
      dtype: the matmul input dtype's name, ``'bfloat16'``.
      options: the non-default kernel settings it ran with (``{}``: the kernels ``auto``
        runs; ``{'batch_tile': 16}``, ``{'approx_math': True}``, ...).
      digest: :func:`digest` of the backend's source as run.
      device_kind: ``jax.devices()[0].device_kind`` of the GPU.
      date: ``YYYY-MM-DD`` of the window.
      commit: the commit the window ran.
      value_error: the loss's relative error against the float32 reference (None: not
        measured).
      grad_error: the worst gradient's relative error (max-abs difference over max-abs
        reference) against it (None: not measured).
      kernel_ms: value-and-gradient (train step) time of the kernel, ms.
      fused_ms: the same of the fused bfloat16 scan, same shape and window, ms.
      stand_in: the window's dry run (a CPU, no kernel): never verifies anything.
    """

    backend: str
    cell: str
    hidden_size: int
    batch: int
    digest: str
    device_kind: str
    kernel_ms: float
    fused_ms: float
    depth: int | None = None
    input_size: int = 1
    length: int | None = None
    dtype: str = "bfloat16"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    date: str = ""
    commit: str = ""
    value_error: float | None = None
    grad_error: float | None = None
    stand_in: bool = False

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Entry:
        """An entry from its JSON object (unknown keys: ValueError)."""
        names = {f.name for f in dataclasses.fields(cls)}
        extra = set(obj) - names
        if extra:
            raise ValueError(f"{RECORD}: unknown entry fields {sorted(extra)}")
        return cls(**obj)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def key(self) -> tuple:
        """What one measurement is of: the configuration, device kind and digest."""
        return (
            self.backend,
            self.cell,
            self.hidden_size,
            self.depth,
            self.input_size,
            self.batch,
            self.dtype,
            tuple(sorted(self.options.items())),
            self.device_kind,
            self.digest,
        )


def parse(text: str) -> list[Entry]:
    """The entries of a record's JSON text (a list of objects).

    Raises:
      ValueError: not a JSON list of entry objects.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"{RECORD} holds a JSON list of entries, got {type(data).__name__}")
    return [Entry.from_json(obj) for obj in data]


def load() -> list[Entry]:
    """The shipped record (``rhnzoo/cells/kernels/verified.json``), or the one
    :func:`using` set."""
    given = _RECORD.get()
    if given is not None:
        return list(given)
    return parse(source(RECORD).decode())


# ------------------------------------------------------------------------------ device


@dataclasses.dataclass(frozen=True)
class Device:
    """The device a kernel would run on: its kind (``'NVIDIA H100 80GB HBM3'``, ``'cpu'``)
    and CUDA compute capability (``'9.0'``; None off a GPU)."""

    kind: str
    compute_capability: str | None = None


_DEVICE: contextvars.ContextVar[Device | None] = contextvars.ContextVar(
    "rhnzoo_kernels_device", default=None
)
_RECORD: contextvars.ContextVar[tuple[Entry, ...] | None] = contextvars.ContextVar(
    "rhnzoo_kernels_record", default=None
)


def device() -> Device:
    """The device :func:`stand_in` set, else JAX's first device (``Device('')`` when JAX
    has none)."""
    given = _DEVICE.get()
    if given is not None:
        return given
    try:
        d = jax.devices()[0]
    except RuntimeError:
        return Device("")
    return Device(str(d.device_kind), getattr(d, "compute_capability", None))


@contextlib.contextmanager
def stand_in(kind: str = H100, compute_capability: str | None = "9.0") -> Iterator[Device]:
    """Within it, the backends' ``fits`` and :func:`verified` see this device kind and
    compute capability instead of JAX's device (with
    :func:`rhnzoo.cells.scan.for_platform` ``('gpu')``: a CPU host chooses as a GPU host
    would)."""
    dev = Device(kind, compute_capability)
    token = _DEVICE.set(dev)
    try:
        yield dev
    finally:
        _DEVICE.reset(token)


@contextlib.contextmanager
def using(entries: Iterable[Entry]) -> Iterator[None]:
    """Within it, :func:`load` returns ``entries`` instead of the shipped record."""
    token = _RECORD.set(tuple(entries))
    try:
        yield
    finally:
        _RECORD.reset(token)


# ------------------------------------------------------------------------------ lookup


def cell_name(cell: Any) -> str:
    """The record's name of a cell's kind: its class name (``'LSTM'``, ``'SCLSTM'``,
    ``'RRN'``, ``'RHN'``), ``'GRU(reset_after)'`` for PyTorch's GRU, ``'HSG(RHN)'``."""
    inner = getattr(cell, "cell", None)
    if inner is not None and type(cell).__name__ == "HSG":
        return f"HSG({cell_name(inner)})"
    if type(cell).__name__ == "GRU" and getattr(cell, "reset_after", False):
        return "GRU(reset_after)"
    return type(cell).__name__


def cell_depth(cell: Any) -> int | None:
    """The RRN's K or the RHN's (HSG's inner RHN's) L; None for the other cells."""
    inner = getattr(cell, "cell", cell)
    return getattr(inner, "depth", None)


def _dtype_name(dtype: Any) -> str | None:
    try:
        return None if dtype is None else jnp.dtype(dtype).name
    except TypeError:
        return None


def checked(entry: Entry) -> bool:
    """Whether ``entry`` verifies its kernel: a GPU's measurement (not a stand-in), both
    errors recorded, finite and at most :data:`MAX_REL_ERROR`, and the kernel's train
    step faster than the fused scan's."""
    errors = (entry.value_error, entry.grad_error)
    return (
        not entry.stand_in
        and all(e is not None and math.isfinite(e) and e <= MAX_REL_ERROR for e in errors)
        and 0 < entry.kernel_ms < entry.fused_ms
    )


def verified(
    backend: Any,
    cell: Any,
    batch: int,
    dtype: Any,
    device_kind: str | None = None,
    *,
    input_size: int = 1,
    options: Mapping[str, Any] | None = None,
    entries: Sequence[Entry] | None = None,
    read: Callable[[str], bytes] | None = None,
) -> Entry | None:
    """The record's entry that verifies ``backend``'s kernels for ``cell`` (its
    :func:`cell_name`, hidden size and :func:`cell_depth`) at ``batch`` rows, matmul input
    ``dtype``, ``input_size`` and kernel ``options`` (None: ``{}``, the kernels ``auto``
    runs) on ``device_kind`` (None: :func:`device`'s): one whose digest is the current
    :func:`digest` (of ``read``'s sources) and that is :func:`checked`; else None.
    ``entries``: the record (None: :func:`load`). Exact sizes: a kernel measured at
    B = 100 says nothing of B = 128."""
    name = backend_name(backend)
    kind = device().kind if device_kind is None else device_kind
    want = (
        name,
        cell_name(cell),
        getattr(cell, "hidden_size", None),
        cell_depth(cell),
        input_size,
        batch,
        _dtype_name(dtype),
        tuple(sorted((options or {}).items())),
        kind,
    )
    listed = [e for e in (load() if entries is None else entries) if e.key()[:-1] == want]
    if not listed:
        return None
    current = digest(name, read)
    return next((e for e in reversed(listed) if e.digest == current and checked(e)), None)


def fits(backend: Any, cell: Any, batch: int, dtype: Any, *, input_size: int = 1) -> bool:
    """A backend's ``fits`` condition from the record: :func:`verified` on this
    :func:`device` (an empty device kind: never)."""
    kind = device().kind
    return (
        bool(kind)
        and verified(backend, cell, batch, dtype, kind, input_size=input_size) is not None
    )


# ------------------------------------------------------------------------------ warning

_WARNED: set[tuple[str, str, str]] = set()


def unchecked_message(backend: Any, cell: Any, device_kind: str) -> str:
    """The one line :func:`warn_unchecked` logs for ``backend``'s kernel of ``cell``."""
    name = backend_name(backend)
    return (
        f"scan_impl='pallas': the {name} kernel of {cell_name(cell)} (n = "
        f"{getattr(cell, 'hidden_size', '?')}) is not yet checked on {device_kind}: no entry "
        f"of rhnzoo/cells/kernels/{RECORD} lists its source (digest {digest(name)[:12]}) "
        f"there; its values and speed are unverified (docs/speed.md, Kernel status)"
    )


def warn_unchecked(
    backend: Any, cell: Any, batch: int | None, dtype: Any, *, input_size: int = 1
) -> bool:
    """Logs (absl, WARNING) one line naming ``backend``'s kernel of ``cell`` as not yet
    checked on this device kind, once a process per backend, cell kind and device kind,
    where :func:`verified` finds no entry. Only on a GPU device kind: the caller skips the
    CPU's interpret mode. Returns whether it logged."""
    kind = device().kind
    key = (backend_name(backend), cell_name(cell), kind)
    if key in _WARNED or batch is None:
        return False
    if verified(backend, cell, batch, dtype, kind, input_size=input_size) is not None:
        return False
    from absl import logging

    _WARNED.add(key)
    logging.warning(unchecked_message(backend, cell, kind))
    return True
