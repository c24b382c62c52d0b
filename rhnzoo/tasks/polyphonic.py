"""Training piano-roll models (JSB Chorales) on the run engine; the JSB optimisation
study of Zilly et al. (2017, sec. 5.1, Fig. 4) that trains them is
:mod:`rhnzoo.studies.jsb`, its settings :mod:`rhnzoo.configs.jsb`.

:func:`train_and_evaluate` is the task's one entry point. It keeps the study's random
search simple: one call per trial, in memory (no workdir, no checkpoints) unless a
workdir is given, and every trial of the same model shares one compiled step (the
hyperparameters live in the optimizer state).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo.configs.jsb import PolyphonicConfig
from rhnzoo.data.music import NUM_NOTES, pad_batch
from rhnzoo.models.piano_roll import PianoRollModel, nll_sums
from rhnzoo import engine
from rhnzoo.engine.evaluate import Report
from rhnzoo.engine import step

Array = jax.Array
Params = Any

# ------------------------------------------------------------------------ the step


def sgd(learning_rate: float, momentum: float, max_grad_norm: float):
    """Global-norm clipping followed by SGD with (heavy-ball) momentum; momentum = 0 is
    plain SGD. The three hyperparameters live in the optimizer state
    (``optax.inject_hyperparams``), so one compiled train step serves every setting."""
    return optax.inject_hyperparams(_clipped_sgd)(
        learning_rate=learning_rate, momentum=momentum, max_grad_norm=max_grad_norm
    )


def _clipped_sgd(learning_rate, momentum, max_grad_norm):
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm), optax.sgd(learning_rate, momentum=momentum)
    )


def nll_loss(model: PianoRollModel, params: Params, batch, key: Array, carry):
    """The loss of :func:`rhnzoo.engine.step.make_train_step`: the batch's mean NLL per
    time step (nats). ``batch``: ``(x [T, B, 88], mask [T, B])`` (``pad_batch``); ``key``
    unused (no dropout), ``carry`` passed through (None). Returns ``(mean, ({'loss': Σ
    NLL, 'count': predictions}, carry))``."""
    del key  # no dropout
    total, count = nll_sums(model, params, *batch)
    return total / jnp.maximum(count, 1.0), ({"loss": total, "count": count}, carry)


@functools.cache
def _engine_step(model: PianoRollModel):
    """The engine's ``train_step(state, batch, key) -> (state, sums)`` for ``model``: the
    one step (:func:`rhnzoo.engine.step.make_train_step`) on :func:`nll_loss` with the
    clipped SGD whose hyperparameters come from the optimizer state. One function object
    per model, so every trial of a random search reuses the compiled step."""
    return step.make_train_step(functools.partial(nll_loss, model), sgd(0.0, 0.0, 1.0))


def eval_sums(model: PianoRollModel, params: Params, batch) -> dict[str, Array]:
    """The engine's ``eval_step``: ``{'loss': Σ NLL (nats), 'count': predictions}`` of
    ``batch = (x [T, B, 88], mask [T, B])`` (``pad_batch``)."""
    total, count = nll_sums(model, params, *batch)
    return {"loss": total, "count": count}


@functools.cache
def _eval_step(model: PianoRollModel):
    """:func:`eval_sums` of ``model``: one function object per model, so every trial of a
    random search reuses the compiled evaluation."""
    return functools.partial(eval_sums, model)


# ------------------------------------------------------------------------ the task


@functools.lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the ``n`` training sequences in ``epoch``: a permutation drawn from
    ``(seed, epoch)`` only, so batch k of epoch e is the same in a resumed run."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def _train_metrics(sums) -> dict[str, float]:
    return {"train_nll": sums["loss"] / max(sums["count"], 1.0)}


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train_and_evaluate`. NLLs are nats per time step. ``diverged``: training
    stopped at a non-finite or exploding loss; ``best_valid`` / ``test_at_best`` are still
    those of the best epoch before it, or inf (and ``best_epoch`` 0) if there was none.
    ``best_params``: the best-validation parameters (host arrays)."""

    best_valid: float
    test_at_best: float
    best_epoch: int  # 1-based; 0 if none
    diverged: bool
    epochs_run: int
    history: tuple[dict, ...]  # per epoch: epoch, train, valid, seconds
    seconds: float
    best_params: Params = dataclasses.field(default=None, repr=False, compare=False)


def _eval_batches(data: dict[str, Sequence[np.ndarray]]):
    """The engine's ``eval_batches(split, final)``: the split's sequences as one batch,
    valid and test padded to one shape (the evaluation compiles once per model)."""
    length = max(s.shape[0] for split in ("valid", "test") for s in data[split])
    size = max(len(data["valid"]), len(data["test"]))
    return lambda split, final: [tuple(map(jnp.asarray, pad_batch(data[split], length, size)))]


def train_and_evaluate(
    config: PolyphonicConfig,
    data: dict[str, Sequence[np.ndarray]],
    workdir: str | os.PathLike | None = None,
    *,
    model: PianoRollModel,
    params: Params | None = None,
    log: Callable[[str], None] | None = None,
    on_divergence: str = "stop",
    seeds: int | None = None,
) -> TrainResult | list[TrainResult]:
    """Trains ``model`` on ``data['train']`` under ``config`` with clipped SGD, keeping the
    best validation epoch: the task's one entry point.

    Each epoch visits the training sequences in an order drawn from ``(seed, epoch)``
    (:func:`epoch_order`), in minibatches of ``batch_size`` (the last one padded with empty
    sequences) padded to the longest training sequence, so every step has one shape and a
    resumed run sees the same batches. The test figure reported is the test NLL of the best
    validation epoch. A non-finite or exploding loss (``divergence_factor``, judged
    against the chance level 88 log 2) stops the run, reported as diverged.

    Args:
      config: the settings (:class:`PolyphonicConfig`, or a subclass such as
        :class:`TrialConfig`); ``config.seed``: initialisation (unless ``params`` given)
        and batch order.
      data: ``{'train', 'valid', 'test'}`` -> rolls ``[T_i, 88]`` (float, 0/1).
      workdir: a run directory for ``config.json``, checkpoints and resume (default: in
        memory).
      model: the model.
      params: initial parameters (default ``model.init``); consumed (donated to the step).
      log, on_divergence, seeds: :func:`rhnzoo.engine.run`'s (``on_divergence`` by
        default ``'stop'``: the run ends, reported as diverged; ``seeds``: K seeds
        stacked, ``workdir`` the first's, a list of their results).
    Returns: TrainResult.
    Raises:
      ValueError: (one line) an incompatible workdir; as :func:`rhnzoo.engine.run`.
    """
    train_seqs, size = list(data["train"]), config.batch_size
    length = max(s.shape[0] for s in train_seqs)

    def init_state(key: Array):
        p = model.init(key) if params is None else params
        return {
            "params": p,
            "opt_state": sgd(config.lr, config.momentum, config.max_grad_norm).init(p),
        }

    def train_batch(seed: int, epoch: int, index: int):
        order = epoch_order(seed, epoch, len(train_seqs))
        picked = order[index * size : (index + 1) * size]
        return pad_batch([train_seqs[j] for j in picked], length, size)

    steps_per_epoch = -(-len(train_seqs) // size)
    task = engine.Task(
        init_state=init_state,
        train_step=_engine_step(model),
        train_batch=train_batch,
        steps_per_epoch=steps_per_epoch,
        eval_step=_eval_step(model),
        eval_batches=_eval_batches(data),
        report=Report(
            select="valid_nll",
            metrics=lambda split, sums: {f"{split}_nll": sums["loss"] / sums["count"]},
            train_metrics=_train_metrics,
            chance_loss=NUM_NOTES * math.log(2),
            unit="step",
        ),
    )
    start = time.perf_counter()
    out = engine.run(task, config, workdir, seeds=seeds, on_divergence=on_divergence, log=log)
    seconds = time.perf_counter() - start
    if seeds is None:
        return _result(out, steps_per_epoch, seconds)
    return [_result(o, steps_per_epoch, seconds) for o in out]


def _result(out: engine.RunResult, steps_per_epoch: int, seconds: float) -> TrainResult:
    """:func:`train_and_evaluate`'s :class:`TrainResult` of the engine's ``out``: steps counted in
    epochs, the NLLs inf when no epoch was kept."""
    best_step = out.results["best_step"]
    kept = best_step > 0
    return TrainResult(
        best_valid=out.results.get("valid_nll", math.inf) if kept else math.inf,
        test_at_best=out.results.get("test_nll", math.inf) if kept else math.inf,
        best_epoch=-(-best_step // steps_per_epoch) if kept else 0,
        diverged=out.diverged,
        epochs_run=-(-out.results["step"] // steps_per_epoch),
        history=tuple(
            {
                "epoch": r["epoch"],
                "train": r["train_nll"],
                "valid": r["valid_nll"],
                "seconds": r["elapsed_s"],
            }
            for r in out.history
        ),
        seconds=seconds,
        best_params=out.best_params,
    )
