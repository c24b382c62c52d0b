"""The tables of every multi-run experiment: a cell over seeds (:func:`mean_sd`), a
markdown table (:func:`markdown`) and writing it whole (:func:`write_table`)."""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax

PathLike = str | pathlib.Path


def mean_sd(values: Sequence[float], fmt: str = ".2f", unit: str = "") -> str | None:
    """A table cell over seeds: ``'<mean> ± <sd><unit> (n=<n>)'`` for n >= 2 values (sd:
    the sample standard deviation, n - 1 in the denominator), ``'<value><unit>'`` for
    one, None for none. ``fmt``: the format spec of both numbers."""
    values = [float(v) for v in values]
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return f"{mean:{fmt}}{unit}"
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:{fmt}} ± {sd:{fmt}}{unit} (n={len(values)})"


_RULES = {"-": "---", "l": ":---", "r": "---:", "c": ":---:"}


def markdown(
    header: Sequence[str], rows: Sequence[Sequence[Any]], blank: str = "—", align: str | None = None
) -> str:
    """A markdown table; None cells print as ``blank``. Every table of every sweep is
    laid out here.

    ``align``: one letter per column, ``'l'``, ``'r'``, ``'c'`` or ``'-'`` (none), e.g.
    ``'rrrrrl'``; None: no alignment. Raises ValueError if its length is not the
    number of columns."""
    align = "-" * len(header) if align is None else align
    if len(align) != len(header) or set(align) - _RULES.keys():
        raise ValueError(
            f"align must be one of l, r, c, - per column ({len(header)}), got {align!r}"
        )
    cell = lambda v: blank if v is None else str(v)
    rules = [_RULES[a] for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "".join(r + "|" for r in rules)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_table(path: PathLike, text: str) -> pathlib.Path:
    """Writes a sweep's table (``text`` plus a newline) to ``path`` whole (a temporary
    file renamed into place), from process 0 only; returns ``path``."""
    path = pathlib.Path(path)
    if jax.process_index() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text.rstrip("\n") + "\n")
        os.replace(tmp, path)
    return path
