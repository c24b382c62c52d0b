"""Sequence classification (Wang & Tian, EMNLP 2016, sec. 4) as a task of the run engine.

* Data: sequences (token-id arrays of any length, or float feature rows for P-MNIST)
  with integer labels, split into train / dev (15 % of the training set, fixed seed;
  model selection and early stopping) / test (reported at the best dev epoch).
* Batches: every sequence is cut to ``max_len`` steps (by default its *last* ones:
  with a final-state readout the end of a review carries its verdict; Keras'
  ``pad_sequences`` truncates the same way) and goes to the smallest of a few fixed padded lengths (``buckets``) that
  holds it, so jit compiles one training and one evaluation shape per bucket. Epoch e
  shuffles each bucket and the list of all batches with ``(seed, e)``; a bucket's last
  batch is filled with weight-0 rows. Batch k of epoch e is therefore a pure function
  of (seed, e, k), as the engine's exact resume needs.
* Optimiser: Adadelta (Zeiler 2012; rho 0.95, eps 1e-6, ``optax.adadelta`` with
  ``learning_rate=1.0`` — its default of None would not negate the update) after
  global-norm gradient clipping; loss = mean cross-entropy over the batch's real rows.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.training import classify, engine

Array = jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """Labelled sequences: ``inputs[i]`` is ``[T_i]`` int32 token ids or ``[T_i, m]``
    float32 features; ``labels [N] int32``."""

    inputs: Sequence[np.ndarray]
    labels: np.ndarray

    def __post_init__(self):
        if len(self.inputs) != len(self.labels):
            raise ValueError(f"{len(self.inputs)} sequences but {len(self.labels)} labels")

    def subset(self, index: np.ndarray) -> Split:
        return Split([self.inputs[i] for i in index], np.asarray(self.labels)[index])


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and batching settings.

    Attributes:
      batch_size: sequences per step.
      max_len: training and evaluation sequences keep ``max_len`` steps.
      keep: ``'last'`` (default) or ``'first'``: which steps of a longer sequence.
      buckets: number of padded lengths (``max_len`` / 2^k, k < buckets, multiples of 8).
      lr: Adadelta learning rate (1.0: Zeiler's method as published).
      rho, eps: Adadelta's decay and epsilon.
      max_grad_norm: global-norm clipping threshold.
      epochs: epochs of the schedule.

    Raises:
      ValueError: for a setting outside its range.
    """

    batch_size: int = 32
    max_len: int = 400
    keep: str = "last"
    buckets: int = 4
    lr: float = 1.0
    rho: float = 0.95
    eps: float = 1e-6
    max_grad_norm: float = 5.0
    epochs: int = 10

    def __post_init__(self):
        for name in ("batch_size", "max_len", "buckets", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.keep not in ("first", "last"):
            raise ValueError(f"keep must be 'first' or 'last', got {self.keep!r}")
        if not (self.lr > 0 and 0 < self.rho < 1 and self.eps > 0 and self.max_grad_norm > 0):
            raise ValueError("need lr > 0, 0 < rho < 1, eps > 0 and max_grad_norm > 0")

    def bucket_lengths(self) -> tuple[int, ...]:
        """The padded lengths, ascending, the last ``max_len``."""
        lengths = {self.max_len}
        for k in range(1, self.buckets):
            lengths.add(max(8, -(-(self.max_len >> k) // 8) * 8))
        return tuple(sorted(x for x in lengths if x <= self.max_len))

    def optimizer(self) -> optax.GradientTransformation:
        return optax.chain(
            optax.clip_by_global_norm(self.max_grad_norm),
            optax.adadelta(learning_rate=self.lr, rho=self.rho, eps=self.eps),
        )


def bucket_of(lengths: np.ndarray, bucket_lengths: Sequence[int]) -> np.ndarray:
    """Index of the smallest bucket holding each (already truncated) length."""
    return np.searchsorted(np.asarray(bucket_lengths), lengths, side="left")


def pad(split: Split, index: Sequence[int], batch_size: int, length: int, keep: str = "last"):
    """``(inputs, lengths, labels, weights)`` of the rows ``index`` (-1: an empty
    weight-0 row), zero-padded at the end to ``[batch_size, length(, m)]``, each cut to
    its ``keep`` (``'first'`` / ``'last'``) ``length`` steps."""
    first = split.inputs[0]
    shape = (batch_size, length) + first.shape[1:]
    inputs = np.zeros(shape, first.dtype)
    lengths = np.zeros(batch_size, np.int32)
    labels = np.zeros(batch_size, np.int32)
    weights = np.zeros(batch_size, np.float32)
    for row, i in enumerate(index):
        if i < 0:
            continue
        seq = split.inputs[i]
        seq = seq[:length] if keep == "first" else seq[max(len(seq) - length, 0) :]
        inputs[row, : len(seq)] = seq
        lengths[row], labels[row], weights[row] = len(seq), split.labels[i], 1.0
    return inputs, lengths, labels, weights


def plan(split: Split, cfg: TrainConfig, shuffle_seed: tuple[int, int] | None):
    """The batches of an epoch: ``[(bucket length, row indices [B] with -1 padding)]``.

    ``shuffle_seed=(seed, epoch)`` shuffles within buckets and the batch order; None
    keeps the data order (evaluation).
    """
    bl = cfg.bucket_lengths()
    truncated = np.minimum([len(x) for x in split.inputs], cfg.max_len)
    which = bucket_of(truncated, bl)
    rng = None if shuffle_seed is None else np.random.default_rng([*shuffle_seed, 0xB0C])
    batches = []
    for b, length in enumerate(bl):
        rows = np.flatnonzero(which == b)
        if rng is not None:
            rows = rng.permutation(rows)
        for start in range(0, len(rows), cfg.batch_size):
            chunk = rows[start : start + cfg.batch_size]
            batches.append((length, np.pad(chunk, (0, cfg.batch_size - len(chunk)),
                                           constant_values=-1)))  # fmt: skip
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def make_task(
    model: SequenceClassifier, train: Split, dev: Split, test: Split, cfg: TrainConfig,
    seed: int = 0, embeddings: tuple[np.ndarray, np.ndarray] | None = None,
) -> engine.Task:  # fmt: skip
    """The classification task of ``model`` for the run engine.

    Args:
      embeddings: optional ``(vectors [V, m], found [V] bool)``
        (:func:`rhnzoo.data.word2vec.load_word2vec`): found rows replace the random
        initial embedding.

    Raises:
      ValueError: an empty split.
    """
    for name, split in (("train", train), ("dev", dev), ("test", test)):
        if not len(split.labels):
            raise ValueError(f"the {name} split is empty")
    tx = cfg.optimizer()
    steps_per_epoch = len(plan(train, cfg, None))

    def init_state(key):
        params = model.init(key)
        if embeddings is not None:
            vectors, found = embeddings
            params["embed"] = jnp.where(found[:, None], vectors, params["embed"])
        return {"params": params, "opt_state": tx.init(params)}

    def train_step(state, batch, key):
        inputs, lengths, labels, weights = batch

        def loss_fn(params):
            logits = model.logits(params, inputs, lengths, key)
            sums = classify.xent_sums(logits, labels, weights)
            return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

        grads, sums = jax.grad(loss_fn, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        state = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
        return state, dict(sums, tokens=jnp.sum(lengths * weights))

    @functools.lru_cache(maxsize=2)
    def epoch_plan(epoch):
        return plan(train, cfg, (seed, epoch))

    def get_batch(epoch, index):
        length, rows = epoch_plan(epoch)[index]
        return pad(train, rows, cfg.batch_size, length, cfg.keep)

    @jax.jit
    def eval_sums(params, inputs, lengths, labels, weights):
        return classify.xent_sums(model.logits(params, inputs, lengths), labels, weights)

    def evaluate(params, split, track, desc):
        batches = plan(split, cfg, None)
        m = classify.means(classify.add_up(
            eval_sums(params, *pad(split, rows, cfg.batch_size, length, cfg.keep))
            for length, rows in track(batches, total=len(batches), desc=desc)))  # fmt: skip
        return m["accuracy"], m["loss"]

    def validate(params, track):
        acc, xent = evaluate(params, dev, track, "dev")
        return {"dev_acc": acc, "dev_xent": xent, "valid_loss": xent}

    def final_evaluate(params, track):
        out = {}
        for name, split in (("dev", dev), ("test", test)):
            out[f"{name}_acc"], out[f"{name}_xent"] = evaluate(params, split, track, name)
        return out

    return engine.Task(
        init_state=init_state, train_step=train_step, get_batch=get_batch,
        steps_per_epoch=steps_per_epoch, validate=validate, final_evaluate=final_evaluate,
        select="dev_acc", higher_is_better=True, train_metrics=classify.train_metrics,
        chance_loss=math.log(model.num_classes), unit="tok", throughput_key="tokens",
    )  # fmt: skip


# --------------------------------------------------------------------- the paper's models

MODELS = ("lstm", "gru", "rrn", "sc_lstm_i", "sc_lstm_p", "hrl", "lstm_gru")
LABELS = {"lstm": "LSTM", "gru": "GRU", "rrn": "RRN", "sc_lstm_i": "SC-LSTM-I",
          "sc_lstm_p": "SC-LSTM-P", "hrl": "HRL (LSTM + RRN)", "lstm_gru": "LSTM + GRU"}  # fmt: skip


def make_cell(name: str, hidden: int, hybrid_hidden: int, *, rrn_depth: int = 2,
              rrn_activation: str = "sigmoid", skip: int = 20, forget_bias: float = 1.0,
              init_scale: float = 0.1):  # fmt: skip
    """The recurrent layer of model ``name`` (one of :data:`MODELS`), Wang & Tian Table 2:
    the two hybrids (HRL, LSTM + GRU) use ``hybrid_hidden`` units per cell, the rest
    ``hidden``.

    Raises:
      ValueError: an unknown name or a bad size.
    """
    from rhnzoo import cells

    lstm = lambda n: cells.LSTM(n, forget_bias=forget_bias, init_scale=init_scale)
    rrn = lambda n: cells.RRN(n, depth=rrn_depth, activation=rrn_activation, init_scale=init_scale)
    make = {
        "lstm": lambda: lstm(hidden),
        "gru": lambda: cells.GRU(hidden, init_scale=init_scale),
        "rrn": lambda: rrn(hidden),
        "sc_lstm_i": lambda: cells.SCLSTM(hidden, skip=skip, forget_bias=forget_bias,
                                          init_scale=init_scale),  # fmt: skip
        "sc_lstm_p": lambda: cells.SCLSTM(hidden, skip=skip, learn_alpha=True,
                                          forget_bias=forget_bias, init_scale=init_scale),  # fmt: skip
        "hrl": lambda: cells.Parallel((lstm(hybrid_hidden), rrn(hybrid_hidden))),
        "lstm_gru": lambda: cells.Parallel((lstm(hybrid_hidden),
                                            cells.GRU(hybrid_hidden, init_scale=init_scale))),  # fmt: skip
    }
    if name not in make:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return make[name]()


DATASETS = ("imdb", "pmnist", "agnews", "20ng")


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """Train / dev / test splits with what the model needs to know about them."""

    train: Split
    dev: Split
    test: Split
    num_classes: int
    vocab: tuple[str, ...] | None  # None: float features (P-MNIST)
    input_size: int | None  # features per step for float inputs


def load_dataset(name: str, *, data_dir=None, download: bool = True, verify: bool = True,
                 source: str = "files", coverage: float = 0.95, dev_fraction: float = 0.15,
                 dev_seed: int = 0, permute: bool = True) -> Dataset:  # fmt: skip
    """One of :data:`DATASETS`, with the paper's 15 % dev split of the training set.

    Text sets are tokenised by :func:`rhnzoo.data.text.tokenize` with a vocabulary of
    the most frequent training words covering ``coverage`` of the training tokens
    (built without the dev documents); P-MNIST is MNIST as 784 pixel steps in [0, 1]
    under the fixed permutation of :func:`rhnzoo.data.images.pixel_sequences`
    (``permute=False``: sequential MNIST). ``source='tfds'`` reads TensorFlow Datasets
    (``imdb_reviews``, ``ag_news_subset``, ``mnist``) instead of the original files.

    Raises:
      ValueError: an unknown name or source (20NG has no TFDS version).
      rhnzoo.data.DataError: missing or corrupt files.
    """
    from rhnzoo.data import images, text

    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if source not in ("files", "tfds"):
        raise ValueError(f"--data_source must be 'files' or 'tfds', got {source!r}")
    if name == "pmnist":
        data = (images.load_tfds_images("mnist", data_dir) if source == "tfds" else
                images.load_mnist(data_dir, download=download, verify=verify))  # fmt: skip
        to_steps = lambda x: images.pixel_sequences(x, permute=permute)[..., None]
        train_all = Split(to_steps(data.train_images), data.train_labels)
        test, vocab, classes = Split(to_steps(data.test_images), data.test_labels), None, 10
    else:
        opts = dict(coverage=coverage, dev_fraction=dev_fraction, dev_seed=dev_seed)
        if source == "tfds":
            tfds_name = {"imdb": "imdb_reviews", "agnews": "ag_news_subset"}.get(name)
            if tfds_name is None:
                raise ValueError(f"{name} is not in TensorFlow Datasets; use --data_source=files")
            data = text.load_tfds_text(tfds_name, data_dir, **opts)
        else:
            load = {"imdb": text.load_imdb, "agnews": text.load_agnews, "20ng": text.load_20ng}
            data = load[name](data_dir, download=download, verify=verify, **opts)
        train_all = Split(data.train, data.train_labels)
        test, vocab, classes = Split(data.test, data.test_labels), data.vocab, data.num_classes
    keep, held_out = text.dev_split(len(train_all.labels), dev_fraction, dev_seed)
    return Dataset(train_all.subset(keep), train_all.subset(held_out), test, classes, vocab,
                   None if vocab is not None else 1)  # fmt: skip
