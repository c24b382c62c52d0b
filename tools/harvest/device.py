"""``run`` (on the device, or a CPU chunk here in the background): the window's experiment
under its deadline, its archives into ``$OUT`` within the device tool's limits."""

from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

from tools.harvest.chunks import (
    ROOT,
    STAGE_NAME,
    Chunk,
    HarvestError,
    chunk_of,
    git,
    limit_s,
    read_json,
    stage_name,
    unpack,
)

OUT_FILES, OUT_FILE_LIMIT, OUT_LIMIT, OUT_DEPTH = 8, 16 * 2**20, 64 * 2**20, 2
PARTIAL_LIMIT = 16 * 2**20  # a cut window's work folder, compressed, if it is to come back
GRACE_S = 30  # from SIGTERM (the runs save) to SIGKILL
KEPT = ("config.json", "metrics.jsonl", "results.json", "sweep.log", "table.md", "log.txt")


def experiment_command(
    chunk: Chunk,
    workdir: pathlib.Path,
    smoke: bool,
    stack: bool | None = None,
    smoke_steps: int | None = None,
) -> list[str]:
    """The experiment's command line, its runs in ``workdir`` (a one-run chunk's in
    ``workdir/<run_dir>``); ``stack`` (default the chunk's): each row's
    ``--seeds=K`` as one program (``--stack_seeds``, ``--jobs`` divided by K);
    ``smoke_steps``: with ``smoke``, ``--max_steps`` instead of the smoke flags' 2."""
    stack = chunk.stack if stack is None else stack
    flags = [*chunk.flags, *(chunk.smoke if smoke else ())]
    if smoke and smoke_steps is not None:
        flags.append(f"--max_steps={smoke_steps}")
    seeds = int(_flag(flags, "--seeds") or 1)
    if stack and seeds > 1:
        flags = [*flags, "--stack_seeds", f"--jobs={max(1, int(_flag(flags, '--jobs')) // seeds)}"]
    if chunk.run_dir:  # a one-run script: its workdir is the run's folder
        workdir = workdir / chunk.run_dir
    return [sys.executable, chunk.script, *flags, f"--workdir={workdir}"]


def _flag(flags: list[str], name: str) -> str | None:
    """The last value of ``--name=value`` in ``flags`` (None if absent)."""
    values = [f.split("=", 1)[1] for f in flags if f.startswith(name + "=")]
    return values[-1] if values else None


def run(
    name: str | None = None,
    out: pathlib.Path | None = None,
    smoke: bool = False,
    deadline_s: float | None = None,
    *,
    root: pathlib.Path = ROOT,
    stack: bool | None = None,
    smoke_steps: int | None = None,
) -> dict:
    """Runs window ``name`` (None: the one prepared in ``root/.harvest/``) on the data
    and vectors the stage carries (else the environment's), resuming its carried
    partial archive; trains in ``root/.harvest/work/`` and stops the experiment at
    ``deadline_s`` (None: :func:`limit_s`; SIGTERM to its main process, which passes
    it on: the runs save).
    Writes into ``out`` only ``<window>.tar.gz``, ``<window>.partial.tar.gz`` (cut, and
    its work folder compressed fits :data:`PARTIAL_LIMIT`) and ``summary.json``;
    returns the summary. ``smoke_steps``: :func:`experiment_command`'s.
    HarvestError: ``deadline_s`` not finite and > 0 (NaN or inf waited for ever)."""
    _check_deadline(deadline_s)
    stage = root / (stage_name(chunk_of(name)) if name else STAGE_NAME)
    window = read_json(stage / "window.json") or {}
    name = name or window.get("window")
    if not name:
        raise HarvestError(f"no window named and none prepared in {stage}")
    chunk = chunk_of(name)
    if out is None:
        raise HarvestError("no $OUT: name the folder the archives go to (--out)")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = stage / "work"
    if work.resolve().is_relative_to(out) or out.is_relative_to(work.resolve()):
        raise HarvestError(f"{out}: the work folder {work} may not be in it or hold it")
    runs = work / "runs"
    resumed = _work_folder(work, stage / "resume" / f"{name}.tar.gz", smoke)
    cmd = experiment_command(chunk, runs, smoke, stack, smoke_steps)
    start = time.time()
    deadline_s = limit_s(chunk) if deadline_s is None else deadline_s
    rc = _experiment(cmd, work / "log.txt", _environment(stage), deadline_s)
    finished = sorted(
        p.parent.relative_to(runs).as_posix()
        for p in runs.rglob("results.json")
        if "stacked" not in p.parts
    )
    minutes = round((time.time() - start) / 60, 2)
    before = (resumed or {}).get("minutes_total", (resumed or {}).get("minutes", 0.0))
    info = {
        "chunk": name,
        "table": chunk.table,
        "on": chunk.device,
        "smoke": smoke,
        "returncode": rc,
        "minutes": minutes,
        "minutes_total": round(before + minutes, 2),
        "finished": finished,
        "complete": rc == 0,
        "resumed": resumed is not None,
        "command": cmd[1:],
        "date": datetime.date.today().isoformat(),
        "commit": window.get("commit") or git(ROOT, "rev-parse", "--short", "HEAD") or "unknown",
        "ended": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": _device(),
        "host": os.uname().nodename,
        "partial": None,
    }
    summary = dict(info, archives=_archives(name, work, out, info, stage))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return summary


def _check_deadline(deadline_s: float | None) -> None:
    """HarvestError unless ``deadline_s`` is None or a finite number of seconds > 0: NaN
    passed ``<= 0`` and ``Popen.wait(timeout=nan)`` (or inf) waits for ever, which
    defeats the deadline that keeps a window's archives."""
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise HarvestError(f"--deadline_s={deadline_s:g}: must be a finite number > 0")


def _work_folder(work: pathlib.Path, carried: pathlib.Path, smoke: bool) -> dict | None:
    """A fresh ``work`` folder with an empty ``runs/``, or the ``carried`` partial
    archive unpacked in it (unless it was a smoke run and this is not, or back); returns
    the resumed archive's ``harvest.json`` (None: nothing resumed)."""
    shutil.rmtree(work, ignore_errors=True)
    runs = work / "runs"
    runs.mkdir(parents=True)
    if not carried.is_file():
        return None
    unpack(carried, work)  # HarvestError: cut short or corrupt
    resumed = read_json(work / "harvest.json")
    if resumed is not None and resumed.get("smoke") != smoke:
        shutil.rmtree(work)  # a smoke partial never resumes a paper window, nor back
        runs.mkdir(parents=True)
        return None
    return resumed


def _environment(stage: pathlib.Path) -> dict[str, str]:
    """The experiment's environment: this checkout on ``PYTHONPATH``, the data and the
    cache the stage carries (if it does)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if (stage / "data").is_dir():
        env["RHNZOO_DATA"] = str(stage / "data")
    if (stage / "cache").is_dir():
        env["XDG_CACHE_HOME"] = str(stage / "cache")
    return env


def _experiment(cmd: list[str], log_path: pathlib.Path, env: dict, deadline_s: float) -> int:
    """Runs ``cmd`` (its lines appended to ``log_path``) and returns its exit status; at
    ``deadline_s`` seconds it gets SIGTERM, and SIGKILL (its process group) when it has
    not ended :data:`GRACE_S` seconds later."""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            # The main process alone: it passes the signal on to its children once (a
            # second SIGTERM would make them exit without saving).
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait()


def _archives(
    name: str, work: pathlib.Path, out: pathlib.Path, info: dict, stage: pathlib.Path
) -> list[str]:
    """Writes ``<name>.tar.gz`` (the work folder's records, no checkpoints) into ``out``
    and, for a window cut short, ``<name>.partial.tar.gz`` (its runs whole, to resume)
    when it fits :data:`PARTIAL_LIMIT` (``info['partial']`` says which); ``harvest.json``
    (``info``) in both. Returns the archives' names."""
    runs, archives = work / "runs", []
    with tempfile.TemporaryDirectory(dir=stage) as tmp:
        partial = pathlib.Path(tmp) / f"{name}.partial.tar.gz"
        if not info["complete"]:
            (work / "harvest.json").write_text(json.dumps(info, indent=1) + "\n")
            with tarfile.open(partial, "w:gz") as tar:
                for path in sorted(runs.rglob("*")):
                    if path.is_file():
                        tar.add(path, arcname=str(path.relative_to(work)))
                tar.add(work / "harvest.json", arcname="harvest.json")
            size = partial.stat().st_size
            info["partial"] = (
                f"{name}.partial.tar.gz"
                if size <= PARTIAL_LIMIT
                else f"not kept: {size / 2**20:.1f} MiB, more than {PARTIAL_LIMIT / 2**20:.0f} MiB"
            )
        (work / "harvest.json").write_text(json.dumps(info, indent=1) + "\n")
        archive = out / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(work.rglob("*")):
                rel = path.relative_to(work)
                kept = path.name in KEPT or rel.parent == pathlib.Path(".")
                state = {"checkpoints", "best", "stacked"} & set(rel.parts)
                if path.is_file() and kept and not state:
                    tar.add(path, arcname=f"{name}/{rel.as_posix()}")
        archives.append(archive.name)
        if info["partial"] == partial.name:
            shutil.move(partial, out / partial.name)
            archives.append(partial.name)
    return archives


def _device() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            text=True,
            capture_output=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    if out:
        return out.splitlines()[0]
    try:  # this CPU, named as docs/runs/cpu names it
        info = pathlib.Path("/proc/cpuinfo").read_text()
        model = next(x for x in info.splitlines() if x.startswith("model name"))
        return f"CPU: {model.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except (OSError, StopIteration):
        return "CPU"


def check_out(out: pathlib.Path) -> list[str]:
    """What in ``out`` breaks the device tool's limits on what comes back (at most
    :data:`OUT_FILES` plain files, each at most :data:`OUT_FILE_LIMIT` bytes,
    :data:`OUT_LIMIT` in all, no more than :data:`OUT_DEPTH` folders down): one line
    each; empty when everything comes back."""
    problems, files = [], [p for p in out.rglob("*") if not p.is_dir()]
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files, more than {OUT_FILES}")
    for p in files:
        rel = p.relative_to(out)
        if p.is_symlink() or not p.is_file():
            problems.append(f"{rel}: not a plain file")
        elif p.stat().st_size > OUT_FILE_LIMIT:
            problems.append(f"{rel}: {p.stat().st_size / 2**20:.1f} MiB")
        if len(rel.parts) - 1 > OUT_DEPTH:
            problems.append(f"{rel}: more than {OUT_DEPTH} folders down")
    total = sum(p.stat().st_size for p in files if p.is_file())
    if total > OUT_LIMIT:
        problems.append(f"{total / 2**20:.1f} MiB in all")
    return problems
