"""Sequence classification (Wang & Tian, EMNLP 2016, sec. 4) as a task of the run engine.

* Data: sequences (token-id arrays of any length, or float feature rows for P-MNIST)
  with integer labels, split into train / dev (15 % of the training set, fixed seed;
  model selection and early stopping) / test (reported at the best dev epoch):
  :class:`rhnzoo.data.sequences.Dataset`, from :func:`rhnzoo.data.load_dataset`.
* Batches: every sequence is cut to ``max_len`` steps (by default its *last* ones:
  with a final-state readout the end of a review carries its verdict; Keras'
  ``pad_sequences`` truncates the same way) and goes to the smallest of a few fixed padded lengths
  (``buckets``) that
  holds it, so jit compiles one training and one evaluation shape per bucket. Epoch e
  shuffles each bucket and the list of all batches with ``(seed, e)``; a bucket's last
  batch is filled with weight-0 rows. Batch k of epoch e is therefore a pure function
  of (seed, e, k), as the engine's exact resume needs.
* Optimiser: Adadelta (Zeiler 2012; rho 0.95, eps 1e-6, ``optax.adadelta`` with
  ``learning_rate=1.0`` — its default of None would not negate the update) after
  global-norm gradient clipping; loss = mean cross-entropy over the batch's real rows.

:func:`train_and_evaluate` is the one entry point: one run of an :class:`RRLConfig`
(every setting, ``config.json``; its optimisation and batching part is
:class:`TrainConfig`) on a :class:`~rhnzoo.data.sequences.Dataset`. The presets and
studies are in :mod:`rhnzoo.configs.rrl`; Table 3's runs and table, with the paper's
numbers, in :mod:`rhnzoo.studies.rrl_table3`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import cells, data, evaluation
from rhnzoo.configs.rrl import RRLConfig, TrainConfig
from rhnzoo.data.sequences import Dataset, Split
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.tasks import classify
from rhnzoo import engine
from rhnzoo.engine import sharding, step
from rhnzoo.engine.evaluate import Batches

Array = jax.Array


def load_data(config: RRLConfig) -> Dataset:
    """The data set of ``config`` (``dataset`` from ``data_dir`` / ``data_source``, its
    vocabulary at ``coverage``, its dev split from ``dev_seed``; P-MNIST ``permute``d).

    Raises:
      rhnzoo.data.DataError: missing or corrupt files (one line naming them).
    """
    return data.load_dataset(
        config.dataset,
        data_dir=config.data_dir,
        download=config.download,
        verify=config.verify_data,
        source=config.data_source,
        coverage=config.coverage,
        dev_seed=config.dev_seed,
        permute=config.permute,
    )


def bucket_of(lengths: np.ndarray, bucket_lengths: Sequence[int]) -> np.ndarray:
    """Index of the smallest bucket holding each (already truncated) length."""
    return np.searchsorted(np.asarray(bucket_lengths), lengths, side="left")


def pad(
    split: Split,
    index: Sequence[int],
    batch_size: int,
    length: int,
    keep: str = "last",
):
    """``(inputs, lengths, labels, weights)`` of the rows ``index`` (-1: an empty
    weight-0 row), each cut to its ``keep`` (``'first'`` / ``'last'``) ``length`` steps,
    zero-padded at the end to ``[batch_size, length(, m)]``."""
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
            batches.append(
                (length, np.pad(chunk, (0, cfg.batch_size - len(chunk)), constant_values=-1))
            )
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _forward(model: SequenceClassifier, params, batch, key):
    """:func:`rhnzoo.tasks.classify.xent_loss`'s ``forward`` on a training batch
    ``(inputs, lengths [B], labels [B], weights [B])``: the logits ``[B, C]`` (``key``:
    dropout), labels, weights and the tokens read (``'tokens'``, the throughput)."""
    inputs, lengths, labels, weights = batch
    logits = model.logits(params, inputs, lengths, key)
    return logits, labels, weights, {"tokens": jnp.sum(lengths * weights)}


def _eval_sums(model: SequenceClassifier, params, batch):
    """The engine's ``eval_step``: :func:`rhnzoo.evaluation.xent_sums` of an evaluation
    batch ``(inputs, lengths [B], labels [B], weights [B])`` (no dropout)."""
    inputs, lengths, labels, weights = batch
    return evaluation.xent_sums(model.logits(params, inputs, lengths), labels, weights)


def make_train_step(model: SequenceClassifier, tx: optax.GradientTransformation):
    """The classifier's train step ``(state, batch, key) -> (state, sums)``
    (:mod:`rhnzoo.engine.step`): ``batch`` is :func:`pad`'s ``(inputs, lengths, labels,
    weights)``, the loss the summed cross-entropy (:func:`_forward`), ``tx`` applied."""
    return step.make_train_step(classify.xent_loss(functools.partial(_forward, model)), tx)


def _initial_params(model: SequenceClassifier, key: Array, embeddings) -> dict:
    """``model.init(key)``, the found rows of ``embeddings`` (``(vectors [V, m], found [V]
    bool)`` or None) replacing the random ones of ``params['embed']``."""
    params = model.init(key)
    if embeddings is not None:
        vectors, found = embeddings
        params["embed"] = jnp.where(found[:, None], vectors, params["embed"])
    return params


def train_batches(train: Split, config: TrainConfig, mesh):
    """The engine's ``train_batch(seed, epoch, index)``: batch ``index`` of the epoch's
    shuffled plan (:func:`plan` of ``(seed, epoch)``, a pure function of the three; the
    plans of recent epochs kept), padded (:func:`pad`), its rows split over ``mesh``.
    Stacked seeds' batches of buckets of other lengths are zero-padded to the longest
    (:attr:`rhnzoo.engine.Task.batch_axes`)."""
    epoch_plan = functools.lru_cache(maxsize=32)(
        lambda seed, epoch: plan(train, config, (seed, epoch))
    )

    def train_batch(seed: int, epoch: int, index: int):
        length, rows = epoch_plan(seed, epoch)[index]
        return sharding.put_rows(pad(train, rows, config.batch_size, length, config.keep), mesh)

    return train_batch


def eval_batches(splits: dict[str, Split], config: TrainConfig, mesh):
    """The engine's ``eval_batches(split, final)``: the split's buckets in data order
    (:func:`plan`), each batch padded (:func:`pad`) and its rows split over ``mesh``."""
    plans = {name: plan(splits[name], config, None) for name in ("dev", "test")}

    def batch(split: Split, length: int, rows):
        return sharding.put_rows(pad(split, rows, config.batch_size, length, config.keep), mesh)

    return lambda name, final: Batches(
        len(plans[name]), lambda i: batch(splits[name], *plans[name][i])
    )


# ------------------------------------------------------------------------- one run


def embeddings_for(config: RRLConfig, dataset: Dataset, log=print):
    """The initial embedding of a text data set: ``(vectors, found)`` or None.

    ``config.embeddings``: ``'word2vec'`` (trained on the training split, cached; the
    default, as the paper fed pre-trained Word2Vec vectors), ``'random'`` (learned from
    scratch) or a word2vec file. Float inputs (P-MNIST) have no embedding: None.
    """
    from rhnzoo.data import word2vec

    spec = config.embeddings
    if dataset.vocab is None or spec in (None, "random"):
        return None
    if spec == "word2vec":
        return word2vec.train_word2vec(
            dataset.train.inputs,
            dataset.vocab,
            config.embedding_size(),
            dataset=config.dataset,
            log=log,
        )
    vectors = word2vec.load_word2vec(spec, dataset.vocab, config.embedding_size())
    log(f"{spec}: vectors for {vectors[1].sum():,} of {len(dataset.vocab):,} words")
    return vectors


def subset(dataset: Dataset, n: int | None) -> Dataset:
    """The first ``n`` training sequences of a fixed shuffle (screening runs); None: all."""
    if n is None or n >= len(dataset.train.labels):
        return dataset
    index = np.sort(np.random.default_rng(0xD5).permutation(len(dataset.train.labels))[:n])
    return dataclasses.replace(dataset, train=dataset.train.subset(index))


def eval_subset(dataset: Dataset, n: int | None) -> Dataset:
    """The dev and test splits cut to ``n`` sequences each, a fixed sample of each kept in
    its order (smoke runs); None: all."""
    cut = {}
    for name in ("dev", "test"):
        split = getattr(dataset, name)
        if n is not None and n < len(split.labels):
            index = np.sort(np.random.default_rng(0xE5).permutation(len(split.labels))[:n])
            cut[name] = split.subset(index)
    return dataclasses.replace(dataset, **cut) if cut else dataset


def train_and_evaluate(
    config: RRLConfig,
    dataset: Dataset,
    workdir=None,
    *,
    devices: list | None = None,
    on_divergence: str = "raise",
    log: Callable[[str], None] | None = print,
    seeds: int | None = None,
) -> engine.RunResult | list[engine.RunResult]:
    """Trains ``config.classifier`` under ``config`` on ``dataset`` (its first
    ``config.subset`` training sequences, :func:`subset`; the initial embedding
    :func:`embeddings_for`'s), validating on dev every epoch (the best: highest
    ``dev_acc``), and evaluates the best parameters on dev and test (each cut to
    ``config.eval_subset`` sequences, :func:`eval_subset`): the task's one entry point.

    Args:
      config: every setting; written to ``workdir/config.json``.
      dataset: token ids with ``vocab`` (its size the embedding's), or float features of
        ``input_size`` per step.
      workdir: the run directory (rerunning resumes); None: in memory.
      devices: data parallelism over these (default: all): every batch's rows are split
        over a ``Mesh(("data",))``, parameters and optimizer state replicated.
      on_divergence, log, seeds: as :func:`rhnzoo.engine.run` (``log`` None:
        silent; ``seeds``: K seeds stacked, a list of their results).

    Returns:
      :class:`rhnzoo.engine.RunResult`; its ``results`` (``results.json``) hold
      ``dev_acc``, ``dev_xent``, ``test_acc``, ``test_xent`` (nats per sequence).

    Raises:
      ValueError: an empty split, a ``batch_size`` the devices do not divide, a bad model
        size (one line); as :func:`rhnzoo.engine.run`.
      rhnzoo.data.DataError: an unreadable embedding file.
    """
    say = log or (lambda line: None)
    kept = eval_subset(subset(dataset, config.subset), config.eval_subset)
    splits = {"train": kept.train, "dev": kept.dev, "test": kept.test}
    for name, split in splits.items():
        if not len(split.labels):
            raise ValueError(f"the {name} split is empty")
    model = config.classifier(
        kept.num_classes, kept.input_size, None if kept.vocab is None else len(kept.vocab)
    )
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(config.batch_size, mesh)
    say(
        f"{cells.label(config.model)} on {config.dataset}: {len(kept.train.labels):,} train / "
        f"{len(kept.dev.labels):,} dev / {len(kept.test.labels):,} test sequences"
    )
    embeddings = embeddings_for(config, kept, say)
    tx = config.optimizer()

    def init_state(key):
        params = _initial_params(model, key, embeddings)
        return sharding.put_tree(
            {"params": params, "opt_state": tx.init(params)}, sharding.replicated(mesh)
        )

    task = engine.Task(
        init_state=init_state,
        train_step=make_train_step(model, tx),
        train_batch=train_batches(kept.train, config, mesh),
        steps_per_epoch=len(plan(kept.train, config, None)),
        eval_step=functools.partial(_eval_sums, model),
        eval_batches=eval_batches(splits, config, mesh),
        report=classify.report(
            "dev_acc",
            higher_is_better=True,
            chance_loss=math.log(kept.num_classes),
            unit="tok",
            throughput_key="tokens",
            validation=("dev",),
            final=("dev", "test"),
        ),
    )
    return engine.run(task, config, workdir, seeds=seeds, on_divergence=on_divergence, log=log)
