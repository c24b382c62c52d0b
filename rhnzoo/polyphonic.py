"""Next-step prediction of polyphonic music (piano rolls) with any rhnzoo cell.

The task of Boulanger-Lewandowski, Bengio & Vincent (ICML 2012) as used for the
optimisation study of Zilly et al. (2017, sec. 5.1, Fig. 4): at every time step the
model outputs 88 independent Bernoulli probabilities, one per piano key, for the next
frame. Input frame t (a 0/1 vector ``[88]``) predicts frame t + 1, so a sequence of
T frames gives T - 1 predictions, the first made from the zero state after one frame.

Loss: the negative log-likelihood of frame t + 1 under the 88 Bernoullis, i.e. the
binary cross-entropy summed over the notes, in nats; the reported figure is that sum
averaged over every prediction of a split (``NLL per time step``, the measure of
Boulanger-Lewandowski et al., Table 1). Training uses whole-sequence BPTT on
zero-padded minibatches; padded steps are masked out of the loss.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import cells
from rhnzoo.data.music import NUM_NOTES, pad_batch

Array = jax.Array
Params = Any


@dataclasses.dataclass(frozen=True)
class PianoRollModel:
    """Cell -> linear -> 88 sigmoid logits.

    ``logits(params, x [T, B, 88]) -> [T, B, 88]``: the cell runs over the frames from
    the zero state; output t holds the logits of frame t + 1 (apply sigmoid for the note
    probabilities). Parameters: ``{'cell': <cell params>, 'W_out': [n, 88], 'b_out':
    [88]}``; ``W_out`` uniform in ±``cell.init_scale`` (like the cell), ``b_out`` zero.

    Attributes:
      cell: any cell of the :mod:`rhnzoo.cells` protocol whose carry is ``[B, n]`` and
        whose output is ``[B, n]`` with n = ``cell.hidden_size``.
      num_notes: piano-roll width (88).
    """

    cell: Any
    num_notes: int = NUM_NOTES

    def init(self, key: Array) -> Params:
        kc, ko = jax.random.split(key)
        scale = getattr(self.cell, "init_scale", 0.04)
        n = self.cell.hidden_size
        return {
            "cell": self.cell.init(kc, self.num_notes),
            "W_out": jax.random.uniform(ko, (n, self.num_notes), jnp.float32, -scale, scale),
            "b_out": jnp.zeros((self.num_notes,), jnp.float32),
        }

    def logits(self, params: Params, x: Array) -> Array:
        """``x [T, B, 88]`` frames -> ``[T, B, 88]`` logits of the frames t + 1."""
        carry = self.cell.initial_carry(x.shape[1], x.dtype)
        _, ys = cells.unroll(self.cell, params["cell"], carry, x)
        return ys @ params["W_out"].astype(ys.dtype) + params["b_out"]


def num_params(model: PianoRollModel) -> int:
    """Number of scalar parameters of ``model`` (from shapes only; nothing is initialised)."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    return sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))


def nll_sums(model: PianoRollModel, params: Params, x: Array, mask: Array) -> tuple[Array, Array]:
    """Summed next-step NLL and the number of predictions in a padded batch.

    Args:
      x: ``[T, B, 88]`` 0/1 frames, zero-padded; mask: ``[T, B]``, 1 on real frames
        (a prefix of each column).
    Returns:
      ``(total, count)``, float32 scalars: ``total`` = Σ over predictions t -> t + 1 with
      mask[t + 1] = 1 of Σ_notes BCE(sigmoid(logit), frame_{t+1}) in nats; ``count`` =
      the number of such predictions (Σ_b (T_b - 1)).
    """
    z = model.logits(params, x[:-1])
    y = x[1:]
    # -log p(y | z) for a Bernoulli with logit z: softplus(z) - y z (stable for any z).
    bce = jnp.sum(jax.nn.softplus(z) - y * z, axis=-1)
    w = mask[1:]
    return jnp.sum(bce * w), jnp.sum(w)


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


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(model: PianoRollModel, params, opt_state, x: Array, mask: Array):
    """One SGD step on a padded minibatch; the loss is the NLL per prediction of the batch.

    Args:
      model: static (hashable); params, opt_state: donated; opt_state from
        ``sgd(...).init(params)``; x ``[T, B, 88]``, mask ``[T, B]`` (``pad_batch``).
    Returns:
      ``(params, opt_state, loss)``; loss is the batch's mean NLL per time step (nats)
      before the update.
    """

    def loss_fn(p):
        total, count = nll_sums(model, p, x, mask)
        return total / jnp.maximum(count, 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = sgd(0.0, 0.0, 1.0).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


_nll_sums_jit = jax.jit(nll_sums, static_argnums=0)


def evaluate(
    model: PianoRollModel,
    params: Params,
    seqs: Sequence[np.ndarray],
    *,
    length: int | None = None,
    batch_size: int | None = None,
) -> float:
    """NLL per time step (nats) of ``seqs`` (rolls ``[T_i, 88]``): the next-step NLL summed
    over all Σ (T_i - 1) predictions, divided by their number.

    Batches of ``batch_size`` sequences (default: all of them) are padded to ``length``
    (default: the longest); fixing both lets several splits share one compiled shape.

    Raises: ValueError if no sequence has two or more frames, or length/batch_size too small.
    """
    length = max(s.shape[0] for s in seqs) if length is None else length
    batch_size = len(seqs) if batch_size is None else batch_size
    total, count = 0.0, 0.0
    for i in range(0, len(seqs), batch_size):
        x, mask = pad_batch(seqs[i : i + batch_size], length, batch_size)
        t, c = _nll_sums_jit(model, params, jnp.asarray(x), jnp.asarray(mask))
        total, count = total + float(t), count + float(c)
    if count == 0:
        raise ValueError("no predictions: every sequence has fewer than two frames")
    return total / count


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train`. NLLs are nats per time step. ``diverged``: training
    stopped at a non-finite loss; ``best_valid`` / ``test_at_best`` are still those of
    the best finite epoch, or inf (and ``best_epoch`` 0) if there was none."""

    best_valid: float
    test_at_best: float
    best_epoch: int  # 1-based; 0 if none
    diverged: bool
    epochs_run: int
    history: tuple[dict, ...]  # per epoch: epoch, train, valid, seconds
    seconds: float


def train(
    model: PianoRollModel,
    data: dict[str, Sequence[np.ndarray]],
    *,
    lr: float,
    momentum: float = 0.0,
    max_grad_norm: float = 10.0,
    batch_size: int = 16,
    epochs: int = 10,
    key: Array | int = 0,
    params: Params | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train ``model`` on ``data['train']`` with clipped SGD, keeping the best validation epoch.

    Each epoch shuffles the training sequences (from ``key``), cuts them into minibatches
    of ``batch_size`` (the last one padded with empty sequences) padded to the longest
    training sequence, so every step has one shape and compiles once per model. After
    each epoch the validation NLL is computed; when it improves, the test NLL too (the
    test figure reported is the one at the best validation epoch). Training stops early
    if an epoch's training loss or the validation NLL is not finite (divergence).

    Args:
      model: the model; data: ``{'train', 'valid', 'test'}`` -> rolls ``[T_i, 88]``.
      lr, momentum, max_grad_norm: SGD hyperparameters (see :func:`sgd`); lr > 0,
        0 <= momentum < 1, max_grad_norm > 0.
      batch_size: sequences per step (>= 1); epochs: >= 1.
      key: PRNG key or int seed: initialisation (unless ``params`` given) and shuffling.
      params: initial parameters (default ``model.init``); consumed (donated to the step).
      log: called with one line per epoch, if given.
    Returns: TrainResult.
    Raises: ValueError for invalid hyperparameters.
    """
    if not lr > 0 or not 0 <= momentum < 1 or not max_grad_norm > 0:
        raise ValueError(
            f"need lr > 0, 0 <= momentum < 1, max_grad_norm > 0; got {lr}, {momentum}, "
            f"{max_grad_norm}"
        )
    if batch_size < 1 or epochs < 1:
        raise ValueError(f"batch_size and epochs must be >= 1, got {batch_size}, {epochs}")
    key = jax.random.PRNGKey(key) if isinstance(key, int) else key
    k_init, k_shuffle = jax.random.split(key)
    if params is None:
        params = model.init(k_init)
    opt_state = sgd(lr, momentum, max_grad_norm).init(params)
    train_seqs = list(data["train"])
    length = max(s.shape[0] for s in train_seqs)
    # Valid and test padded to one shape: the evaluation compiles once per model.
    eval_pad = {
        "length": max(s.shape[0] for split in ("valid", "test") for s in data[split]),
        "batch_size": max(len(data["valid"]), len(data["test"])),
    }
    rng = np.random.default_rng(int(jax.random.randint(k_shuffle, (), 0, 2**31 - 1)))
    best = {"valid": math.inf, "test": math.inf, "epoch": 0}
    history, diverged, start = [], False, time.perf_counter()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        order = rng.permutation(len(train_seqs))
        losses = []
        for i in range(0, len(order), batch_size):
            x, mask = pad_batch(
                [train_seqs[j] for j in order[i : i + batch_size]], length, batch_size
            )
            params, opt_state, loss = train_step(
                model, params, opt_state, jnp.asarray(x), jnp.asarray(mask)
            )
            losses.append(loss)
        train_loss = float(jnp.mean(jnp.stack(losses)))
        valid = (
            evaluate(model, params, data["valid"], **eval_pad)
            if math.isfinite(train_loss)
            else math.nan
        )
        if math.isfinite(valid) and valid < best["valid"]:
            best = {
                "valid": valid,
                "test": evaluate(model, params, data["test"], **eval_pad),
                "epoch": epoch,
            }
        seconds = time.perf_counter() - t0
        history.append({"epoch": epoch, "train": train_loss, "valid": valid, "seconds": seconds})
        if log is not None:
            log(
                f"epoch {epoch:3d} | train {train_loss:8.4f} | valid {valid:8.4f} | "
                f"best valid {best['valid']:8.4f} (test {best['test']:.4f}) | {seconds:6.1f} s"
            )
        if not (math.isfinite(train_loss) and math.isfinite(valid)):
            diverged = True
            break
    return TrainResult(
        best_valid=best["valid"],
        test_at_best=best["test"],
        best_epoch=best["epoch"],
        diverged=diverged,
        epochs_run=len(history),
        history=tuple(history),
        seconds=time.perf_counter() - start,
    )
