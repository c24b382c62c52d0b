"""The ends of a run's epochs and of the run itself, for the run loop
(:mod:`rhnzoo.engine.loop`'s run class takes them on): validation, the divergence check of
its loss, best checkpoints, patience, a seed's stop and the final evaluation."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from rhnzoo.engine import evaluate, progress, stacking
from rhnzoo.engine.progress import TrainingDiverged
from rhnzoo.engine.seeds import Seed
from rhnzoo.engine.signals import Interrupted, Track, track
from rhnzoo.engine.task import RunResult
from rhnzoo.engine.workdir import write_json

Params = Any


class Ending:
    """The epoch's end and the run's end of :mod:`rhnzoo.engine.loop`'s run (its state:
    ``task``, ``seeds``, ``state``, ``step``, ``pace``, ``latest``...)."""

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

    def params(self, seed: Seed) -> Params:
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
