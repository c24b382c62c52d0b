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
studies are in :mod:`rhnzoo.configs.rrl`; :func:`run_experiment` is
``experiments/rrl.py``'s body.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import cells, data, dropout
from rhnzoo.cells import registry, scan
from rhnzoo.config import Config, DataSettings, DistributedSettings, RunSettings, setting
from rhnzoo.data.sequences import Dataset, Split
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.tasks import classify
from rhnzoo import engine
from rhnzoo.engine import sharding, stacking, step
from rhnzoo.studies import sweep, tables

Array = jax.Array


# Wang & Tian's models (Table 2), the rows of Table 3 (labels: rhnzoo.cells.label).
MODELS = ("lstm", "gru", "rrn", "sc_lstm_i", "sc_lstm_p", "hrl", "lstm_gru")
# Adadelta's decay (Zeiler 2012), as the paper's Keras code had it.
ADADELTA_RHO = 0.95


@dataclasses.dataclass(frozen=True)
class TrainConfig(Config):
    """Optimisation and batching settings of :func:`train_and_evaluate` (an
    :class:`RRLConfig` is one): Adadelta (rho :data:`ADADELTA_RHO`) after global-norm clipping,
    sequences cut
    to ``max_len`` steps in ``buckets`` padded lengths.

    Raises:
      ValueError: on construction, for a setting outside its range (one line naming it).
    """

    batch_size: int = setting(32, "Sequences per step.", low=1)
    max_len: int = setting(400, "Steps kept per sequence.", low=1)
    keep: str = setting("last", "Which steps a longer sequence keeps.", choices=("last", "first"))
    buckets: int = setting(4, "Padded lengths: max_len / 2^k, k < buckets.", low=1)
    lr: float = setting(1.0, "Adadelta learning rate (> 0; 1: Zeiler's method as published).")
    adadelta_eps: float = setting(1e-6, "Adadelta's epsilon (> 0).")
    max_grad_norm: float = setting(5.0, "Global-norm gradient clipping (> 0).")
    epochs: int = setting(10, "Epochs.", low=1)
    freeze_embeddings: bool = setting(
        False, "Keep the (pre-trained) embedding, params['embed'], fixed."
    )

    def check(self) -> None:
        super().check()
        for name in ("lr", "adadelta_eps", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name} must be > 0, got {getattr(self, name)}")

    def bucket_lengths(self) -> tuple[int, ...]:
        """The padded lengths, ascending, the last ``max_len``."""
        lengths = {self.max_len}
        for k in range(1, self.buckets):
            lengths.add(max(8, -(-(self.max_len >> k) // 8) * 8))
        return tuple(sorted(x for x in lengths if x <= self.max_len))

    def optimizer(self) -> optax.GradientTransformation:
        """Clipping to ``max_grad_norm``, then Adadelta (``lr``, ``adadelta_eps``); with
        ``freeze_embeddings`` the embedding gets zero updates and no part of the norm."""
        tx = optax.chain(
            optax.clip_by_global_norm(self.max_grad_norm),
            optax.adadelta(learning_rate=self.lr, rho=ADADELTA_RHO, eps=self.adadelta_eps),
        )
        if not self.freeze_embeddings:
            return tx
        # The frozen embedding neither moves nor counts in the clipped gradient norm.
        return optax.multi_transform(
            {"trained": tx, "frozen": optax.set_to_zero()}, _embedding_frozen
        )


def _embedding_frozen(params: Mapping[str, Any]) -> dict[str, str]:
    """``optax.multi_transform``'s labels: ``'frozen'`` for ``params['embed']``."""
    return {k: "frozen" if k == "embed" else "trained" for k in params}


# The data sets of experiments/rrl.py, the default first, then the registry's order.
DATASETS = ("imdb", *(name for name in data.names("sequences") if name != "imdb"))


@dataclasses.dataclass(frozen=True)
class RRLConfig(TrainConfig, RunSettings, DataSettings, DistributedSettings):
    """One sequence-classification run, one field per setting (the flags of
    ``experiments/rrl.py`` are generated from them); ``to_dict()`` is its
    ``config.json``. The defaults are the flags'; the presets are
    :mod:`rhnzoo.configs.rrl`. Optimisation and batching are :class:`TrainConfig`'s
    fields, the engine's :class:`~rhnzoo.config.RunSettings`', the data files'
    and several processes' :class:`~rhnzoo.config.DataSettings` and
    :class:`~rhnzoo.config.DistributedSettings`.

    Raises:
      ValueError: (one line, on construction) an unknown cell or data set, a bad cell
        setting, a training setting out of range, a drop probability outside [0, 1),
        ``subset`` < 1, ``coverage`` outside (0, 1], a bad run setting.
    """

    # The model: the cell and its width (Table 2), the embedding (m) or pixel.
    model: str = setting(
        "lstm",
        "Recurrent layer: a cell of rhnzoo.cells (Wang & Tian's: "
        f"{', '.join(MODELS)}; also rhn, hsg_rhn, dtrnn, ...).",
    )
    embed_size: int = setting(256, "Embedding width m (P-MNIST: 1, the pixel).", low=1)
    hidden_size: int = setting(512, "Hidden units n (LSTM, GRU, RRN, SC-LSTM).", low=1)
    hybrid_hidden_size: int = setting(384, "Hidden units per cell of HRL / LSTM+GRU.", low=1)
    hybrid_embed_size: int | None = setting(
        None, "Embedding width of HRL / LSTM+GRU (default: --embed_size).", low=1
    )
    # The cells' own settings (each goes to the cells that have it).
    rrn_depth: int = setting(2, "K, layers of the RRN transition F (eq. 4).", low=1)
    rrn_activation: str = setting(
        "sigmoid",
        "Inner activation of the RRN transition (the paper's σ is the logistic function).",
        choices=("sigmoid", "tanh"),
    )
    rrn_recurrent_init: str = setting("uniform", "RRN U_k init.", choices=("uniform", "orthogonal"))
    rrn_f_bias: float = setting(0.0, "Initial bias of the RRN's last F layer (paper: 0).")
    skip: int = setting(20, "SC-LSTM skip length L (eq. 5).", low=1)
    gru_reset_after: bool = setting(
        False,
        "GRU: reset gate after the recurrent matmul, "
        "as torch.nn.GRU / cuDNN (default: before, Cho et al. "
        "2014, the paper's).",
    )
    # Initialisation, dropout and the time scan.
    forget_bias: float = setting(1.0, "Initial LSTM forget-gate bias.")
    init_scale: float = setting(0.1, "Uniform initialisation half-width.")
    drop: float = setting(0.5, "Dropout probability on the final representation.")
    input_drop: float = setting(0.0, "Dropout probability on the embedded inputs.")
    scan_impl: str = scan.scan_impl_setting()
    dtype: str = setting(
        "float32",
        "Matmul inputs of the recurrent layer, float32 accumulation: float32 "
        "(computed at --matmul_precision: TF32 / bfloat16 passes by default on GPUs / TPUs) "
        "or bfloat16 (float32 state and parameters).",
        choices=("float32", "bfloat16"),
    )
    # The data.
    dataset: str = setting("imdb", "Data set.", choices=DATASETS)
    subset: int | None = setting(None, "Train on this many training sequences (screening).", low=1)
    eval_subset: int | None = setting(
        None,
        "Evaluate on this many dev and this many test "
        "sequences, a fixed sample of each (smoke runs; "
        "default: all).",
        low=1,
    )
    embeddings: str | None = setting(
        "word2vec",
        "Text: 'word2vec' (trained on the training split, cached), 'random' "
        "(learned from scratch) or a word2vec file.",
    )
    coverage: float = setting(
        0.95,
        "Vocabulary: most frequent words covering this fraction "
        "(in (0, 1]) of the training tokens; the rest is <unk>.",
    )
    dev_seed: int = setting(0, "Seed of the 15 % dev split.", low=0)
    permute: bool = setting(
        True, "P-MNIST: the fixed pixel permutation (--nopermute: sequential MNIST)."
    )
    data_source: str = setting(
        "files",
        "Original files (download, checksum, cache) or "
        "TensorFlow Datasets (pip install 'rhnzoo[tfds]').",
        choices=data.SOURCES,
    )
    # The run: its directory and preset (the engine's settings are RunSettings').
    workdir: str | None = setting(
        None,
        "Root directory: a model trains in <root>/<model>, "
        "a study in <root>/study_<study>; rerunning resumes "
        "(default: runs/rrl_<dataset>_<preset>).",
        resumable=True,
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True, flag=False)

    def check(self) -> None:
        super().check()  # the training and run settings
        SequenceClassifier(self.cell(), 2, 1, **self._scan())
        dropout.check_rate("--drop", self.drop)
        dropout.check_rate("--input_drop", self.input_drop)
        if not 0 < self.coverage <= 1:
            raise ValueError(f"--coverage must be a fraction in (0, 1], got {self.coverage}")

    def cell(self):
        """The recurrent layer: :func:`rhnzoo.cells.make` of ``model`` with
        ``hybrid_hidden_size`` units per cell for the two-cell hybrids
        (:data:`rhnzoo.cells.registry.PARALLEL_NAMES`), else ``hidden_size``; each
        setting goes to the cells that have it. Raises ValueError (one line)."""
        settings = {
            "depth": self.rrn_depth,
            "activation": self.rrn_activation,
            "skip": self.skip,
            "recurrent_init": self.rrn_recurrent_init,
            "f_bias": self.rrn_f_bias,
            "forget_bias": self.forget_bias,
            "init_scale": self.init_scale,
            "reset_after": self.gru_reset_after,
        }
        n = self.hybrid_hidden_size if self.model in registry.PARALLEL_NAMES else self.hidden_size
        return cells.make(self.model, n, **cells.applicable(self.model, settings))

    def embedding_size(self) -> int:
        """m, the embedding width of ``model``: ``hybrid_embed_size`` (when set) for the
        two-cell hybrids, else ``embed_size`` (Wang & Tian Table 2, 20NG: 500, hybrids 256)."""
        hybrid = self.model in registry.PARALLEL_NAMES and self.hybrid_embed_size is not None
        return self.hybrid_embed_size if hybrid else self.embed_size

    def _scan(self) -> dict[str, Any]:
        return {"scan_impl": self.scan_impl, "dtype": self.dtype}

    def classifier(
        self, num_classes: int, input_size: int | None = None, vocab_size: int | None = None
    ) -> SequenceClassifier:
        """The model: embedding (``vocab_size`` tokens of :meth:`embedding_size`) or
        ``input_size`` features per step -> :meth:`cell` -> dropout -> softmax over
        ``num_classes``. Raises ValueError for a bad size."""
        return SequenceClassifier(
            self.cell(),
            num_classes,
            input_size or self.embedding_size(),
            vocab_size,
            drop=self.drop,
            input_drop=self.input_drop,
            init_scale=self.init_scale,
            **self._scan(),
        )


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
    width: int | None = None,
):
    """``(inputs, lengths, labels, weights)`` of the rows ``index`` (-1: an empty
    weight-0 row), each cut to its ``keep`` (``'first'`` / ``'last'``) ``length`` steps,
    zero-padded at the end to ``[batch_size, width(, m)]`` (``width`` >= ``length``,
    default ``length``)."""
    first = split.inputs[0]
    shape = (batch_size, length if width is None else width) + first.shape[1:]
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


def _eval_sums(model: SequenceClassifier, params, inputs, lengths, labels, weights):
    """:func:`rhnzoo.tasks.classify.xent_sums` of an evaluation batch (no dropout)."""
    return classify.xent_sums(model.logits(params, inputs, lengths), labels, weights)


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


def _evaluate(
    sums_fn,
    params,
    name: str,
    split: Split,
    batches,
    config: TrainConfig,
    mesh,
    track,
    stacked: bool = False,
) -> dict[str, float] | list[dict[str, float]]:
    """``{'<name>_acc': accuracy, '<name>_xent': mean cross-entropy (nats)}`` of ``params``
    on ``split`` in its evaluation ``batches`` (:func:`plan`), each padded and its rows
    split over ``mesh``; ``sums_fn``: the jitted :func:`_eval_sums`, ``track``: the
    engine's; ``stacked``: K stacked seeds' ``params``, ``sums_fn`` vmapped over them, a
    dict per seed."""
    totals = classify.add_up(
        sums_fn(
            params,
            *sharding.put_rows(pad(split, rows, config.batch_size, length, config.keep), mesh),
        )
        for length, rows in track(batches, total=len(batches), desc=name)
    )
    named = lambda m: {f"{name}_acc": m["accuracy"], f"{name}_xent": m["loss"]}
    return (
        [named(m) for m in classify.seed_means(totals)]
        if stacked
        else named(classify.means(totals))
    )


# --------------------------------------------------------------------- the paper's models

# Wang & Tian 2016, Table 3 (test accuracy, %), ../shared/papers/004_b303ba294415a388.txt.
PAPER_TABLE3: dict[tuple[str, str], float] = {
    (model, dataset): acc
    for model, row in {
        "lstm": (91.76, 88.88, 79.21, 90.64),
        "rrn": (91.19, 89.13, 79.76, 88.63),
        "sc_lstm_p": (92.01, 90.74, 82.98, 94.46),
        "sc_lstm_i": (92.05, 90.67, 81.85, 94.80),
        "lstm_gru": (91.05, 89.23, 80.12, 90.28),
        "hrl": (91.90, 90.92, 81.73, 90.33),
    }.items()
    for dataset, acc in zip(("agnews", "imdb", "20ng", "pmnist"), row)
}


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

    # Batch k of epoch e: a pure function of (seed, e, k); the plans of an epoch are kept.
    epoch_plan = functools.lru_cache(maxsize=32)(
        lambda seed, epoch: plan(kept.train, config, (seed, epoch))
    )

    def get_batch(seed, epoch, index):
        length, rows = epoch_plan(seed, epoch)[index]
        return sharding.put_rows(
            pad(kept.train, rows, config.batch_size, length, config.keep), mesh
        )

    def get_batches(seeds, epoch, index):  # K seeds' buckets padded to the longest on the host
        planned = [epoch_plan(seed, epoch)[index] for seed in seeds]
        longest = max(length for length, _ in planned)
        batches = [
            pad(kept.train, rows, config.batch_size, length, config.keep, width=longest)
            for length, rows in planned
        ]
        return sharding.put_rows(stacking.stack(batches), mesh, stacked=True)

    eval_sums = jax.jit(functools.partial(_eval_sums, model))
    seeds_sums = jax.jit(jax.vmap(functools.partial(_eval_sums, model), (0,) + (None,) * 4))
    eval_plans = {name: plan(splits[name], config, None) for name in ("dev", "test")}

    def evaluate(params, name, track, stacked=False):
        return _evaluate(
            seeds_sums if stacked else eval_sums,
            params,
            name,
            splits[name],
            eval_plans[name],
            config,
            mesh,
            track,
            stacked,
        )

    def validate(params, track):
        dev = evaluate(params, "dev", track)
        return {**dev, "valid_loss": dev["dev_xent"]}

    def validate_stacked(params, track):  # K seeds' parameters, one evaluation
        return [
            {**dev, "valid_loss": dev["dev_xent"]}
            for dev in evaluate(params, "dev", track, stacked=True)
        ]

    task = engine.Task(
        init_state=init_state,
        train_step=make_train_step(model, tx),
        get_batch=get_batch,
        get_batches=get_batches,
        steps_per_epoch=len(plan(kept.train, config, None)),
        validate=validate,
        validate_stacked=validate_stacked,
        select="dev_acc",
        higher_is_better=True,
        final_evaluate=lambda params, track: {
            **evaluate(params, "dev", track),
            **evaluate(params, "test", track),
        },
        train_metrics=classify.train_metrics,
        chance_loss=math.log(kept.num_classes),
        unit="tok",
        throughput_key="tokens",
    )
    return engine.run(task, config, workdir, seeds=seeds, on_divergence=on_divergence, log=log)


def _train(
    config: RRLConfig,
    load: Callable[[], Dataset],
    log,
    workdir,
    on_divergence: str,
    seeds: int | None = None,
) -> dict:
    """A sweep run's ``train(workdir, on_divergence) -> results`` (with
    ``functools.partial``): :func:`train_and_evaluate` on ``load()`` (``seeds``: K seeds
    stacked, the first one's results)."""
    out = train_and_evaluate(
        config, load(), workdir, on_divergence=on_divergence, log=log, seeds=seeds
    )
    return out.results if seeds is None else out[0].results


# ------------------------------------------------------------------------ tables


def _measured(runs: Sequence[dict | None]) -> list:
    """``[best dev acc %, test acc % (or 'diverged' / 'failed'), epochs, minutes]`` of a
    row's runs, one per seed (:func:`rhnzoo.studies.sweep.collect`): each seed's best dev
    accuracy and its test accuracy at that checkpoint; over several seeds the mean ± sd
    of those measured (:func:`rhnzoo.studies.tables.mean_sd`), the test cell naming the
    seeds that diverged or failed, epochs and minutes the mean per seed. A run not
    finished (no results, not failed; or, beside a seed that started, not started) has
    no test accuracy and the dev cell says so (:func:`_unfinished`). None where nothing
    is measured (yet)."""
    devs, tests, epochs, minutes, notes, unfinished = [], [], [], [], [], []
    started = any(run is not None for run in runs)
    for run in runs:
        r, hist = (run or {}).get("results"), (run or {}).get("history") or []
        if started and r is None and not (run or {}).get("failed"):
            unfinished.append(_progress(run))
        best = max((h.get("dev_acc", math.nan) for h in hist), default=None)
        best = r["dev_acc"] if r and "dev_acc" in r else best
        if best is not None:
            devs.append(100 * best)
        if r and r.get("diverged"):
            notes.append("diverged")
        elif r and "test_acc" in r:
            tests.append(100 * r["test_acc"])
        elif (run or {}).get("failed"):
            notes.append("failed")
        if hist:
            epochs.append(len(hist))
            minutes.append(hist[-1]["elapsed_s"] / 60)
    test = tables.mean_sd(tests)
    if notes:
        counts = {n: notes.count(n) for n in dict.fromkeys(notes)}
        said = ", ".join(n if len(runs) == 1 else f"{k} {n}" for n, k in counts.items())
        test = said if test is None else f"{test}; {said}"
    dev = _unfinished(tables.mean_sd(devs), unfinished, len(runs))
    return [dev, test, _mean(epochs, ".0f"), _mean(minutes, ".1f")]


def _progress(run: dict | None) -> str:
    """``'epoch <e> of <epochs>'``: how far an unfinished run of
    :func:`rhnzoo.studies.sweep.collect` got (its last epoch record; 0 before one);
    ``'not started'`` for None."""
    if run is None:
        return "not started"
    hist, config = run.get("history") or [], run.get("config") or {}
    total = f" of {config['epochs']}" if "epochs" in config else ""
    return f"epoch {hist[-1]['epoch'] if hist else 0}{total}"


def _unfinished(dev: str | None, progress: Sequence[str], n: int) -> str | None:
    """The dev cell ``dev`` of a row of ``n`` runs marked with the ``progress`` of its
    unfinished ones: ``'79.33 (epoch 1 of 10, unfinished)'`` for one run, ``'... (1 of
    2 unfinished: epoch 1 of 10)'`` for seeds; ``dev`` itself when every run finished."""
    if not progress:
        return dev
    note = (
        f"({progress[0]}, unfinished)"
        if n == 1
        else f"({len(progress)} of {n} unfinished: {'; '.join(progress)})"
    )
    return note if dev is None else f"{dev} {note}"


def _mean(values: Sequence[float], spec: str) -> str | None:
    """The mean of ``values`` formatted with ``spec``; None for none."""
    return f"{math.fsum(values) / len(values):{spec}}" if values else None


def table_text(root, models: Sequence[str], dataset: str, title: str, seeds: int = 1) -> str:
    """Table 3's layout from the workdirs ``root/<model>`` (seed k > 0:
    ``<model>_s<k>``): the paper's test accuracy beside our dev and test accuracy (several
    seeds: mean ± sd), parameters, epochs and minutes (a run not yet finished: its best
    dev accuracy so far, marked ``(epoch e of N, unfinished)``, and no test accuracy).

    Raises:
      ValueError: a workdir's JSON file is unreadable (one line naming it)."""
    rows = []
    for name in models:
        runs = list(sweep.collect(root, [sweep.seed_name(name, k) for k in range(seeds)]).values())
        paper = PAPER_TABLE3.get((name, dataset))
        r = next((run["results"] for run in runs if run and run["results"]), None) or {}
        params = f"{r['parameters']:,}" if "parameters" in r else None
        dev, test, epochs, minutes = _measured(runs)
        rows.append(
            [
                cells.label(name),
                "n/a" if paper is None else f"{paper:.2f}",
                dev,
                test,
                params,
                epochs,
                minutes,
            ]
        )
    header = [
        f"model ({title})",
        "paper test acc (Table 3)",
        "rhnzoo dev acc",
        "rhnzoo test acc",
        "parameters",
        "epochs",
        "minutes",
    ]
    return tables.markdown(header, rows)


def study_table(root, names: Sequence[str], title: str, seeds: int = 1) -> str:
    """The recipe study's table: setting, dev accuracy (best epoch), test accuracy,
    epochs, minutes (several seeds: mean ± sd; unfinished runs marked as in
    :func:`table_text`). Raises ValueError as :func:`table_text`."""
    rows = [
        [
            name,
            *_measured(
                list(sweep.collect(root, [sweep.seed_name(name, k) for k in range(seeds)]).values())
            ),
        ]
        for name in names
    ]
    return tables.markdown(
        [f"setting ({title})", "best dev acc", "test acc (best dev)", "epochs", "minutes"], rows
    )


# ------------------------------------------------------------------- the experiment


def run_experiment(
    configs: Mapping[str, RRLConfig],
    root,
    *,
    study: str | None,
    table: bool,
    run_missing: bool,
    load: Callable[[], Dataset],
    title: str,
    log: Callable[[str], None] | None = print,
    seeds: int = 1,
    jobs=None,
) -> str | None:
    """What ``experiments/rrl.py`` does: one model, the ``--table`` models, or a study.

    ``configs`` holds every run (name -> config, checked before any data is read:
    :func:`rhnzoo.configs.rrl.runs`); ``load()`` loads the data set, once, when a run
    trains. A model trains in ``root/<model>``, a study's setting in
    ``root/study_<study>/<setting>``; seed k > 0 of either in ``<name>_s<k>`` with
    seed ``config.seed + k``. With several runs (``table``, ``study`` or ``seeds`` > 1) a
    diverging one is recorded and the others go on
    (:func:`rhnzoo.studies.sweep.run_all`). Returns the table (also written to
    ``root/table.md``) for ``table``, ``study`` or one model's ``seeds`` > 1 (its one row:
    mean ± sd over the seeds), else None.

    Args:
      log: where progress lines go (None: nowhere; a multi-process run's other
        processes). ``table.md`` is written by process 0 only.
      seeds: runs per model or setting (seeds ``config.seed``, ``+ 1``, ...).
      jobs: how the runs train (:class:`rhnzoo.studies.sweep.Jobs`; default: in turn,
        in this process).
    """
    say = log or (lambda line: None)
    root = pathlib.Path(root) / f"study_{study}" if study else pathlib.Path(root)
    several = bool(table or study)
    tabled = several or seeds > 1  # a table to show
    seeded = {
        sweep.seed_name(name, k): c.replace(seed=c.seed + k)
        for name, c in configs.items()
        for k in range(seeds)
    }
    runs = sweep.seed_runs(
        list(seeded.items()),
        seeds,
        lambda c, k: functools.partial(_train, c, load, say, seeds=k),
        stack=jobs is not None and jobs.stack_seeds,
    )
    if run_missing or not several:
        if jobs is not None and jobs.n > 1:  # in this process, before any child starts:
            dataset = load()  # a data error is one line; word2vec trained once, cached
            for c in {
                (c.embeddings, c.embedding_size(), c.subset): c for c in seeded.values()
            }.values():
                embeddings_for(c, subset(dataset, c.subset), say)
        sweep.run_all(runs, root, log=say, jobs=jobs, on_divergence="stop" if tabled else "raise")
    if not tabled:
        return None
    first = next(iter(configs.values()))
    text = (
        study_table(root, list(configs), f"{first.model} {title}", seeds)
        if study
        else table_text(root, list(configs), first.dataset, title, seeds)
    )
    tables.write_table(root / "table.md", text)
    return text
