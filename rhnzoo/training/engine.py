"""The run engine: one training loop for every rhnzoo experiment.

An experiment brings a :class:`Task` (its jit-able train step, how batch k of
epoch e is made, its evaluation, its metric); :func:`run` owns everything else,
once, for all of them:

* the workdir and its ``config.json`` (checked on resume: only the keys in
  ``resumable_keys``, run length and reporting, may differ);
* orbax checkpoints: ``checkpoints/`` (latest three, every epoch and every
  ``checkpoint_every_steps``; the whole state, so resume is exact) and ``best/``
  (the best-validation parameters); a checkpoint that cannot be read is moved to
  ``corrupt/`` with a one-line warning and the previous one is used;
* SIGTERM / SIGINT: the state is saved and the run stops with one line and
  :class:`Interrupted` (exit status 128 + signal in the experiments), also during
  long evaluations (:func:`track` checks between chunks);
* divergence: a non-finite training loss, or a finite one above
  ``divergence_factor`` x the chance-level loss, stops the run before anything
  is saved, so the last good checkpoint stays intact (:class:`TrainingDiverged`);
* ``metrics.jsonl``: one record per epoch (``"kind": "epoch"``) and every
  ``log_every`` steps (``"kind": "train"``), also printed as one line each; an
  optional TensorBoard event log (``tensorboardX``, no TensorFlow needed); tqdm
  bars with ETA for training and evaluation;
* the final evaluation of the best parameters, written to ``results.json``
  (strict JSON: non-finite numbers become ``null``).

The workdir's files, checkpoints and metrics log are :mod:`rhnzoo.training.workdir`;
its public names are re-exported here.

Exactness under interruption: the step's PRNG key is ``fold_in(run_key, step)``,
batch k of epoch e is ``task.get_batch(e, k)`` (a pure function), and the
checkpoint holds the step, the task state (parameters, optimizer state, any
carried state), the epoch's running loss sums and the bookkeeping of validation
(which step was last validated, the best value and its step). An epoch's
validation, metrics record and best checkpoint are redone on resume unless the
checkpoint says they were done, and ``metrics.jsonl`` is cut back to the
checkpoint, so a run killed at any moment and resumed writes the same outputs
as an uninterrupted one (up to timing fields).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rhnzoo.training.workdir import (  # noqa: F401  (re-exported: engine.RunError, ...)
    RESUMABLE_KEYS,
    Checkpoints,
    MetricsLog,
    RunError,
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

class TrainingDiverged(RunError):
    """The training (or validation) loss became non-finite or exploded."""


class Interrupted(Exception):
    """The run stopped on a signal after saving its state; ``signum`` says which."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"stopped by signal {signum}")
        self.signum = signum


# --------------------------------------------------------------------------- signals

_signals = {"received": None, "installed": False, "previous": {}}


def _on_signal(signum, frame):
    del frame
    if _signals["received"] is not None:  # a second signal: leave now, without saving
        print(f"second signal {signum}: exiting without saving", file=sys.stderr, flush=True)
        os._exit(128 + signum)
    _signals["received"] = signum


def catch_signals() -> None:
    """Installs the SIGTERM/SIGINT handlers that ask the run to stop (idempotent).

    The experiments call it first thing, so a signal during start-up (data loading,
    compilation) is remembered and honoured as soon as the engine can save. Only
    the main thread can install handlers; elsewhere this does nothing.
    """
    if _signals["installed"] or not _is_main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        _signals["previous"][signum] = signal.signal(signum, _on_signal)
    _signals["installed"] = True


def release_signals() -> None:
    """Restores the handlers that were there before :func:`catch_signals`; clears a
    received signal."""
    if _signals["installed"]:
        for signum, handler in _signals["previous"].items():
            signal.signal(signum, handler)
    _signals.update(received=None, installed=False, previous={})


def stop_requested() -> int | None:
    """The signal number received since :func:`catch_signals`, or None."""
    return _signals["received"]


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def track(
    iterable: Iterable, *, total: int | None = None, desc: str = "", progress: bool = True
) -> Iterator:
    """Iterates with a tqdm bar (ETA) when ``progress``, checking for SIGTERM/SIGINT
    before every item.

    Raises:
      Interrupted: when a signal was received; the caller's work since the last item
        is abandoned.
    """
    bar = tqdm(iterable, total=total, desc=desc, disable=not progress, leave=False,
               dynamic_ncols=True)  # fmt: skip
    try:
        for item in bar:
            if stop_requested() is not None:
                raise Interrupted(stop_requested())
            yield item
    finally:
        bar.close()


Track = Callable[..., Iterator]


# ------------------------------------------------------------------------ task, config


@dataclasses.dataclass(frozen=True)
class Task:
    """What an experiment brings to the engine.

    Attributes:
      init_state: ``key -> state``: the task's training state, a pytree with at
        least ``'params'`` (and e.g. ``'opt_state'``, a truncated-BPTT carry),
        already placed on its devices.
      train_step: ``(state, batch, key) -> (state, sums)``, a pure function (the
        engine jit-compiles it with the state donated): one update; ``sums`` is a
        dict of scalar sums over the batch, with ``'loss'`` (summed loss, nats)
        and ``count_key`` (its number of units), and any others to report.
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
      chance_loss: loss per unit of a uniform guess (log V, log C, 88 log 2); the
        divergence threshold is a multiple of it (None: of the first step's loss).
      count_key: the key of ``sums`` counting loss units.
      unit: name of one throughput unit in the log (``'tok'``, ``'img'``, ...).
      throughput_key: the key of ``sums`` counted for the throughput (default
        ``count_key``), e.g. ``'tokens'`` when the loss is per sequence.
      learning_rate: ``step -> lr`` for the log, or None.
      final_label: shown in the final line, e.g. ``'eval batch 1'``.
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
    count_key: str = "count"
    unit: str = "ex"
    throughput_key: str | None = None
    learning_rate: Callable[[int], float] | None = None
    final_label: str = ""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Run length and reporting (the engine's flags).

    Attributes:
      epochs: epochs of the full schedule (>= 1).
      seed: seeds the initialisation and the per-step PRNG keys.
      max_steps: stop after this many steps in all (None: no limit; else >= 1).
      max_epochs: stop after this many epochs in all (None: ``epochs``; else >= 1).
      checkpoint_every_steps: also checkpoint every N steps (0: at epoch ends only).
      log_every: steps between training-loss lines and records (>= 1).
      progress: tqdm bars.
      tensorboard: also write TensorBoard event files (needs ``tensorboardX``).
      divergence_factor: stop when the loss exceeds this multiple of the
        chance-level loss (0: only non-finite losses stop the run).
      patience: early stopping: end training when the validation ``select`` metric
        has not improved for this many epochs (None: never).

    Raises:
      ValueError: for a value outside its range (one line naming the flag).
    """

    epochs: int
    seed: int = 0
    max_steps: int | None = None
    max_epochs: int | None = None
    checkpoint_every_steps: int = 0
    log_every: int = 100
    progress: bool = True
    tensorboard: bool = False
    divergence_factor: float = 2.0
    patience: int | None = None

    def __post_init__(self):
        checks = [("epochs", self.epochs, 1), ("log_every", self.log_every, 1),
                  ("checkpoint_every_steps", self.checkpoint_every_steps, 0)]  # fmt: skip
        checks += [(k, getattr(self, k), 1) for k in ("max_steps", "max_epochs", "patience")
                   if getattr(self, k) is not None]  # fmt: skip
        for name, value, low in checks:
            if not isinstance(value, int) or value < low:
                raise ValueError(f"--{name} must be an integer >= {low}, got {value!r}")
        if not self.divergence_factor >= 0:
            raise ValueError(f"--divergence_factor must be >= 0, got {self.divergence_factor}")

    def total_steps(self, steps_per_epoch: int) -> int:
        epochs = min(self.epochs, self.max_epochs or self.epochs)
        total = epochs * steps_per_epoch
        return total if self.max_steps is None else min(total, self.max_steps)

    def cut_short(self, steps_per_epoch: int) -> bool:
        """Whether --max_steps / --max_epochs end the run before its schedule does."""
        return self.total_steps(steps_per_epoch) < self.epochs * steps_per_epoch


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


def num_params(params: Params) -> int:
    return int(sum(np.size(p) for p in jax.tree.leaves(params)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e5 or (v != 0 and abs(v) < 1e-3) else f"{v:.3f}"
    return str(v)


def _label(key: str) -> str:
    return key.replace("_", " ")


def run(
    task: Task,
    cfg: RunConfig,
    workdir: PathLike | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    resumable_keys=RESUMABLE_KEYS,
    on_divergence: str = "raise",
    log: Callable[[str], None] | None = print,
) -> RunResult:
    """Trains ``task`` and evaluates its best parameters (see the module docstring).

    Args:
      task: the experiment's step, batches and evaluation.
      cfg: run length and reporting.
      workdir: run directory (``config.json``, ``metrics.jsonl``, ``checkpoints/``,
        ``best/``, ``results.json``); rerunning with it resumes exactly. None: an
        in-memory run (nothing written, no resume), e.g. a random-search trial.
      config: every setting of the run, written to / checked against ``config.json``.
      resumable_keys: config keys that may differ on resume.
      on_divergence: ``'raise'`` (:class:`TrainingDiverged`) or ``'stop'`` (end
        the run, evaluate the best parameters so far, ``RunResult.diverged``).
      log: receives every printed line (one per epoch, every ``log_every`` steps,
        warnings, the final line); None: silent.

    Returns:
      :class:`RunResult`.

    Raises:
      ValueError: an incompatible or unusable workdir.
      TrainingDiverged: the loss became non-finite or exploded (``'raise'``).
      Interrupted: a SIGTERM/SIGINT arrived; the state was saved first.
      RunError: a checkpoint or file could not be written.
    """
    primary = jax.process_index() == 0  # prints and writes files in a multi-process run
    say = log if log is not None and primary else (lambda line: None)
    installed_here = not _signals["installed"]
    catch_signals()
    spe = task.steps_per_epoch
    total = cfg.total_steps(spe)
    workdir = None if workdir is None else prepare_workdir(workdir, config or {}, resumable_keys)
    if workdir is not None and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("rhnzoo workdir ready")
    ckpt = None if workdir is None else Checkpoints(workdir)
    metrics = None
    try:
        init_key, run_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
        task_state = task.init_state(init_key)
        state = {"step": _scalar_like(task_state), "task": task_state}
        shardings = jax.tree.map(lambda a: a.sharding, state)

        jitted = jax.jit(_engine_step, static_argnums=0, donate_argnums=1,
                         out_shardings=(shardings, None))  # fmt: skip
        step_fn = functools.partial(jitted, task.train_step)
        sums_shape = jax.eval_shape(functools.partial(_engine_step, task.train_step), state,
                                    task.get_batch(0, 0), run_key)[1]  # fmt: skip
        zeros = lambda: {k: np.zeros((), np.float64) for k in sums_shape}
        worst = -math.inf if task.higher_is_better else math.inf
        meta = {"validated": np.array(-1), "best": np.array(worst), "best_step": np.array(-1),
                "epoch_sums": zeros(), "window_sums": zeros(), "elapsed": np.array(0.0),
                "ref_loss": np.array(task.chance_loss or math.nan)}  # fmt: skip
        if ckpt is not None:
            restored = ckpt.restore_latest({"state": state, "meta": meta}, say)
            if restored is not None:
                state, meta = restored["state"], restored["meta"]
        step = int(state["step"])
        metrics = MetricsLog(workdir, cfg.tensorboard, purge_step=step)
        if ckpt is not None:
            ckpt.drop_best_after(step)
        if step:
            metrics.cut_back(step, int(meta["validated"]))
            say(f"resumed {workdir} at step {step}")
        params_count = num_params(state["task"]["params"])
        say(f"{params_count:,} parameters, {spe:,} steps per epoch, {total:,} steps in this run")

        best_params = None  # in-memory runs keep a host copy of the best parameters
        last_saved = step if step else None
        pending: collections.deque = collections.deque()
        recent: collections.deque = collections.deque(maxlen=10)
        t_start, elapsed0 = time.time(), float(meta["elapsed"])
        # Units trained by this process since the last log line / epoch start (throughput).
        clock = {"window": t_start, "epoch": t_start, "window_count": 0.0, "epoch_count": 0.0}
        diverged = None

        def meta_now():
            return dict(meta, elapsed=np.array(elapsed0 + time.time() - t_start))

        def save(at: int) -> None:
            nonlocal last_saved
            if ckpt is not None:
                ckpt.save(at, {"state": state, "meta": meta_now()})
                last_saved = at

        def explode(what: str, loss: float, at: int) -> None:
            """Raises TrainingDiverged if ``loss`` (nats per unit) is non-finite or exploded."""
            ref = float(meta["ref_loss"])
            intact = (f"the last good checkpoint (step {last_saved}) is intact"
                      if last_saved is not None else "no checkpoint was written")  # fmt: skip
            if not math.isfinite(loss):
                raise TrainingDiverged(f"non-finite {what} loss at step {at}; {intact}; "
                                       "try a lower --lr")  # fmt: skip
            if cfg.divergence_factor and math.isfinite(ref) and loss > cfg.divergence_factor * ref:
                level = "the chance level" if task.chance_loss else "the first step's loss"
                raise TrainingDiverged(
                    f"{what} loss {loss:.4g} at step {at} exploded (> {cfg.divergence_factor:g} x "
                    f"{ref:.4g} nats, {level}); {intact}; try a lower --lr"
                )

        throughput_key = task.throughput_key or task.count_key

        def drain(keep: int = 0) -> None:
            """Reads the loss sums of all but ``keep`` dispatched steps (one host sync)."""
            while len(pending) > keep:
                at, sums = pending.popleft()
                values = {k: float(v) for k, v in sums.items()}
                loss = values["loss"] / max(values[task.count_key], 1.0)
                if not math.isfinite(float(meta["ref_loss"])):
                    meta["ref_loss"] = np.array(loss)
                for acc in (meta["epoch_sums"], meta["window_sums"]):
                    for k, v in values.items():
                        acc[k] = np.array(acc[k] + v)
                clock["window_count"] += values[throughput_key]
                clock["epoch_count"] += values[throughput_key]
                recent.append((values["loss"], values[task.count_key]))
                if not math.isfinite(loss):
                    explode("training", loss, at + 1)
                loss_sum, count = (sum(x) for x in zip(*recent))  # the last 10 steps
                explode("training", loss_sum / max(count, 1.0), at + 1)

        def lr_fields(at: int) -> dict:
            return {} if task.learning_rate is None else {"lr": float(task.learning_rate(at))}

        def log_train(at: int) -> None:
            sums = {k: float(v) for k, v in meta["window_sums"].items()}
            rate = clock["window_count"] / max(time.time() - clock["window"], 1e-9)
            shown = task.train_metrics(sums)
            record = {"kind": "train", "epoch": at // spe + (at % spe > 0), "step": at,
                      **lr_fields(at - 1), **shown, f"{task.unit}_per_s": rate}  # fmt: skip
            metrics.write(record)
            say(f"  step {at:7d} | " + " | ".join(f"{_label(k)} {_fmt(v)}" for k, v in shown.items())
                + f" | {rate:,.0f} {task.unit}/s")  # fmt: skip
            meta["window_sums"] = zeros()
            clock.update(window=time.time(), window_count=0.0)

        def end_of_epoch(at: int) -> None:
            nonlocal best_params
            epoch = (at - 1) // spe + 1
            done = at - (epoch - 1) * spe
            rate = clock["epoch_count"] / max(time.time() - clock["epoch"], 1e-9)  # no validation
            sums = {k: float(v) for k, v in meta["epoch_sums"].items()}
            params = state["task"]["params"]
            try:
                valid = task.validate(params, _tracker(f"valid (epoch {epoch})"))
            except Interrupted as e:
                save(at)
                raise _stopped(e.signum, at, "during validation") from None
            if "valid_loss" in valid:
                explode(f"validation (epoch {epoch})", valid["valid_loss"], at)
            value = valid[task.select]
            better = value > meta["best"] if task.higher_is_better else value < meta["best"]
            if better:
                if ckpt is not None:
                    ckpt.save_best(at, params)
                else:
                    best_params = jax.device_get(params)
                meta["best"], meta["best_step"] = np.array(value), np.array(at)
            shown = task.train_metrics(sums)
            record = {"kind": "epoch", "epoch": epoch, "step": at, **lr_fields(at - 1), **shown,
                      **valid, f"{task.unit}_per_s": rate,
                      "elapsed_s": elapsed0 + time.time() - t_start,
                      "epoch_complete": done == spe}  # fmt: skip
            metrics.write(record)
            fields = [f"{_label(k)} {_fmt(v)}" for k, v in {**lr_fields(at - 1), **shown,
                      **valid}.items() if k != "valid_loss"]  # fmt: skip
            say(f"epoch {epoch:3d} | step {at:7d} | " + " | ".join(fields)
                + f" | {rate:,.0f} {task.unit}/s | {record['elapsed_s']:.1f} s"
                + ("" if done == spe else f" (partial epoch: {done}/{spe} steps)"))  # fmt: skip
            meta["validated"] = np.array(at)
            save(at)
            clock.update(epoch=time.time(), epoch_count=0.0, window=time.time(), window_count=0.0)

        def _tracker(desc: str):
            def tracker(iterable, total=None, desc=desc):
                return track(iterable, total=total, desc=desc, progress=cfg.progress and primary)

            return tracker

        def _stopped(signum: int, at: int, where: str) -> Interrupted:
            saved = (f"checkpoint saved at step {at} in {ckpt.latest.directory}; rerun with the "
                     "same --workdir to resume" if ckpt is not None else "nothing saved")  # fmt: skip
            message = f"stopped by signal {signum} {where} at step {at}; {saved}"
            say(message)
            return Interrupted(signum, message)

        bar = None
        try:
            while True:
                if stop_requested() is not None:
                    if bar is not None:
                        bar.close()
                    drain()
                    if last_saved != step:
                        save(step)
                    raise _stopped(stop_requested(), step, "in training" if step else "at start-up")
                boundary = step > 0 and (step % spe == 0 or step == total)
                if boundary and int(meta["validated"]) != step:
                    if bar is not None:
                        bar.close()
                        bar = None
                    drain()
                    end_of_epoch(step)
                if step >= total:
                    break
                if cfg.patience and step % spe == 0:
                    best_epoch = -(-int(meta["best_step"]) // spe)
                    if step // spe - best_epoch >= cfg.patience:
                        say(f"early stopping: {task.select} has not improved for "
                            f"{cfg.patience} epochs (best at epoch {best_epoch})")  # fmt: skip
                        break
                epoch, index = divmod(step, spe)
                if index == 0:
                    meta["epoch_sums"], meta["window_sums"] = zeros(), zeros()
                if bar is None:
                    bar = tqdm(total=min(spe, total - epoch * spe), initial=index,
                               desc=f"epoch {epoch + 1}", disable=not (cfg.progress and primary),
                               leave=False, dynamic_ncols=True)  # fmt: skip
                state, sums = step_fn(state, task.get_batch(epoch, index), run_key)
                pending.append((step, sums))
                step += 1
                drain(keep=1)
                bar.update(1)
                if step % cfg.log_every == 0:
                    drain()
                    log_train(step)
                    bar.set_postfix(task.train_metrics(
                        {k: float(v) for k, v in meta["epoch_sums"].items()}))  # fmt: skip
                end = step % spe == 0 or step == total
                if end and bar is not None:
                    bar.close()
                    bar = None
                if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0 and not end:
                    drain()
                    save(step)
        except TrainingDiverged as e:
            if on_divergence != "stop":
                raise
            diverged = str(e)
            say(f"stopped: {e}")
        finally:
            if bar is not None:
                bar.close()

        # Final evaluation of the best parameters.
        params = state["task"]["params"]
        best_step = int(meta["best_step"])
        best = ckpt.restore_best(best_step, params) if ckpt is not None else best_params
        if best is None:
            best, best_step = (None, -1) if diverged else (params, step)
        results = {"step": step, "best_step": best_step, f"best_{task.select}": float(meta["best"]),
                   "parameters": params_count}  # fmt: skip
        if diverged:
            results["diverged"] = diverged
        if best is not None:
            try:
                results.update(task.final_evaluate(best, _tracker("final evaluation")))
            except Interrupted as e:
                raise _stopped(e.signum, step, "during the final evaluation") from None
        if workdir is not None and primary:
            write_json(workdir / "results.json", results)
        label = f"best checkpoint, step {best_step}" + (
            f", {task.final_label}" if task.final_label else ""
        )
        shown = {k: v for k, v in results.items()
                 if isinstance(v, float) and not k.endswith("_s") and not k.startswith("best_")}  # fmt: skip
        say(f"final ({label}): " + " | ".join(f"{_label(k)} {_fmt(v)}" for k, v in shown.items()))
        history = [r for r in metrics.records if r["kind"] == "epoch"]
        host_best = None if best is None else jax.device_get(best)
        return RunResult(results, history, host_best, diverged is not None)
    finally:
        if metrics is not None:
            metrics.close()
        if ckpt is not None:
            ckpt.close()
        if installed_here:
            release_signals()
