"""The run engine: one training loop for every rhnzoo experiment.

An experiment brings a :class:`Task` (its jit-able train step, how batch k of
epoch e is made, its evaluation, its metric); :func:`run` owns everything else,
once, for all of them:

* the workdir and its ``config.json`` (checked on resume: only the config's resumable
  settings, run length, reporting and implementation choices, may differ);
* orbax checkpoints: ``checkpoints/`` (latest three, every epoch and every
  ``checkpoint_every_steps``; the whole state, so resume is exact) and ``best/``
  (the best-validation parameters); a checkpoint that cannot be read is moved to
  ``corrupt/`` with a one-line warning and the previous one is used;
* SIGTERM / SIGINT: the state is saved and the run stops with one line and
  :class:`Interrupted` (exit status 128 + signal in the experiments), also during
  long evaluations (:func:`track` checks between chunks);
* the matmul precision ``cfg.matmul_precision`` (:mod:`rhnzoo.precision`) around every
  compiled step and evaluation of the run;
* one trainer per workdir: process 0 holds an advisory lock on ``<workdir>/.lock``
  for the life of the run (released by the OS if the process dies); a second run
  in the same workdir is one error line naming the holder's pid;
* divergence (:class:`LossBook`): a non-finite training loss, or a mean over
  :data:`DIVERGENCE_WINDOW` steps, after :data:`DIVERGENCE_WARMUP` steps, more
  than ``ln divergence_factor`` nats above the chance level or the run's best
  such mean, stops the run before anything is saved, so the last good
  checkpoint stays intact (:class:`TrainingDiverged`);
* ``metrics.jsonl``: one record per epoch (``"kind": "epoch"``) and every
  ``log_every`` steps (``"kind": "train"``), also printed as one line each; an
  optional TensorBoard event log (``tensorboardX``, no TensorFlow needed); tqdm
  bars with ETA for training and evaluation; the whole run's estimated time once
  steps after compilation are timed (:class:`Pace`), and again after the first
  validation, counting the validations left;
* the final evaluation of the best parameters, written to ``results.json``
  (strict JSON: non-finite numbers become ``null``).

The workdir's files, checkpoints and metrics log are :mod:`rhnzoo.training.workdir`;
its public names are re-exported here.

Exactness under interruption: the step's PRNG key is ``fold_in(run_key, step)``,
batch k of epoch e is ``task.get_batch(e, k)`` (a pure function), and the
checkpoint holds the step, the task state (parameters, optimizer state, any
carried state), the epoch's running loss sums, the divergence check's window and
the bookkeeping of validation (which step was last validated, the best value and
its step). An epoch's validation, metrics record and best checkpoint are redone on
resume unless the checkpoint says they were done, and ``metrics.jsonl`` is cut back
to the checkpoint, so a run killed at any moment and resumed writes the same
outputs as an uninterrupted one (up to timing fields).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rhnzoo import precision
from rhnzoo.config import Config, setting
from rhnzoo.models import num_params
from rhnzoo.training import signals
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
    """The training (or validation) loss became non-finite or stayed above the stop level."""


def _now() -> float:
    """Seconds on a monotonic clock: every duration the engine reports (tests replace it)."""
    return time.monotonic()


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
      chance_loss: loss per unit of a uniform guess (log V, log C, 88 log 2), nats:
        a level of the divergence check (None: the check has only the run's best
        window mean).
      count_key: the key of ``sums`` counting loss units.
      unit: name of one throughput unit in the log (``'tok'``, ``'img'``, ...).
      throughput_key: the key of ``sums`` counted for the throughput (default
        ``count_key``), e.g. ``'tokens'`` when the loss is per sequence.
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
    count_key: str = "count"
    unit: str = "ex"
    throughput_key: str | None = None
    learning_rate: Callable[[int], float] | None = None
    final_label: str = ""
    final_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunSettings(Config):
    """The engine's flags but the schedule's length: run length limits, reporting, the
    divergence check, patience and matmul precision. Every task's config (whose
    ``config.json`` is flat) subclasses it; :class:`RunConfig` adds ``epochs``.

    Attributes:
      seed: seeds the initialisation and the per-step PRNG keys.
      max_steps: stop after this many steps in all (None: no limit; else >= 1).
      max_epochs: stop after this many epochs in all (None: ``epochs``; else >= 1).
      checkpoint_every_steps: also checkpoint every N steps (0: at epoch ends only).
      log_every: steps between training-loss lines and records (>= 1).
      progress: tqdm bars.
      tensorboard: also write TensorBoard event files (needs ``tensorboardX``).
      divergence_factor: F, the divergence check's tolerance (0: only a
        non-finite loss stops the run; else >= 1). A finite training loss counts
        as diverged when its mean over a window of :data:`DIVERGENCE_WINDOW` (50)
        steps, judged for every window after the run's first
        :data:`DIVERGENCE_WARMUP` (20) steps, is more than ln F nats above the
        lower of the task's chance-level loss (a uniform guess) and the run's best
        window mean so far: the data then became F times less likely per unit
        (a perplexity F times the uniform guess's, or F times the run's best).
        A validation loss from step 70 on is held to the chance level alike. A
        training or validation loss more than :data:`BLOWUP_NATS` (20) nats above chance
        stops the run at any step.
        Default 3 (ln 3 = 1.1 nats): at ``--preset=paper`` on IMDB the σ-RRN's
        window means stay up to 0.6 nats above chance for 250 steps and train on.
      patience: early stopping: end training when the validation ``select`` metric
        has not improved for this many epochs (None: never).
      matmul_precision: precision of float32 matmuls in training and evaluation
        (:mod:`rhnzoo.precision`: ``'default'``, ``'high'``, ``'highest'``, JAX's
        aliases), applied with ``jax.default_matmul_precision``; recorded as a level,
        None taking JAX's setting where the config is made.

    Raises:
      ValueError: for a value outside its range (one line naming the flag).
    """

    seed: int = setting(0, "Random seed (initialisation, dropout, batch order).")
    max_steps: int | None = setting(
        None, "Stop after this many train steps in all.", low=1, resumable=True)
    max_epochs: int | None = setting(None, "Stop after this many epochs in all.", low=1,
                                     resumable=True)
    checkpoint_every_steps: int = setting(
        0, "Also checkpoint every N steps (0: at the end of every epoch only).", low=0,
        resumable=True)
    log_every: int = setting(100, "Steps between training-loss lines.", low=1, resumable=True)
    progress: bool = setting(True, "Show progress bars (training and evaluation).",
                             resumable=True)
    tensorboard: bool = setting(
        False, "Also write TensorBoard event files to <workdir>/tensorboard (pip install "
        "'rhnzoo[tensorboard]').", resumable=True)
    divergence_factor: float = setting(
        3.0, "F: the run stops as diverged (one error line; the last checkpoint is kept) at "
        "a NaN/inf loss, at any step whose training or validation loss is more than 20 nats "
        "above the chance level (a uniform guess: a blow-up), or when, from step 70 on, the "
        "mean training loss of the last 50 steps is more than ln F nats above chance or "
        "above the run's best such mean, or a validation loss is more than ln F above "
        "chance. 0: only NaN/inf stop the run.", resumable=True)
    patience: int | None = setting(
        None, "Early stopping: end training after this many epochs without a better "
        "validation metric (default: never).", low=1, resumable=True)
    matmul_precision: str | None = setting(
        None, "Precision of float32 matmuls (jax.default_matmul_precision), recorded in "
        "config.json: 'default' is the backend's fastest (CPU: float32; NVIDIA GPU: "
        "TensorFloat-32 inputs, about 1e-3 relative error; TPU: one bfloat16 pass), 'high' "
        "(GPU: TF32; TPU: 3 bfloat16 passes), 'highest' (float32; TPU: 6 passes); also "
        "JAX's names bfloat16, tensorfloat32, float32. Default: "
        "$JAX_DEFAULT_MATMUL_PRECISION, else 'default'.")

    def __post_init__(self):
        # Recorded as a level: None takes JAX's setting where the config is made.
        try:
            level = precision.resolve(self.matmul_precision)
        except ValueError as e:
            raise ValueError(f"--matmul_precision: {e}") from None
        object.__setattr__(self, "matmul_precision", level)
        super().__post_init__()

    def check(self) -> None:
        for name in ("seed", "log_every", "checkpoint_every_steps", "max_steps", "max_epochs",
                     "patience"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, int):
                raise ValueError(f"--{name} must be an integer, got {value!r}")
        if not (self.divergence_factor == 0 or 1 <= self.divergence_factor < math.inf):
            raise ValueError("--divergence_factor must be 0 (off) or a finite number >= 1, "
                             f"got {self.divergence_factor}")  # fmt: skip

    def run_settings(self) -> dict[str, Any]:
        """``{field: value}`` of the run settings alone (a subclass's other fields left
        out)."""
        return {name: getattr(self, name) for name in RUN_SETTINGS}


# The run settings' names (RunSettings' fields; the engine's flags but --epochs).
RUN_SETTINGS = tuple(f.name for f in dataclasses.fields(RunSettings))


@dataclasses.dataclass(frozen=True)
class RunConfig(RunSettings):
    """Run length, reporting and matmul precision (the engine's flags): the
    :class:`RunSettings` and ``epochs``, the epochs of the full schedule (>= 1;
    keyword only).

    Raises:
      ValueError: for a value outside its range (one line naming the flag).
    """

    epochs: int = dataclasses.field(kw_only=True, metadata={"low": 1})

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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e5 or (v != 0 and abs(v) < 1e-3) else f"{v:.3f}"
    return str(v)


ESTIMATE_MIN_S = 60.0  # a run expected to take less gets no estimate line
WARMUP_STEPS = 2  # the first steps of a process are not timed (XLA compilation)
ESTIMATE_STEPS = 20  # timed steps before the whole run's estimated time is printed
STEADY_FACTOR = 5.0  # a step over this many times its span's median time is not steady
DIVERGENCE_WARMUP = 20  # steps of a run whose finite losses are judged only as blow-ups
# A loss this many nats per unit above the chance level (a uniform guess) is a blow-up no
# start-up transient explains (the data e^20 = 5e8 times less likely per unit than by a
# uniform guess; the largest transient seen, the Table 3 GRU's step 3 at the paper preset
# on IMDB, is 4.7 nats above chance): the run stops at any step, warm-up or not.
BLOWUP_NATS = 20.0
# Steps whose mean loss is judged; the length of the checkpointed meta['recent'] (a
# change makes earlier checkpoints unreadable).
DIVERGENCE_WINDOW = 50


def _duration(seconds: float) -> str:
    """``'3 d 4 h'``, ``'2 h 5 min'``, ``'7 min'``, ``'40 s'``, rounded to the unit shown
    (116 s is ``'2 min'``)."""
    minutes = round(seconds / 60)
    if round(seconds) < 60:
        return f"{round(seconds)} s"
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        return "{} h {} min".format(*divmod(minutes, 60))
    return "{} d {} h".format(*divmod(round(seconds / 3600), 24))


def _device() -> str:
    d = jax.devices()[0]
    return f"{jax.device_count()} x {d.device_kind}" if d.platform != "cpu" else "CPU"


def _label(key: str) -> str:
    return key.replace("_", " ")


class LossBook:
    """The running loss sums of the epoch and of the log window, and the divergence check.

    Everything lives in ``meta``, checkpointed with the state, so a resumed run reports
    the same means and judges the same windows: ``'epoch_sums'``, ``'window_sums'``;
    ``'recent'``, the (loss sum, count) of the last :data:`DIVERGENCE_WINDOW` steps (step
    s in row s mod the window); ``'best_mean'``, the lowest judged window mean so far.
    """

    def __init__(self, task: Task, cfg: RunConfig, meta: dict, sums_keys):
        self.task, self.cfg, self.meta, self.keys = task, cfg, meta, tuple(sums_keys)
        self.chance = math.inf if task.chance_loss is None else task.chance_loss
        self.last_saved: int | None = None  # named in divergence messages

    def zeros(self) -> dict:
        return {k: np.zeros((), np.float64) for k in self.keys}

    def add(self, at: int, sums: Mapping[str, Any]) -> dict[str, float]:
        """Adds step ``at``'s sums (0-based); returns them as floats (a host sync).

        Raises:
          TrainingDiverged: the step's loss is non-finite, or the mean loss of the window
            ending with it (judged once the window lies past the warm-up) is more than
            ln ``divergence_factor`` above the lower of the chance level and the best
            window mean so far.
        """
        values = {k: float(v) for k, v in sums.items()}
        loss = values["loss"] / max(values[self.task.count_key], 1.0)
        for acc in (self.meta["epoch_sums"], self.meta["window_sums"]):
            for k, v in values.items():
                acc[k] = np.array(acc[k] + v)
        recent = np.array(self.meta["recent"])
        recent[at % DIVERGENCE_WINDOW] = (values["loss"], values[self.task.count_key])
        self.meta["recent"] = recent
        done, first = at + 1, at + 2 - DIVERGENCE_WINDOW  # steps 1-based
        self.check(f"training loss at step {done}", loss, done, window=False)
        if first <= DIVERGENCE_WARMUP:
            return values
        loss_sum, count = recent.sum(axis=0)
        mean, best = loss_sum / max(count, 1.0), float(self.meta["best_mean"])
        self.meta["best_mean"] = np.array(min(best, mean))
        factor = self.cfg.divergence_factor
        if factor and mean > best + math.log(factor) and not mean > self.chance + math.log(factor):
            raise self.diverged(f"mean training loss over steps {first}-{done} is {mean:.4g} "
                                f"nats, more than ln {factor:g} above the run's best such "
                                f"mean, {best:.4g}")  # fmt: skip
        self.check(f"mean training loss over steps {first}-{done}", mean, done)
        return values

    def check(self, what: str, loss: float, at: int, window: bool = True) -> None:
        """Raises TrainingDiverged if ``loss`` (nats per unit) is non-finite, more than
        :data:`BLOWUP_NATS` above the chance level (at any step), or (with ``window``)
        from step ``DIVERGENCE_WARMUP + DIVERGENCE_WINDOW`` on, more than ln
        ``divergence_factor`` above the chance level. ``what`` names the loss."""
        if not math.isfinite(loss):
            raise self.diverged(f"non-finite {what} ({loss})")
        factor = self.cfg.divergence_factor
        if factor and loss > self.chance + BLOWUP_NATS:
            raise self.diverged(f"{what} is {loss:.4g} nats, more than {BLOWUP_NATS:g} above "
                                f"the chance level (a uniform guess), {self.chance:.4g}: a "
                                "blow-up")  # fmt: skip
        judged = window and at >= DIVERGENCE_WARMUP + DIVERGENCE_WINDOW
        if factor and judged and loss > self.chance + math.log(factor):
            raise self.diverged(f"{what} is {loss:.4g} nats, more than ln {factor:g} above "
                                f"the chance level (a uniform guess), {self.chance:.4g}")  # fmt: skip

    def diverged(self, what: str) -> TrainingDiverged:
        intact = (f"the last good checkpoint (step {self.last_saved}) is intact"
                  if self.last_saved is not None else "no checkpoint was written")  # fmt: skip
        off = "" if what.startswith("non-finite") else " (--divergence_factor=0: no such stop)"
        return TrainingDiverged(f"{what}: the run diverged; {intact}; try a lower --lr{off}")

    def take(self, kind: str) -> dict[str, float]:
        """The ``'window'`` / ``'epoch'`` sums as floats; zeroes the window's."""
        sums = {k: float(v) for k, v in self.meta[f"{kind}_sums"].items()}
        if kind == "window":
            self.meta["window_sums"] = self.zeros()
        return sums

    def reset_sums(self) -> None:
        """At an epoch's first step: zero the epoch's and the window's sums."""
        self.meta["epoch_sums"], self.meta["window_sums"] = self.zeros(), self.zeros()


class Pace:
    """This process's training time per step and throughput, from its steady steps.

    A step's time runs from the previous step's completion (or from :meth:`restart`,
    e.g. after a validation) to its own. The first :data:`WARMUP_STEPS` steps of the
    process, started or resumed, are not timed: they hold the XLA compilation. Spans:
    ``'window'`` (the log window) and ``'epoch'``, each restarted by :meth:`take`. An
    epoch's end (validation, checkpoints) is timed apart: :meth:`epoch_end`.
    """

    def __init__(self):
        self.steps = 0  # completed in this process
        self.first: list[float] = []  # the first ESTIMATE_STEPS timed steps' seconds
        self.ends: list[float] = []  # this process's epoch ends' seconds
        self.epoch_steps: list[float] = []  # the step time of each epoch ended here
        self.spans = {kind: self._span() for kind in ("window", "epoch")}
        self.restart()

    @staticmethod
    def _span() -> dict:
        return {"units": 0.0, "seconds": 0.0, "durations": [], "all_units": 0.0, "all_seconds": 0.0}

    def restart(self) -> None:
        """The time until the next step's completion is not that step's (validation)."""
        self.last = _now()

    def step_done(self, units: float) -> None:
        """Step completed now, having trained ``units`` (tokens, images, ...)."""
        now = _now()
        seconds, self.last = now - self.last, now
        self.steps += 1
        timed = self.steps > WARMUP_STEPS
        if timed and len(self.first) < ESTIMATE_STEPS:
            self.first.append(seconds)
        for span in self.spans.values():
            span["all_units"] += units
            span["all_seconds"] += seconds
            if timed:
                span["units"] += units
                span["seconds"] += seconds
                span["durations"].append(seconds)

    def seconds_per_step(self, kind: str = "window") -> float | None:
        """The :meth:`steady` time of the span's timed steps; None before one."""
        durations = self.spans[kind]["durations"]
        return self.steady(durations) if durations else None

    @staticmethod
    def steady(durations) -> float:
        """The mean of ``durations`` (one or more), those over :data:`STEADY_FACTOR` x
        their median left out: a recompilation (e.g. for a new batch shape) does not
        move it, a loaded machine's slow steps do."""
        d = np.asarray(durations, np.float64)
        return float(d[d <= STEADY_FACTOR * np.median(d)].mean())

    def take(self, kind: str) -> float:
        """The span's units per second (its timed steps; all its steps if none is timed
        yet), and restarts it."""
        span = self.spans[kind]
        units, seconds = ((span["units"], span["seconds"]) if span["durations"]
                          else (span["all_units"], span["all_seconds"]))  # fmt: skip
        self.spans[kind] = self._span()
        return units / max(seconds, 1e-9)

    def epoch_end(self, seconds: float, per_step: float | None) -> None:
        """An epoch's end (validation, checkpoints) took ``seconds`` after its steps took
        ``per_step`` each (:meth:`seconds_per_step`; None: none was timed); the next
        step's time starts now."""
        self.ends.append(seconds)
        if per_step is not None:
            self.epoch_steps.append(per_step)
        self.restart()

    def seconds_per_end(self) -> float:
        """The mean time of this process's epoch ends (0 before the first)."""
        return float(np.mean(self.ends)) if self.ends else 0.0


def final_line(task: Task, results: Mapping[str, Any]) -> str:
    """The run's last printed line, from its results."""
    label = f"best checkpoint, step {results['best_step']}" + (
        f", {task.final_label}" if task.final_label else "")  # fmt: skip
    shown = {k: v for k, v in results.items()
             if isinstance(v, float) and not k.endswith("_s") and not k.startswith("best_")}  # fmt: skip
    return f"final ({label}): " + " | ".join(f"{_label(k)} {_fmt(v)}" for k, v in shown.items())


def _finished(workdir, total: int) -> dict | None:
    """The stored results of a run that is over at this run length, else None: it reached
    ``total`` steps, or stopped early (patience, divergence), which more steps won't undo."""
    try:
        results = json.loads((workdir / "results.json").read_text())
    except (OSError, ValueError):
        return None
    if results.get("stopped") in ("patience", "diverged") or "diverged" in results:
        return results
    return results if int(results.get("step", -1)) >= total else None


def _evaluate_again(task: Task, done: dict | None, say) -> bool:
    """Whether the finished run's results (``done``) were evaluated with other final
    settings than ``task.final_settings`` (then it says which, in one line)."""
    stale = {k: v for k, v in task.final_settings.items()
             if done is not None and done.get(k) != v}  # fmt: skip
    if stale:
        shown = ", ".join(f"{k} {done.get(k)} -> {v}" for k, v in stale.items())
        say(f"finished; evaluating its best checkpoint again ({shown})")
    return bool(stale)


class Every:
    """A periodic action of the training loop (as clu's ``periodic_actions``):
    ``action(step)`` after every step whose count ``step`` (1-based, over the whole run)
    is a multiple of ``n``; ``n = 0``: never."""

    def __init__(self, n: int, action: Callable[[int], None]):
        self.n, self.action = n, action

    def __call__(self, step: int) -> None:
        if self.n and step % self.n == 0:
            self.action(step)


class _Run:
    """One run's state and the steps of :func:`run` (start-up, the loop, the end)."""

    def __init__(self, task: Task, cfg: RunConfig, workdir, ckpt, say, primary: bool):
        self.task, self.cfg, self.workdir, self.ckpt, self.say = task, cfg, workdir, ckpt, say
        self.primary, self.spe = primary, task.steps_per_epoch
        self.total = cfg.total_steps(self.spe)
        self.epochs = -(-self.total // self.spe)  # of this run, the last one maybe partial
        self.metrics = self.bar = None
        self.best_params = None  # in-memory runs keep a host copy of the best parameters
        self.periodic = (Every(cfg.log_every, self.log_train),
                         Every(cfg.checkpoint_every_steps, self.checkpoint))  # fmt: skip

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
        if step:
            self.say(f"resumed {self.workdir} at step {step}")
        self.params_count = num_params(self.state["task"]["params"])
        self.say(f"{self.params_count:,} parameters, {self.spe:,} steps per epoch, "
                 f"{self.total:,} steps in this run")  # fmt: skip
        self.book.last_saved = step if step else None
        self.pending: collections.deque = collections.deque()  # dispatched, sums not read
        self.t_start, self.elapsed0 = _now(), float(self.meta["elapsed"])
        self.pace, self.estimated = Pace(), False

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
                "recent": np.zeros((DIVERGENCE_WINDOW, 2)), "best_mean": np.array(math.inf)}  # fmt: skip
        self.book = LossBook(self.task, self.cfg, meta, sums_shape)
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
        self.estimate()
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

    def estimate(self) -> None:
        """Once, as soon as :data:`ESTIMATE_STEPS` steps after the warm-up are timed
        (unless :meth:`revise` came first): the whole run's time (their
        :meth:`Pace.steady` time per step x the steps left)."""
        if self.estimated or len(self.pace.first) < ESTIMATE_STEPS:
            return
        self.estimated = True
        per_step = self.pace.steady(self.pace.first)
        left = self.total - (self.step - len(self.pending))
        seconds = per_step * left
        if seconds >= ESTIMATE_MIN_S:
            hint = ("; at this size a GPU/TPU job: the scripts' CPU presets (--preset=small, "
                    "--preset=cpu) fit a CPU" if _device() == "CPU" and seconds > 6 * 3600 else "")  # fmt: skip
            self.say(f"estimated {_duration(seconds)} for the {left:,} steps left ({per_step:.3g} s "
                     f"per step on {_device()}, timed after compilation; validation not "
                     f"included){hint}")  # fmt: skip

    def revise(self, at: int, per_step: float | None) -> None:
        """Once, after this process's first epoch with timed steps (its end at step count
        ``at``): the whole run's time left, the validations included (:meth:`time_left`
        at the epoch's :meth:`Pace.steady` time per step); the first estimate is then not
        printed."""
        if per_step is None or len(self.pace.epoch_steps) != 1 or at >= self.total:
            return
        self.estimated = True
        seconds, n = self.time_left(at, per_step), self.validations_left(at)
        if seconds >= ESTIMATE_MIN_S:
            self.say(f"estimated {_duration(seconds)} for the {self.total - at:,} steps and {n} "
                     f"validation{'s' if n != 1 else ''} left ({per_step:.3g} s per step in "
                     f"epoch {self.epoch_of(at)}, {self.pace.seconds_per_end():.3g} s per "
                     "validation and its checkpoints; validation included, the final "
                     "evaluation not)")  # fmt: skip

    def validations_left(self, at: int) -> int:
        """The epoch ends (each validated) after step count ``at``."""
        return 0 if at >= self.total else self.epochs - at // self.spe

    def time_left(self, at: int, per_step: float) -> float:
        """Seconds for the steps after step count ``at`` at ``per_step`` each, and their
        epoch ends at this process's mean epoch end (none before the first)."""
        ends = self.pace.seconds_per_end() * self.validations_left(at)
        return per_step * (self.total - at) + ends

    def log_train(self, at: int) -> None:
        """The training-log line and record of the steps since the last one (every
        ``log_every`` steps), with the run's time left (:meth:`time_left`)."""
        self.drain()
        per_step = self.pace.seconds_per_step("window")
        eta = (f" | run ETA {_duration(self.time_left(at, per_step))}"
               if per_step is not None and self.total > at else "")  # fmt: skip
        sums, rate = self.book.take("window"), self.pace.take("window")
        shown = self.task.train_metrics(sums)
        record = {"kind": "train", "epoch": self.epoch_of(at), "step": at,
                  **self.lr_fields(at - 1), **shown, f"{self.task.unit}_per_s": rate}  # fmt: skip
        self.metrics.write(record)
        self.say(f"  step {at:7d} | " + " | ".join(f"{_label(k)} {_fmt(v)}" for k, v in shown.items())
                 + f" | {rate:,.0f} {self.task.unit}/s{eta}")  # fmt: skip
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
            self.pace.step_done(values[self.task.throughput_key or self.task.count_key])

    def save(self, at: int) -> None:
        if self.ckpt is not None:
            meta = dict(self.meta, elapsed=np.array(self.elapsed0 + _now() - self.t_start))
            self.ckpt.save(at, {"state": self.state, "meta": meta})
            self.book.last_saved = at

    def lr_fields(self, at: int) -> dict:
        return {} if self.task.learning_rate is None else {"lr": float(self.task.learning_rate(at))}

    # ------------------------------------------------------------------ an epoch's end

    def end_of_epoch(self) -> None:
        """Validate -> (if better) best checkpoint -> metrics record -> latest checkpoint
        (timed: :meth:`Pace.epoch_end`) -> the revised estimate (:meth:`revise`)."""
        self.close_bar()
        self.drain()
        at, started, per_step = self.step, _now(), self.pace.seconds_per_step("epoch")
        sums, rate = self.book.take("epoch"), self.pace.take("epoch")  # before validation
        valid = self.validate(at)
        self.keep_if_best(valid[self.task.select], at)
        self.log_epoch(at, sums, rate, valid)
        self.meta["validated"] = np.array(at)
        self.save(at)
        self.pace.take("window")  # the next epoch's steps start a new log window
        self.pace.epoch_end(_now() - started, per_step)
        self.revise(at, per_step)

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

    def log_epoch(self, at: int, sums: dict, rate: float, valid: dict) -> None:
        """The epoch's metrics record and line."""
        task, spe, epoch = self.task, self.spe, self.epoch_of(at)
        done = at - (epoch - 1) * spe
        shown = task.train_metrics(sums)
        record = {"kind": "epoch", "epoch": epoch, "step": at, **self.lr_fields(at - 1), **shown,
                  **valid, f"{task.unit}_per_s": rate,
                  "elapsed_s": self.elapsed0 + _now() - self.t_start,
                  "epoch_complete": done == spe}  # fmt: skip
        self.metrics.write(record)
        fields = [f"{_label(k)} {_fmt(v)}" for k, v in {**self.lr_fields(at - 1), **shown,
                  **valid}.items() if k != "valid_loss"]  # fmt: skip
        self.say(f"epoch {epoch:3d} | step {at:7d} | " + " | ".join(fields)
                 + f" | {rate:,.0f} {task.unit}/s | {record['elapsed_s']:.1f} s"
                 + ("" if done == spe else f" (partial epoch: {done}/{spe} steps)"))  # fmt: skip

    def tracker(self, desc: str) -> Track:
        """:func:`track` for the task's evaluations: bars on process 0 when ``progress``."""
        return functools.partial(track, desc=desc, progress=self.cfg.progress and self.primary)

    # ------------------------------------------------------------------------ the end

    def stopped(self, signum: int, where: str, at: int | None = None) -> Interrupted:
        at = self.step if at is None else at
        saved = (f"checkpoint saved at step {at} in {self.ckpt.latest.directory}; rerun with "
                 "the same --workdir to resume" if self.ckpt is not None else "nothing saved")  # fmt: skip
        message = f"stopped by signal {signum} {where} at step {at}; {saved}"
        self.say(message)
        return Interrupted(signum, message)

    def finish(self, stopped: str, diverged: str | None) -> RunResult:
        """The final evaluation of the best parameters -> results.json and the final line."""
        task, step = self.task, self.step
        params = self.state["task"]["params"]
        best_step = int(self.meta["best_step"])
        best = self.ckpt.restore_best(best_step, params) if self.ckpt is not None else self.best_params
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
        results["final"] = final_line(task, results)  # shown again by an "already finished"
        if self.workdir is not None and self.primary:
            write_json(self.workdir / "results.json", results)
        self.say(results["final"])
        history = [r for r in self.metrics.records if r["kind"] == "epoch"]
        host_best = None if best is None else jax.device_get(best)
        return RunResult(results, history, host_best, diverged is not None)


def run(
    task: Task,
    cfg: RunConfig,
    workdir: PathLike | None = None,
    config: Config | None = None,
    *,
    on_divergence: str = "raise",
    log: Callable[[str], None] | None = print,
) -> RunResult:
    """Trains ``task`` and evaluates its best parameters (see the module docstring).

    A workdir whose run is already over at this run length (``results.json`` at the
    total number of steps, or stopped early by patience or divergence) is not trained
    or evaluated again: one line ``already finished: <its final line>`` and its stored
    results (read only: the workdir may be read-only), unless its results were evaluated
    with other ``task.final_settings`` (then its best checkpoint is evaluated again and
    ``results.json`` rewritten; no training). A longer ``--max_steps`` /
    ``--max_epochs`` / ``epochs`` extends it. Otherwise process 0 holds the workdir's
    :class:`WorkdirLock` until the run ends; incomplete checkpoint saves left by an
    earlier process are deleted.

    Args:
      task: the experiment's step, batches and evaluation.
      cfg: run length, reporting and the matmul precision of its steps and evaluations.
      workdir: run directory (``config.json``, ``metrics.jsonl``, ``checkpoints/``,
        ``best/``, ``results.json``); rerunning with it resumes exactly. None: an
        in-memory run (nothing written, no resume), e.g. a random-search trial.
      config: every setting of the run, written to ``config.json`` and checked against
        it on resume (:meth:`rhnzoo.config.Config.conflicts`); None: no settings.
      on_divergence: ``'raise'`` (:class:`TrainingDiverged`) or ``'stop'`` (end
        the run, evaluate the best parameters so far, ``RunResult.diverged``).
      log: receives every printed line (one per epoch, every ``log_every`` steps,
        warnings, the final line); None: silent.

    Returns:
      :class:`RunResult` (``results['stopped']``: ``'end'``, ``'patience'`` or
      ``'diverged'``).

    Raises:
      ValueError: an incompatible or unusable workdir.
      TrainingDiverged: the loss became non-finite or stayed above the stop level
        (``'raise'``).
      Interrupted: a SIGTERM/SIGINT arrived; the state was saved first.
      RunError: another process is training in the workdir, or a checkpoint or file
        could not be written.
    """
    primary = jax.process_index() == 0  # prints and writes files in a multi-process run
    say = log if log is not None and primary else (lambda line: None)
    installed_here = not signals.installed()
    catch_signals()
    lock = ckpt = r = done = None
    again = False
    try:
        if workdir is not None:
            workdir, config = pathlib.Path(workdir).absolute(), config or Config()
            if (workdir / "results.json").is_file():  # a finished run is read, never written
                prepare_workdir(workdir, config, check_only=True)
                done = _finished(workdir, cfg.total_steps(task.steps_per_epoch))
                again = _evaluate_again(task, done, say)
                if done is not None and not again:
                    say(f"already finished: {done.get('final') or final_line(task, done)}")
                    return RunResult(done, read_metrics(workdir), restore_params(workdir),
                                     "diverged" in done)  # fmt: skip
            lock = WorkdirLock(workdir, warn=say) if primary else None
            workdir = prepare_workdir(workdir, config, log=say)
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("rhnzoo workdir ready")
            ckpt = Checkpoints(workdir)
            for tmp in ckpt.remove_incomplete() if primary else ():
                say(f"removed {tmp}: a checkpoint save that did not finish")
        r = _Run(task, cfg, workdir, ckpt, say, primary)
        with precision.context(cfg.matmul_precision):  # every step and evaluation traced here
            r.start()
            if again:  # a finished run, evaluated with other final settings; no training
                return r.finish(done.get("stopped", "end"), done.get("diverged"))
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
    finally:
        if r is not None and r.metrics is not None:
            r.metrics.close()
        if ckpt is not None:
            ckpt.close()
        if lock is not None:
            lock.release()
        if installed_here:
            release_signals()
