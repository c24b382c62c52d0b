"""Training the fully connected highway and plain nets (Srivastava et al.) on the run engine.

:func:`train_and_evaluate` is the one entry point of a run (the depth sweep,
:mod:`rhnzoo.studies.highway`, trains each of its runs through it). The optimiser is the
ECBM4040 reproduction's: SGD with momentum on the batch's mean cross-entropy, the learning
rate decayed in a staircase (:func:`make_optimizer`; the values and their source:
:mod:`rhnzoo.configs.highway`). The validation set (the last ``valid_size`` training
images, :func:`rhnzoo.evaluation.split_data`) picks the best epoch's parameters; the test
set is evaluated once, on those. The papers' figure of merit, the mean training
cross-entropy per epoch (Srivastava et al. Fig. 1), is the engine's ``train_xent``
(running mean over the epoch's batches, as Keras reports it).

The whole training split lives on the device; batch k of epoch e is an index
vector (:func:`rhnzoo.tasks.classify.batch_indices`, a function of the seed,
e and k) and the step gathers its images, so a step moves 512 bytes to the device.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax

from rhnzoo import evaluation
from rhnzoo.evaluation import inputs
from rhnzoo.configs.highway import HighwayConfig
from rhnzoo.models.highway import FeedForwardNet
from rhnzoo.tasks import classify
from rhnzoo import engine
from rhnzoo.engine import sharding, step

Array = jax.Array
Params = Any
Split = evaluation.Split


def make_optimizer(
    cfg: HighwayConfig, lr: float
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """SGD with momentum and a staircase exponential decay from ``lr``: ``(tx, schedule)``."""
    schedule = optax.exponential_decay(lr, cfg.lr_decay_steps, cfg.lr_decay_rate, staircase=True)
    return optax.sgd(schedule, momentum=cfg.momentum or None), schedule


def forward(net: FeedForwardNet, params, batch, key):
    """The net on a batch, for :func:`rhnzoo.tasks.classify.xent_loss`: ``batch`` is
    ``(images uint8 [N, m], labels [N], idx int [B])``; returns ``(logits [B, C], labels
    [B], None, {})`` (no dropout: ``key`` unused)."""
    del key
    images, labels, idx = batch
    return net.apply(params, inputs(images[idx])), labels[idx], None, {}


def make_train_step(net: FeedForwardNet, tx: optax.GradientTransformation):
    """The engine's ``train_step``: ``(state, (images, labels, idx), key) -> (state, sums)``
    (:func:`forward`'s batch); the update is on the batch's mean cross-entropy; ``sums``
    are :func:`rhnzoo.evaluation.xent_sums` before the update."""
    return step.make_train_step(classify.xent_loss(functools.partial(forward, net)), tx)


@functools.lru_cache(maxsize=16)
def eval_step(net: FeedForwardNet):
    """The engine's ``eval_step(params, (images, labels, weights)) -> xent_sums`` of
    ``net``: one function object per net, so the runs of a sweep share its compilation."""
    return functools.partial(evaluation.highway_sums, net)


def init_state(net: FeedForwardNet, tx: optax.GradientTransformation, key: Array) -> dict:
    """A fresh training state ``{'params', 'opt_state'}``: ``net.init(key)`` and ``tx``'s
    state of it."""
    params = net.init(key)
    return {"params": params, "opt_state": tx.init(params)}


def _check_images(net: FeedForwardNet, splits: Mapping[str, Split]) -> None:
    """Raises ValueError (one line) unless every split's images are ``[N, net.input_size]``."""
    for name, (x, _) in splits.items():
        if x.ndim != 2 or x.shape[1] != net.input_size:
            raise ValueError(
                f"{name} images are {x.shape[1:]} per example, the net takes "
                f"{net.input_size} inputs"
            )


def train_and_evaluate(
    cfg: HighwayConfig,
    splits: Mapping[str, Split],
    workdir: str | os.PathLike | None = None,
    *,
    net: FeedForwardNet | None = None,
    devices: list | None = None,
    log: Callable[[str], None] | None = print,
    on_divergence: str = "raise",
    seeds: int | None = None,
) -> engine.RunResult | list[engine.RunResult]:
    """Trains and evaluates one net: the one entry point of a highway / plain net run.

    Builds the net, the optimizer (:func:`make_optimizer` at
    :meth:`HighwayConfig.learning_rate` of the net's kind and depth), the state, the
    batches (:func:`rhnzoo.tasks.classify.batch_indices` of ``cfg.seed``) and the
    evaluation, and runs them on :func:`rhnzoo.engine.run` at ``cfg``, in
    ``workdir`` (None: in memory), whose ``config.json`` is ``cfg.to_dict()`` (a run's
    own config: :meth:`HighwayConfig.narrow`).

    Args:
      cfg: the run's settings; splits: :func:`rhnzoo.evaluation.split_data`'s (images
        uint8 ``[N, m]``).
      net: the model; default ``cfg.net()`` (the dataset's sizes): pass one only for
        images of other sizes (synthetic data). ``config.json`` records ``cfg``.
      devices: data parallelism over these (default: all): the training split and the
        parameters replicated, each batch's rows split over a ``Mesh(("data",))``.
      log, on_divergence, seeds: :func:`rhnzoo.engine.run`'s (``seeds``: K
        seeds stacked, a list of their results).

    Returns:
      The engine's :class:`~rhnzoo.engine.RunResult`: results ``valid_xent``,
      ``valid_acc``, ``test_xent``, ``test_acc`` (nats, fractions) of the best epoch.

    Raises:
      ValueError: (one line) images not ``[N, net.input_size]``, a training split
        smaller than a batch, devices that do not divide the batch, an incompatible
        workdir; and what :func:`rhnzoo.engine.run` raises.
    """
    net = cfg.net() if net is None else net
    _check_images(net, splits)
    x_train, y_train = splits["train"]
    steps_per_epoch = classify.steps_per_epoch(len(x_train), cfg.batch_size)
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(cfg.batch_size, mesh)
    tx, schedule = make_optimizer(cfg, cfg.learning_rate(net.kind, net.depth))
    replicated = sharding.replicated(mesh)
    images, labels = sharding.put_tree((x_train, y_train), replicated)
    fresh = jax.jit(functools.partial(init_state, net, tx))  # one compilation per run

    def train_batch(seed: int, epoch: int, index: int):  # indices into the training set
        idx = classify.batch_indices(seed, epoch, index, len(x_train), cfg.batch_size)
        return images, labels, sharding.put_rows(idx.astype(np.int32), mesh)

    task = engine.Task(
        init_state=lambda key: sharding.put_tree(fresh(key), replicated),
        train_step=make_train_step(net, tx),
        train_batch=train_batch,
        steps_per_epoch=steps_per_epoch,
        eval_step=eval_step(net),
        eval_batches=classify.eval_batches(splits, cfg.eval_batch_size, mesh),
        report=classify.report(
            "valid_xent",
            chance_loss=math.log(net.num_classes),
            unit="img",
            learning_rate=lambda step: float(schedule(step)),
        ),
        batch_axes=(None, None, 0),  # the training set kept once, shared by the seeds
    )
    return engine.run(task, cfg, workdir, seeds=seeds, on_divergence=on_divergence, log=log)
