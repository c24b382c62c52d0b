"""Sequence classification (Wang & Tian, EMNLP 2016, sec. 4) as a task of the run engine.

* Data: sequences (token-id arrays of any length, or float feature rows for P-MNIST)
  with integer labels, split into train / dev (15 % of the training set, fixed seed;
  model selection and early stopping) / test (reported at the best dev epoch):
  :class:`rhnzoo.data.sequences.Dataset`, from :func:`rhnzoo.data.load_dataset`.
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
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import dropout
from rhnzoo.data.sequences import Dataset, Split
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.training import classify, engine, sharding, step

Array = jax.Array


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
      freeze_embeddings: keep the embedding (``params['embed']``) at its initial
        value (e.g. pre-trained vectors); default False: fine-tuned with the rest.

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
    freeze_embeddings: bool = False

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
        tx = optax.chain(
            optax.clip_by_global_norm(self.max_grad_norm),
            optax.adadelta(learning_rate=self.lr, rho=self.rho, eps=self.eps),
        )
        if not self.freeze_embeddings:
            return tx
        # The frozen embedding neither moves nor counts in the clipped gradient norm.
        label = lambda params: {k: "frozen" if k == "embed" else "trained" for k in params}
        return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, label)


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
    devices: list | None = None,
) -> engine.Task:  # fmt: skip
    """The classification task of ``model`` for the run engine.

    Args:
      embeddings: optional ``(vectors [V, m], found [V] bool)``
        (:func:`rhnzoo.data.word2vec.load_word2vec`): found rows replace the random
        initial embedding.
      devices: data parallelism over these (default: all): every batch's rows are
        split over a ``Mesh(("data",))``, parameters and optimizer state replicated.

    Raises:
      ValueError: an empty split, or a batch the devices do not divide.
    """
    for name, split in (("train", train), ("dev", dev), ("test", test)):
        if not len(split.labels):
            raise ValueError(f"the {name} split is empty")
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(cfg.batch_size, mesh)
    tx = cfg.optimizer()
    steps_per_epoch = len(plan(train, cfg, None))

    def init_state(key):
        params = model.init(key)
        if embeddings is not None:
            vectors, found = embeddings
            params["embed"] = jnp.where(found[:, None], vectors, params["embed"])
        return sharding.put_tree({"params": params, "opt_state": tx.init(params)},
                                 sharding.replicated(mesh))  # fmt: skip

    def forward(params, batch, key):
        inputs, lengths, labels, weights = batch
        logits = model.logits(params, inputs, lengths, key)
        return logits, labels, weights, {"tokens": jnp.sum(lengths * weights)}

    train_step = step.make_train_step(classify.xent_loss(forward), tx)

    @functools.lru_cache(maxsize=2)
    def epoch_plan(epoch):
        return plan(train, cfg, (seed, epoch))

    def get_batch(epoch, index):
        length, rows = epoch_plan(epoch)[index]
        return sharding.put_rows(pad(train, rows, cfg.batch_size, length, cfg.keep), mesh)

    @jax.jit
    def eval_sums(params, inputs, lengths, labels, weights):
        return classify.xent_sums(model.logits(params, inputs, lengths), labels, weights)

    splits = {"dev": dev, "test": test}
    eval_plans = {name: plan(split, cfg, None) for name, split in splits.items()}

    def evaluate(params, name, track):
        split, batches = splits[name], eval_plans[name]
        m = classify.means(classify.add_up(
            eval_sums(params, *sharding.put_rows(pad(split, rows, cfg.batch_size, length,
                                                     cfg.keep), mesh))
            for length, rows in track(batches, total=len(batches), desc=name)))  # fmt: skip
        return m["accuracy"], m["loss"]

    def validate(params, track):
        acc, xent = evaluate(params, "dev", track)
        return {"dev_acc": acc, "dev_xent": xent, "valid_loss": xent}

    def final_evaluate(params, track):
        out = {}
        for name in splits:
            out[f"{name}_acc"], out[f"{name}_xent"] = evaluate(params, name, track)
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
              rrn_activation: str = "sigmoid", rrn_recurrent_init: str = "uniform",
              rrn_f_bias: float = 0.0, skip: int = 20, forget_bias: float = 1.0,
              init_scale: float = 0.1):  # fmt: skip
    """The recurrent layer of model ``name``: any cell of the registry
    (:func:`rhnzoo.cells.make`; :data:`MODELS` are Wang & Tian's, Table 2). The two
    hybrids (HRL, LSTM + GRU) use ``hybrid_hidden`` units per cell, the rest ``hidden``;
    ``rrn_depth`` is the depth of every cell that has one.

    Raises:
      ValueError: an unknown name or a bad size (one line).
    """
    from rhnzoo import cells

    settings = dict(depth=rrn_depth, activation=rrn_activation, skip=skip,
                    recurrent_init=rrn_recurrent_init, f_bias=rrn_f_bias,
                    forget_bias=forget_bias, init_scale=init_scale)  # fmt: skip
    n = hybrid_hidden if name in ("hrl", "lstm_gru") else hidden
    return cells.make(name, n, **cells.applicable(name, settings))


DATASETS = ("imdb", "pmnist", "agnews", "20ng")  # = rhnzoo.data.names("sequences")


# ------------------------------------------------------- experiments from one config dict

# Wang & Tian Table 2: embedding x hidden (hybrids: hidden per cell).
PAPER_SIZES = {
    "imdb": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "agnews": dict(embed_size=256, hidden_size=512, hybrid_hidden_size=384),
    "20ng": dict(embed_size=500, hidden_size=768, hybrid_hidden_size=512),
    "pmnist": dict(embed_size=1, hidden_size=100, hybrid_hidden_size=80, max_len=784,
                   buckets=1),
}  # fmt: skip
# 2-core CPU, about 7-30 minutes per model (measured times in README / BUILD_NOTES.md):
# smaller widths than Table 2, the last 400 steps of a review, fewer epochs.
CPU_SIZES = {
    "imdb": dict(embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=400,
                 epochs=10, patience=3, batch_size=32),
    "agnews": dict(embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=64,
                   epochs=3, batch_size=64),
    "20ng": dict(embed_size=64, hidden_size=128, hybrid_hidden_size=96, max_len=400,
                 epochs=10, patience=3, batch_size=32),
    "pmnist": dict(embed_size=1, hidden_size=64, hybrid_hidden_size=48, max_len=784,
                   buckets=1, epochs=8, batch_size=100),
}  # fmt: skip
PRESETS = {"paper": PAPER_SIZES, "cpu": CPU_SIZES}

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

# Studies (issue 15): what the paper leaves open, screened at a reduced budget on dev.
# (study, dataset) -> the model, the budget (config overrides), and the settings
# (setting name -> config overrides; a ``model`` key runs another model, e.g. the LSTM
# as a reference at the same budget). `rrn`: the RRN recipe (eqs. 3-4 and sec. 4 leave
# initialisation, the bias of F, input scale, Adadelta's eps, clipping and dropout
# placement open); `skip`: SC-LSTM's skip length L, which the paper tuned on dev (sec. 4).
_W2V = {"embeddings": "word2vec"}
_RRN_SETTINGS = {
    "paper": {},
    "fbias-3": {"rrn_f_bias": -3.0},
    "fbias-1": {"rrn_f_bias": -1.0},
    "orth": {"rrn_recurrent_init": "orthogonal"},
    "orth_fbias-3": {"rrn_recurrent_init": "orthogonal", "rrn_f_bias": -3.0},
    "init0.3": {"init_scale": 0.3},
    "eps1e-4": {"adadelta_eps": 1e-4},
    "clip1": {"max_grad_norm": 1.0},
    "clip50": {"max_grad_norm": 50.0},
    "tanh": {"rrn_activation": "tanh"},
    "lstm_reference": {"model": "lstm"},
}
_SCREEN = {"imdb": dict(max_len=100, epochs=3, patience=None, buckets=2, divergence_factor=5.0),
           "pmnist": dict(subset=12000, epochs=3, divergence_factor=5.0)}  # fmt: skip
STUDIES = {
    ("rrn", "imdb"): dict(model="rrn", budget=_SCREEN["imdb"], settings={
        "paper_random_emb": {"embeddings": "random"},
        **{("paper_w2v" if k == "paper" else k if "model" in v else f"w2v_{k}"): {**_W2V, **v}
           for k, v in _RRN_SETTINGS.items()},
        "w2v_indrop0.25": {**_W2V, "input_drop": 0.25},
        "w2v_frozen": {**_W2V, "freeze_embeddings": True},
    }),
    ("rrn", "pmnist"): dict(model="rrn", budget=_SCREEN["pmnist"], settings={
        **_RRN_SETTINGS,
        "tanh_init0.03": {"rrn_activation": "tanh", "init_scale": 0.03},
        "tanh_clip1": {"rrn_activation": "tanh", "max_grad_norm": 1.0},
    }),
    ("skip", "imdb"): dict(model="sc_lstm_i", budget=dict(subset=8000, epochs=3, patience=None),
                           settings={f"L{L}": {"skip": L} for L in (10, 20, 50)}),
    ("skip", "pmnist"): dict(model="sc_lstm_i", budget=dict(subset=12000, epochs=3),
                             settings={f"L{L}": {"skip": L} for L in (10, 20, 50)}),
}


def cell_from_config(name: str, c) -> Any:
    """``make_cell`` from a run's config dict (the flags of ``experiments/rrl.py``)."""
    return make_cell(name, c["hidden_size"], c["hybrid_hidden_size"], rrn_depth=c["rrn_depth"],
                     rrn_activation=c["rrn_activation"],
                     rrn_recurrent_init=c["rrn_recurrent_init"], rrn_f_bias=c["rrn_f_bias"],
                     skip=c["skip"], forget_bias=c["forget_bias"],
                     init_scale=c["init_scale"])  # fmt: skip


def train_config(c) -> TrainConfig:
    """The optimisation settings of a run's config dict. Raises ValueError for a bad one."""
    return TrainConfig(batch_size=c["batch_size"], max_len=c["max_len"], keep=c["keep"],
                       buckets=c["buckets"], lr=c["lr"], eps=c["adadelta_eps"],
                       max_grad_norm=c["max_grad_norm"], epochs=c["epochs"],
                       freeze_embeddings=c["freeze_embeddings"])  # fmt: skip


def scan_options(c) -> dict:
    """The classifier's ``scan_impl`` and ``dtype`` from a run's config (keys absent in
    configs written before they existed: auto and float32)."""
    impl = c.get("scan_impl", "auto")
    return {"scan_impl": None if impl == "auto" else impl, "dtype": c.get("dtype", "float32")}


def check_config(models: Sequence[str], c) -> None:
    """Builds every cell and the optimiser settings, so a bad setting is one line before
    any data is read. Raises ValueError."""
    for name in models:
        SequenceClassifier(cell_from_config(name, c), 2, 1, **scan_options(c))
    train_config(c)
    dropout.check_rate("--drop", c["drop"])
    dropout.check_rate("--input_drop", c["input_drop"])
    if c.get("subset") is not None and c["subset"] < 1:
        raise ValueError(f"--subset must be >= 1, got {c['subset']}")


def embeddings_for(c, dataset: Dataset, log=print):
    """The initial embedding of a text data set: ``(vectors, found)`` or None.

    ``c['embeddings']``: ``'word2vec'`` (trained on the training split, cached; the
    default, as the paper fed pre-trained Word2Vec vectors), ``'random'`` (learned from
    scratch) or a word2vec file. Float inputs (P-MNIST) have no embedding: None.
    """
    from rhnzoo.data import word2vec

    spec = c["embeddings"]
    if dataset.vocab is None or spec in (None, "random"):
        return None
    if spec == "word2vec":
        return word2vec.train_word2vec(dataset.train.inputs, dataset.vocab, c["embed_size"],
                                       dataset=c["dataset"], log=log)  # fmt: skip
    vectors = word2vec.load_word2vec(spec, dataset.vocab, c["embed_size"])
    log(f"{spec}: vectors for {vectors[1].sum():,} of {len(dataset.vocab):,} words")
    return vectors


def subset(dataset: Dataset, n: int | None) -> Dataset:
    """The first ``n`` training sequences of a fixed shuffle (screening runs); None: all."""
    if n is None or n >= len(dataset.train.labels):
        return dataset
    index = np.sort(np.random.default_rng(0xD5).permutation(len(dataset.train.labels))[:n])
    return dataclasses.replace(dataset, train=dataset.train.subset(index))


def train_model(name: str, c, dataset: Dataset, run: engine.RunConfig, workdir,
                on_divergence: str = "raise", log=print) -> dict:  # fmt: skip
    """Trains model ``name`` (a cell name) under config ``c`` in ``workdir``; its results
    (``on_divergence``: see :func:`rhnzoo.training.engine.run`)."""
    data = subset(dataset, c.get("subset"))
    model = SequenceClassifier(cell_from_config(name, c), data.num_classes,
                               data.input_size or c["embed_size"],
                               None if data.vocab is None else len(data.vocab), drop=c["drop"],
                               input_drop=c["input_drop"], init_scale=c["init_scale"],
                               **scan_options(c))  # fmt: skip
    log(f"{LABELS.get(name, name)} on {c['dataset']}: {len(data.train.labels):,} train / "
        f"{len(data.dev.labels):,} dev / {len(data.test.labels):,} test sequences")
    vectors = embeddings_for(c, data, log)
    task = make_task(model, data.train, data.dev, data.test, train_config(c), run.seed, vectors)
    return engine.run(task, run, workdir, {"model": name, **c}, on_divergence=on_divergence,
                      log=log).results  # fmt: skip


def _measured(runs: Sequence[dict | None]) -> list:
    """``[best dev acc %, test acc % (or 'diverged' / 'failed'), epochs, minutes]`` of a
    row's runs, one per seed (:func:`rhnzoo.training.sweep.collect`): each seed's best dev
    accuracy and its test accuracy at that checkpoint; over several seeds the mean ± sd
    of those measured (:func:`rhnzoo.training.sweep.mean_sd`), the test cell naming the
    seeds that diverged or failed, epochs and minutes the mean per seed. None where
    nothing is measured (yet)."""
    from rhnzoo.training import sweep

    devs, tests, epochs, minutes, notes = [], [], [], [], []
    for run in runs:
        r, hist = (run or {}).get("results"), (run or {}).get("history") or []
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
    test = sweep.mean_sd(tests)
    if notes:
        counts = {n: notes.count(n) for n in dict.fromkeys(notes)}
        said = ", ".join(n if len(runs) == 1 else f"{k} {n}" for n, k in counts.items())
        test = said if test is None else f"{test}; {said}"
    mean = lambda values, spec: f"{math.fsum(values) / len(values):{spec}}" if values else None
    return [sweep.mean_sd(devs), test, mean(epochs, ".0f"), mean(minutes, ".1f")]


def table_text(root, models: Sequence[str], dataset: str, title: str, seeds: int = 1) -> str:
    """Table 3's layout from the workdirs ``root/<model>`` (seed k > 0:
    ``<model>_s<k>``): the paper's test accuracy beside our dev and test accuracy (several
    seeds: mean ± sd), parameters, epochs and minutes (a run not yet finished: its best
    dev accuracy so far)."""
    from rhnzoo.training import sweep

    rows = []
    for name in models:
        runs = list(sweep.collect(root, [sweep.seed_name(name, k) for k in range(seeds)]).values())
        paper = PAPER_TABLE3.get((name, dataset))
        r = next((run["results"] for run in runs if run and run["results"]), None) or {}
        params = f"{r['parameters']:,}" if "parameters" in r else None
        dev, test, epochs, minutes = _measured(runs)
        rows.append([LABELS.get(name, name), "n/a" if paper is None else f"{paper:.2f}",
                     dev, test, params, epochs, minutes])  # fmt: skip
    header = [f"model ({title})", "paper test acc (Table 3)", "rhnzoo dev acc",
              "rhnzoo test acc", "parameters", "epochs", "minutes"]  # fmt: skip
    return sweep.markdown(header, rows)


def study_table(root, names: Sequence[str], title: str, seeds: int = 1) -> str:
    """The recipe study's table: setting, dev accuracy (best epoch), epochs, minutes
    (several seeds: mean ± sd)."""
    from rhnzoo.training import sweep

    rows = [[name, *_measured(list(sweep.collect(root, [sweep.seed_name(name, k)
                                                       for k in range(seeds)]).values()))]
            for name in names]  # fmt: skip
    return sweep.markdown([f"setting ({title})", "best dev acc", "test acc (best dev)",
                           "epochs", "minutes"], rows)  # fmt: skip


def run_experiment(base, root, models: Sequence[str], *, study: str | None, table: bool,
                   run_missing: bool, load, run_config, title: str,
                   log: Callable[[str], None] | None = print, seeds: int = 1,
                   jobs=None) -> str | None:  # fmt: skip
    """What ``experiments/rrl.py`` does: one model, the ``--table`` models, or a study.

    Every run's settings are checked before any data is read (``load()`` loads the data
    set, once, when a run trains); a model trains in ``root/<model>``, a study's setting
    in ``root/study_<study>/<setting>``; seed k > 0 of either in ``<name>_s<k>`` with
    ``base['seed'] + k``. With several runs a diverging one is recorded and the others
    go on. Returns the table (also written to ``table.md``) for ``table`` or ``study``,
    else None.

    Args:
      base: the run's config (the script's flags).
      run_config: ``config -> engine.RunConfig``.
      log: where progress lines go (None: nowhere; a multi-process run's other
        processes). ``table.md`` is written by process 0 only.
      seeds: runs per model or setting (seeds ``base['seed']``, ``+ 1``, ...).
      jobs: how the runs train (:class:`rhnzoo.training.sweep.Jobs`; default: in turn,
        in this process).

    Raises:
      ValueError: a bad setting or an unknown study (one line).
    """
    from rhnzoo.training import sweep

    say = log or (lambda line: None)
    root = pathlib.Path(root)
    if study:
        spec = STUDIES.get((study, base["dataset"]))
        if spec is None:
            raise ValueError(f"no {study} study on {base['dataset']}; studies: "
                             f"{', '.join('/'.join(k) for k in STUDIES)}")  # fmt: skip
        configs = {s: {**base, **spec["budget"], **o} for s, o in spec["settings"].items()}
        models = [c.pop("model", spec["model"]) for c in configs.values()]
        root = root / f"study_{study}"
    else:
        models = list(dict.fromkeys(models))
        configs = {m: base for m in models}
    for c, model in zip(configs.values(), models):
        check_config([model], c)
    several = bool(table or study)
    stop = "stop" if several else "raise"
    seeded = [(sweep.seed_name(name, k), {**c, "seed": c["seed"] + k}, model)
              for (name, c), model in zip(configs.items(), models)
              for k in range(seeds)]  # fmt: skip
    runs = [sweep.Run(name, {"model": model, **c},
                      lambda wd, on_divergence, model=model, c=c: train_model(
                          model, c, load(), run_config(c), wd, on_divergence=on_divergence,
                          log=say))
            for name, c, model in seeded]  # fmt: skip
    if run_missing or not several:
        if jobs is not None and jobs.n > 1:  # in this process, before any child starts:
            dataset = load()  # a data error is one line; word2vec trained once, cached
            for c in {(c["embeddings"], c["embed_size"], c.get("subset")): c
                      for _, c, _ in seeded}.values():  # fmt: skip
                embeddings_for(c, subset(dataset, c.get("subset")), say)
        sweep.run_all(runs, root, log=say, jobs=jobs, on_divergence=stop)
    if not several:
        return None
    text = (study_table(root, list(configs), f"{models[0]} {title}", seeds) if study
            else table_text(root, models, base["dataset"], title, seeds))  # fmt: skip
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
        (root / "table.md").write_text(text + "\n")
    return text
