"""A kernel window's results into the verified record (issues 68, 70): a tool of the
project, beside the package. From the repository root::

  python -m tools.kernel_record OUT_DIR [--dry]

reads the window's folder (``env.txt`` and its ``*.jsonl`` figure lines:
:func:`entries_from_window`) and adds its entries to this checkout's
``rhnzoo/cells/kernels/verified.json`` (:func:`merge`: an entry of the same configuration,
device kind and digest is replaced); ``--dry`` prints them and writes nothing. Figure
lines that carry no ``digest`` are recorded with this checkout's digests only when the
checkout is the window's commit (``env.txt``) with the kernels' source files unmodified;
otherwise the command refuses (exit 1, one ``error:`` line). A dry run's entries
(``stand_in``: ``measure.sh --dry``, no kernel ran) are printed by ``--dry`` and never
written. Then commit ``verified.json`` and update docs/speed.md's Kernel status table.

What the library reads at run time (the record, :class:`~rhnzoo.cells.kernels.verified.Entry`,
the digest, ``fits``) is :mod:`rhnzoo.cells.kernels.verified`; this module only writes
the record.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rhnzoo.cells.kernels import verified
from rhnzoo.cells.kernels.verified import Entry

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "rhnzoo" / "cells" / "kernels"  # this checkout's kernel sources and record

# kernel_probe.py's candidates (figure prefixes) and the kernel options each ran with.
CANDIDATES: dict[str, dict[str, Any]] = {
    "pallas": {},
    "pallas_bt16": {"batch_tile": 16},
    "pallas_bt32": {"batch_tile": 32},
    "pallas_approx_math": {"approx_math": True},
    "pallas_no_auto_barriers": {"no_auto_barriers": True},
}
FUSED = "fused_bf16"  # the fused bfloat16 scan's figures
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


# ------------------------------------------------------------------------------ the record


def dumps(entries: Iterable[Entry]) -> str:
    """The record's JSON text (what :func:`rhnzoo.cells.kernels.verified.parse` reads):
    one entry a line, ``[]`` when empty."""
    lines = [json.dumps(e.to_json(), sort_keys=True) for e in entries]
    return "[]\n" if not lines else "[\n" + ",\n".join(lines) + "\n]\n"


def merge(old: Sequence[Entry], new: Sequence[Entry]) -> list[Entry]:
    """``old`` with ``new`` appended; an old entry of the same
    :meth:`~rhnzoo.cells.kernels.verified.Entry.key` is replaced by the new one."""
    keys = {e.key() for e in new}
    return [e for e in old if e.key() not in keys] + list(new)


# ------------------------------------------------------------------------------ windows


def window_date_and_commit(env_text: str) -> tuple[str, str]:
    """``(YYYY-MM-DD, commit)`` from a window's ``env.txt`` (``date -u``'s line and
    ``git rev-parse HEAD``'s); ``''`` for what it lacks."""
    date = commit = ""
    for line in env_text.splitlines():
        line = line.strip()
        if not commit and re.fullmatch(r"[0-9a-f]{40}", line):
            commit = line
        iso = re.match(r"(\d{4}-\d{2}-\d{2})(?!\d)", line)
        unix = re.match(r"\w{3},? +(\w{3}) +(\d{1,2}) .*?(\d{4})$", line)
        if not date and iso:
            date = iso.group(1)
        elif not date and unix and unix.group(1) in _MONTHS:
            month = _MONTHS.index(unix.group(1)) + 1
            date = f"{unix.group(3)}-{month:02d}-{int(unix.group(2)):02d}"
    return date, commit


def read_lines(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The JSON objects of JSON-lines files (lines that are not one: skipped)."""
    out = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _worst(errors: Any) -> float | None:
    if errors is None:
        return None
    values = errors.values() if isinstance(errors, Mapping) else [errors]
    return max(float(v) for v in values)


def entries_from_lines(
    lines: Sequence[Mapping[str, Any]],
    *,
    date: str = "",
    commit: str = "",
    digests: Mapping[str, str] | None = None,
) -> list[Entry]:
    """Record entries from a kernel window's figure lines (tools/gpu/kernel_probe.py's
    JSON lines): per shape (``n``, ``B``, and ``m``, ``cell``, ``backend`` where a line
    has them; else 1, ``'LSTM'``, ``'gated'``) and kernel candidate of :data:`CANDIDATES`,
    the kernel's and the fused scan's value-and-gradient time (``{candidate}_value_and_grad``
    beside ``fused_bf16_value_and_grad``, else the two ``error_{candidate}`` /
    ``error_fused_bf16`` lines' ``ms``) and the candidate's errors from its
    ``error_{candidate}`` line (``loss_rel_err``, the worst of ``grad_rel_err``; None
    without one). The digest: a line's ``digest``, else ``digests[backend]``. A figure
    that failed (an ``error`` message) gives no time; a shape without both times, no
    entry.

    Raises:
      ValueError: a shape whose lines carry no digest and ``digests`` lacks its backend.
    """
    shapes: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for line in lines:
        figure = line.get("figure")
        if not isinstance(figure, str) or "n" not in line or "B" not in line:
            continue
        shape = (
            line.get("backend", "gated"),
            line.get("cell", "LSTM"),
            int(line["n"]),
            line.get("depth"),
            int(line.get("m", 1)),
            int(line["B"]),
        )
        shapes.setdefault(shape, {})[figure] = line

    def ms(line):
        return None if line is None or "error" in line or "ms" not in line else float(line["ms"])

    entries = []
    for (backend, cell, n, depth, m, B), figures in shapes.items():
        for candidate, options in CANDIDATES.items():
            check = figures.get(f"error_{candidate}")
            pairs = [
                (
                    figures.get(f"{candidate}_value_and_grad"),
                    figures.get(f"{FUSED}_value_and_grad"),
                ),
                (check, figures.get(f"error_{FUSED}")),
            ]
            times = next(((ms(k), ms(f)) for k, f in pairs if ms(k) and ms(f)), None)
            if times is None:
                continue
            # the kernel's own lines first: the fused scan's carry the shape, not the kernel
            first = next(line for line in (pairs[0][0], check, pairs[0][1]) if line is not None)
            found = first.get("digest") or (digests or {}).get(backend)
            if not found:
                raise ValueError(
                    f"the window's {backend} figures carry no kernel digest: pass the "
                    f"digest of the commit it ran (digests={{'{backend}': ...}})"
                )
            ok = check is not None and "error" not in check
            entries.append(
                Entry(
                    backend=backend,
                    cell=cell,
                    hidden_size=n,
                    depth=depth,
                    input_size=m,
                    batch=B,
                    length=first.get("T"),
                    dtype=first.get("dtype", "bfloat16"),
                    options=dict(options),
                    digest=found,
                    device_kind=str(first.get("device", "")),
                    date=date,
                    commit=commit,
                    value_error=_worst(check.get("loss_rel_err")) if ok else None,
                    grad_error=_worst(check.get("grad_rel_err")) if ok else None,
                    kernel_ms=times[0],
                    fused_ms=times[1],
                    stand_in=bool(first.get("stand_in", False)),
                )
            )
    return entries


def entries_from_window(
    out_dir: str | Path, *, digests: Mapping[str, str] | None = None
) -> list[Entry]:
    """:func:`entries_from_lines` of a window's folder: every ``*.jsonl`` file in it, the
    date and commit from its ``env.txt`` (:func:`window_date_and_commit`).

    Raises:
      ValueError: as :func:`entries_from_lines`.
    """
    out = Path(out_dir)
    env = out / "env.txt"
    date, commit = window_date_and_commit(env.read_text() if env.exists() else "")
    lines = read_lines(sorted(out.glob("*.jsonl")))
    return entries_from_lines(lines, date=date, commit=commit, digests=digests)


# ------------------------------------------------------------------------------ the command


def _source(name: str) -> bytes:
    return (KERNELS / name).read_bytes()


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def checkout_digests(commit: str) -> dict[str, str]:
    """This checkout's :func:`~rhnzoo.cells.kernels.verified.digest` of every backend (of
    the files under ``rhnzoo/cells/kernels/``), if the checkout is ``commit`` with the
    kernels' source files (:data:`~rhnzoo.cells.kernels.verified.SOURCES`) unmodified.

    Raises:
      ValueError: another commit, an unknown one, or modified kernel sources.
    """
    files = sorted({f for fs in verified.SOURCES.values() for f in fs})
    head = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--", *(f"rhnzoo/cells/kernels/{f}" for f in files))
    if not commit or head != commit or dirty:
        raise ValueError(
            f"the window's lines carry no digest and this checkout is not its commit "
            f"{commit or '(unknown)'} with the kernel sources unmodified (HEAD {head or '?'}"
            f"{', kernel sources modified' if dirty else ''}): check out that commit"
        )
    return {name: verified.digest(name, _source) for name in verified.SOURCES}


def entries(out_dir: Path) -> list[Entry]:
    """The window's entries; lines without a digest take :func:`checkout_digests`.

    Raises:
      ValueError: as :func:`checkout_digests`.
    """
    try:
        return entries_from_window(out_dir)
    except ValueError:
        env = out_dir / "env.txt"
        _, commit = window_date_and_commit(env.read_text() if env.exists() else "")
        return entries_from_window(out_dir, digests=checkout_digests(commit))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.kernel_record")
    ap.add_argument("out_dir", help="the kernel window's folder (the device tool's files)")
    ap.add_argument("--dry", action="store_true", help="print the entries, write nothing")
    args = ap.parse_args(argv)
    try:
        new = entries(Path(args.out_dir))
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 1
    if args.dry:
        print(dumps(new), end="")
        return 0
    path = KERNELS / verified.RECORD
    dry = [e for e in new if e.stand_in]
    new = [e for e in new if not e.stand_in]
    if dry:  # a dry run's (measure.sh --dry): no kernel ran, nothing to record
        print(f"{len(dry)} entries of a dry run (stand_in: no kernel ran): not recorded")
    if not new:
        return 0
    path.write_text(dumps(merge(verified.parse(path.read_text()), new)))
    good = sum(verified.checked(e) for e in new)
    print(f"{len(new)} entries ({good} verify their kernel) into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
