"""Pieces shared by the classification tasks (feed-forward highway nets, sequence
classifiers): shuffled minibatches as a pure function of (seed, epoch, index), the
mean cross-entropy loss of a step, and the engine's evaluation of a classifier (its
report and batches; the sums are :mod:`rhnzoo.evaluation`'s).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo import evaluation
from rhnzoo.engine import sharding
from rhnzoo.engine.evaluate import Batches, Report
from rhnzoo.evaluation import xent_sums

Array = jax.Array


@functools.lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of ``n`` examples in ``epoch``: a permutation drawn from ``(seed, epoch)``
    only, so batch k of epoch e is the same in a resumed run."""
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


def batch_indices(seed: int, epoch: int, index: int, n: int, batch_size: int) -> np.ndarray:
    """``[batch_size]`` example indices of batch ``index`` of ``epoch`` (the last partial
    batch of an epoch is dropped: ``n // batch_size`` batches per epoch)."""
    return epoch_permutation(seed, epoch, n)[index * batch_size : (index + 1) * batch_size]


def steps_per_epoch(n: int, batch_size: int) -> int:
    """``n // batch_size``. Raises ValueError if there is no full batch."""
    if batch_size < 1 or n < batch_size:
        raise ValueError(
            f"batch_size must be in [1, {n}] for {n} training examples, got {batch_size}"
        )
    return n // batch_size


def xent_loss(forward: Callable[[Any, Any, Array], tuple]):
    """A classifier's loss for :func:`rhnzoo.engine.step.make_train_step`: the batch's
    mean cross-entropy (highway nets, sequence classifiers).

    ``forward(params, batch, key) -> (logits [B, C], labels [B], weights [B] or None,
    extra)``: the model on the batch (``key`` for its dropout), and ``extra`` a dict of
    sums to report beside :func:`xent_sums` (e.g. the tokens read). Returns
    ``loss_fn(params, batch, key, carry) -> (mean CE, (sums, carry))``.
    """
    return functools.partial(_mean_xent, forward)


def _mean_xent(forward, params, batch, key, carry):
    """:func:`xent_loss`'s ``loss_fn`` with its ``forward`` bound first."""
    logits, labels, weights, extra = forward(params, batch, key)
    sums = xent_sums(logits, labels, weights)
    return sums["loss"] / jnp.maximum(sums["count"], 1.0), ({**sums, **extra}, carry)


def train_metrics(sums) -> dict[str, float]:
    """Reported training metrics from summed ``xent_sums``: cross-entropy and accuracy."""
    count = max(sums["count"], 1.0)
    return {"train_xent": sums["loss"] / count, "train_acc": sums.get("correct", math.nan) / count}


def report(select: str, higher_is_better: bool = False, **kwargs) -> Report:
    """A classifier's :class:`rhnzoo.engine.evaluate.Report`: each split's mean
    cross-entropy ``'<split>_xent'`` (nats) and accuracy ``'<split>_acc'`` from summed
    :func:`rhnzoo.evaluation.xent_sums`, :func:`train_metrics`; ``kwargs``: the Report's
    other fields (chance loss, unit, ...)."""
    metrics = lambda split, s: {
        f"{split}_xent": s["loss"] / s["count"],
        f"{split}_acc": s["correct"] / s["count"],
    }
    return Report(select, metrics, higher_is_better, train_metrics, **kwargs)


def eval_batches(splits: Mapping[str, tuple[np.ndarray, ...]], batch_size: int, mesh=None):
    """The engine's ``eval_batches(split, final)`` of a classifier evaluated on whole
    arrays (``splits[split]``, e.g. ``(images, labels)``, each ``[N, ...]``): batches of
    ``batch_size`` rows plus weights, the last zero-padded with weight 0
    (:func:`rhnzoo.evaluation.padded_slices`), their rows split over ``mesh`` (zero-weight
    rows appended when the devices do not divide them)."""
    place = (
        (lambda b: b) if mesh is None else functools.partial(sharding.put_rows, mesh=mesh, pad=True)
    )

    def batches(split: str, final: bool) -> Batches:
        arrays = splits[split]
        get = lambda i: place(next(evaluation.padded_slices(arrays, batch_size, [i * batch_size])))
        return Batches(-(-len(arrays[0]) // batch_size), get)

    return batches
