"""The run engine: one training loop for every rhnzoo experiment.

A task's ``train_and_evaluate`` hands its model's pure steps and batches to :func:`run` as
a :class:`Task`; :func:`run` owns the rest, once for all: the workdir and its checkpoints
(:mod:`rhnzoo.engine.workdir`), SIGTERM / SIGINT (:class:`Interrupted`), the matmul
precision ``config.matmul_precision`` around every compiled step and evaluation,
divergence (:class:`rhnzoo.engine.progress.LossBook`), the lines, records and estimates
(:mod:`rhnzoo.engine.progress`), the validation after every epoch and the final evaluation
of the best parameters (:mod:`rhnzoo.engine.evaluate`). docs/engine.md describes it whole.

The loop is written once against the seeds' layout (:mod:`rhnzoo.engine.stacking`: one
seed is its K = 1 case, every operation the identity), chosen once with the compiled
programs.

Exact resume: the step's PRNG key is ``fold_in(run_key, step)``, batch k of epoch e
is ``task.train_batch(seed, e, k)`` (a pure function), and the checkpoint holds the step,
the task state, the running loss sums, the divergence window and the validation
bookkeeping; ``metrics.jsonl`` is cut back to the checkpoint, so a run killed at any
moment and resumed writes the same outputs as an uninterrupted one (up to timings).
"""

from __future__ import annotations

import collections
import functools
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from rhnzoo import precision
from rhnzoo.config import RunSettings
from rhnzoo.engine import compiled, evaluate, progress, signals, stacking
from rhnzoo.engine.progress import TrainingDiverged
from rhnzoo.engine.seeds import Seed
from rhnzoo.engine.signals import (
    Interrupted,
    Track,
    catch_signals,
    release_signals,
    stop_requested,
    track,
)
from rhnzoo.engine.task import RunResult, Task
from rhnzoo.engine.workdir import Checkpoints, MetricsLog, write_json

Array = jax.Array
State = Any
Params = Any
PathLike = str | os.PathLike


class _Run:
    """One run's state and the steps of :func:`run` (start-up, the loop, an epoch's end,
    the end): its seeds in ``layout`` (one seed, or K stacked along a leading axis of the
    state, :func:`run`'s ``seeds``)."""

    def __init__(
        self,
        task: Task,
        seeds: list[Seed],
        layout: stacking.One | stacking.Stacked,
        latest: Checkpoints | None,
        say,
        primary: bool,
        on_divergence: str,
    ):
        self.task, self.seeds, self.layout, self.latest, self.say = task, seeds, layout, latest, say
        self.report = task.report
        self.cfg = seeds[0].config
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
    def active(self) -> list[Seed]:
        return [s for s in self.seeds if s.active]

    # ------------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Initial (or restored) state, the compiled step, the metrics logs, the first lines."""
        keys = [jax.random.split(jax.random.PRNGKey(s.config.seed)) for s in self.seeds]
        states = [self.task.init_state(init_key) for init_key, _ in keys]
        task_state = self.layout.stack(states)
        self.run_key = self.layout.stack([k for _, k in keys])
        state = {"step": compiled.scalar_like(task_state), "task": task_state}
        sums_shape = self.compile(state)
        self.state = self.restore(
            state,
            [s.fresh_meta(self.report, sums_shape, self.cfg.divergence_factor) for s in self.seeds],
        )
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
            seed.report = progress.Journal(seed.metrics, seed.say, self.report, self.spe)
        self.set_mask()
        if step:
            self.say(f"resumed {self.latest.workdir} at step {step}")
        self.params_count = sum(np.size(a) for a in jax.tree.leaves(task_state["params"]))
        self.params_count //= len(self.seeds)
        self.say(
            f"{self.params_count:,} parameters, {self.spe:,} steps per epoch, "
            f"{self.total:,} steps in this run" + self.layout.shown
        )
        self.pending: collections.deque = collections.deque()  # dispatched, sums not read
        self.t_start, self.elapsed0 = progress.now(), float(self.seeds[0].meta["elapsed"])
        self.pace = progress.Pace()
        self.estimate = progress.Forecast(self.pace, self.total, self.spe, self.say)

    def compile(self, state: State) -> Any:
        """Sets ``step_fn``, the jitted engine step; returns the shapes of its sums."""
        fn, sums_shape = compiled.compile_step(
            self.layout,
            self.task.train_step,
            self.task.batch_axes,
            state,
            self.batch(0, 0),
            self.run_key,
            self.layout.mask([True] * len(self.seeds)),
        )
        self.step_fn = lambda state, batch, key: fn(state, batch, key, self.mask)
        return sums_shape

    def batch(self, epoch: int, index: int) -> Any:
        """Batch ``index`` of ``epoch``: each seed's, stacked (:attr:`Task.batch_axes`)."""
        batches = [self.task.train_batch(s.config.seed, epoch, index) for s in self.seeds]
        return self.layout.stack(batches, self.task.batch_axes)

    def set_mask(self) -> None:
        """The stacked step's ``active`` argument: which seeds still train."""
        self.mask = self.layout.mask([s.active for s in self.seeds])

    def restore(self, state: State, metas: list[dict]) -> State:
        """The latest readable checkpoint's state (and each seed's bookkeeping), else ``state``."""
        if self.latest is None:
            return state
        like = {"state": state, "meta": self.layout.pack(metas)}
        restored = self.latest.restore_latest(like, self.say)
        if restored is None:
            return state
        for seed, meta in zip(self.seeds, self.layout.unpack(restored["meta"]), strict=True):
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
            sums = jax.device_get(sums)
            units = []
            for seed in self.active:
                try:
                    values = seed.book.add(at, self.layout.row(sums, seed.k))
                except TrainingDiverged as e:
                    self.diverged(seed, e)
                    continue
                units.append(values[units_key])
            self.pace.step_done(sum(units) / max(len(units), 1))  # per seed

    def save(self, at: int) -> None:
        if self.latest is not None:
            elapsed = np.array(self.elapsed0 + progress.now() - self.t_start)
            metas = [dict(s.meta, elapsed=elapsed) for s in self.seeds]
            self.latest.save(at, {"state": self.state, "meta": self.layout.pack(metas)})
            self.last_saved = at
            for seed in self.seeds:
                seed.book.last_saved = at

    # ------------------------------------------------------------ patience, divergence

    def out_of_patience(self, seed: Seed) -> bool:
        """At an epoch's start: whether ``select`` has not improved for ``patience`` epochs."""
        best_epoch = -(-int(seed.meta["best_step"]) // self.spe)
        if self.step // self.spe - best_epoch < self.cfg.patience:
            return False
        seed.say(
            f"early stopping: {self.report.select} has not improved for "
            f"{self.cfg.patience} epochs (best at epoch {best_epoch})"
        )
        return True

    def diverged(self, seed: Seed, e: TrainingDiverged) -> None:
        """``seed`` diverged: raised again (``on_divergence='raise'``), or the seed stops."""
        if self.on_divergence != "stop":
            raise e
        seed.say(f"stopped: {e}")
        if len(self.active) == 1:
            self.close_bar()
        self.finish(seed, "diverged", str(e))

    # --------------------------------------------------------------- an epoch's end

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

    def params(self, seed: Seed) -> Params:
        params = self.state["task"]["params"]
        return self.layout.row(params, seed.k)

    def validate(self, at: int) -> dict[int, dict[str, float]]:
        """The validation of each training seed (saved and stopped on a signal): K stacked
        seeds at once (:func:`rhnzoo.engine.evaluate.splits`)."""
        track = self.tracker("valid")
        try:
            rows = evaluate.splits(
                self.task,
                self.state["task"]["params"],
                final=False,
                seeds=self.layout.seeds,
                track=track,
            )
            return {seed.k: rows[seed.k] for seed in self.active}
        except Interrupted as e:
            self.save(at)
            raise self.stopped(e.signum, "during validation", at) from None

    def valid_loss_checked(self, seed: Seed, valid: Mapping[str, float], at: int) -> bool:
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

    def keep_if_best(self, seed: Seed, value: float, at: int) -> None:
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
        saved = "nothing saved"
        if self.latest is not None:
            saved = (
                f"checkpoint saved at step {at} in {self.latest.latest.directory}; rerun with the "
                "same --workdir to resume"
            )
        message = f"stopped by signal {signum} {where} at step {at}; {saved}"
        self.say(message)
        return Interrupted(signum, message)

    def finish(self, seed: Seed, stopped: str, diverged: str | None = None) -> None:
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
    train as one program: their states stacked along a leading seed axis, the task's step
    ``jax.vmap``-ped over it (:attr:`Task.batch_axes` stacks their batches). Each seed gets
    what a run of ``config.replace(seed=...)`` in its own workdir gives (to float32
    rounding), in ``workdir`` for the first seed and ``<workdir>_s<k>``
    (:func:`~rhnzoo.engine.stacking.seed_name`) for seed k; the stacked state is
    checkpointed in ``<workdir>/stacked/``. docs/engine.md ("--jobs / --seeds") says what
    each seed keeps.

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
    layout = stacking.layout(len(configs) if len(configs) > 1 else None)  # K = 1: one seed
    root = None if workdir is None else pathlib.Path(workdir).absolute()
    seeds = [
        Seed(
            k,
            c,
            None if root is None else root.with_name(stacking.seed_name(root.name, k)),
            layout.voice(say, c.seed),
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
                seed.open(primary, layout.own_latest)
            latest = layout.latest(seeds, root, configs, primary, say)
        r = _Run(task, seeds, layout, latest, say, primary, on_divergence)
        # Every step and evaluation is traced here.
        with precision.context(configs[0].matmul_precision):
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
        layout.close(latest)
        if installed_here:
            release_signals()
