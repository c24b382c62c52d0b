"""Pieces shared by the classification tasks (feed-forward highway nets, sequence
classifiers): shuffled minibatches as a pure function of (seed, epoch, index),
softmax cross-entropy sums for the engine, and batched evaluation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo.engine import sharding

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


def xent_sums(logits: Array, labels: Array, weights: Array | None = None) -> dict[str, Array]:
    """Softmax cross-entropy sums for the engine: ``{'loss': Σ CE (nats), 'count': Σ w,
    'correct': Σ w 1[argmax = label]}`` over ``logits [B, C]``, ``labels [B]`` int."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    hit = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    w = jnp.ones_like(ce) if weights is None else weights.astype(ce.dtype)
    return {"loss": jnp.sum(ce * w), "count": jnp.sum(w), "correct": jnp.sum(hit * w)}


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


def evaluate(
    sums_fn: Callable[..., dict[str, Array]],
    params: Any,
    arrays: tuple[np.ndarray, ...],
    batch_size: int,
    track: Callable | None = None,
    desc: str = "",
    mesh: jax.sharding.Mesh | None = None,
    stacked: bool = False,
) -> dict[str, float] | list[dict[str, float]]:
    """Mean cross-entropy and accuracy of ``params`` over a dataset, in batches.

    Args:
      sums_fn: jit-compiled ``sums_fn(params, *batch_arrays, weights) -> xent_sums``.
      arrays: the dataset, each ``[N, ...]`` (e.g. ``(images, labels)``); the last
        batch is zero-padded with weight 0, so every call has one shape.
      batch_size: rows per call.
      track: the engine's progress/signal iterator, if any.
      mesh: the params' ``Mesh(("data",))``: each batch's rows are split over it
        (:func:`rhnzoo.engine.sharding.put_rows`, zero-weight rows appended when the
        devices do not divide ``batch_size``); None: default placement.
      stacked: ``params`` are K stacked seeds' and ``sums_fn`` is ``jax.vmap``-ped over
        them (its sums ``[K]``): one dict per seed.

    Returns:
      ``{'loss': mean CE (nats), 'accuracy': fraction correct, 'count': N}`` (stacked: a
      list of K).
    """
    n = len(arrays[0])
    starts = range(0, n, batch_size)
    if track is not None:
        starts = track(starts, total=-(-n // batch_size), desc=desc)
    place = (lambda b: b) if mesh is None else (lambda b: sharding.put_rows(b, mesh, pad=True))
    batches = padded_slices(arrays, batch_size, starts)
    totals = add_up(sums_fn(params, *place(b)) for b in batches)
    return seed_means(totals) if stacked else means(totals)


def padded_slices(arrays: Sequence[np.ndarray], batch_size: int, starts=None):
    """Yields ``(*parts, weights)`` for the rows ``start : start + batch_size`` of every
    array (default starts: every batch), the last one zero-padded to ``batch_size``
    rows with weight 0, so that a jit-compiled function sees one shape."""
    for start in range(0, len(arrays[0]), batch_size) if starts is None else starts:
        part = [a[start : start + batch_size] for a in arrays]
        pad = batch_size - len(part[0])
        weights = np.concatenate([np.ones(len(part[0]), np.float32), np.zeros(pad, np.float32)])
        part = [
            np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) if pad else a for a in part
        ]
        yield (*part, weights)


def add_up(sums: Iterable[Any]) -> Any:
    """The element-wise sum of a stream of equal pytrees (of device arrays)."""
    totals = None
    for s in sums:
        totals = s if totals is None else jax.tree.map(jnp.add, totals, s)
    return totals


def seed_means(totals: dict[str, Array]) -> list[dict[str, float]]:
    """:func:`means` of each seed of K stacked seeds' totals (each ``[K]``)."""
    totals = jax.device_get(totals)
    return [means({k: v[i] for k, v in totals.items()}) for i in range(len(totals["count"]))]


def means(totals: dict[str, Array]) -> dict[str, float]:
    """``{'loss', 'accuracy', 'count'}`` from summed :func:`xent_sums`."""
    totals = {k: float(v) for k, v in totals.items()}
    return {
        "loss": totals["loss"] / totals["count"],
        "accuracy": totals["correct"] / totals["count"],
        "count": int(totals["count"]),
    }
