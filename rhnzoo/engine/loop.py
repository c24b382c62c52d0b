"""The run engine: one training loop for every rhnzoo experiment.

A task's ``train_and_evaluate`` builds its model, state, batches and evaluation and
hands them to :func:`run` as a :class:`Task`; :func:`run` owns the rest, once for all:

* the workdir: ``config.json`` (on resume only a structural setting may not differ),
  one trainer per workdir (process 0's advisory lock), orbax checkpoints of the whole
  state (``checkpoints/``, every epoch and every ``checkpoint_every_steps``; ``best/``;
  an unreadable one moved to ``corrupt/`` and the previous one used), ``metrics.jsonl``
  (:mod:`rhnzoo.engine.workdir`);
* SIGTERM / SIGINT: the state is saved and the run stops with one line and
  :class:`Interrupted` (exit status 128 + signal), also during long evaluations;
* the matmul precision ``config.matmul_precision`` around every compiled step and
  evaluation;
* divergence (:class:`rhnzoo.engine.progress.LossBook`): a non-finite, blown-up or
  persistently high loss stops the run before anything is saved
  (:class:`TrainingDiverged`);
* one line per epoch and every ``log_every`` steps, tqdm bars, the run's estimated
  time (:mod:`rhnzoo.engine.progress`);
* the final evaluation of the best parameters, written to ``results.json``.

:func:`run` with ``seeds=K`` trains K seeds of one config as one program by the same
loop: the states stacked on a leading seed axis, the step ``jax.vmap``-ped
(:mod:`rhnzoo.engine.stacking`), each seed with its own records, verdicts and workdir.

Exact resume: the step's PRNG key is ``fold_in(run_key, step)``, batch k of epoch e
is ``task.train_batch(seed, e, k)`` (a pure function), and the checkpoint holds the step, the
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rhnzoo import precision
from rhnzoo.config import RunSettings
from rhnzoo.engine import evaluate, progress, signals, stacking
from rhnzoo.engine.evaluate import Report
from rhnzoo.engine.progress import TrainingDiverged
from rhnzoo.engine.signals import (
    Interrupted,
    Track,
    catch_signals,
    release_signals,
    stop_requested,
    track,
)
from rhnzoo.engine.workdir import (  # noqa: F401  (re-exported: engine.RunError, ...)
    Checkpoints,
    MetricsLog,
    RunError,
    WorkdirLock,
    finished_results,
    prepare_workdir,
    read_json,
    read_metrics,
    restore_params,
    seed_name,
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
    """What a task's ``train_and_evaluate`` hands the engine: its pure step, batches and
    evaluation step (closures over its model and data) and how its run is reported.

    Attributes:
      init_state: ``key -> state``: the task's training state, a pytree with at
        least ``'params'`` (and e.g. ``'opt_state'``, a truncated-BPTT carry),
        already placed on its devices.
      train_step: ``(state, batch, key) -> (state, sums)``, a pure function (the
        engine jit-compiles it with the state donated): one update; ``sums`` is a
        dict of scalar sums over the batch, with ``'loss'`` (summed loss, nats)
        and ``'count'`` (its number of units), and any others to report.
      train_batch: ``(seed, epoch, index) -> batch``, batch ``index`` (0-based) of
        ``epoch`` (0-based) in the data order of ``seed`` (the run's ``config.seed``), a
        pure function of the three: exact resume depends on it.
      steps_per_epoch: batches per epoch.
      eval_step: ``(params, batch) -> sums``, pure (the engine jit-compiles it): a dict
        of scalar sums over an evaluation batch, e.g. ``{'loss': Σ nats, 'count':
        units}``; with ``eval_carry``, ``(params, batch, carry) -> (sums, carry)``, the
        carry passed on from batch to batch of a split (e.g. the LM's state).
      eval_batches: ``(split, final) -> batches`` (a sequence, e.g.
        :class:`rhnzoo.engine.evaluate.Batches`): the evaluation batches of ``split``
        (a name in ``report.validation`` or ``report.final``), placed on the devices;
        ``final``: the final evaluation's protocol (e.g. the LM's batch 1), else the
        validation's. The same for every seed.
      report: how the run is reported (:class:`rhnzoo.engine.evaluate.Report`: the
        metrics of the sums, the selected metric, units, labels, learning rate...).
      batch_axes: K stacked seeds' training batch: which leaves are stacked on a new
        leading seed axis (0; ragged leaves zero-padded at their ends to the largest)
        and which are shared by all seeds (None: the first seed's, e.g. a whole training
        set kept once on the devices), a prefix of the batch's pytree in tuples, as
        ``jax.vmap``'s ``in_axes`` (:func:`rhnzoo.engine.stacking.stack`).
      eval_carry: ``(split, final) -> carry``, the carry at the start of a split's
        evaluation (placed like its batches' rows); None: ``eval_step`` has no carry.
    """

    init_state: Callable[[Array], State]
    train_step: Callable[[State, Any, Array], tuple[State, dict[str, Array]]]
    train_batch: Callable[[int, int, int], Any]
    steps_per_epoch: int
    eval_step: Callable[..., Any]
    eval_batches: Callable[[str, bool], Sequence[Any]]
    report: Report
    batch_axes: Any = 0
    eval_carry: Callable[[str, bool], Any] | None = None


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


class _Seed:
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
        self.again = _evaluate_again(task, self.done, self.say)

    def already_finished(self, task: Task) -> RunResult:
        final = self.done.get("final") or progress.final_line(self.done, task.report.final_label)
        self.say(f"already finished: {final}")
        return RunResult(
            self.done,
            read_metrics(self.workdir),
            restore_params(self.workdir),
            "diverged" in self.done,
        )

    def open(self, primary: bool, stacked: bool) -> None:
        """The workdir locked and prepared for training, its checkpoints opened (stacked:
        the best ones only)."""
        if self.workdir is not None:
            self.lock = WorkdirLock(self.workdir, warn=self.say) if primary else None
            self.ckpt = _open_workdir(
                self.workdir, self.config, primary, self.say, latest=not stacked
            )

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.ckpt is not None:
            self.ckpt.close()
        if self.lock is not None:
            self.lock.release()


def _evaluate_again(task: Task, done: dict | None, say) -> bool:
    """Whether the finished run's results (``done``) were evaluated with other final
    settings than ``task.report.final_settings`` (then it says which, in one line)."""
    stale = {
        k: v for k, v in task.report.final_settings.items() if done is not None and done.get(k) != v
    }
    if stale:
        shown = ", ".join(f"{k} {done.get(k)} -> {v}" for k, v in stale.items())
        say(f"finished; evaluating its best checkpoint again ({shown})")
    return bool(stale)


class _Run:
    """One run's state and the steps of :func:`run` (start-up, the loop, the end): one
    seed, or K seeds stacked along a leading axis of the state (:func:`run`'s ``seeds``)."""

    def __init__(
        self,
        task: Task,
        seeds: list[_Seed],
        latest: Checkpoints | None,
        say,
        primary: bool,
        on_divergence: str,
    ):
        self.task, self.seeds, self.latest, self.say = task, seeds, latest, say
        self.report = task.report
        self.cfg, self.stacked = seeds[0].config, len(seeds) > 1
        self.primary, self.on_divergence, self.spe = primary, on_divergence, task.steps_per_epoch
        self.total = self.cfg.total_steps(self.spe)
        self.epochs = -(-self.total // self.spe)  # of this run, the last one maybe partial
        self.bar = None
        self.last_saved: int | None = None
        self.periodic = (
            progress.Every(self.cfg.log_every, self.log_train),
            progress.Every(self.cfg.checkpoint_every_steps, self.checkpoint),
        )

    @property
    def active(self) -> list[_Seed]:
        return [s for s in self.seeds if s.active]

    # ------------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Initial (or restored) state, the compiled step, the metrics logs, the first lines."""
        keys = [jax.random.split(jax.random.PRNGKey(s.config.seed)) for s in self.seeds]
        states = [self.task.init_state(init_key) for init_key, _ in keys]
        task_state = stacking.stack(states) if self.stacked else states[0]
        self.run_key = stacking.stack([k for _, k in keys]) if self.stacked else keys[0][1]
        state = {"step": _scalar_like(task_state), "task": task_state}
        sums_shape = self.compile(state)
        self.state = self.restore(state, [self.fresh_meta(s, sums_shape) for s in self.seeds])
        self.step = step = int(self.state["step"])
        self.last_saved = step if step else None
        for seed in self.active if self.latest is not None else ():
            seed.ckpt.drop_best_after(step)
        for seed in self.seeds:
            seed.book.last_saved = self.last_saved
            seed.metrics = MetricsLog(
                seed.workdir if seed.active else None, self.cfg.tensorboard, purge_step=step
            )
            # Lines past the checkpoint (at step 0: all of an earlier try's) are cut.
            seed.metrics.cut_back(step, int(seed.meta["validated"]))
            seed.report = progress.Report(seed.metrics, seed.say, self.report, self.spe)
        self.set_mask()
        if step:
            where = self.latest.workdir if self.stacked else self.seeds[0].workdir
            self.say(f"resumed {where} at step {step}")
        self.params_count = sum(np.size(a) for a in jax.tree.leaves(task_state["params"]))
        self.params_count //= len(self.seeds)
        self.say(
            f"{self.params_count:,} parameters, {self.spe:,} steps per epoch, "
            f"{self.total:,} steps in this run"
            + (f", {len(self.seeds)} seeds stacked" if self.stacked else "")
        )
        self.pending: collections.deque = collections.deque()  # dispatched, sums not read
        self.t_start, self.elapsed0 = progress.now(), float(self.seeds[0].meta["elapsed"])
        self.pace = progress.Pace()
        self.estimate = progress.Estimate(self.pace, self.total, self.spe, self.say)

    def compile(self, state: State) -> Any:
        """Sets ``step_fn``, the jitted engine step; returns the shapes of its sums."""
        shardings = jax.tree.map(lambda a: a.sharding, state)
        if self.stacked:
            fn = functools.partial(
                stacking.stacked_step, self.task.train_step, self.task.batch_axes
            )
            jitted = jax.jit(
                stacking.stacked_step,
                static_argnums=(0, 1),
                donate_argnums=2,
                out_shardings=(shardings, None),
            )
            step_fn = functools.partial(jitted, self.task.train_step, self.task.batch_axes)
            self.step_fn = lambda state, batch, key: step_fn(state, batch, key, self.mask)
            mask = jnp.ones(len(self.seeds), bool)
            return jax.eval_shape(fn, state, self.batch(0, 0), self.run_key, mask)[1]
        jitted = jax.jit(
            _engine_step, static_argnums=0, donate_argnums=1, out_shardings=(shardings, None)
        )
        self.step_fn = functools.partial(jitted, self.task.train_step)
        return jax.eval_shape(
            functools.partial(_engine_step, self.task.train_step),
            state,
            self.batch(0, 0),
            self.run_key,
        )[1]

    def batch(self, epoch: int, index: int) -> Any:
        """Batch ``index`` of ``epoch``: each seed's, stacked (:attr:`Task.batch_axes`)."""
        get = self.task.train_batch
        if not self.stacked:
            return get(self.cfg.seed, epoch, index)
        batches = [get(s.config.seed, epoch, index) for s in self.seeds]
        return stacking.stack(batches, self.task.batch_axes)

    def set_mask(self) -> None:
        """The stacked step's ``active`` argument: which seeds still train."""
        self.mask = jnp.asarray([s.active for s in self.seeds]) if self.stacked else None

    def fresh_meta(self, seed: _Seed, sums_shape: Any) -> dict:
        """A new run's bookkeeping of ``seed`` (checkpointed with the state); sets its book."""
        worst = -math.inf if self.report.higher_is_better else math.inf
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
        seed.book = progress.LossBook(
            meta, sums_shape, self.report.chance_loss, self.cfg.divergence_factor
        )
        meta["epoch_sums"], meta["window_sums"] = seed.book.zeros(), seed.book.zeros()
        seed.meta = meta
        return meta

    def restore(self, state: State, metas: list[dict]) -> State:
        """The latest readable checkpoint's state (and each seed's bookkeeping), else ``state``."""
        if self.latest is None:
            return state
        like = {"state": state, "meta": metas if self.stacked else metas[0]}
        restored = self.latest.restore_latest(like, self.say)
        if restored is None:
            return state
        metas = restored["meta"] if self.stacked else [restored["meta"]]
        for seed, meta in zip(self.seeds, metas, strict=True):
            seed.meta = seed.book.meta = meta
        return restored["state"]

    # ------------------------------------------------------------------------ the loop

    def train(self) -> None:
        """The training loop from ``self.step`` on, until the run's end or until no seed
        trains (patience, divergence). A stop request is honoured at start-up and after
        every step."""
        self.stop_if_requested()
        if self.epoch_ends_at(self.step) and any(
            int(s.meta["validated"]) != self.step for s in self.active
        ):
            self.end_of_epoch()  # its steps were done before a stop
        if self.step >= self.total:
            return
        for epoch in range(self.step // self.spe, self.epochs):
            first = self.step - epoch * self.spe  # > 0: resumed mid-epoch
            if self.cfg.patience and first == 0:
                for seed in self.active:
                    if self.out_of_patience(seed):
                        self.finish(seed, "patience")
            if not self.active:
                return
            self.start_epoch(epoch, first)
            for index in range(first, self.steps_in(epoch)):
                self.take_step(epoch, index)
                self.stop_if_requested()
                if not self.active:
                    return
            self.end_of_epoch()

    def steps_in(self, epoch: int) -> int:
        """The number of steps of ``epoch`` in this run (the last one may be cut short)."""
        return min(self.spe, self.total - epoch * self.spe)

    def epoch_ends_at(self, step: int) -> bool:
        """Whether ``step`` steps in all complete an epoch of this run (or the run)."""
        return step > 0 and (step % self.spe == 0 or step == self.total)

    def start_epoch(self, epoch: int, first: int) -> None:
        """Zeroes the loss sums (at the epoch's first step) and opens its progress bar."""
        if first == 0:
            for seed in self.active:
                seed.book.reset_sums()
        self.bar = tqdm(
            total=self.steps_in(epoch),
            initial=first,
            desc=f"epoch {epoch + 1}",
            disable=not (self.cfg.progress and self.primary),
            leave=False,
            dynamic_ncols=True,
        )

    def take_step(self, epoch: int, index: int) -> None:
        """Batch ``index`` of ``epoch`` through the compiled step, then the periodic actions."""
        self.state, sums = self.step_fn(self.state, self.batch(epoch, index), self.run_key)
        self.pending.append((self.step, sums))
        self.step += 1
        self.drain(keep=1)  # the previous step's sums, while this one runs
        if not self.active:  # the last seed diverged
            return
        self.estimate.first(self.step - len(self.pending))
        self.bar.update(1)
        for action in self.periodic:
            action(self.step)

    def stop_if_requested(self) -> None:
        """After a SIGTERM/SIGINT: saves the state (unless saved at this step) and raises
        :class:`Interrupted` (unless every seed has just stopped)."""
        signum = stop_requested()
        if signum is None:
            return
        self.close_bar()
        self.drain()
        if not self.active:
            return
        if self.last_saved != self.step:
            self.save(self.step)
        raise self.stopped(signum, "in training" if self.step else "at start-up")

    def out_of_patience(self, seed: _Seed) -> bool:
        """At an epoch's start: whether ``select`` has not improved for ``patience`` epochs."""
        best_epoch = -(-int(seed.meta["best_step"]) // self.spe)
        if self.step // self.spe - best_epoch < self.cfg.patience:
            return False
        seed.say(
            f"early stopping: {self.report.select} has not improved for "
            f"{self.cfg.patience} epochs (best at epoch {best_epoch})"
        )
        return True

    def diverged(self, seed: _Seed, e: TrainingDiverged) -> None:
        """``seed`` diverged: raised again (``on_divergence='raise'``), or the seed stops."""
        if self.on_divergence != "stop":
            raise e
        seed.say(f"stopped: {e}")
        if len(self.active) == 1:
            self.close_bar()
        self.finish(seed, "diverged", str(e))

    # ------------------------------------------------------------ periodic actions, saving

    def log_train(self, at: int) -> None:
        """The training-log line and record of the steps since the last one (every
        ``log_every`` steps), with the run's time left."""
        self.drain()
        per_step = self.pace.seconds_per_step("window")
        eta = (
            f" | run ETA {progress.duration(self.estimate.time_left(at, per_step))}"
            if per_step is not None and self.total > at
            else ""
        )
        rate = self.pace.take("window")
        for seed in self.active:
            seed.report.train(at, seed.book.take("window"), rate, eta)
        if self.bar is not None and self.active:
            self.bar.set_postfix(
                self.report.train_metrics(
                    {k: float(v) for k, v in self.active[0].meta["epoch_sums"].items()}
                )
            )

    def checkpoint(self, at: int) -> None:
        """The mid-epoch checkpoint (every ``checkpoint_every_steps``; an epoch's end
        saves anyway)."""
        if not self.epoch_ends_at(at):
            self.drain()
            if self.active:
                self.save(at)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def drain(self, keep: int = 0) -> None:
        """Reads the loss sums of all but ``keep`` dispatched steps (one host sync each);
        a seed whose loss diverged stops (:meth:`diverged`)."""
        units_key = self.report.throughput_key or "count"
        while len(self.pending) > keep:
            at, sums = self.pending.popleft()
            sums = jax.device_get(sums) if self.stacked else sums
            units = []
            for seed in self.active:
                try:
                    values = seed.book.add(at, stacking.row(sums, seed.k) if self.stacked else sums)
                except TrainingDiverged as e:
                    self.diverged(seed, e)
                    continue
                units.append(values[units_key])
            self.pace.step_done(sum(units) / max(len(units), 1))  # per seed

    def save(self, at: int) -> None:
        if self.latest is not None:
            elapsed = np.array(self.elapsed0 + progress.now() - self.t_start)
            metas = [dict(s.meta, elapsed=elapsed) for s in self.seeds]
            self.latest.save(at, {"state": self.state, "meta": metas if self.stacked else metas[0]})
            self.last_saved = at
            for seed in self.seeds:
                seed.book.last_saved = at

    # ------------------------------------------------------------------ an epoch's end

    def end_of_epoch(self) -> None:
        """Validate -> (if better) best checkpoint -> metrics record, for each seed ->
        latest checkpoint (timed: :meth:`Pace.epoch_end`) -> the revised estimate."""
        self.close_bar()
        self.drain()
        at, started, per_step = self.step, progress.now(), self.pace.seconds_per_step("epoch")
        rate = self.pace.take("epoch")
        sums = {seed.k: seed.book.take("epoch") for seed in self.active}  # before validation
        valids = self.validate(at)
        for seed in self.active:
            valid = valids[seed.k]
            if not self.valid_loss_checked(seed, valid, at):
                continue  # it diverged
            self.keep_if_best(seed, valid[self.report.select], at)
            seed.report.epoch(
                at, sums[seed.k], rate, valid, self.elapsed0 + progress.now() - self.t_start
            )
            seed.meta["validated"] = np.array(at)
        if self.active:
            self.save(at)
        self.pace.take("window")  # the next epoch's steps start a new log window
        self.pace.epoch_end(progress.now() - started, per_step)
        self.estimate.revise(at, per_step)

    def epoch_of(self, at: int) -> int:
        """The 1-based epoch that step count ``at`` (>= 1) falls in."""
        return (at - 1) // self.spe + 1

    def params(self, seed: _Seed) -> Params:
        params = self.state["task"]["params"]
        return stacking.row(params, seed.k) if self.stacked else params

    def validate(self, at: int) -> dict[int, dict[str, float]]:
        """The validation of each training seed (saved and stopped on a signal): K stacked
        seeds at once (:func:`rhnzoo.engine.evaluate.splits`)."""
        track = self.tracker("valid")
        try:
            rows = evaluate.splits(
                self.task,
                self.state["task"]["params"],
                final=False,
                seeds=len(self.seeds) if self.stacked else None,
                track=track,
            )
            return {seed.k: rows[seed.k] for seed in self.active}
        except Interrupted as e:
            self.save(at)
            raise self.stopped(e.signum, "during validation", at) from None

    def valid_loss_checked(self, seed: _Seed, valid: Mapping[str, float], at: int) -> bool:
        """Whether ``seed``'s validation loss passes the divergence check (else it stops)."""
        if "valid_loss" in valid:
            try:
                seed.book.check(
                    f"validation loss after epoch {self.epoch_of(at)}", valid["valid_loss"], at
                )
            except TrainingDiverged as e:
                self.diverged(seed, e)
                return False
        return True

    def keep_if_best(self, seed: _Seed, value: float, at: int) -> None:
        """The best checkpoint (a host copy in memory) if ``value`` is the best so far."""
        meta = seed.meta
        if value > meta["best"] if self.report.higher_is_better else value < meta["best"]:
            if seed.ckpt is not None:
                seed.ckpt.save_best(at, self.params(seed))
            else:
                seed.best_params = jax.device_get(self.params(seed))
            meta["best"], meta["best_step"] = np.array(value), np.array(at)

    def tracker(self, desc: str) -> Track:
        """:func:`track` for the task's evaluations: bars on process 0 when ``progress``."""
        return functools.partial(track, desc=desc, progress=self.cfg.progress and self.primary)

    # ------------------------------------------------------------------------ the end

    def stopped(self, signum: int, where: str, at: int | None = None) -> Interrupted:
        at = self.step if at is None else at
        saved = (
            "nothing saved"
            if self.latest is None
            else (
                f"checkpoint saved at step {at} in {self.latest.latest.directory}; rerun with the "
                "same --workdir to resume"
            )
        )
        message = f"stopped by signal {signum} {where} at step {at}; {saved}"
        self.say(message)
        return Interrupted(signum, message)

    def finish(self, seed: _Seed, stopped: str, diverged: str | None = None) -> None:
        """The final evaluation of ``seed``'s best parameters -> results.json, the final
        line and ``seed.result``; a seed stopped early no longer trains."""
        task, params, record = self.task, self.params(seed), seed.done or {}
        step, best_step = (
            record.get("step", self.step),
            record.get("best_step", int(seed.meta["best_step"])),
        )
        best = seed.best_params if seed.ckpt is None else seed.ckpt.restore_best(best_step, params)
        if best is None:
            best, best_step = (None, -1) if diverged else (params, step)
        results = {
            "step": step,
            "best_step": best_step,
            f"best_{task.report.select}": record.get(
                f"best_{task.report.select}", float(seed.meta["best"])
            ),
            "parameters": self.params_count,
            "stopped": stopped,
        }
        if diverged:
            results["diverged"] = diverged
        if best is not None:
            try:
                track = self.tracker("final")
                results.update(task.report.final_settings)
                results.update(evaluate.splits(task, best, final=True, track=track)[0])
            except Interrupted as e:
                raise self.stopped(e.signum, "during the final evaluation") from None
        # Shown again by an "already finished" rerun.
        results["final"] = progress.final_line(results, task.report.final_label)
        if seed.workdir is not None and self.primary:
            write_json(seed.workdir / "results.json", results)
        seed.say(results["final"])
        history = [r for r in seed.metrics.records if r["kind"] == "epoch"]
        host_best = None if best is None else jax.device_get(best)
        seed.result = RunResult(results, history, host_best, diverged is not None)
        self.set_mask()


def run(
    task: Task,
    config: RunSettings,
    workdir: PathLike | None = None,
    *,
    seeds: int | None = None,
    on_divergence: str = "raise",
    log: Callable[[str], None] | None = print,
) -> RunResult | list[RunResult]:
    """Trains ``task`` and evaluates its best parameters (see the module docstring).

    A run already over at this run length (``results.json`` at the total number of
    steps, or stopped by patience or divergence) is not trained again: one line
    ``already finished: <its final line>`` and its stored results (the workdir is only
    read), unless they were evaluated with other ``report.final_settings`` (then its best
    checkpoint is evaluated again). A longer ``max_steps`` / ``max_epochs`` extends it.

    With ``seeds`` = K, K runs of ``config`` with seeds ``config.seed``, ``+ 1``, ...
    train as one program: their states stacked along a leading seed axis, the task's
    step ``jax.vmap``-ped over it and compiled once (:attr:`Task.batch_axes` stacks their
    batches). Each seed gets what a run of
    ``config.replace(seed=...)`` in its own workdir gives (to float32 rounding: the
    vmapped matmuls may sum in another order): its initialisation, dropout keys and data
    order; its lines (``[seed s] ...``); its validation, best checkpoint, early stopping
    and divergence verdict (a seed that stops is evaluated and recorded then and no
    longer changes; the others go on); its ``config.json``, ``metrics.jsonl``,
    ``best/`` and ``results.json``, in ``workdir`` for the first seed and in
    ``<workdir>_s<k>`` (:func:`seed_name`) for seed k, where single runs and the
    multi-run tables read them. The stacked state is checkpointed in
    ``<workdir>/stacked/`` (:data:`rhnzoo.engine.stacking.STACKED`), so rerunning with the
    same ``seeds`` resumes exactly; seeds already finished are carried along untrained.
    The validation evaluates the K seeds at once (:mod:`rhnzoo.engine.evaluate`, equal to
    a single run's), the final evaluations seed by seed.

    Args:
      task: the experiment's step, batches and evaluation.
      config: every setting of the run; the engine reads its :class:`RunSettings` (run
        length from ``epochs``, reporting, matmul precision). Written to ``config.json``
        and checked against it on resume (:meth:`rhnzoo.config.Config.conflicts`).
      workdir: run directory (``config.json``, ``metrics.jsonl``, ``checkpoints/``,
        ``best/``, ``results.json``), held by process 0's :class:`WorkdirLock`; rerunning
        with it resumes exactly. None: in memory (nothing written), e.g. a trial.
      seeds: None: one run; K >= 1: K seeds stacked (K = 1: one run, unstacked).
      on_divergence: ``'raise'`` (:class:`TrainingDiverged`) or ``'stop'`` (end the run,
        or the seed, evaluate the best parameters so far, ``RunResult.diverged``).
      log: receives every printed line; None: silent.

    Returns:
      :class:`RunResult` (``results['stopped']``: ``'end'``, ``'patience'`` or
      ``'diverged'``); with ``seeds``, a list of the K seeds' in order.

    Raises:
      ValueError: ``seeds`` < 1, an incompatible or unusable workdir, a stacked
        checkpoint of other seeds.
      TrainingDiverged: the loss became non-finite or too high (``'raise'``).
      Interrupted: a SIGTERM/SIGINT arrived; the state was saved first.
      RunError: another process is training in the workdir, or a file could not be
        written.
    """
    if seeds is None:
        return _run(task, [config], workdir, on_divergence, log)[0]
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    root = None if workdir is None else pathlib.Path(workdir).absolute()
    configs = [stacking.seed_config(config, k, root) for k in range(seeds)]
    return _run(task, configs, workdir, on_divergence, log)


def _run(
    task: Task,
    configs: list[RunSettings],
    workdir: PathLike | None,
    on_divergence: str,
    log: Callable[[str], None] | None,
) -> list[RunResult]:
    """:func:`run` of one config, or of K seeds' configs stacked."""
    primary = jax.process_index() == 0  # prints and writes files in a multi-process run
    say = log if log is not None and primary else (lambda line: None)
    stacked = len(configs) > 1
    root = None if workdir is None else pathlib.Path(workdir).absolute()
    seeds = [
        _Seed(
            k,
            c,
            None if root is None else root.with_name(seed_name(root.name, k)),
            (lambda line, s=c.seed: say(f"[seed {s}] {line}")) if stacked else say,
        )
        for k, c in enumerate(configs)
    ]
    installed_here = not signals.installed()
    catch_signals()
    latest = r = None
    try:
        for seed in seeds:
            seed.read_finished(task)
        if all(s.done is not None and not s.again for s in seeds):
            return [s.already_finished(task) for s in seeds]
        if root is not None:
            for seed in seeds:
                seed.open(primary, stacked)
            latest = (
                stacking.open_stack(root / stacking.STACKED, configs, primary, say)
                if stacked
                else seeds[0].ckpt
            )
        r = _Run(task, seeds, latest, say, primary, on_divergence)
        with precision.context(
            configs[0].matmul_precision
        ):  # every step and evaluation traced here
            r.start()
            for seed in seeds:
                if seed.done is not None:
                    if seed.again:  # evaluated with other final settings; no training
                        r.finish(seed, seed.done.get("stopped", "end"), seed.done.get("diverged"))
                    else:
                        seed.result = seed.already_finished(task)
            try:
                r.train()
            finally:
                r.close_bar()
            for seed in r.active:
                r.finish(seed, "end")
            return [s.result for s in seeds]
    finally:
        for seed in seeds:
            seed.close()
        if stacked and latest is not None:
            latest.close()
        if installed_here:
            release_signals()


def _open_workdir(
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
    for tmp in ckpt.remove_incomplete() if primary else ():
        say(f"removed {tmp}: a checkpoint save that did not finish")
    return ckpt
