"""What a run reports as it goes, for :mod:`rhnzoo.engine`: the loss book (the
running loss sums and the divergence check, checkpointed with the state), the pace (this
process's time per step, from which the engine's estimates come), the periodic actions
and the formats of the printed lines."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from rhnzoo.engine.workdir import RunError


class TrainingDiverged(RunError):
    """The training (or validation) loss became non-finite or stayed above the stop level."""


def now() -> float:
    """Seconds on a monotonic clock: every duration the engine reports (tests replace it)."""
    return time.monotonic()


def fmt(v: Any) -> str:
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


def duration(seconds: float) -> str:
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


def device_name() -> str:
    d = jax.devices()[0]
    return f"{jax.device_count()} x {d.device_kind}" if d.platform != "cpu" else "CPU"


def label(key: str) -> str:
    return key.replace("_", " ")


def fields(values: Mapping[str, Any]) -> str:
    """``'train ppl 123.4 | lr 1.000'``: a printed line's fields."""
    return " | ".join(f"{label(k)} {fmt(v)}" for k, v in values.items())


def final_line(results: Mapping[str, Any], final_label: str = "") -> str:
    """The run's last printed line, from its results (``final_label``: how the best
    checkpoint was evaluated, e.g. ``'eval batch 1'``)."""
    where = f"best checkpoint, step {results['best_step']}" + (
        f", {final_label}" if final_label else ""
    )
    shown = {
        k: v
        for k, v in results.items()
        if isinstance(v, float) and not k.endswith("_s") and not k.startswith("best_")
    }
    return f"final ({where}): " + fields(shown)


class LossBook:
    """The running loss sums of the epoch and of the log window, and the divergence check.

    Everything lives in ``meta``, checkpointed with the state, so a resumed run reports
    the same means and judges the same windows: ``'epoch_sums'``, ``'window_sums'``;
    ``'recent'``, the (loss sum, count) of the last :data:`DIVERGENCE_WINDOW` steps (step
    s in row s mod the window); ``'best_mean'``, the lowest judged window mean so far.
    """

    def __init__(self, meta: dict, sums_keys, chance_loss: float | None, divergence_factor: float):
        self.meta, self.keys, self.factor = meta, tuple(sums_keys), divergence_factor
        self.chance = math.inf if chance_loss is None else chance_loss
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
        loss = values["loss"] / max(values["count"], 1.0)
        for acc in (self.meta["epoch_sums"], self.meta["window_sums"]):
            for k, v in values.items():
                acc[k] = np.array(acc[k] + v)
        recent = np.array(self.meta["recent"])
        recent[at % DIVERGENCE_WINDOW] = (values["loss"], values["count"])
        self.meta["recent"] = recent
        done, first = at + 1, at + 2 - DIVERGENCE_WINDOW  # steps 1-based
        self.check(f"training loss at step {done}", loss, done, window=False)
        if first <= DIVERGENCE_WARMUP:
            return values
        loss_sum, count = recent.sum(axis=0)
        mean, best = loss_sum / max(count, 1.0), float(self.meta["best_mean"])
        self.meta["best_mean"] = np.array(min(best, mean))
        factor = self.factor
        if factor and mean > best + math.log(factor) and not mean > self.chance + math.log(factor):
            raise self.diverged(
                f"mean training loss over steps {first}-{done} is {mean:.4g} "
                f"nats, more than ln {factor:g} above the run's best such "
                f"mean, {best:.4g}"
            )
        self.check(f"mean training loss over steps {first}-{done}", mean, done)
        return values

    def check(self, what: str, loss: float, at: int, window: bool = True) -> None:
        """Raises TrainingDiverged if ``loss`` (nats per unit) is non-finite, more than
        :data:`BLOWUP_NATS` above the chance level (at any step), or (with ``window``)
        from step ``DIVERGENCE_WARMUP + DIVERGENCE_WINDOW`` on, more than ln
        ``divergence_factor`` above the chance level. ``what`` names the loss."""
        if not math.isfinite(loss):
            raise self.diverged(f"non-finite {what} ({loss})")
        factor = self.factor
        if factor and loss > self.chance + BLOWUP_NATS:
            raise self.diverged(
                f"{what} is {loss:.4g} nats, more than {BLOWUP_NATS:g} above "
                f"the chance level (a uniform guess), {self.chance:.4g}: a "
                "blow-up"
            )
        judged = window and at >= DIVERGENCE_WARMUP + DIVERGENCE_WINDOW
        if factor and judged and loss > self.chance + math.log(factor):
            raise self.diverged(
                f"{what} is {loss:.4g} nats, more than ln {factor:g} above "
                f"the chance level (a uniform guess), {self.chance:.4g}"
            )

    def diverged(self, what: str) -> TrainingDiverged:
        intact = "no checkpoint was written"
        if self.last_saved is not None:
            intact = f"the last good checkpoint (step {self.last_saved}) is intact"
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
        self.last = now()

    def step_done(self, units: float) -> None:
        """Step completed now, having trained ``units`` (tokens, images, ...)."""
        t = now()
        seconds, self.last = t - self.last, t
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
        units, seconds = (
            (span["units"], span["seconds"])
            if span["durations"]
            else (span["all_units"], span["all_seconds"])
        )
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


class Every:
    """A periodic action of the training loop (as clu's ``periodic_actions``):
    ``action(step)`` after every step whose count ``step`` (1-based, over the whole run)
    is a multiple of ``n``; ``n = 0``: never."""

    def __init__(self, n: int, action: Callable[[int], None]):
        self.n, self.action = n, action

    def __call__(self, step: int) -> None:
        if self.n and step % self.n == 0:
            self.action(step)


class Forecast:
    """The whole run's estimated time from this process's :class:`Pace`, printed with
    ``say``: once as soon as :data:`ESTIMATE_STEPS` steps after the warm-up are timed
    (:meth:`first`), and once revised after this process's first epoch with timed steps,
    the validations included (:meth:`revise`; the first estimate is then not printed).
    A run expected to take less than :data:`ESTIMATE_MIN_S` gets neither."""

    def __init__(self, pace: Pace, total: int, steps_per_epoch: int, say: Callable[[str], None]):
        self.pace, self.total, self.spe, self.say = pace, total, steps_per_epoch, say
        self.epochs = -(-total // steps_per_epoch)  # of this run, the last one maybe partial
        self.printed = False

    def first(self, done: int) -> None:
        """After a step, ``done`` steps completed: the estimate for the steps left at the
        :meth:`Pace.steady` time of the first timed steps (validation not included)."""
        if self.printed or len(self.pace.first) < ESTIMATE_STEPS:
            return
        self.printed = True
        per_step = self.pace.steady(self.pace.first)
        left = self.total - done
        seconds, where = per_step * left, device_name()
        if seconds >= ESTIMATE_MIN_S:
            hint = (where == "CPU" and seconds > 6 * 3600) * (
                "; at this size a GPU/TPU job: the scripts' CPU presets (--preset=small, "
                "--preset=cpu) fit a CPU"
            )
            self.say(
                f"estimated {duration(seconds)} for the {left:,} steps left ({per_step:.3g} "
                f"s per step on {where}, timed after compilation; validation not "
                f"included){hint}"
            )

    def revise(self, at: int, per_step: float | None) -> None:
        """After the epoch ending at step count ``at`` whose steps took ``per_step`` each
        (None: none timed): once, the time left, validations included (:meth:`time_left`)."""
        if per_step is None or len(self.pace.epoch_steps) != 1 or at >= self.total:
            return
        self.printed = True
        seconds, n = self.time_left(at, per_step), self.validations_left(at)
        if seconds >= ESTIMATE_MIN_S:
            self.say(
                f"estimated {duration(seconds)} for the {self.total - at:,} steps and {n} "
                f"validation{'s' if n != 1 else ''} left ({per_step:.3g} s per step in "
                f"epoch {(at - 1) // self.spe + 1}, {self.pace.seconds_per_end():.3g} s "
                "per validation and its checkpoints; validation included, the final "
                "evaluation not)"
            )

    def validations_left(self, at: int) -> int:
        """The epoch ends (each validated) after step count ``at``."""
        return 0 if at >= self.total else self.epochs - at // self.spe

    def time_left(self, at: int, per_step: float) -> float:
        """Seconds for the steps after step count ``at`` at ``per_step`` each, and their
        epoch ends at this process's mean epoch end (none before the first)."""
        ends = self.pace.seconds_per_end() * self.validations_left(at)
        return per_step * (self.total - at) + ends


class Journal:
    """A seed's records (``metrics``, a :class:`rhnzoo.engine.workdir.MetricsLog`) and
    printed lines (``say``): every ``log_every`` steps (:meth:`train`) and at each epoch's
    end (:meth:`epoch`), in the words of ``words`` (the task's
    :class:`rhnzoo.engine.evaluate.Report`: its ``train_metrics``, ``unit`` and
    ``learning_rate``)."""

    def __init__(self, metrics, say: Callable[[str], None], words, steps_per_epoch: int):
        self.metrics, self.say, self.words, self.spe = metrics, say, words, steps_per_epoch

    def head(self, kind: str, at: int, shown: Mapping[str, float]) -> dict:
        """A record's first fields: kind, 1-based epoch, step count ``at``, the learning
        rate of its last step, the training metrics ``shown``."""
        lr = self.words.learning_rate
        return {
            "kind": kind,
            "epoch": (at - 1) // self.spe + 1,
            "step": at,
            **({} if lr is None else {"lr": float(lr(at - 1))}),
            **shown,
        }

    def train(self, at: int, sums: Mapping[str, float], rate: float, eta: str) -> None:
        """The training-log record and line of the steps up to step count ``at``."""
        shown = self.words.train_metrics(sums)
        self.metrics.write({**self.head("train", at, shown), f"{self.words.unit}_per_s": rate})
        self.say(f"  step {at:7d} | {fields(shown)} | {rate:,.0f} {self.words.unit}/s{eta}")

    def epoch(
        self,
        at: int,
        sums: Mapping[str, float],
        rate: float,
        valid: Mapping[str, Any],
        elapsed: float,
    ) -> None:
        """The record and line of the epoch ending at step count ``at`` (maybe cut short)."""
        record = {**self.head("epoch", at, self.words.train_metrics(sums)), **valid}
        hidden = ("kind", "epoch", "step", "valid_loss")
        shown = {k: v for k, v in record.items() if k not in hidden}
        done = at - (record["epoch"] - 1) * self.spe
        self.metrics.write(
            {
                **record,
                f"{self.words.unit}_per_s": rate,
                "elapsed_s": elapsed,
                "epoch_complete": done == self.spe,
            }
        )
        self.say(
            f"epoch {record['epoch']:3d} | step {at:7d} | {fields(shown)} | {rate:,.0f} "
            f"{self.words.unit}/s | {elapsed:.1f} s"
            + ("" if done == self.spe else f" (partial epoch: {done}/{self.spe} steps)")
        )
