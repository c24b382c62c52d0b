"""The evaluation shared by training and analysis, below both: what a batch contributes
(scalar sums), how a split is cut into batches, and how sums become metrics, for the
classifiers and the language models (Zilly et al. 2017's protocol). The one evaluation
loop, :func:`rhnzoo.engine.evaluate.evaluate`, sums these steps over a split's batches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import data

Array = jax.Array
Split = tuple[np.ndarray, np.ndarray]  # (images uint8 [N, m], labels int32 [N])


# ------------------------------------------------------------------- classification


def xent_sums(logits: Array, labels: Array, weights: Array | None = None) -> dict[str, Array]:
    """Softmax cross-entropy sums for the engine: ``{'loss': Σ CE (nats), 'count': Σ w,
    'correct': Σ w 1[argmax = label]}`` over ``logits [B, C]``, ``labels [B]`` int."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    hit = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    w = jnp.ones_like(ce) if weights is None else weights.astype(ce.dtype)
    return {"loss": jnp.sum(ce * w), "count": jnp.sum(w), "correct": jnp.sum(hit * w)}


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


def inputs(images: Array) -> Array:
    """A highway net's inputs: ``uint8 [B, ...] -> float32 [B, m]`` in [0, 1], flattened,
    pixel / 255."""
    return images.reshape(images.shape[0], -1).astype(jnp.float32) / 255.0


def highway_sums(net, params, batch) -> dict[str, Array]:
    """:func:`xent_sums` of a feed-forward net (``net.apply``, no dropout) on ``batch =
    (images uint8 [B, m], labels [B], weights [B])``."""
    images, labels, weights = batch
    return xent_sums(net.apply(params, inputs(images)), labels, weights)


@functools.lru_cache(maxsize=16)
def highway_sums_fn(net) -> Callable[..., dict[str, Array]]:
    """jit ``(params, images, labels, weights) -> xent_sums`` of ``net``
    (:func:`highway_sums`; one compilation per net, shared by its runs)."""
    return jax.jit(lambda params, *batch: highway_sums(net, params, batch))


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


# ------------------------------------------------------------------- language models

# Metric name -> nats per symbol to the metric: perplexity (inf past e^700), bits per character.
METRICS = {
    "ppl": lambda nats: math.exp(nats) if nats < 700 else math.inf,
    "bpc": lambda nats: nats / math.log(2),
}


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
    words) make the CPU page in fresh memory on every call (docs/runs/engine/figures.md).
    """
    steps = max(1, max_logits // (batch_size * vocab_size))
    return max(c for c in range(1, min(steps, num_steps) + 1) if num_steps % c == 0)


def window_sums(model, params, window, carry) -> tuple[dict[str, Array], Any]:
    """One evaluation window of a language model (no dropout): ``window = (x, y, w)``, each
    ``[B, T]`` (:func:`eval_windows`), ``carry`` the state after the previous window.
    Returns ``({'loss': Σ w NLL (nats), 'count': Σ w}, carry after the window)``."""
    x, y, w = window
    chunk = eval_time_chunk(x.shape[1], x.shape[0], model.vocab_size)
    nll, carry = model.nll(params, carry, x, y, None, w, time_chunk=chunk)
    return {"loss": nll, "count": jnp.sum(w)}, carry
