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
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import data
from rhnzoo.configs.lm import LMConfig
from rhnzoo.models.lm import LanguageModel
from rhnzoo import engine
from rhnzoo.engine import sharding, step

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
    """The LM's ``train_step(state, (rows, window), key) -> (state, sums)``: the one
    step (:func:`rhnzoo.engine.step.make_train_step`) of :func:`window_loss`.

    The state is :func:`init_state`'s; the engine jit-compiles the step with the state
    donated; to call it yourself, wrap it in ``jax.jit(..., donate_argnums=0)``.
    """
    return step.make_train_step(functools.partial(window_loss, model, cfg), tx)


def eval_windows(tokens: np.ndarray, batch_size: int, num_steps: int):
    """Cuts ``tokens [N]`` into evaluation windows covering every prediction.

    Returns ``(x, y, w)``, each ``[W, B, num_steps]``: inputs, targets and 0/1
    weights (the last window is zero-padded); B rows of the batchified stream,
    so B = 1 evaluates all N - 1 predictions as one sequence.
    """
    rows = data.batchify(tokens, batch_size)
    x, y = rows[:, :-1], rows[:, 1:]
    pad = -x.shape[1] % num_steps
    w = np.pad(np.ones_like(x, np.float32), ((0, 0), (0, pad)))
    x, y = (np.pad(a, ((0, 0), (0, pad))) for a in (x, y))
    split = lambda a: a.reshape(batch_size, -1, num_steps).transpose(1, 0, 2)
    return split(x), split(y), split(w)


def eval_time_chunk(
    num_steps: int, batch_size: int, vocab_size: int, max_logits: int = 1 << 21
) -> int:
    """The largest divisor c of ``num_steps`` with ``c * batch_size * vocab_size <=
    max_logits`` (at least 1): the ``time_chunk`` of :meth:`LanguageModel.nll` that keeps
    an evaluation window's logits at most ``max_logits`` floats (8 MB by default).

    Why: a window's whole ``[T, B, V]`` logits (80 MB at T 100, B 20 and PTB's 10,000
    words) make the CPU page in fresh memory on every call (figures in docs/runs/engine/figures.md).
    """
    steps = max(1, max_logits // (batch_size * vocab_size))
    return max(c for c in range(1, min(steps, num_steps) + 1) if num_steps % c == 0)


def _eval_window(model: LanguageModel, params, carry, total, x, y, w):
    """One evaluation window: the carry after it and ``total`` plus its summed NLL."""
    chunk = eval_time_chunk(x.shape[1], x.shape[0], model.vocab_size)
    nll, carry = model.nll(params, carry, x, y, None, w, time_chunk=chunk)
    return carry, total + nll


class Evaluator:
    """``evaluate(params, tokens, batch_size, num_steps, track=None) -> (nll_sum, count)``;
    with ``stacked=True``, K seeds' parameters stacked on a leading axis evaluated at once
    (the window ``jax.vmap``-ped over them): ``([nll_sum] * K, count)``.

    One jit-compiled call per window of ``num_steps`` (the state carried across
    windows, at most two in flight), so a long evaluation shows progress and stops
    promptly on a signal when given the engine's ``track``; no dropout.
    Nats per symbol are ``nll_sum / count``; :data:`METRICS` turns them into the metric.

    With a ``mesh`` (the params' devices, possibly spread over processes) the
    windows' rows are sharded over its ``"data"`` axis, zero-weight rows appended when
    the devices do not divide ``batch_size`` (the batch-1 protocol on 8 devices runs
    as 8 rows, one per device, 7 of them weighing nothing); every process passes the
    same tokens.
    """

    def __init__(self, model: LanguageModel, mesh: jax.sharding.Mesh | None = None):
        self.model, self.mesh = model, mesh
        window = functools.partial(_eval_window, model)
        self._window = jax.jit(window)
        self._windows = jax.jit(jax.vmap(window, in_axes=(0, 0, 0, None, None, None)))

    def _rows(self, a):
        return a if self.mesh is None else sharding.put_rows(a, self.mesh, pad=True)

    def __call__(self, params, tokens, batch_size, num_steps, track=None, stacked=False):
        x, y, w = eval_windows(tokens, batch_size, num_steps)
        carry, total = self._rows(self.model.initial_carry(batch_size)), np.zeros((), np.float32)
        window = self._window
        if stacked:  # one carry and total per seed, the rows still split over the devices
            k = len(jax.tree.leaves(params)[0])
            carry = jax.tree.map(lambda a: jnp.stack([a] * k), carry)
            total, window = np.zeros(k, np.float32), self._windows
        if self.mesh is not None:
            total = sharding.put(total, sharding.replicated(self.mesh))
        indices = range(len(x)) if track is None else track(range(len(x)), total=len(x))
        for i in indices:
            previous = total
            carry, total = window(params, carry, total, *self._rows((x[i], y[i], w[i])))
            jax.block_until_ready(previous)
        count = float(w.sum())
        return (
            (np.asarray(total).astype(float).tolist(), count) if stacked else (float(total), count)
        )


# Metric name -> nats per symbol to the metric: perplexity (inf past e^700), bits per character.
METRICS = {
    "ppl": lambda nats: math.exp(nats) if nats < 700 else math.inf,
    "bpc": lambda nats: nats / math.log(2),
}


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
      log: receives every printed line; None: silent.
      on_divergence: ``'raise'`` or ``'stop'`` (:func:`rhnzoo.engine.run`).
      model: a language model of one's own to train by this protocol (default:
        ``config.model(corpus.vocab_size)``; ``config.json`` still records ``config``).
      seeds: K seeds stacked (:func:`rhnzoo.engine.run`): a list of their results.

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
    model, metric = model or config.model(corpus.vocab_size), config.metric
    to_metric = METRICS[metric]
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(config.batch_size, mesh)
    rows_np = data.batchify(corpus.train, config.batch_size)
    data.batchify(corpus.valid, config.batch_size)  # fail early if valid is too short
    steps_per_epoch = data.num_windows(rows_np.shape[1], config.num_steps)
    rows = sharding.put(rows_np, sharding.by_rows(mesh))
    tx, schedule = make_optimizer(config, steps_per_epoch), config.schedule(steps_per_epoch)
    evaluate = Evaluator(model, mesh)
    cut = config.cut_short(steps_per_epoch)
    eval_batch = config.eval_batch_size or (config.batch_size if cut else 1)
    for split in ("valid", "test"):  # before training: the final evaluation's batch fits
        n = len(getattr(corpus, split))
        if eval_batch > n // 2:
            raise ValueError(
                f"--eval_batch_size={eval_batch} is too large for the {split} "
                f"split's {n:,} tokens (at most {n // 2:,}: two per row)"
            )

    def init(key):
        state = sharding.put_tree(init_state(model, config, tx, key), sharding.replicated(mesh))
        state["carry"] = sharding.put_tree(state["carry"], sharding.by_rows(mesh))
        return state

    def validated(nll, count):
        return {f"valid_{metric}": to_metric(nll / count), "valid_loss": nll / count}

    def validate(params, track):
        return validated(
            *evaluate(params, corpus.valid, config.batch_size, config.num_steps, track)
        )

    def validate_stacked(params, track):  # K seeds' parameters, one evaluation
        nlls, count = evaluate(
            params, corpus.valid, config.batch_size, config.num_steps, track, stacked=True
        )
        return [validated(nll, count) for nll in nlls]

    def final_evaluate(params, track):
        out = {
            "eval_batch_size": eval_batch,
            "eval_protocol": "reference batch-1" if eval_batch == 1 else "batched",
        }
        for split in ("valid", "test"):
            t0 = time.perf_counter()
            split_track = functools.partial(track, desc=f"final {split} (batch {eval_batch})")
            nll, count = evaluate(
                params, getattr(corpus, split), eval_batch, config.eval_num_steps, split_track
            )
            out[f"{split}_{metric}"] = to_metric(nll / count)
            out[f"{split}_eval_s"] = time.perf_counter() - t0
        return out

    short = (
        ", batched because the run was cut short" if cut and config.eval_batch_size is None else ""
    )
    task = engine.Task(
        init_state=init,
        train_step=make_train_step(model, config, tx),
        get_batch=lambda seed, epoch, index: (rows, np.int32(index)),  # one order for all
        get_batches=lambda seeds, epoch, index: (rows, np.int32(index)),
        seed_axes=None,
        steps_per_epoch=steps_per_epoch,
        validate=validate,
        validate_stacked=validate_stacked,
        final_evaluate=final_evaluate,
        select=f"valid_{metric}",
        train_metrics=lambda s: {f"train_{metric}": to_metric(s["loss"] / max(s["count"], 1))},
        chance_loss=math.log(model.vocab_size),
        unit="tok",
        learning_rate=lambda step: float(schedule(step)),
        final_label=f"eval batch {eval_batch}{short}",
        final_settings={"eval_batch_size": eval_batch},
    )
    out = engine.run(
        task, config, workdir or config.run_dir, seeds=seeds, on_divergence=on_divergence, log=log
    )
    return out.results if seeds is None else [r.results for r in out]
