"""Every rhnzoo cell by name: ``make(name, hidden_size, **kwargs)``.

One registry for every task (language model, sequence classifier, polyphonic music,
flow analysis), so any cell runs in any task from one flag::

    cells.make("lstm", 256)                          # LSTM(256)
    cells.make("rhn", 256, depth=5, init_bias=-2.5)  # RHN(256, 5, init_bias=-2.5)
    cells.make("hsg_rhn", 256, depth=10)             # HSG(RHN(256, 10))
    cells.make("gru", 256, hsg=True)                 # HSG(GRU(256))
    cells.make("gru", 256, reset_after=True)         # GRU(256, reset_after=True): PyTorch's

Names (:data:`NAMES`): ``rhn``, ``dtrnn``, ``dtsrnn``, ``lstm``, ``gru``, ``rrn``,
``sc_lstm_i``, ``sc_lstm_p``, ``hrl`` (``Parallel((LSTM, RRN))``), ``lstm_gru``
(``Parallel((LSTM, GRU))``). ``hsg_<name>`` (or ``hsg=True``) wraps the cell in the
Highway State Gate; only cells whose carry is one ``[B, n]`` vector can be wrapped
(:data:`HSG_NAMES`), the others are refused with one line (gating an LSTM's c, h or
both would be a new model, not Shoham & Permuter's).

Keyword arguments are the cell's own fields (:func:`options` lists them; an unknown
one is one ``ValueError`` line naming the valid ones); ``hsg_init_bias`` and
``hsg_init_scale`` set the HSG gate (defaults -2.5 and the cell's ``init_scale``).
A task that holds one set of settings for every cell (``depth``, ``init_scale``,
``init_bias``...) passes :func:`applicable` of them.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rhnzoo.cells.deep_transition import DTRNN, DTSRNN
from rhnzoo.cells.lstm import GRU, LSTM, SCLSTM
from rhnzoo.cells.residual import RRN, Parallel
from rhnzoo.cells.rhn import HSG, RHN


def _fields(cls) -> tuple[str, ...]:
    """A cell class's settings: its dataclass fields but ``hidden_size``."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "hidden_size")


def _single(cls, **fixed):
    """(builder, options) of one cell class; ``fixed`` settings are part of the name."""
    options = tuple(k for k in _fields(cls) if k not in fixed)
    return (lambda n, **kw: cls(n, **fixed, **kw)), options


def _parallel(*classes):
    """(builder, options) of ``Parallel`` over ``classes``: each gets the settings it has."""
    options = tuple(dict.fromkeys(k for cls in classes for k in _fields(cls)))

    def build(n, **kw):
        return Parallel(
            tuple(cls(n, **{k: v for k, v in kw.items() if k in _fields(cls)}) for cls in classes)
        )

    return build, options


# name -> (label, (builder(hidden_size, **kwargs), the kwargs it takes))
_CELLS: dict[str, tuple[str, tuple[Callable[..., Any], tuple[str, ...]]]] = {
    "rhn": ("RHN", _single(RHN)),
    "dtrnn": ("DT-RNN", _single(DTRNN)),
    "dtsrnn": ("DT(S)-RNN", _single(DTSRNN)),
    "lstm": ("LSTM", _single(LSTM)),
    "gru": ("GRU", _single(GRU)),
    "rrn": ("RRN", _single(RRN)),
    "sc_lstm_i": ("SC-LSTM-I", _single(SCLSTM, learn_alpha=False)),
    "sc_lstm_p": ("SC-LSTM-P", _single(SCLSTM, learn_alpha=True)),
    "hrl": ("HRL (LSTM + RRN)", _parallel(LSTM, RRN)),
    "lstm_gru": ("LSTM + GRU", _parallel(LSTM, GRU)),
}

NAMES: tuple[str, ...] = tuple(_CELLS)
# The two-cell hybrids (``Parallel``): ``hidden_size`` is each cell's, so a task that
# matches their parameter count to a single cell's gives them fewer units (Wang & Tian,
# Table 2).
PARALLEL_NAMES: tuple[str, ...] = ("hrl", "lstm_gru")
# Cells whose carry is one [B, n] vector: the ones HSG can wrap.
HSG_NAMES: tuple[str, ...] = tuple(
    f"hsg_{name}" for name in ("rhn", "dtrnn", "dtsrnn", "gru", "rrn")
)
ALL_NAMES: tuple[str, ...] = NAMES + HSG_NAMES
HSG_OPTIONS = ("hsg_init_bias", "hsg_init_scale")

# The option values make() checks by type, keyed by the cells' field annotations:
# (test, what the one-line error says). Sizes and choices are the cells' own checks.
_VALUE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, (bool, np.bool_)), "True or False"),
}
# option -> its annotation (the same in every cell that has it), HSG's with the prefix.
_OPTION_TYPES: dict[str, str] = {
    **{
        f.name: getattr(f.type, "__name__", f.type)
        for cls in (RHN, DTRNN, DTSRNN, LSTM, GRU, SCLSTM, RRN)
        for f in dataclasses.fields(cls)
    },
    **{f"hsg_{f.name}": getattr(f.type, "__name__", f.type) for f in dataclasses.fields(HSG)},
}


def _split(name: str) -> tuple[str, bool]:
    """``'hsg_rhn'`` -> ``('rhn', True)``; raises ValueError for an unknown name."""
    base, hsg = (name[4:], True) if name.startswith("hsg_") else (name, False)
    if base not in _CELLS:
        raise ValueError(f"unknown cell {name!r}; choose from {', '.join(ALL_NAMES)}")
    return base, hsg


def options(name: str) -> tuple[str, ...]:
    """The keyword arguments :func:`make` accepts for ``name``."""
    base, hsg = _split(name)
    return _CELLS[base][1][1] + (HSG_OPTIONS if hsg else ())


def label(name: str) -> str:
    """Display name: ``'rhn'`` -> ``'RHN'``, ``'hsg_gru'`` -> ``'HSG-GRU'``."""
    base, hsg = _split(name)
    return ("HSG-" if hsg else "") + _CELLS[base][0]


def applicable(name: str, settings: Mapping[str, Any], *, hsg: bool = False) -> dict[str, Any]:
    """The entries of ``settings`` that cell ``name`` takes (None values dropped)."""
    valid = options(name) + (HSG_OPTIONS if hsg else ())
    return {k: v for k, v in settings.items() if k in valid and v is not None}


def make(name: str, hidden_size: int, *, hsg: bool = False, **kwargs: Any):
    """Builds cell ``name`` (one of :data:`ALL_NAMES`) with ``hidden_size`` units.

    Args:
      name: a registered name; ``hsg_<name>`` wraps it in :class:`~rhnzoo.cells.HSG`.
      hidden_size: n (for the hybrids, each of the two cells has n units).
      hsg: wrap in HSG (same as the ``hsg_`` prefix).
      **kwargs: the cell's own settings (:func:`options`).

    Raises:
      ValueError: (one line) an unknown name or keyword; a bad value: a scale or bias
        (``init_scale``, ``init_bias``, ``forget_bias``, ``f_bias``, ``hsg_init_*``) that
        is not a real number, a flag (``coupled``, ``reset_after``) that is not a bool, or
        what the cell's own checks refuse (sizes, choices); HSG around a cell whose carry
        is not one ``[B, n]`` vector.
    """
    base, prefixed = _split(name)
    hsg = hsg or prefixed
    build, valid = _CELLS[base][1]
    valid_all = valid + (HSG_OPTIONS if hsg else ())
    unknown = sorted(set(kwargs) - set(valid_all))
    if unknown:
        raise ValueError(
            f"cell {name!r}{' with hsg' if hsg and not prefixed else ''} takes no "
            f"{', '.join(unknown)}; its options are {', '.join(valid_all)}"
        )
    for key, value in kwargs.items():
        test, what = _VALUE_CHECKS.get(_OPTION_TYPES.get(key), (None, None))
        if test is not None and not test(value):
            raise ValueError(f"cell {name!r}: {key} must be {what}, got {value!r}")
    hsg_kwargs = {k[4:]: kwargs.pop(k) for k in HSG_OPTIONS if k in kwargs}
    try:
        cell = build(hidden_size, **kwargs)
    except TypeError as e:  # e.g. a wrong type reaching a dataclass
        raise ValueError(f"cell {name!r}: {e}") from None
    if hsg:
        hsg_kwargs.setdefault("init_scale", kwargs.get("init_scale", 0.04))
        cell = HSG(cell, **hsg_kwargs)
    return cell
