"""The harvest's queue: one table (``docs/runs/harvest_queue.tsv``) whose rows are its
chunks in the order they run and whose columns are each chunk's composition and size
(what it runs, on which device, its estimate) and then what ran (state, date, device,
commit, minutes, note: written by ``record``). Re-sizing, re-ordering or adding a chunk is
an edit of that table; the sizes' evidence is docs/runs/gpu/README.md ("Window sizes").

Columns, by the file's own header:

* ``chunk``: the window's name; ``on``: ``gpu`` (a device window) or ``cpu`` (a
  background job on one core of this CPU);
* ``table``: the records' folder (``<records>/<table>/``), shared by a table's chunks;
* ``script``, ``flags`` (space-separated), ``data`` (comma-separated folders of
  ``$RHNZOO_DATA``), ``vectors`` (the RRL data set whose Word2Vec vectors it reads, or
  empty), ``smoke`` (flags over ``flags`` at a CPU's scale);
* ``metric`` (the table's column, a ``results.json`` key), ``select`` (a random search's
  selection key, or empty), ``stack`` (``yes``: a row's ``--seeds=K`` as one program),
  ``run_dir`` (a one-run script's ``--workdir`` under the runs folder, or empty);
* ``estimate``: minutes, the chunk's size (``record`` re-sizes a table's pending GPU
  windows from a window's wall time);
* ``state`` (pending / partial / done), ``date``, ``device``, ``commit``, ``minutes``,
  ``note``: what ran.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import tarfile
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "runs"
QUEUE = RUNS / "harvest_queue.tsv"
GPU_RECORDS = RUNS / "gpu"  # the device calls' records: dated folders and harvest/
# <table>/<run>/{config.json, ...}, <table>/<window>.{json,log}, <table>/partial/: a GPU
# window's records beside the device's other records, a CPU chunk's apart from them.
RECORDS = {"gpu": GPU_RECORDS / "harvest", "cpu": RUNS / "cpu" / "harvest"}
SMOKE_RECORDS = ROOT / "runs" / "harvest_smoke"  # --smoke records: never a paper table
STAGE_NAME = ".harvest"  # what a device call carries: data/, cache/, resume/, window.json
CPU_STAGE_NAME = ".harvest_cpu"  # a CPU chunk's, beside it
TIMEOUT_S = 600  # one device command
DEADLINE_S = 9 * 60 - 40  # the experiment's share of a window (archives after)
CPU_LIMIT_S = 45 * 60  # a CPU chunk's sitting on one core (a cut one resumes)
DEFINITION = (
    "chunk", "on", "table", "script", "flags", "data", "vectors", "smoke",
    "metric", "select", "stack", "run_dir", "estimate",
)  # fmt: skip
RAN = ("state", "date", "device", "commit", "minutes", "note")
QUEUE_HEADER = DEFINITION + RAN
STATES = ("pending", "partial", "done")


class HarvestError(Exception):
    """Bad input or a window that cannot be prepared or recorded (one line)."""


def unpack(archive: pathlib.Path, dest: pathlib.Path) -> None:
    """Extracts the ``.tar.gz`` ``archive`` into ``dest`` (tarfile's ``data`` filter).

    Raises:
      HarvestError: (one line naming it) an archive cut short or corrupt.
    """
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        why = (str(e).strip().splitlines() or [""])[0]
        raise HarvestError(
            f"{archive}: cut short or corrupt, not a readable .tar.gz ({type(e).__name__}: {why})"
        ) from None


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One queue row's work: ``script`` with ``flags`` into ``<records>/<table>``, on a
    GPU (a device call) or on this CPU (a background job)."""

    name: str
    table: str
    script: str
    flags: tuple[str, ...]
    data: tuple[str, ...]
    vectors: str | None = None
    minutes: float = 8.0  # the row's estimate
    smoke: tuple[str, ...] = ()
    metric: str = "test_acc"
    select: str | None = None
    stack: bool = False
    device: str = "gpu"  # the row's ``on``
    run_dir: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, str]) -> Chunk:
        """The chunk of a queue row; HarvestError naming the row for a bad cell."""
        name = row["chunk"]
        if row["on"] not in RECORDS:
            raise HarvestError(f"queue row {name}: on={row['on']!r}, not one of gpu, cpu")
        if not row["script"] or not row["table"]:
            raise HarvestError(f"queue row {name}: no script or no table")
        try:
            minutes = float(row["estimate"])
        except ValueError:
            raise HarvestError(f"queue row {name}: estimate {row['estimate']!r}") from None
        return cls(
            name=name,
            table=row["table"],
            script=row["script"],
            flags=tuple(row["flags"].split()),
            data=tuple(filter(None, row["data"].split(","))),
            vectors=row["vectors"] or None,
            minutes=minutes,
            smoke=tuple(row["smoke"].split()),
            metric=row["metric"] or "test_acc",
            select=row["select"] or None,
            stack=row["stack"] == "yes",
            device=row["on"],
            run_dir=row["run_dir"] or None,
        )


def read_queue(queue: pathlib.Path | None = None) -> list[dict[str, str]]:
    """The rows of ``queue`` (default :data:`QUEUE`), in its order, each with every
    column of :data:`QUEUE_HEADER` (read by the file's own header; a missing one empty).
    A ``queue`` not written yet is the committed queue's chunks, every one pending (what
    ran cleared): a fresh queue. HarvestError: a chunk listed twice, an unknown state."""
    path = QUEUE if queue is None else queue
    fresh = not path.is_file()
    lines = (QUEUE if fresh else path).read_text().splitlines()
    header = lines[0].split("\t") if lines else []
    rows, seen = [], set()
    for line in lines[1:]:
        if not line.strip():
            continue
        fields = dict(zip(header, line.split("\t")))
        row = {k: fields.get(k, "").strip() for k in QUEUE_HEADER}
        if fresh:
            row |= dict.fromkeys(RAN, "")
        row["state"] = row["state"] or "pending"
        if row["chunk"] in seen or row["state"] not in STATES:
            raise HarvestError(
                f"{path}: row {row['chunk']}: listed twice or state {row['state']!r}"
            )
        seen.add(row["chunk"])
        rows.append(row)
    return rows


def write_queue(rows: list[dict[str, str]], queue: pathlib.Path | None = None) -> None:
    queue = QUEUE if queue is None else queue
    text = "\t".join(QUEUE_HEADER) + "\n"
    text += "".join("\t".join(r[k] for k in QUEUE_HEADER) + "\n" for r in rows)
    tmp = queue.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, queue)


def read_chunks(queue: pathlib.Path | None = None) -> dict[str, Chunk]:
    """The queue's chunks by name, in its order."""
    return {row["chunk"]: Chunk.from_row(row) for row in read_queue(queue)}


CHUNKS: dict[str, Chunk] = read_chunks()  # the committed queue's, as it was at import


def chunk_of(name: str, queue: pathlib.Path | None = None) -> Chunk:
    """The chunk (window) ``name``; HarvestError for an unknown one."""
    found = read_chunks(queue)
    if name not in found:
        raise HarvestError(f"no window {name!r}; `list` shows them")
    return found[name]


def records_dir(chunk: Chunk) -> pathlib.Path:
    """Where ``chunk``'s table is recorded: a GPU window's under ``docs/runs/gpu/harvest/``,
    a CPU chunk's under ``docs/runs/cpu/harvest/`` (so no CPU chunk reads as a GPU window)."""
    return RECORDS[chunk.device]


def stage_name(chunk: Chunk) -> str:
    """The folder (in the checkout's root) ``chunk`` is staged in and trains in."""
    return STAGE_NAME if chunk.device == "gpu" else CPU_STAGE_NAME


def limit_s(chunk: Chunk) -> float:
    """The seconds ``chunk``'s experiment may take: :data:`DEADLINE_S` on a GPU,
    :data:`CPU_LIMIT_S` on the CPU."""
    return DEADLINE_S if chunk.device == "gpu" else CPU_LIMIT_S


def next_pending(queue: pathlib.Path | None = None, on: str = "gpu") -> str:
    """The first chunk ``on`` ``"gpu"`` (a device window) or ``"cpu"`` whose row is
    ``pending`` or ``partial`` (a partial one resumes)."""
    for row in read_queue(queue):
        if row["on"] == on and row["state"] in ("pending", "partial"):
            return row["chunk"]
    raise HarvestError(f"no {on} window is pending")


def check_size(name: str, queue: pathlib.Path | None = None) -> float:
    """The estimated minutes of window ``name`` (its queue row's); HarvestError where a
    GPU window's exceeds its deadline (:func:`limit_s`): such a window would be cut every
    time, so it is refused, to be split into smaller chunks. A CPU chunk longer than its
    45 min sitting is not refused: it is cut, kept in its partial archive, and resumes at
    its next sitting."""
    chunk = chunk_of(name, queue)
    minutes, limit = chunk.minutes, limit_s(chunk) / 60
    if minutes > limit and chunk.device == "gpu":
        raise HarvestError(
            f"{name}: estimated {minutes:g} min, more than the {limit:g} min a {chunk.device} "
            "chunk may take; split it (fewer models, depths or seeds a chunk)"
        )
    return minutes


def read_json(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def git(tree: pathlib.Path, *args: str) -> str:
    """``git args``'s output in ``tree`` ('' where there is no git)."""
    try:
        return subprocess.run(
            ["git", *args], cwd=tree, text=True, capture_output=True, check=False
        ).stdout.strip()
    except OSError:
        return ""
