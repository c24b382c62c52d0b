"""A run's directory (used by :mod:`rhnzoo.engine`): ``config.json`` written or checked
(:func:`prepare_workdir`), one trainer per workdir (:class:`WorkdirLock`), orbax
checkpoints (:class:`Checkpoints`), ``metrics.jsonl`` (:class:`MetricsLog`), strict JSON
written atomically (:func:`write_json`), and what analyses and tables read back
(:func:`restore_params`, :func:`read_metrics`, :func:`read_config`, :func:`read_json`).

Only process 0 writes files in a multi-process run.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp

from rhnzoo.config import Config, strict

Params = Any
PathLike = str | os.PathLike


class RunError(RuntimeError):
    """A run cannot go on (disk full, unreadable checkpoint, ...); the message is one line."""


def _one_line(e: BaseException) -> str:
    """The innermost OSError's text if there is one in the chain, else the message."""
    seen, cause = set(), e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.strerror:
            where = f" ({cause.filename})" if cause.filename else ""
            return f"{cause.strerror}{where}"
        cause = cause.__cause__ or cause.__context__
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    first = first if len(first) <= 160 else first[:157] + "..."
    return f"{type(e).__name__}: {first}"


def write_json(path: pathlib.Path, obj: Any) -> None:
    """Writes strict JSON (NaN/inf become null) atomically (temporary file + rename).

    Raises:
      RunError: if the file cannot be written (one line naming it).
    """
    text = json.dumps(strict(obj), indent=1, sort_keys=True, allow_nan=False) + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunError(f"cannot write {path}: {_one_line(e)}") from None


def read_json(path: PathLike) -> Any:
    """The JSON of ``path``; None if there is no such file. Raises ValueError (one line
    naming the file) if it is unreadable."""
    path = pathlib.Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({_one_line(e)})") from None


def settings_object(path: PathLike, value: Any) -> dict[str, Any]:
    """``value``, read from the config file ``path``, if it is a JSON object (the settings
    by name); else ValueError, one line naming the file (``[1, 2, 3]`` is valid JSON and
    no config)."""
    if not isinstance(value, dict):
        kind = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(value), "a number"
        )
        raise ValueError(f"{path} is unreadable (a JSON object of settings expected, got {kind})")
    return value


def read_config(workdir: PathLike) -> dict[str, Any]:
    """The run's settings, ``<workdir>/config.json``. Raises ValueError (one line, with
    the path) if it is missing, not readable JSON or not a JSON object."""
    path = pathlib.Path(workdir) / "config.json"
    config = read_json(path)
    if config is None:
        raise ValueError(f"{workdir} has no config.json; is it an rhnzoo training workdir?")
    return settings_object(path, config)


def recorded_settings(workdir: PathLike) -> dict[str, Any] | None:
    """The settings ``<workdir>/config.json`` records for a run to resume (None: no such
    file). Raises ValueError (one line naming the file, ``use another --workdir``) where
    it is unreadable or not a JSON object; a trainer checks this before it makes its
    ``.lock``, so such a workdir is refused with nothing written."""
    path = pathlib.Path(workdir) / "config.json"
    try:
        value = read_json(path)
        return None if value is None else settings_object(path, value)
    except ValueError as e:
        raise ValueError(f"{e}; use another --workdir") from None


def prepare_workdir(
    workdir: PathLike,
    config: Config,
    *,
    log: Callable[[str], None] | None = None,
    check_only: bool = False,
) -> pathlib.Path:
    """Creates ``workdir`` with ``config.json`` (``config.to_dict()``), or checks a resumed
    run's config.

    A workdir whose ``config.json`` holds other settings but which holds no run
    (:func:`holds_run`: e.g. a run stopped before its first checkpoint) takes the new
    config, with one line to ``log``. In a multi-process run only process 0 creates and
    writes; every process checks.

    Args:
      check_only: only check an existing workdir's settings; write nothing.

    Returns:
      The workdir as an absolute path.

    Raises:
      ValueError: if ``workdir`` is a file, cannot be created, or holds a run
        whose structural settings differ (:meth:`rhnzoo.config.Config.conflicts`: a
        setting its config.json lacks counts as the default; one line).
    """
    workdir = pathlib.Path(workdir).absolute()
    path = workdir / "config.json"
    writes = not check_only and jax.process_index() == 0
    refuse_study_root(workdir)
    if path.is_file():
        old = recorded_settings(workdir)
        diff = config.conflicts(old)
        if not diff:
            if writes and old != strict(config.to_dict()):
                write_json(path, config.to_dict())  # the resumed run's settings, recorded
            return workdir
        shown = ", ".join(diff[:4])
        if holds_run(workdir):
            raise ValueError(
                f"workdir {workdir} holds an incompatible run ({shown}); "
                "use another --workdir or the same settings"
            )
        if not writes:
            return workdir
        (log or (lambda line: None))(
            f"workdir {workdir} holds no checkpoint of its earlier settings ({shown}); "
            "starting afresh with these"
        )
    elif not writes:
        return workdir
    _make_dir(workdir)
    try:
        write_json(path, config.to_dict())
    except RunError as e:
        raise ValueError(str(e)) from None
    return workdir


# What a run writes before its first checkpoint: a workdir holding nothing else holds no run.
_BEFORE_CHECKPOINT = frozenset(
    "config.json .config.json.tmp .lock metrics.jsonl .metrics.jsonl.tmp tensorboard "
    "checkpoints best corrupt".split()
)


def holds_run(workdir: pathlib.Path) -> bool:
    """Whether ``workdir`` holds a run: a checkpoint, or anything else a run does not
    write before its first checkpoint (``results.json``, a study's trials, ...)."""
    checkpoints = workdir / "checkpoints"
    return any(p.name not in _BEFORE_CHECKPOINT for p in workdir.iterdir()) or (
        checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())
    )


# What a study writes in its root beside its runs' workdirs.
_STUDY_TABLES = ("results.md", "table.md", "results.jsonl")


def refuse_study_root(workdir: PathLike) -> None:
    """Refuses (ValueError, one line) a study's root as a run's workdir: a directory with
    no ``config.json`` of its own that holds a run's workdir (a subfolder with a
    ``config.json``) or a study's table (``results.md``, ...). Reads only; a trainer
    checks this before it creates anything (its ``.lock`` included)."""
    workdir = pathlib.Path(workdir).absolute()
    if not workdir.is_dir() or (workdir / "config.json").exists():
        return
    try:
        entries = sorted(workdir.iterdir())
    except OSError:
        return  # unreadable: creating or writing in it fails with its own line
    runs = [p.name for p in entries if p.is_dir() and (p / "config.json").is_file()]
    tables = [p.name for p in entries if p.name in _STUDY_TABLES and p.is_file()]
    if not runs and not tables:
        return
    named = runs or tables
    shown = ", ".join(named[:4]) + (", ..." if len(named) > 4 else "")
    raise ValueError(
        f"{workdir} is a study's root ({'runs' if runs else 'it holds'} {shown}): "
        "give a run's own workdir"
    )


def _make_dir(workdir: pathlib.Path) -> None:
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"workdir {workdir} exists and is not a directory")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create workdir {workdir}: {_one_line(e)}") from None


class WorkdirLock:
    """One trainer per workdir: an advisory lock (``fcntl.flock``) on ``<workdir>/.lock``,
    held from construction to :meth:`release`. The OS releases it when the process ends,
    however it ends (``kill -9`` leaves no stale lock); the file holds the holder's pid.
    Readers (analyses, an ``already finished`` rerun) need no lock.

    Raises (on construction):
      ValueError: the workdir cannot be created or is not writable (one line).
      RunError: another process holds the lock (one line naming the workdir and its pid).
    """

    def __init__(self, workdir: PathLike, warn: Callable[[str], None] | None = None):
        workdir = pathlib.Path(workdir).absolute()
        refuse_study_root(workdir)  # before anything is created
        _make_dir(workdir)
        try:  # a run must be able to write (os.access says yes to root, so try)
            with tempfile.TemporaryFile(dir=workdir):
                pass
            self.fd: int | None = os.open(workdir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ValueError(f"workdir {workdir} is not writable: {_one_line(e)}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "(pid unknown)"
            self.release()
            raise RunError(
                f"workdir {workdir} is in use by process {holder}, which is training in it; "
                "wait for it to end or stop it, or use another --workdir"
            ) from None
        except OSError as e:  # a file system without flock (some network mounts)
            self.release()
            if warn is not None:
                warn(
                    f"warning: cannot lock {workdir / '.lock'} ({_one_line(e)}); nothing "
                    "stops a second run from training in this workdir"
                )
            return
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor releases the lock
            self.fd = None


class Checkpoints:
    """orbax managers for the latest states (resume) and the best-validation params.

    Saves are synchronous, so an error (disk full) surfaces at the call as one
    :class:`RunError` line; orbax's own error logging is muted meanwhile. ``latest`` /
    ``best`` False: that manager is not opened (stacked seeds: their states are
    checkpointed together, their best parameters each in its own workdir).
    """

    def __init__(self, workdir: pathlib.Path, *, latest: bool = True, best: bool = True):
        self.workdir = workdir
        self.latest = self._manager("checkpoints", 3) if latest else None
        self.best = self._manager("best", 2) if best else None

    def _manager(self, name: str, keep: int) -> ocp.CheckpointManager:
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=False
        )
        with _quiet_orbax():  # an unreadable step's metadata: orbax logs it at ERROR, then
            # reads on without it (only its timestamp); an unreadable checkpoint is this
            # module's warning when it is restored (restore_latest)
            return ocp.CheckpointManager(self.workdir / name, options=opts)

    def _save(self, manager: ocp.CheckpointManager, step: int, tree: Any) -> None:
        with _quiet_orbax():
            try:
                if step in manager.all_steps():
                    manager.delete(step)
                manager.save(step, args=ocp.args.StandardSave(tree))
                manager.wait_until_finished()
            except Exception as e:  # orbax wraps OSErrors in several exception types
                for tmp in pathlib.Path(manager.directory).glob(f"{step}.orbax-checkpoint-tmp*"):
                    shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left
                reason = _one_line(e)
                if "RESOURCE_EXHAUSTED" in reason or "No space left" in reason:
                    reason = "no space left on device"
                raise RunError(
                    f"cannot save checkpoint {manager.directory / str(step)}: {reason}"
                ) from None

    def save(self, step: int, tree: Any) -> None:
        self._save(self.latest, step, tree)

    def save_best(self, step: int, params: Params) -> None:
        self._save(self.best, step, params)

    def remove_incomplete(self, say: Callable[[str], None]) -> None:
        """Deletes the temporary directories of saves that never finished (a second signal
        during a save, a kill), one line to ``say`` each. Call from process 0 alone, under
        the lock."""
        managers = [m for m in (self.latest, self.best) if m is not None]
        for manager in managers:
            for tmp in list(pathlib.Path(manager.directory).glob("*.orbax-checkpoint-tmp*")):
                shutil.rmtree(tmp, ignore_errors=True)
                say(f"removed {tmp}: a checkpoint save that did not finish")

    def restore_latest(self, like: Any, warn: Callable[[str], None]) -> Any | None:
        """The newest readable checkpoint, restored like ``like``, or None.

        An unreadable one (or one of another structure) is moved to
        ``<workdir>/corrupt/`` with one warning line.
        """
        while True:
            step = self.latest.latest_step()
            if step is None:
                return None
            try:
                with _quiet_orbax():
                    return self.latest.restore(step, args=ocp.args.StandardRestore(like))
            except Exception as e:  # any failure to read: truncated, missing files, structure
                reason = _one_line(e)
            with _quiet_orbax(collect=True):  # the exception is released: its leftovers go now
                bad = self.latest.directory / str(step)
                aside = self.workdir / "corrupt" / f"checkpoints_{step}_{int(time.time())}"
                if jax.process_index() == 0:
                    aside.parent.mkdir(exist_ok=True)
                    os.replace(bad, aside)
                if jax.process_count() > 1:
                    from jax.experimental import multihost_utils

                    multihost_utils.sync_global_devices(f"rhnzoo moved checkpoint {step}")
                self.latest.reload()
                older = self.latest.latest_step()
                warn(
                    f"warning: checkpoint {bad} is unreadable ({reason}); moved to "
                    f"{aside}; "
                    + (
                        f"resuming from step {older}"
                        if older is not None
                        else "starting from scratch"
                    )
                )

    def drop_best_after(self, step: int) -> None:
        """Deletes best checkpoints newer than ``step`` (left by a run that died after
        them): the resumed run re-derives its own from the restored state."""
        for s in self.best.all_steps():
            if s > step:
                self.best.delete(s)

    def restore_best(self, step: int, like: Params) -> Params | None:
        """The best parameters saved at ``step`` (None if ``step`` < 0)."""
        if step < 0:
            return None
        if step not in self.best.all_steps():
            raise RunError(
                f"{self.best.directory} lacks the best checkpoint of step {step} that the "
                "latest state refers to; delete the workdir's checkpoints to retrain"
            )
        try:
            with _quiet_orbax():
                return self.best.restore(step, args=ocp.args.StandardRestore(like))
        except Exception as e:
            raise RunError(
                f"best checkpoint {self.best.directory / str(step)} is unreadable "
                f"({_one_line(e)}); delete {self.best.directory} and rerun to re-select it"
            ) from None

    def close(self) -> None:
        for manager in (self.latest, self.best):
            if manager is not None:
                manager.close()


class _quiet_orbax:
    """Mutes what orbax prints around a failing save or restore: absl logging (it logs
    tracebacks at ERROR before raising), the coroutines and worker threads it leaves
    behind (Python's unraisable-exception and thread hooks), collected before unmuting."""

    def __init__(self, collect: bool = False):
        self.collect = collect  # also collect garbage before unmuting, failure or not

    def __enter__(self):
        import threading

        from absl import logging

        self.logger = logging.get_absl_logger()
        self.saved = (self.logger.level, sys.unraisablehook, threading.excepthook)
        self.logger.setLevel(60)
        sys.unraisablehook = lambda unraisable: None
        threading.excepthook = lambda args: None

    def __exit__(self, *exc):
        import gc
        import threading

        if exc[0] is not None or self.collect:
            gc.collect()  # abandoned coroutines report here, muted
        level, sys.unraisablehook, threading.excepthook = self.saved
        self.logger.setLevel(level)


class MetricsLog:
    """``metrics.jsonl`` (and optional TensorBoard events); in-memory when no workdir."""

    def __init__(self, workdir: pathlib.Path | None, tensorboard: bool, purge_step: int):
        if jax.process_index() != 0:  # one writer in a multi-process run
            workdir = None
        self.path = None if workdir is None else workdir / "metrics.jsonl"
        self.records: list[dict] = []
        self.tb = None
        if tensorboard and workdir is not None:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise ValueError(
                    "--tensorboard needs tensorboardX: pip install 'rhnzoo[tensorboard]'"
                ) from None
            self.tb = SummaryWriter(str(workdir / "tensorboard"), purge_step=purge_step)

    def cut_back(self, step: int, validated: int) -> None:
        """Drops records after checkpoint ``step`` (and its epoch record unless the
        checkpoint says that epoch was validated), so a resumed run rewrites them."""
        if self.path is None or not self.path.is_file():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:  # a line cut by a kill
                continue
            if r["step"] < step or (
                r["step"] == step and (r.get("kind") != "epoch" or validated == step)
            ):
                keep.append(line + "\n")
        tmp = self.path.with_name(".metrics.jsonl.tmp")
        try:
            tmp.write_text("".join(keep))
            os.replace(tmp, self.path)
        except OSError as e:  # e.g. a workdir that became read-only
            raise RunError(f"cannot write {self.path}: {_one_line(e)}") from None

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self.path is not None:
            try:
                with open(self.path, "a") as f:
                    f.write(json.dumps(strict(record), allow_nan=False) + "\n")
            except OSError as e:
                raise RunError(f"cannot write {self.path}: {_one_line(e)}") from None
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, float | int) and k not in ("step", "epoch"):
                    self.tb.add_scalar(f"{record['kind']}/{k}", v, record["step"])
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def finished_results(workdir: PathLike, total: int) -> dict | None:
    """The stored ``results.json`` of a run that is over at this run length, else None: it
    reached ``total`` steps, or stopped early (patience, divergence), which more steps
    won't undo."""
    try:
        results = json.loads((pathlib.Path(workdir) / "results.json").read_text())
    except (OSError, ValueError):
        return None
    if results.get("stopped") in ("patience", "diverged") or "diverged" in results:
        return results
    return results if int(results.get("step", -1)) >= total else None


def restore_params(workdir: PathLike) -> Params | None:
    """The parameters of a run: ``best/`` if it has a step, else the latest state in
    ``checkpoints/`` (a run stopped before its first validation); None if neither.

    Reads checkpoints as saved (host arrays).
    """

    def latest(directory: pathlib.Path) -> Any | None:
        if not directory.is_dir():
            return None
        with _quiet_orbax():  # as Checkpoints._manager
            manager = ocp.CheckpointManager(directory.absolute())
        try:
            step = manager.latest_step()
            with _quiet_orbax():
                return (
                    None if step is None else manager.restore(step, args=ocp.args.StandardRestore())
                )
        finally:
            manager.close()

    workdir = pathlib.Path(workdir)
    params = latest(workdir / "best")
    if params is None:
        state = latest(workdir / "checkpoints")
        if state is not None:
            params = state["state"]["task"]["params"]
    return params


def read_metrics(workdir: PathLike, kind: str = "epoch") -> list[dict[str, Any]]:
    """The ``kind`` records (``'epoch'`` or ``'train'``) of ``workdir/metrics.jsonl``, in order.

    For ``'epoch'``, one record per epoch: if a resumed run reported an epoch twice
    (cut short, then completed), the last record wins. A missing file gives ``[]``.

    Raises:
      ValueError: the file is unreadable, or a record is not the engine's (one line
        naming the file).
    """
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        return []
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        records = [r for r in records if r["kind"] == kind]
        by_epoch = {int(r["epoch"]): r for r in records} if kind == "epoch" else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is unreadable ({_one_line(e)})") from None
    return records if by_epoch is None else [by_epoch[e] for e in sorted(by_epoch)]
