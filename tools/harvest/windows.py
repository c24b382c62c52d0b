"""``next``: which GPU window runs next, and its exact call, from the queue and the records
(docs/runs/gpu/README.md, "Which window does what").

First, while the kernels' verified record (:mod:`rhnzoo.cells.kernels.verified`) lists no
entry for a backend's current source digest, the kernels are measured: ``auto`` runs no
kernel a GPU has not checked, so a window that fills the record tells the most (issue
68). Then one rule: a window alternates between the harvest and the kernel measurements.
If the newest GPU record is a harvest window, the next window measures the kernels
(:data:`KERNEL_CALL`); otherwise it runs the harvest's next pending GPU window. The GPU
records are the dated folders of ``docs/runs/gpu/`` (``YYYY-MM-DD/``: the measurement
windows) and the harvest's GPU window records
(``docs/runs/gpu/harvest/<table>/<window>.json``); a CPU chunk's records
(``docs/runs/cpu/harvest/``, or any record whose window is a CPU chunk or ran on a CPU)
never count. Times: a window record's ``ended`` (else its
``date``), a dated folder's newest ``*env.txt`` first line (``date -u``; else its name);
on a tie the harvest record is taken as the newer (the kernels are measured first).
"""

from __future__ import annotations

import datetime
import pathlib
import re

from rhnzoo.cells.kernels import verified
from tools.harvest.chunks import (
    GPU_RECORDS,
    STAGE_NAME,
    TIMEOUT_S,
    HarvestError,
    next_pending,
    read_chunks,
    read_json,
)
from tools.harvest.stage import device_command

# The kernels' measurement window: a measure.sh part, one device call, nothing carried.
KERNEL_PART = "kernels"  # issue 68 item 3: ~8.3 min, nothing carried
KERNEL_CALL = {
    "command": f"bash tools/gpu/measure.sh {KERNEL_PART}",
    "carry": [],
    "timeout_s": TIMEOUT_S,
}
_DATED = re.compile(r"\d{4}-\d{2}-\d{2}")


def _env_time(folder: pathlib.Path) -> str:
    """The newest ``date -u`` first line of ``folder``'s ``*env.txt`` files, as ISO UTC;
    else the folder's name (its date)."""
    stamps = []
    for env in folder.glob("*env.txt"):
        first = (env.read_text(errors="replace").splitlines() or [""])[0].strip()
        for fmt in ("%a %b %d %I:%M:%S %p %Z %Y", "%a %b %d %H:%M:%S %Z %Y"):
            try:
                when = datetime.datetime.strptime(first, fmt)
            except ValueError:
                continue
            stamps.append(when.strftime("%Y-%m-%dT%H:%M:%S+00:00"))
            break
    return max((s for s in stamps if s.startswith(folder.name)), default=folder.name)


def gpu_windows(
    gpu: pathlib.Path = GPU_RECORDS, queue: pathlib.Path | None = None
) -> list[tuple[str, str, str]]:
    """Every GPU window recorded under ``gpu``, oldest first: ``(time, kind, name)`` with
    ``kind`` ``"kernels"`` (a dated folder) or ``"harvest"`` (a window record)."""
    cpu = {name for name, c in read_chunks(queue).items() if c.device == "cpu"}
    found = []
    if gpu.is_dir():
        for folder in gpu.iterdir():
            if folder.is_dir() and _DATED.fullmatch(folder.name):
                found.append((_env_time(folder), "kernels", folder.name))
        for path in (gpu / "harvest").glob("*/*.json"):
            info = read_json(path)
            if not isinstance(info, dict) or "chunk" not in info or info.get("smoke"):
                continue
            if info["chunk"] in cpu or info.get("on") == "cpu":
                continue  # a CPU chunk's record never counts as a GPU window
            if str(info.get("device", "")).startswith("CPU"):
                continue
            found.append((str(info.get("ended") or info.get("date", "")), "harvest", info["chunk"]))
    # On a tie the harvest record sorts last (the newer).
    return sorted(found, key=lambda w: (w[0], w[1] == "harvest", w[2]))


def unmeasured_backends(entries: list | None = None) -> list[str]:
    """The kernel backends whose current source digest no entry of the verified record
    (``entries``; None: the package's) holds."""
    entries = verified.load() if entries is None else entries
    held = {(e.backend, e.digest) for e in entries}
    return [b for b in verified.SOURCES if (b, verified.digest(b)) not in held]


def next_window(
    gpu: pathlib.Path = GPU_RECORDS, queue: pathlib.Path | None = None, entries: list | None = None
) -> dict:
    """The next GPU window: ``{"window": "harvest" | "kernels", "name", "why", "call",
    "before", "after"}``, ``call`` the device call (command, carry, timeout_s),
    ``before`` / ``after`` the commands run here around it (None: nothing)."""
    windows = gpu_windows(gpu, queue)
    newest = windows[-1] if windows else None
    said = ""
    if newest is not None:
        what = "a harvest window," if newest[1] == "harvest" else "a measurement window,"
        said = f"the newest GPU record is {what} {newest[2]} ({newest[0]})"
    kernels = {
        "window": "kernels",
        "name": KERNEL_PART,
        "call": dict(KERNEL_CALL),
        "before": None,
        "after": "python -m tools.kernel_record FILES_AT --dry, then without "
        "--dry (docs/runs/gpu/README.md, the kernel window); the files into "
        "docs/runs/gpu/YYYY-MM-DD/",
    }
    unmeasured = unmeasured_backends(entries)
    if unmeasured:
        why = f"the verified record holds no entry for the current {', '.join(unmeasured)} kernels"
        return kernels | {"why": why}
    if newest is not None and newest[1] == "harvest":
        return kernels | {"why": said}
    try:
        name = next_pending(queue, "gpu")
    except HarvestError:
        return kernels | {"why": (said + "; " if said else "") + "no harvest window is pending"}
    return {
        "window": "harvest",
        "name": name,
        "why": said or "no GPU window is recorded",
        "call": {"command": device_command(name), "carry": [STAGE_NAME], "timeout_s": TIMEOUT_S},
        "before": f"python -m tools.harvest prepare {name}",
        "after": "python -m tools.harvest record OUT_DIR",
    }
