"""Language modelling with truncated BPTT, as a task of the run engine.

The protocol of the reference RHN code (Zilly et al. 2017, ``rhn_train.py``):

* the training stream is cut into B rows and windows of ``num_steps`` tokens; the
  final carry of a window feeds the next one and is zeroed at each epoch start;
* loss = summed cross-entropy over the window / B, plus ``weight_decay`` times
  half the squared L2 norm of every parameter; global-norm clipping; plain SGD
  with lr = lr0 / lr_decay ** max(epoch - max_epoch + 1, 0) (epochs from 0);
* validation perplexity (batched, no dropout) after every epoch; the best one is
  kept, and the final validation and test perplexity are recomputed from it,
  with batch size 1 over the whole sequence (the reference protocol) for a full
  run, batched for a run cut short by ``--max_steps`` / ``--max_epochs``.

The training rows live on the device; the loss (:func:`window_loss`, fed to the one
step of :mod:`rhnzoo.engine.step`) slices its window, draws its dropout masks from
the engine's per-step key and returns the truncated-BPTT carry in its aux, kept in the
training state, so the engine's checkpoints resume it exactly.

:class:`~rhnzoo.configs.lm.LMConfig` holds every setting of a run (``config.json``), beside
its presets; :func:`train_and_evaluate` trains one on a corpus.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import data, evaluation
from rhnzoo.configs.lm import LMConfig
from rhnzoo.models.lm import LanguageModel
from rhnzoo import engine
from rhnzoo.engine import sharding, step
from rhnzoo.engine.evaluate import Batches, Report

Array = jax.Array
State = dict[str, Any]


def l2_penalty(params: Any) -> Array:
    """0.5 * sum of squares of every parameter (TensorFlow's ``l2_loss``)."""
    return 0.5 * sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params))


def make_optimizer(cfg: LMConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm), optax.sgd(cfg.schedule(steps_per_epoch))
    )


def init_state(
    model: LanguageModel, cfg: LMConfig, tx: optax.GradientTransformation, key: Array
) -> State:
    """The task's training state: params, optimizer state and the truncated-BPTT carry."""
    params = model.init(key)
    return {
        "params": params,
        "opt_state": tx.init(params),
        "carry": model.initial_carry(cfg.batch_size),
    }


def window(rows: Array, index: Array, num_steps: int) -> tuple[Array, Array]:
    """Inputs and targets ``[B, T]`` of training window ``index`` (0-based) of the
    batchified stream ``rows [B, N] int32``; T = ``num_steps``."""
    xy = jax.lax.dynamic_slice_in_dim(rows, index * num_steps, num_steps + 1, axis=1)
    return xy[:, :-1], xy[:, 1:]


def reset_carry(carry: Any, index: Array) -> Any:
    """``carry`` zeroed at window 0 (an epoch's start), else as it is."""
    return jax.tree.map(lambda c: jnp.where(index == 0, jnp.zeros_like(c), c), carry)


def window_loss(
    model: LanguageModel,
    cfg: LMConfig,
    params: Any,
    batch: tuple[Array, Array],
    key: Array,
    carry: Any,
) -> tuple[Array, tuple[dict[str, Array], Any]]:
    """The training loss of one window, as :func:`rhnzoo.engine.step.make_train_step`
    takes it (bind ``model`` and ``cfg`` first).

    ``batch = (rows, index)``: the batchified training stream ``rows [B, N] int32`` (on
    the device) and the window's index (:func:`window`); the carry is zeroed at window 0
    and the dropout masks drawn from ``key``. Returns ``(loss, (sums, carry))``: loss =
    summed cross-entropy / B + ``weight_decay`` * 0.5 ||params||^2; ``sums = {'loss':
    summed cross-entropy of the window (nats, before weight decay), 'count': B T}``.
    """
    rows, index = batch
    x, y = window(rows, index, cfg.num_steps)
    masks = model.dropout_masks(key, x, cfg.rates)
    nll, carry = model.nll(params, reset_carry(carry, index), x, y, masks)
    loss = nll / cfg.batch_size + cfg.weight_decay * l2_penalty(params)
    return loss, ({"loss": nll, "count": jnp.float32(cfg.batch_size * cfg.num_steps)}, carry)


def make_train_step(model: LanguageModel, cfg: LMConfig, tx: optax.GradientTransformation):
    """The LM's ``train_step(state, (rows, window), key) -> (state, sums)`` on
    :func:`init_state`'s state: the one step (:func:`rhnzoo.engine.step.make_train_step`,
    which says how to call it) of :func:`window_loss`."""
    return step.make_train_step(functools.partial(window_loss, model, cfg), tx)


def final_batch_size(config: LMConfig, corpus: data.Corpus, steps_per_epoch: int) -> int:
    """The final evaluation's rows: ``config.eval_batch_size``, else 1 (the reference
    protocol) for a full run and the training batch for a run cut short.

    Raises ValueError (before training) if a split has fewer than two tokens a row.
    """
    cut = config.cut_short(steps_per_epoch)
    eval_batch = config.eval_batch_size or (config.batch_size if cut else 1)
    for split in ("valid", "test"):
        n = len(getattr(corpus, split))
        if eval_batch > n // 2:
            raise ValueError(
                f"--eval_batch_size={eval_batch} is too large for the {split} "
                f"split's {n:,} tokens (at most {n // 2:,}: two per row)"
            )
    return eval_batch


def eval_protocol(model: LanguageModel, config: LMConfig, corpus, mesh, eval_batch: int):
    """The engine's ``(eval_step, eval_batches, eval_carry)`` of the LM: windows of the
    split's stream (:func:`rhnzoo.evaluation.eval_windows`), the state carried across
    them from zero (:func:`rhnzoo.evaluation.window_sums`); the validation in
    ``config.batch_size`` rows and ``num_steps`` windows, the final evaluation in
    ``eval_batch`` rows and ``eval_num_steps`` windows; rows split over ``mesh``
    (zero-weight rows appended when the devices do not divide them)."""
    place = functools.partial(sharding.put_rows, mesh=mesh, pad=True)
    final_shape = (eval_batch, config.eval_num_steps)
    shape = lambda final: final_shape if final else (config.batch_size, config.num_steps)

    def eval_batches(split: str, final: bool):
        x, y, w = evaluation.eval_windows(getattr(corpus, split), *shape(final))
        return Batches(len(x), lambda i: place((x[i], y[i], w[i])))

    def eval_carry(split: str, final: bool):
        return place(model.initial_carry(shape(final)[0]))

    return functools.partial(evaluation.window_sums, model), eval_batches, eval_carry


def report(config: LMConfig, model, schedule, eval_batch: int, steps_per_epoch: int) -> Report:
    """How an LM run is reported: ``config.metric`` (perplexity or BPC) of the splits and
    of the training windows, tokens, the learning rate and the final protocol."""
    metric, to_metric = config.metric, evaluation.METRICS[config.metric]
    cut = config.cut_short(steps_per_epoch) and config.eval_batch_size is None
    return Report(
        select=f"valid_{metric}",
        metrics=lambda split, s: {f"{split}_{metric}": to_metric(s["loss"] / s["count"])},
        train_metrics=lambda s: {f"train_{metric}": to_metric(s["loss"] / max(s["count"], 1))},
        chance_loss=math.log(model.vocab_size),
        unit="tok",
        learning_rate=lambda step: float(schedule(step)),
        timed=True,
        final_label=f"eval batch {eval_batch}" + (", batched because the run was cut short" * cut),
        final_settings={
            "eval_batch_size": eval_batch,
            "eval_protocol": "reference batch-1" if eval_batch == 1 else "batched",
        },
    )


def train_and_evaluate(
    config: LMConfig,
    corpus: data.Corpus,
    *,
    workdir: str | os.PathLike | None = None,
    devices: list | None = None,
    log=print,
    on_divergence: str = "raise",
    model: LanguageModel | None = None,
    seeds: int | None = None,
) -> dict[str, Any] | list[dict[str, Any]]:
    """Trains the language model ``config`` describes on ``corpus`` and evaluates its best
    parameters: the one entry point of ``experiments/ptb.py``, ``char.py`` and the depth
    sweep.

    Args:
      config: every setting of the run (model, optimisation, evaluation, run length);
        ``config.json`` is ``config.to_dict()``, checked on resume.
      corpus: token id streams (``train``, ``valid``, ``test``: int arrays).
      workdir: run directory (default ``config.run_dir``); rerunning with it resumes
        exactly (:func:`rhnzoo.engine.run`).
      devices: data parallelism over these (default: all): batch rows are sharded over
        a ``Mesh(("data",))``, parameters replicated.
      log, on_divergence, seeds: :func:`rhnzoo.engine.run`'s (``seeds``: K seeds
        stacked, a list of their results).
      model: a language model of one's own to train by this protocol (default:
        ``config.model(corpus.vocab_size)``; ``config.json`` still records ``config``).

    Returns:
      The final results (also ``results.json``): ``valid_<metric>``, ``test_<metric>``
      (``config.metric``: perplexity or BPC), the evaluation protocol and the run's
      bookkeeping.

    Raises:
      ValueError: bad settings for this corpus (training or final evaluation batch too
        large, windows too long, batch not divisible by the devices), or an incompatible
        workdir (the corpus checks before anything is written).
      engine.TrainingDiverged: the loss became non-finite or exploded (``'raise'``).
      rhnzoo.engine.signals.Interrupted: a signal arrived (the state was saved).
    """
    model = model or config.model(corpus.vocab_size)
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(config.batch_size, mesh)
    rows_np = data.batchify(corpus.train, config.batch_size)
    data.batchify(corpus.valid, config.batch_size)  # fail early if valid is too short
    steps_per_epoch = data.num_windows(rows_np.shape[1], config.num_steps)
    rows = sharding.put(rows_np, sharding.by_rows(mesh))
    tx, schedule = make_optimizer(config, steps_per_epoch), config.schedule(steps_per_epoch)
    eval_batch = final_batch_size(config, corpus, steps_per_epoch)
    eval_step, eval_batches, eval_carry = eval_protocol(model, config, corpus, mesh, eval_batch)

    def init(key):
        state = sharding.put_tree(init_state(model, config, tx, key), sharding.replicated(mesh))
        state["carry"] = sharding.put_tree(state["carry"], sharding.by_rows(mesh))
        return state

    task = engine.Task(
        init_state=init,
        train_step=make_train_step(model, config, tx),
        train_batch=lambda seed, epoch, index: (rows, np.int32(index)),  # one order for all
        steps_per_epoch=steps_per_epoch,
        eval_step=eval_step,
        eval_batches=eval_batches,
        report=report(config, model, schedule, eval_batch, steps_per_epoch),
        batch_axes=None,  # the stream kept once, shared by the seeds
        eval_carry=eval_carry,
    )
    out = engine.run(
        task, config, workdir or config.run_dir, seeds=seeds, on_divergence=on_divergence, log=log
    )
    return out.results if seeds is None else [r.results for r in out]
