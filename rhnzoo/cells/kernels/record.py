"""A kernel window's results into the verified record (issue 68)::

  python -m rhnzoo.cells.kernels.record OUT_DIR [--dry]

reads the window's folder (``env.txt`` and its ``*.jsonl`` figure lines:
:func:`rhnzoo.cells.kernels.verified.entries_from_window`) and adds its entries to
``rhnzoo/cells/kernels/verified.json`` (an entry of the same configuration, device kind
and digest is replaced); ``--dry`` prints them and writes nothing. Figure lines that
carry no ``digest`` are recorded with this checkout's digests only when the checkout is
the window's commit (``env.txt``) with the kernels' source files unmodified; otherwise
the command refuses (exit 1, one ``error:`` line). A dry run's entries (``stand_in``:
``measure.sh --dry``, no kernel ran) are printed by ``--dry`` and never written. Run from
the repository root, then commit ``verified.json`` and update docs/speed.md's Kernel
status table.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence
from pathlib import Path

from rhnzoo.cells.kernels import verified

ROOT = Path(__file__).resolve().parents[3]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def checkout_digests(commit: str) -> dict[str, str]:
    """This checkout's :func:`~rhnzoo.cells.kernels.verified.digest` of every backend, if
    the checkout is ``commit`` with the kernels' source files
    (:data:`~rhnzoo.cells.kernels.verified.SOURCES`) unmodified.

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
    return {name: verified.digest(name) for name in verified.SOURCES}


def entries(out_dir: Path) -> list[verified.Entry]:
    """The window's entries; lines without a digest take :func:`checkout_digests`.

    Raises:
      ValueError: as :func:`checkout_digests`.
    """
    try:
        return verified.entries_from_window(out_dir)
    except ValueError:
        env = out_dir / "env.txt"
        _, commit = verified.window_date_and_commit(env.read_text() if env.exists() else "")
        return verified.entries_from_window(out_dir, digests=checkout_digests(commit))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rhnzoo.cells.kernels.record")
    ap.add_argument("out_dir", help="the kernel window's folder (the device tool's files)")
    ap.add_argument("--dry", action="store_true", help="print the entries, write nothing")
    args = ap.parse_args(argv)
    try:
        new = entries(Path(args.out_dir))
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 1
    if args.dry:
        print(verified.dumps(new), end="")
        return 0
    path = Path(verified.__file__).with_name(verified.RECORD)
    dry = [e for e in new if e.stand_in]
    new = [e for e in new if not e.stand_in]
    if dry:  # a dry run's (measure.sh --dry): no kernel ran, nothing to record
        print(f"{len(dry)} entries of a dry run (stand_in: no kernel ran): not recorded")
    if not new:
        return 0
    path.write_text(verified.dumps(verified.merge(verified.parse(path.read_text()), new)))
    good = sum(verified.checked(e) for e in new)
    print(f"{len(new)} entries ({good} verify their kernel) into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
