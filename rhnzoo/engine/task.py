"""The engine's contract: what a task hands :func:`rhnzoo.engine.run` (:class:`Task`)
and what a run gives back (:class:`RunResult`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rhnzoo.engine.evaluate import Report

Array = jax.Array
State = Any
Params = Any


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
