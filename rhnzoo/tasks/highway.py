"""Training the fully connected highway and plain nets (Srivastava et al.) on the run engine.

:func:`train_and_evaluate` is the one entry point of a run (the depth sweep,
:mod:`rhnzoo.studies.highway`, trains each of its runs through it).

The optimiser is the ECBM4040 reproduction's: SGD with momentum 0.9 on the batch's
mean cross-entropy, the learning rate decayed by 0.96 every 100,000 steps
(staircase), batches of 128. Images are ``uint8``; the step divides by 255.

Data: the last ``valid_size`` training images (10,000 by default, the usual
50,000 / 10,000 MNIST split) are held out for validation, which picks the best
epoch's parameters; the test set is evaluated once, on those (``results.json``).
The papers' figure of merit, the mean training cross-entropy per epoch
(Srivastava et al. Fig. 1), is the engine's ``train_xent`` (running mean over the
epoch's batches, as Keras reports it).

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
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo.configs.highway import HighwayConfig
from rhnzoo.models.highway import FeedForwardNet
from rhnzoo.tasks import classify
from rhnzoo import engine
from rhnzoo.engine import sharding, step

Array = jax.Array
Params = Any
Split = tuple[np.ndarray, np.ndarray]  # (images uint8 [N, m], labels int32 [N])

__all__ = [
    "inputs",
    "split_data",
    "make_optimizer",
    "forward",
    "make_train_step",
    "make_sums_fn",
    "evaluate",
    "init_state",
    "train_and_evaluate",
]


def inputs(images: Array) -> Array:
    """``uint8 [B, ...] -> float32 [B, m]`` in [0, 1]: flattened, pixel / 255."""
    return images.reshape(images.shape[0], -1).astype(jnp.float32) / 255.0


def split_data(
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    valid_size: int,
) -> dict[str, Split]:
    """``{'train', 'valid', 'test'}`` -> (images uint8 ``[N, m]`` flattened, labels
    int32 ``[N]``); valid is the last ``valid_size`` training images.

    Raises:
      ValueError: unless 1 <= valid_size < number of training images.
    """
    n = len(train_images)
    if not isinstance(valid_size, int) or not 1 <= valid_size < n:
        raise ValueError(
            f"--valid_size must be in [1, {n - 1}] for {n} training images, got {valid_size!r}"
        )
    flat = lambda a: np.ascontiguousarray(np.asarray(a, np.uint8).reshape(len(a), -1))
    x, y = flat(train_images), np.asarray(train_labels, np.int32)
    return {
        "train": (x[: n - valid_size], y[: n - valid_size]),
        "valid": (x[n - valid_size :], y[n - valid_size :]),
        "test": (flat(test_images), np.asarray(test_labels, np.int32)),
    }


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
    """The engine's ``train_step``: ``(state, (images, labels, idx), key) -> (state, sums)``.

    ``images uint8 [N, m]`` and ``labels [N]`` are the device-resident training
    split, ``idx int [B]`` the batch; the update is on the batch's mean
    cross-entropy; ``sums`` are :func:`rhnzoo.tasks.classify.xent_sums` before
    the update.
    """
    return step.make_train_step(classify.xent_loss(functools.partial(forward, net)), tx)


@functools.lru_cache(maxsize=16)
def make_sums_fn(net: FeedForwardNet, stacked: bool = False) -> Callable[..., dict[str, Array]]:
    """jit ``(params, images uint8 [B, m], labels [B], weights [B]) -> xent_sums``
    (``stacked``: K stacked seeds' params, the sums ``[K]``).

    The stacked sums are each seed's, one seed after another in the one program
    (``jax.lax.map``), each formed as the unstacked function forms it: on the CPU equal
    bit for bit to a separate run's, so a near-tie picks the same best checkpoint. (A
    ``jax.vmap`` over the seeds rounded differently: validation losses off in the 8th
    digit at some shapes.)
    """
    sums = lambda p, images, labels, w: classify.xent_sums(net.apply(p, inputs(images)), labels, w)
    if not stacked:
        return jax.jit(sums)
    return jax.jit(lambda ps, *batch: jax.lax.map(lambda p: sums(p, *batch), ps))


def evaluate(
    net: FeedForwardNet,
    params: Params,
    split: Split,
    batch_size: int = 1000,
    track=None,
    desc: str = "",
    mesh=None,
) -> dict[str, float]:
    """Mean cross-entropy (nats) and accuracy of ``params`` on ``split``:
    ``{'loss', 'accuracy', 'count'}`` (:func:`rhnzoo.tasks.classify.evaluate`)."""
    return classify.evaluate(make_sums_fn(net), params, split, batch_size, track, desc, mesh)


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
      cfg: the run's settings; splits: :func:`split_data`'s (images uint8 ``[N, m]``).
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

    def indices(seed: int, epoch: int, index: int):
        idx = classify.batch_indices(seed, epoch, index, len(x_train), cfg.batch_size)
        return idx.astype(np.int32)

    def get_batch(seed: int, epoch: int, index: int):
        return images, labels, sharding.put_rows(indices(seed, epoch, index), mesh)

    def get_batches(seeds, epoch: int, index: int):  # K seeds' indices into one training set
        idx = np.stack([indices(seed, epoch, index) for seed in seeds])
        return images, labels, sharding.put_rows(idx, mesh, stacked=True)

    def metrics(params, split: str, track) -> dict[str, float]:
        r = evaluate(net, params, splits[split], cfg.eval_batch_size, track, split, mesh)
        return {f"{split}_xent": r["loss"], f"{split}_acc": r["accuracy"]}

    def validate(params, track) -> dict[str, float]:
        out = metrics(params, "valid", track)
        return {**out, "valid_loss": out["valid_xent"]}

    seeds_sums = make_sums_fn(net, stacked=True)

    def validate_stacked(params, track) -> list[dict[str, float]]:  # K seeds at once
        rows = classify.evaluate(
            seeds_sums,
            params,
            splits["valid"],
            cfg.eval_batch_size,
            track,
            "valid",
            mesh,
            stacked=True,
        )
        return [
            {"valid_xent": r["loss"], "valid_acc": r["accuracy"], "valid_loss": r["loss"]}
            for r in rows
        ]

    task = engine.Task(
        init_state=lambda key: sharding.put_tree(fresh(key), replicated),
        train_step=make_train_step(net, tx),
        get_batch=get_batch,
        get_batches=get_batches,
        seed_axes=(None, None, 0),
        steps_per_epoch=steps_per_epoch,
        validate=validate,
        validate_stacked=validate_stacked,
        final_evaluate=lambda p, track: {**metrics(p, "valid", track), **metrics(p, "test", track)},
        select="valid_xent",
        train_metrics=classify.train_metrics,
        chance_loss=math.log(net.num_classes),
        unit="img",
        learning_rate=lambda step: float(schedule(step)),
    )
    return engine.run(task, cfg, workdir, seeds=seeds, on_divergence=on_divergence, log=log)
