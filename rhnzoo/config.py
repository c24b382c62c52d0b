"""The base of every task's config: a frozen dataclass whose fields (:func:`setting`) are
the settings, the flags (:func:`rhnzoo.apps.cli.define_config_flags`) and ``config.json``
(:meth:`Config.to_dict`; resume rule :meth:`Config.conflicts`). Design: BUILD_NOTES.md,
"A setting is one line"; presets are ``get_config(preset)`` in ``rhnzoo/configs/<task>.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self, TypeVar

import numpy as np

from rhnzoo import precision
from rhnzoo.cells import scan

C = TypeVar("C", bound="Config")
# The greatest seed: JAX's PRNGKey(seed) keeps a seed's low 32 bits in its default
# 32-bit mode (PRNGKey(2**32) == PRNGKey(0)), and NumPy's generators take no negative one.
SEED_HIGH = 2**32 - 1


def setting(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    gt: float | None = None,
    high: float | None = None,
    choices: Sequence[Any] | None = None,
    resumable: bool = False,
) -> Any:
    """A config field: ``default``, its ``help`` text, its checks and its resume rule; a
    flag of the scripts unless its class names it in :attr:`Config.NOT_FLAGS`.

    The annotation is checked on construction too: an ``int`` field takes integers only
    (not 2.5, not True), a ``float`` field any real number but a bool, a ``bool`` field
    True or False, a ``str`` field a non-empty string, a ``tuple[int, ...]`` field a tuple
    (or list, made a tuple) of integers; ``X | None`` also takes None.

    Args:
      default: the value when not given (immutable: a tuple, not a list; a mapping, e.g.
        ``{depth: rate}``, is copied for each config).
      help: one or two sentences for ``--help``.
      low: the least value allowed (None passes where the annotation takes None).
      gt: a bound the value must exceed (strictly greater: a rate, a scale > 0).
      high: the greatest value allowed.
      choices: the values allowed (also the flag's enum).
      resumable: True where a resumed run may take another value (length, reporting,
        an implementation of the same function); False: structural, a resumed run
        with another value is refused (a subclass may make it structural:
        :attr:`Config.STRUCTURAL`).
    """
    meta = {
        "help": help,
        "low": low,
        "gt": gt,
        "high": high,
        "choices": None if choices is None else tuple(choices),
        "resumable": resumable,
    }
    if isinstance(default, Mapping):  # no dataclass default: each config its own copy
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def meta(f: dataclasses.Field) -> Mapping[str, Any]:
    """A field's :func:`setting` metadata as declared (a plain field: structural, no help,
    no bounds); its class may change the resume rule (:meth:`Config.resumable`)."""
    return {
        "help": "",
        "low": None,
        "gt": None,
        "high": None,
        "choices": None,
        "resumable": False,
        **f.metadata,
    }


def scan_impl_setting() -> Any:
    """The ``scan_impl`` field of every task's config (:mod:`rhnzoo.cells.scan`'s default,
    help and choices), resumable: the implementations compute the same function."""
    return setting(scan.DEFAULT, scan.HELP, choices=scan.CHOICES, resumable=True)


def check_scan_dtype(scan_impl: str, dtype: str | None) -> None:
    """Refuses ``scan_impl='pallas'`` without ``dtype='bfloat16'`` (the kernels' one
    precision) on construction, before a script writes anything; ``dtype`` None: a task
    without a ``--dtype`` setting (it computes in float32), where pallas is refused.

    Raises:
      ValueError: (one line naming the flags) for pallas with another dtype.
    """
    if scan_impl == "pallas" and dtype != "bfloat16":
        why = f"got --dtype={dtype}" if dtype else "and this task has no --dtype (float32 only)"
        raise ValueError(
            "--scan_impl=pallas needs --dtype=bfloat16 (the Pallas kernels compute in "
            f"bfloat16), {why}; use --scan_impl=fused or auto"
        )


def _class_names(cls: type, attr: str) -> frozenset[str]:
    """The union of ``attr`` (a set of field names) over ``cls`` and its bases."""
    return frozenset().union(*(vars(c).get(attr, ()) for c in cls.__mro__))


@functools.cache
def _kinds(cls: type) -> dict[str, tuple[type | None, bool, type | None]]:
    """``{field: (type, takes None, item type)}`` of ``cls``'s annotations: the type
    without ``None`` (None: not checked, e.g. ``Any``), and a tuple's item type."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        optional = union and type(None) in args
        if union:
            rest = [a for a in args if a is not type(None)]
            hint = rest[0] if len(rest) == 1 else Any
        kind = typing.get_origin(hint) or hint
        item = None
        if kind is tuple:
            items = [a for a in typing.get_args(hint) if a is not Ellipsis]
            item = items[0] if len(set(items)) == 1 and isinstance(items[0], type) else None
        out[f.name] = (kind if kind in _TYPE_WORDS else None, optional, item)
    return out


# The types a field's annotation is checked for, and how an error names them.
_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    tuple: "a list",
}


def _is(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)
    if kind is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
    if kind is bool:
        return isinstance(value, bool | np.bool_)
    return isinstance(value, kind)


def _type_error(name: str, value: Any, kind: type, item: type | None) -> str | None:
    """The one-line error of ``value`` for a field of type ``kind`` (items ``item``)."""
    if not _is(value, kind):
        return f"--{name} must be {_TYPE_WORDS[kind]}, got {value!r}"
    if kind is tuple and item in _TYPE_WORDS and not all(_is(v, item) for v in value):
        plural = {int: "integers", float: "numbers", bool: "true or false", str: "strings"}
        return f"--{name} must be {plural[item]}, got {list(value)}"
    return None


def strict(obj: Any) -> Any:
    """``obj`` as strict JSON holds it: tuples as lists, NumPy scalars as Python ones,
    non-finite floats as None (JSON has no NaN/inf)."""
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


@dataclasses.dataclass(frozen=True)
class Config:
    """A frozen, checked settings record: each field's annotated type, its ``low`` / ``gt``
    / ``high`` / ``choices`` (and no empty string) are checked on construction, then
    :meth:`check` (the rules between fields), so a config that exists is a valid one.

    Attributes:
      NOT_FLAGS: class-level, the fields the scripts do not offer as flags (recorded,
        set by the code: a preset's name, a runner's own flags); a subclass adds to its
        bases' (the union over the classes).
      STRUCTURAL: class-level, fields declared resumable that this class makes
        structural (e.g. a study whose finished trials are never trained again).

    Raises (on construction):
      ValueError: one line naming the flag, for a value of another type or out of range.
    """

    NOT_FLAGS: ClassVar[frozenset[str]] = frozenset()
    STRUCTURAL: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self):
        kinds = _kinds(type(self))
        for f in dataclasses.fields(self):
            m, value = meta(f), getattr(self, f.name)
            kind, optional, item = kinds[f.name]
            if value is None and (optional or kind is None):
                continue
            if kind is tuple and isinstance(value, list):  # JSON's lists
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            if kind is not None:
                error = _type_error(f.name, value, kind, item)
                if error:
                    raise ValueError(error)
            if m["choices"] is not None and value not in m["choices"]:
                shown = ", ".join(map(str, m["choices"]))
                raise ValueError(f"--{f.name} must be one of {shown}, got {value!r}")
            if m["low"] is not None and not value >= m["low"]:
                raise ValueError(f"--{f.name} must be >= {m['low']}, got {value!r}")
            if m["gt"] is not None and not value > m["gt"]:
                raise ValueError(f"--{f.name} must be > {m['gt']}, got {value!r}")
            if m["high"] is not None and not value <= m["high"]:
                raise ValueError(f"--{f.name} must be <= {m['high']}, got {value!r}")
            if isinstance(value, str) and not value.strip():
                raise ValueError(f"--{f.name} must not be empty (leave it out for the default)")
        self.check()

    def check(self) -> None:
        """Raises ValueError (one line) for settings that do not go together; the base
        checks nothing beyond the fields' own type, ``low``, ``gt``, ``high`` and
        ``choices``."""

    @classmethod
    def flags(cls) -> tuple[str, ...]:
        """The fields the scripts offer as flags: all but :attr:`NOT_FLAGS`."""
        hidden = _class_names(cls, "NOT_FLAGS")
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in hidden)

    @classmethod
    def resumable(cls, name: str) -> bool:
        """Whether field ``name`` may change when a run resumes: its :func:`setting`'s
        rule, unless the class makes it structural (:attr:`STRUCTURAL`)."""
        if name in _class_names(cls, "STRUCTURAL"):
            return False
        return meta({f.name: f for f in dataclasses.fields(cls)}[name])["resumable"]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, strict: bool = True) -> Self:
        """The config of ``values`` (e.g. a run's ``config.json``); missing keys take
        their defaults, lists become tuples where the default is a tuple.

        Raises:
          ValueError: ``values`` is no mapping (a ``config.json`` holding a JSON list);
            with ``strict``, keys that are not fields (one line naming them); any check
            failure.
        """
        if not isinstance(values, Mapping):
            raise ValueError(
                f"{cls.__name__} is read from a JSON object of settings by name, "
                f"got a {type(values).__name__}"
            )
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if strict:
            _refuse_unknown(cls, values)
        return cls(
            **{
                k: tuple(v) if isinstance(fields[k].default, tuple) and isinstance(v, list) else v
                for k, v in values.items()
                if k in fields
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """``{field: value}`` of every field: the run's ``config.json``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def conflicts(self, recorded_values: Mapping[str, Any]) -> list[str]:
        """The structural fields whose value in ``recorded_values`` (a workdir's
        ``config.json``) differs from this config's, as ``'name=<there> there vs
        <here>'``. The recorded values are read as a config of this class: a field
        missing there counts as its default (it was added later), a key that is no
        field is ignored; resumable fields may differ."""
        try:
            there = type(self).from_dict(recorded_values, strict=False)
        except ValueError as e:
            return [f"settings this version refuses ({e})"]
        out = []
        for f in dataclasses.fields(self):
            old, new = strict(getattr(there, f.name)), strict(getattr(self, f.name))
            if not self.resumable(f.name) and old != new:
                out.append(f"{f.name}={old!r} there vs {new!r}")
        return out

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (checked). Raises ValueError (one line) for a key that
        is no field or a value out of range."""
        _refuse_unknown(type(self), changes)
        return dataclasses.replace(self, **changes)


def _refuse_unknown(cls: type[Config], keys: Mapping[str, Any]) -> None:
    unknown = sorted(set(keys) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {cls.__name__} setting(s): {', '.join(unknown)}")


@dataclasses.dataclass(frozen=True)
class DataSettings(Config):
    """Where a task's data come from (its config subclasses this)."""

    data_dir: str | None = setting(
        None,
        "Directory with the data files (default: $RHNZOO_DATA/<dataset>, else the user cache).",
        resumable=True,
    )
    download: bool = setting(True, "Download the data when the files are absent.", resumable=True)
    verify_data: bool = setting(
        True,
        "Check the sha256 of data files already on disk (--noverify_data: files of your own).",
        resumable=True,
    )


@dataclasses.dataclass(frozen=True)
class DistributedSettings(Config):
    """Several processes or hosts (:func:`rhnzoo.apps.cli.initialize_distributed`)."""

    distributed: bool = setting(
        False,
        "Call jax.distributed.initialize() first (several processes/hosts: settings "
        "from --coordinator_address, --num_processes, --process_id when given, else from the "
        "TPU/SLURM/MPI/Kubernetes runtime). Only process 0 prints and writes files.",
        resumable=True,
    )
    coordinator_address: str | None = setting(
        None, "With --distributed: host:port of process 0.", resumable=True
    )
    num_processes: int | None = setting(
        None, "With --distributed: number of processes.", low=1, resumable=True
    )
    process_id: int | None = setting(
        None, "With --distributed: this process's index.", low=0, resumable=True
    )
    distributed_timeout: int = setting(
        300,
        "With --distributed: seconds to wait for every process to join at the "
        "coordinator before giving up with one error line.",
        low=1,
        resumable=True,
    )


@dataclasses.dataclass(frozen=True)
class RunSettings(Config):
    """The run engine's settings (:func:`rhnzoo.engine.run`), each described by its help
    text: run length limits, reporting, the divergence check (``divergence_factor`` F,
    docs/engine.md "Divergence"; the constants in :mod:`rhnzoo.engine.progress`), patience
    (epochs without a better validation ``select`` metric) and matmul precision
    (:mod:`rhnzoo.precision`, recorded as a level: None takes JAX's setting where the
    config is made). Every task's config (whose ``config.json`` is flat) subclasses it and
    has ``epochs``, the epochs of its full schedule (a field, or a property such as the
    LM's ``max_max_epoch``).

    Raises:
      ValueError: for a value outside its range (one line naming the flag).
    """

    seed: int = setting(
        0,
        f"Random seed (initialisation, dropout, batch order): 0 to {SEED_HIGH}.",
        low=0,
        high=SEED_HIGH,
    )
    max_steps: int | None = setting(
        None, "Stop after this many train steps in all.", low=1, resumable=True
    )
    max_epochs: int | None = setting(
        None, "Stop after this many epochs in all.", low=1, resumable=True
    )
    checkpoint_every_steps: int = setting(
        0,
        "Also checkpoint every N steps (0: at the end of every epoch only).",
        low=0,
        resumable=True,
    )
    log_every: int = setting(100, "Steps between training-loss lines.", low=1, resumable=True)
    progress: bool = setting(True, "Show progress bars (training and evaluation).", resumable=True)
    tensorboard: bool = setting(
        False,
        "Also write TensorBoard event files to <workdir>/tensorboard (pip install "
        "'rhnzoo[tensorboard]').",
        resumable=True,
    )
    divergence_factor: float = setting(
        3.0,
        "F: the run stops as diverged (one error line; the last checkpoint is kept) at "
        "a NaN/inf loss, at any step whose training or validation loss is more than 20 nats "
        "above the chance level (a uniform guess: a blow-up), or when, from step 70 on, the "
        "mean training loss of the last 50 steps is more than ln F nats above chance or "
        "above the run's best such mean, or a validation loss is more than ln F above "
        "chance. 0: only NaN/inf stop the run.",
        resumable=True,
    )
    patience: int | None = setting(
        None,
        "Early stopping: end training after this many epochs without a better "
        "validation metric (default: never).",
        low=1,
        resumable=True,
    )
    matmul_precision: str | None = setting(
        None,
        "Precision of float32 matmuls (jax.default_matmul_precision), recorded in "
        "config.json: 'default' is the backend's fastest (CPU: float32; NVIDIA GPU: "
        "TensorFloat-32 inputs, about 1e-3 relative error; TPU: one bfloat16 pass), 'high' "
        "(GPU: TF32; TPU: 3 bfloat16 passes), 'highest' (float32; TPU: 6 passes); also "
        "JAX's names bfloat16, tensorfloat32, float32. Default: "
        "$JAX_DEFAULT_MATMUL_PRECISION, else 'default'.",
    )

    def __post_init__(self):
        # Recorded as a level: None takes JAX's setting where the config is made (a value
        # that is no string is left to the type check).
        if self.matmul_precision is None or isinstance(self.matmul_precision, str):
            try:
                level = precision.resolve(self.matmul_precision)
            except ValueError as e:
                raise ValueError(f"--matmul_precision: {e}") from None
            object.__setattr__(self, "matmul_precision", level)
        super().__post_init__()

    def check(self) -> None:
        super().check()
        if not (self.divergence_factor == 0 or 1 <= self.divergence_factor < math.inf):
            raise ValueError(
                "--divergence_factor must be 0 (off) or a finite number >= 1, "
                f"got {self.divergence_factor}"
            )

    def total_steps(self, steps_per_epoch: int) -> int:
        """The run's steps: ``epochs`` at ``steps_per_epoch``, ended sooner by
        ``max_epochs`` / ``max_steps``."""
        epochs = min(self.epochs, self.max_epochs or self.epochs)
        total = epochs * steps_per_epoch
        return total if self.max_steps is None else min(total, self.max_steps)

    def cut_short(self, steps_per_epoch: int) -> bool:
        """Whether --max_steps / --max_epochs end the run before its schedule does."""
        return self.total_steps(steps_per_epoch) < self.epochs * steps_per_epoch


def preset_settings(presets: Mapping[str, Any], name: str | None) -> Any:
    """``presets[name]``, the settings of preset ``name`` (None: no preset, ``{}``).

    Raises:
      ValueError: ``--preset must be one of <names>, got <name>`` (one line).
    """
    if name is None:
        return {}
    if name not in presets:
        raise ValueError(f"--preset must be one of {', '.join(presets)}, got {name!r}")
    return presets[name]
