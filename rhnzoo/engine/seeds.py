"""One seed's records in a run (:class:`Seed`): its config and workdir, checkpoints,
metrics log and report, loss book and validation bookkeeping, and its result."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import jax
import numpy as np

from rhnzoo.config import RunSettings
from rhnzoo.engine import progress
from rhnzoo.engine.task import RunResult, Task
from rhnzoo.engine.workdir import (
    Checkpoints,
    WorkdirLock,
    finished_results,
    prepare_workdir,
    recorded_settings,
    read_metrics,
    restore_params,
)


class Seed:
    """One seed's records in a run: its config and workdir, its best checkpoints, metrics
    log and report, its loss book and validation bookkeeping (``meta``), and, once it
    stopped, its :class:`RunResult`."""

    def __init__(self, k: int, config: RunSettings, workdir: pathlib.Path | None, say):
        self.k, self.config, self.workdir, self.say = k, config, workdir, say
        self.ckpt: Checkpoints | None = None
        self.lock: WorkdirLock | None = None
        self.metrics = self.report = self.book = self.meta = None
        self.best_params = None  # in-memory runs keep a host copy of the best parameters
        self.done: dict | None = None  # results of a run over before this one started
        self.again = False  # ... evaluated with other final settings: evaluate it again
        self.result: RunResult | None = None

    @property
    def active(self) -> bool:
        return self.result is None and self.done is None

    def read_finished(self, task: Task) -> None:
        """Sets ``done`` (and ``again``) from a finished run's ``results.json``."""
        if self.workdir is None or not (self.workdir / "results.json").is_file():
            return
        prepare_workdir(self.workdir, self.config, check_only=True)
        self.done = finished_results(self.workdir, self.config.total_steps(task.steps_per_epoch))
        self.again = evaluate_again(task, self.done, self.say)

    def already_finished(self, task: Task) -> RunResult:
        final = self.done.get("final") or progress.final_line(self.done, task.report.final_label)
        self.say(f"already finished: {final}")
        return RunResult(
            self.done,
            read_metrics(self.workdir),
            restore_params(self.workdir),
            "diverged" in self.done,
        )

    def open(self, primary: bool, latest: bool) -> None:
        """The workdir locked and prepared for training, its checkpoints opened (not
        ``latest``, stacked seeds: the best ones only)."""
        if self.workdir is not None:
            recorded_settings(self.workdir)  # an unreadable one: refused before the .lock
            self.lock = WorkdirLock(self.workdir, warn=self.say) if primary else None
            self.ckpt = open_workdir(self.workdir, self.config, primary, self.say, latest=latest)

    def fresh_meta(self, report, sums_shape: Any, divergence_factor: float) -> dict:
        """A new run's bookkeeping of this seed (checkpointed with the state); sets its
        loss book (``report``: the task's :class:`rhnzoo.engine.evaluate.Report`)."""
        worst = -math.inf if report.higher_is_better else math.inf
        meta = {
            "validated": np.array(-1),
            "best": np.array(worst),
            "best_step": np.array(-1),
            "epoch_sums": None,
            "window_sums": None,
            "elapsed": np.array(0.0),
            "recent": np.zeros((progress.DIVERGENCE_WINDOW, 2)),
            "best_mean": np.array(math.inf),
        }
        self.book = progress.LossBook(meta, sums_shape, report.chance_loss, divergence_factor)
        meta["epoch_sums"], meta["window_sums"] = self.book.zeros(), self.book.zeros()
        self.meta = meta
        return meta

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.ckpt is not None:
            self.ckpt.close()
        if self.lock is not None:
            self.lock.release()


def evaluate_again(task: Task, done: dict | None, say) -> bool:
    """Whether the finished run's results (``done``) were evaluated with other final
    settings than ``task.report.final_settings`` (then it says which, in one line)."""
    stale = {
        k: v for k, v in task.report.final_settings.items() if done is not None and done.get(k) != v
    }
    if stale:
        shown = ", ".join(f"{k} {done.get(k)} -> {v}" for k, v in stale.items())
        say(f"finished; evaluating its best checkpoint again ({shown})")
    return bool(stale)


def open_workdir(
    workdir: pathlib.Path, config: RunSettings, primary: bool, say, latest: bool = True
) -> Checkpoints:
    """The workdir prepared for training (``config.json`` written or checked; every
    process waits for it) and its checkpoints (``latest``: the states' too), incomplete
    saves removed."""
    prepare_workdir(workdir, config, log=say)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("rhnzoo workdir ready")
    ckpt = Checkpoints(workdir, latest=latest)
    if primary:
        ckpt.remove_incomplete(say)
    return ckpt
