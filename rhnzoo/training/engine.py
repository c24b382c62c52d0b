"""The run engine: one training loop for every rhnzoo experiment.

A task's ``train_and_evaluate`` builds its model, state, batches and evaluation and
hands them to :func:`run` as a :class:`Task`; :func:`run` owns the rest, once for all:

* the workdir: ``config.json`` (on resume only a structural setting may not differ),
  one trainer per workdir (process 0's advisory lock), orbax checkpoints of the whole
  state (``checkpoints/``, every epoch and every ``checkpoint_every_steps``; ``best/``;
  an unreadable one moved to ``corrupt/`` and the previous one used), ``metrics.jsonl``
  (:mod:`rhnzoo.training.workdir`);
* SIGTERM / SIGINT: the state is saved and the run stops with one line and
  :class:`Interrupted` (exit status 128 + signal), also during long evaluations;
* the matmul precision ``config.matmul_precision`` around every compiled step and
  evaluation;
* divergence (:class:`rhnzoo.training.progress.LossBook`): a non-finite, blown-up or
  persistently high loss stops the run before anything is saved
  (:class:`TrainingDiverged`);
* one line per epoch and every ``log_every`` steps, tqdm bars, the run's estimated
  time (:mod:`rhnzoo.training.progress`);
* the final evaluation of the best parameters, written to ``results.json``.

Exact resume: the step's PRNG key is ``fold_in(run_key, step)``, batch k of epoch e
is ``task.get_batch(e, k)`` (a pure function), and the checkpoint holds the step, the
task state, the running loss sums, the divergence window and the validation
bookkeeping; ``metrics.jsonl`` is cut back to the checkpoint, so a run killed at any
moment and resumed writes the same outputs as an uninterrupted one (up to timings).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rhnzoo import precision
from rhnzoo.config import RunSettings
from rhnzoo.models import num_params
from rhnzoo.training import progress, signals
from rhnzoo.training.progress import TrainingDiverged
from rhnzoo.training.signals import (
    Interrupted,
    Track,
    catch_signals,
    release_signals,
    stop_requested,
    track,
)
from rhnzoo.training.workdir import (  # noqa: F401  (re-exported: engine.RunError, ...)
    Checkpoints,
    MetricsLog,
    RunError,
    WorkdirLock,
    finished_results,
    prepare_workdir,
    read_metrics,
    restore_params,
    strict,
    write_json,
)

Array = jax.Array
State = Any
Params = Any
PathLike = str | os.PathLike


# ------------------------------------------------------------------------ task, config


@dataclasses.dataclass(frozen=True)
class Task:
    """What a task's ``train_and_evaluate`` hands the engine: its step, batches and
    evaluation (closures over its model and data) and how its run is reported.

    Attributes:
      init_state: ``key -> state``: the task's training state, a pytree with at
        least ``'params'`` (and e.g. ``'opt_state'``, a truncated-BPTT carry),
        already placed on its devices.
      train_step: ``(state, batch, key) -> (state, sums)``, a pure function (the
        engine jit-compiles it with the state donated): one update; ``sums`` is a
        dict of scalar sums over the batch, with ``'loss'`` (summed loss, nats)
        and ``'count'`` (its number of units), and any others to report.
      get_batch: ``(epoch, index) -> batch``, 0-based, a pure function of the two
        (and the task's seed): exact resume depends on it.
      steps_per_epoch: batches per epoch.
      validate: ``(params, track) -> dict`` of floats after every epoch; holds
        ``select`` and, for the divergence check, ``'valid_loss'`` (nats per unit)
        if it can. Long evaluations iterate with ``track`` (progress, signals).
      final_evaluate: ``(params, track) -> dict`` (floats, ints, strings) on the
        best parameters: the run's results.
      select: the key of ``validate``'s dict that picks the best epoch.
      higher_is_better: direction of ``select``.
      train_metrics: ``sums -> dict`` of reported training metrics (e.g.
        ``{'train_ppl': ...}``) from sums over any span of steps.
      chance_loss: loss per unit of a uniform guess (log V, log C, 88 log 2), nats:
        a level of the divergence check (None: the check has only the run's best
        window mean).
      unit: name of one throughput unit in the log (``'tok'``, ``'img'``, ...).
      throughput_key: the key of ``sums`` counted for the throughput (default
        ``'count'``), e.g. ``'tokens'`` when the loss is per sequence.
      learning_rate: ``step -> lr`` for the log, or None.
      final_label: shown in the final line, e.g. ``'eval batch 1'``.
      final_settings: the final evaluation's settings as its results record them (e.g.
        ``{'eval_batch_size': 1}``): a finished run whose ``results.json`` holds other
        values is not trained again but its best checkpoint is evaluated again.
    """

    init_state: Callable[[Array], State]
    train_step: Callable[[State, Any, Array], tuple[State, dict[str, Array]]]
    get_batch: Callable[[int, int], Any]
    steps_per_epoch: int
    validate: Callable[[Params, Track], dict[str, float]]
    final_evaluate: Callable[[Params, Track], dict[str, Any]]
    select: str
    higher_is_better: bool = False
    train_metrics: Callable[[Mapping[str, float]], dict[str, float]] = (
        lambda s: {"train_loss": s["loss"] / max(s["count"], 1.0)}
    )
    chance_loss: float | None = None
    unit: str = "ex"
    throughput_key: str | None = None
    learning_rate: Callable[[int], float] | None = None
    final_label: str = ""
    final_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- run


@dataclasses.dataclass
class RunResult:
    """What :func:`run` returns.

    Attributes:
      results: the final results (also ``results.json``).
      history: the per-epoch records of this process (``metrics.jsonl``'s epoch lines).
      best_params: the best-validation parameters (host arrays).
      diverged: the run stopped on divergence (only with ``on_divergence='stop'``).
    """

    results: dict[str, Any]
    history: list[dict[str, Any]]
    best_params: Params
    diverged: bool = False


def _engine_step(train_step, state, batch, run_key):
    """The task's step with the engine's step count and per-step key ``fold_in(run_key,
    step)``; module-level with ``train_step`` static, so runs of the same task step (a
    random search) share one compiled function."""
    key = jax.random.fold_in(run_key, state["step"])
    task_state, sums = train_step(state["task"], batch, key)
    return {"step": state["step"] + 1, "task": task_state}, sums


def _scalar_like(tree: Any) -> Array:
    """An int32 0 placed like ``tree``: replicated over its mesh if it has one."""
    leaf_sharding = jax.tree.leaves(tree)[0].sharding
    if isinstance(leaf_sharding, jax.sharding.NamedSharding):
        replicated = jax.sharding.NamedSharding(leaf_sharding.mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_callback((), replicated, lambda _: np.zeros((), np.int32))
    return jnp.zeros((), jnp.int32)


def _evaluate_again(task: Task, done: dict | None, say) -> bool:
    """Whether the finished run's results (``done``) were evaluated with other final
    settings than ``task.final_settings`` (then it says which, in one line)."""
    stale = {k: v for k, v in task.final_settings.items()
             if done is not None and done.get(k) != v}  # fmt: skip
    if stale:
        shown = ", ".join(f"{k} {done.get(k)} -> {v}" for k, v in stale.items())
        say(f"finished; evaluating its best checkpoint again ({shown})")
    return bool(stale)


class _Run:
    """One run's state and the steps of :func:`run` (start-up, the loop, the end)."""

    def __init__(self, task: Task, cfg: RunSettings, workdir, ckpt, say, primary: bool):
        self.task, self.cfg, self.workdir, self.ckpt, self.say = task, cfg, workdir, ckpt, say
        self.primary, self.spe = primary, task.steps_per_epoch
        self.total = cfg.total_steps(self.spe)
        self.epochs = -(-self.total // self.spe)  # of this run, the last one maybe partial
        self.metrics = self.bar = None
        self.best_params = None  # in-memory runs keep a host copy of the best parameters
        self.periodic = (progress.Every(cfg.log_every, self.log_train),
                         progress.Every(cfg.checkpoint_every_steps, self.checkpoint))  # fmt: skip

    # ------------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Initial (or restored) state, the compiled step, the metrics log, the first lines."""
        init_key, self.run_key = jax.random.split(jax.random.PRNGKey(self.cfg.seed))
        task_state = self.task.init_state(init_key)
        state = {"step": _scalar_like(task_state), "task": task_state}
        sums_shape = self.compile(state)
        self.state, self.meta = self.restore(state, self.fresh_meta(sums_shape))
        self.step = step = int(self.state["step"])
        self.metrics = MetricsLog(self.workdir, self.cfg.tensorboard, purge_step=step)
        if self.ckpt is not None:
            self.ckpt.drop_best_after(step)
        # Lines past the checkpoint (at step 0: all of an earlier try's) are cut.
        self.metrics.cut_back(step, int(self.meta["validated"]))
        self.report = progress.Report(self.metrics, self.say, self.task, self.spe)
        if step:
            self.say(f"resumed {self.workdir} at step {step}")
        self.params_count = num_params(self.state["task"]["params"])
        self.say(f"{self.params_count:,} parameters, {self.spe:,} steps per epoch, "
                 f"{self.total:,} steps in this run")  # fmt: skip
        self.book.last_saved = step if step else None
        self.pending: collections.deque = collections.deque()  # dispatched, sums not read
        self.t_start, self.elapsed0 = progress.now(), float(self.meta["elapsed"])
        self.pace = progress.Pace()
        self.estimate = progress.Estimate(self.pace, self.total, self.spe, self.say)

    def compile(self, state: State) -> Any:
        """Sets ``step_fn``, the jitted engine step; returns the shapes of its sums."""
        shardings = jax.tree.map(lambda a: a.sharding, state)
        jitted = jax.jit(_engine_step, static_argnums=0, donate_argnums=1,
                         out_shardings=(shardings, None))  # fmt: skip
        self.step_fn = functools.partial(jitted, self.task.train_step)
        return jax.eval_shape(functools.partial(_engine_step, self.task.train_step), state,
                              self.task.get_batch(0, 0), self.run_key)[1]  # fmt: skip

    def fresh_meta(self, sums_shape: Any) -> dict:
        """A new run's bookkeeping (checkpointed with the state); sets ``book`` on it."""
        worst = -math.inf if self.task.higher_is_better else math.inf
        meta = {"validated": np.array(-1), "best": np.array(worst), "best_step": np.array(-1),
                "epoch_sums": None, "window_sums": None, "elapsed": np.array(0.0),
                "recent": np.zeros((progress.DIVERGENCE_WINDOW, 2)),
                "best_mean": np.array(math.inf)}  # fmt: skip
        self.book = progress.LossBook(meta, sums_shape, self.task.chance_loss,
                                      self.cfg.divergence_factor)
        meta["epoch_sums"], meta["window_sums"] = self.book.zeros(), self.book.zeros()
        return meta

    def restore(self, state: State, meta: dict) -> tuple[State, dict]:
        """The latest readable checkpoint's state and bookkeeping, else ``state``, ``meta``."""
        if self.ckpt is None:
            return state, meta
        restored = self.ckpt.restore_latest({"state": state, "meta": meta}, self.say)
        if restored is None:
            return state, meta
        self.book.meta = restored["meta"]
        return restored["state"], restored["meta"]

    # ------------------------------------------------------------------------ the loop

    def train(self) -> str:
        """The training loop from ``self.step`` on; returns why it ended: ``'end'``,
        ``'patience'``. A stop request is honoured at start-up and after every step."""
        self.stop_if_requested()
        if self.epoch_ends_at(self.step) and int(self.meta["validated"]) != self.step:
            self.end_of_epoch()  # its steps were done before a stop
        if self.step >= self.total:
            return "end"
        for epoch in range(self.step // self.spe, self.epochs):
            first = self.step - epoch * self.spe  # > 0: resumed mid-epoch
            if self.cfg.patience and first == 0 and self.out_of_patience():
                return "patience"
            self.start_epoch(epoch, first)
            for index in range(first, self.steps_in(epoch)):
                self.take_step(epoch, index)
                self.stop_if_requested()
            self.end_of_epoch()
        return "end"

    def steps_in(self, epoch: int) -> int:
        """The number of steps of ``epoch`` in this run (the last one may be cut short)."""
        return min(self.spe, self.total - epoch * self.spe)

    def epoch_ends_at(self, step: int) -> bool:
        """Whether ``step`` steps in all complete an epoch of this run (or the run)."""
        return step > 0 and (step % self.spe == 0 or step == self.total)

    def start_epoch(self, epoch: int, first: int) -> None:
        """Zeroes the loss sums (at the epoch's first step) and opens its progress bar."""
        if first == 0:
            self.book.reset_sums()
        self.bar = tqdm(total=self.steps_in(epoch), initial=first, desc=f"epoch {epoch + 1}",
                        disable=not (self.cfg.progress and self.primary), leave=False,
                        dynamic_ncols=True)  # fmt: skip

    def take_step(self, epoch: int, index: int) -> None:
        """Batch ``index`` of ``epoch`` through the compiled step, then the periodic actions."""
        self.state, sums = self.step_fn(self.state, self.task.get_batch(epoch, index), self.run_key)
        self.pending.append((self.step, sums))
        self.step += 1
        self.drain(keep=1)  # the previous step's sums, while this one runs
        self.estimate.first(self.step - len(self.pending))
        self.bar.update(1)
        for action in self.periodic:
            action(self.step)

    def stop_if_requested(self) -> None:
        """After a SIGTERM/SIGINT: saves the state (unless saved at this step) and raises
        :class:`Interrupted`."""
        signum = stop_requested()
        if signum is None:
            return
        self.close_bar()
        self.drain()
        if self.book.last_saved != self.step:
            self.save(self.step)
        raise self.stopped(signum, "in training" if self.step else "at start-up")

    def out_of_patience(self) -> bool:
        """At an epoch's start: whether ``select`` has not improved for ``patience`` epochs."""
        best_epoch = -(-int(self.meta["best_step"]) // self.spe)
        if self.step // self.spe - best_epoch < self.cfg.patience:
            return False
        self.say(f"early stopping: {self.task.select} has not improved for "
                 f"{self.cfg.patience} epochs (best at epoch {best_epoch})")  # fmt: skip
        return True

    # ------------------------------------------------------------ periodic actions, saving

    def log_train(self, at: int) -> None:
        """The training-log line and record of the steps since the last one (every
        ``log_every`` steps), with the run's time left."""
        self.drain()
        per_step = self.pace.seconds_per_step("window")
        eta = (f" | run ETA {progress.duration(self.estimate.time_left(at, per_step))}"
               if per_step is not None and self.total > at else "")  # fmt: skip
        sums, rate = self.book.take("window"), self.pace.take("window")
        self.report.train(at, sums, rate, eta)
        if self.bar is not None:
            self.bar.set_postfix(self.task.train_metrics(
                {k: float(v) for k, v in self.meta["epoch_sums"].items()}))  # fmt: skip

    def checkpoint(self, at: int) -> None:
        """The mid-epoch checkpoint (every ``checkpoint_every_steps``; an epoch's end
        saves anyway)."""
        if not self.epoch_ends_at(at):
            self.drain()
            self.save(at)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def drain(self, keep: int = 0) -> None:
        """Reads the loss sums of all but ``keep`` dispatched steps (one host sync)."""
        while len(self.pending) > keep:
            values = self.book.add(*self.pending.popleft())
            self.pace.step_done(values[self.task.throughput_key or "count"])

    def save(self, at: int) -> None:
        if self.ckpt is not None:
            meta = dict(self.meta, elapsed=np.array(self.elapsed0 + progress.now() - self.t_start))
            self.ckpt.save(at, {"state": self.state, "meta": meta})
            self.book.last_saved = at

    # ------------------------------------------------------------------ an epoch's end

    def end_of_epoch(self) -> None:
        """Validate -> (if better) best checkpoint -> metrics record -> latest checkpoint
        (timed: :meth:`Pace.epoch_end`) -> the revised estimate."""
        self.close_bar()
        self.drain()
        at, started, per_step = self.step, progress.now(), self.pace.seconds_per_step("epoch")
        sums, rate = self.book.take("epoch"), self.pace.take("epoch")  # before validation
        valid = self.validate(at)
        self.keep_if_best(valid[self.task.select], at)
        self.report.epoch(at, sums, rate, valid, self.elapsed0 + progress.now() - self.t_start)
        self.meta["validated"] = np.array(at)
        self.save(at)
        self.pace.take("window")  # the next epoch's steps start a new log window
        self.pace.epoch_end(progress.now() - started, per_step)
        self.estimate.revise(at, per_step)

    def epoch_of(self, at: int) -> int:
        """The 1-based epoch that step count ``at`` (>= 1) falls in."""
        return (at - 1) // self.spe + 1

    def validate(self, at: int) -> dict[str, float]:
        """The task's validation (saved and stopped on a signal), its loss checked."""
        epoch = self.epoch_of(at)
        try:
            valid = self.task.validate(self.state["task"]["params"],
                                       self.tracker(f"valid (epoch {epoch})"))  # fmt: skip
        except Interrupted as e:
            self.save(at)
            raise self.stopped(e.signum, "during validation", at) from None
        if "valid_loss" in valid:
            self.book.check(f"validation loss after epoch {epoch}", valid["valid_loss"], at)
        return valid

    def keep_if_best(self, value: float, at: int) -> None:
        """The best checkpoint (a host copy in memory) if ``value`` is the best so far."""
        meta, params = self.meta, self.state["task"]["params"]
        if value > meta["best"] if self.task.higher_is_better else value < meta["best"]:
            if self.ckpt is not None:
                self.ckpt.save_best(at, params)
            else:
                self.best_params = jax.device_get(params)
            meta["best"], meta["best_step"] = np.array(value), np.array(at)

    def tracker(self, desc: str) -> Track:
        """:func:`track` for the task's evaluations: bars on process 0 when ``progress``."""
        return functools.partial(track, desc=desc, progress=self.cfg.progress and self.primary)

    # ------------------------------------------------------------------------ the end

    def stopped(self, signum: int, where: str, at: int | None = None) -> Interrupted:
        at = self.step if at is None else at
        saved = "nothing saved" if self.ckpt is None else (
            f"checkpoint saved at step {at} in {self.ckpt.latest.directory}; rerun with the "
            "same --workdir to resume")  # fmt: skip
        message = f"stopped by signal {signum} {where} at step {at}; {saved}"
        self.say(message)
        return Interrupted(signum, message)

    def finish(self, stopped: str, diverged: str | None) -> RunResult:
        """The final evaluation of the best parameters -> results.json and the final line."""
        task, step = self.task, self.step
        params = self.state["task"]["params"]
        best_step = int(self.meta["best_step"])
        best = self.best_params if self.ckpt is None else self.ckpt.restore_best(best_step, params)
        if best is None:
            best, best_step = (None, -1) if diverged else (params, step)
        results = {"step": step, "best_step": best_step,
                   f"best_{task.select}": float(self.meta["best"]),
                   "parameters": self.params_count, "stopped": stopped}  # fmt: skip
        if diverged:
            results["diverged"] = diverged
        if best is not None:
            try:
                results.update(task.final_evaluate(best, self.tracker("final evaluation")))
            except Interrupted as e:
                raise self.stopped(e.signum, "during the final evaluation") from None
        # Shown again by an "already finished" rerun.
        results["final"] = progress.final_line(results, task.final_label)
        if self.workdir is not None and self.primary:
            write_json(self.workdir / "results.json", results)
        self.say(results["final"])
        history = [r for r in self.metrics.records if r["kind"] == "epoch"]
        host_best = None if best is None else jax.device_get(best)
        return RunResult(results, history, host_best, diverged is not None)


def run(
    task: Task,
    config: RunSettings,
    workdir: PathLike | None = None,
    *,
    on_divergence: str = "raise",
    log: Callable[[str], None] | None = print,
) -> RunResult:
    """Trains ``task`` and evaluates its best parameters (see the module docstring).

    A run already over at this run length (``results.json`` at the total number of
    steps, or stopped by patience or divergence) is not trained again: one line
    ``already finished: <its final line>`` and its stored results (the workdir is only
    read), unless they were evaluated with other ``task.final_settings`` (then its best
    checkpoint is evaluated again). A longer ``max_steps`` / ``max_epochs`` extends it.

    Args:
      task: the experiment's step, batches and evaluation.
      config: every setting of the run; the engine reads its :class:`RunSettings` (run
        length from ``epochs``, reporting, matmul precision). Written to ``config.json``
        and checked against it on resume (:meth:`rhnzoo.config.Config.conflicts`).
      workdir: run directory (``config.json``, ``metrics.jsonl``, ``checkpoints/``,
        ``best/``, ``results.json``), held by process 0's :class:`WorkdirLock`; rerunning
        with it resumes exactly. None: in memory (nothing written), e.g. a trial.
      on_divergence: ``'raise'`` (:class:`TrainingDiverged`) or ``'stop'`` (end the run,
        evaluate the best parameters so far, ``RunResult.diverged``).
      log: receives every printed line; None: silent.

    Returns:
      :class:`RunResult` (``results['stopped']``: ``'end'``, ``'patience'`` or
      ``'diverged'``).

    Raises:
      ValueError: an incompatible or unusable workdir.
      TrainingDiverged: the loss became non-finite or too high (``'raise'``).
      Interrupted: a SIGTERM/SIGINT arrived; the state was saved first.
      RunError: another process is training in the workdir, or a file could not be
        written.
    """
    primary = jax.process_index() == 0  # prints and writes files in a multi-process run
    say = log if log is not None and primary else (lambda line: None)
    installed_here = not signals.installed()
    catch_signals()
    lock = ckpt = r = done = None
    again = False
    try:
        if workdir is not None:
            workdir = pathlib.Path(workdir).absolute()
            if (workdir / "results.json").is_file():  # a finished run is read, never written
                prepare_workdir(workdir, config, check_only=True)
                done = finished_results(workdir, config.total_steps(task.steps_per_epoch))
                again = _evaluate_again(task, done, say)
                if done is not None and not again:
                    final = done.get("final") or progress.final_line(done, task.final_label)
                    say(f"already finished: {final}")
                    return RunResult(done, read_metrics(workdir), restore_params(workdir),
                                     "diverged" in done)  # fmt: skip
            lock = WorkdirLock(workdir, warn=say) if primary else None
            ckpt = _open_workdir(workdir, config, primary, say)
        r = _Run(task, config, workdir, ckpt, say, primary)
        with precision.context(config.matmul_precision):  # every step and evaluation traced here
            r.start()
            if again:  # a finished run, evaluated with other final settings; no training
                return r.finish(done.get("stopped", "end"), done.get("diverged"))
            return _train(r, on_divergence, say)
    finally:
        if r is not None and r.metrics is not None:
            r.metrics.close()
        if ckpt is not None:
            ckpt.close()
        if lock is not None:
            lock.release()
        if installed_here:
            release_signals()


def _open_workdir(workdir: pathlib.Path, config: RunSettings, primary: bool, say) -> Checkpoints:
    """The workdir prepared for training (``config.json`` written or checked; every
    process waits for it) and its checkpoints, incomplete saves removed."""
    prepare_workdir(workdir, config, log=say)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("rhnzoo workdir ready")
    ckpt = Checkpoints(workdir)
    for tmp in ckpt.remove_incomplete() if primary else ():
        say(f"removed {tmp}: a checkpoint save that did not finish")
    return ckpt


def _train(r: _Run, on_divergence: str, say) -> RunResult:
    """The training loop, then the final evaluation (also after a divergence with
    ``on_divergence='stop'``)."""
    diverged = None
    try:
        stopped = r.train()
    except TrainingDiverged as e:
        if on_divergence != "stop":
            raise
        diverged, stopped = str(e), "diverged"
        say(f"stopped: {e}")
    finally:
        r.close_bar()
    return r.finish(stopped, diverged)
