"""``experiments/rrl.py``'s flags and body (Wang & Tian, EMNLP 2016): the flags ->
one :class:`~rhnzoo.training.rrl.RRLConfig` per run (:func:`rhnzoo.configs.rrl.runs`) ->
:func:`rhnzoo.training.rrl.run_experiment`, with the data set loaded once, only when a
run trains.
"""

from __future__ import annotations

import functools
import pathlib

import jax
from absl import flags

from rhnzoo import data
from rhnzoo.apps import cli
from rhnzoo.configs import rrl as presets
from rhnzoo.training import rrl, sweep

FLAGS = flags.FLAGS
CONFIG_FLAGS = ("dataset", "embed_size", "hidden_size", "hybrid_hidden_size", "rrn_depth",
                "rrn_activation", "rrn_recurrent_init", "rrn_f_bias", "skip", "forget_bias",
                "init_scale", "drop", "input_drop", "batch_size", "max_len", "keep", "buckets",
                "lr", "adadelta_eps", "max_grad_norm", "epochs", "subset", "coverage",
                "dev_seed", "permute", "embeddings", "freeze_embeddings", "data_source")  # fmt: skip


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script)."""
    # The default data set first, then the registry's order.
    datasets = ["imdb", *(name for name in data.names("sequences") if name != "imdb")]
    flags.DEFINE_enum("dataset", "imdb", datasets, "Data set.")
    flags.DEFINE_string("model", "lstm", "Recurrent layer: a cell of rhnzoo.cells (Wang & "
                        f"Tian's: {', '.join(rrl.MODELS)}; also rhn, hsg_rhn, dtrnn, ...).")
    flags.DEFINE_list("models", list(rrl.MODELS), "With --table: the models of the table.")
    flags.DEFINE_boolean("table", False, "Train the --models not finished under the root, then "
                         "print the Table 3 layout (--norun_missing: only print).")
    flags.DEFINE_enum("study", None, sorted({s for s, _ in presets.STUDIES}), "A study of what the "
                      "paper leaves open, screened on dev at a reduced budget (rrl.STUDIES): "
                      "'rrn' the RRN recipe, 'skip' SC-LSTM's L; then its table.")
    flags.DEFINE_boolean("run_missing", True, "With --table / --study: train unfinished runs.")
    flags.DEFINE_enum("data_source", "files", ["files", "tfds"], "Original files (download, "
                      "checksum, cache) or TensorFlow Datasets (pip install 'rhnzoo[tfds]').")
    flags.DEFINE_integer("embed_size", 256, "Embedding width (P-MNIST: 1, the pixel).")
    flags.DEFINE_integer("hidden_size", 512, "Hidden units (LSTM, GRU, RRN, SC-LSTM).")
    flags.DEFINE_integer("hybrid_hidden_size", 384, "Hidden units per cell of HRL / LSTM+GRU.")
    flags.DEFINE_integer("rrn_depth", 2, "K, layers of the RRN transition F (eq. 4).")
    flags.DEFINE_enum("rrn_activation", "sigmoid", ["sigmoid", "tanh"], "Inner activation of the "
                      "RRN transition (the paper's σ is the logistic function).")
    flags.DEFINE_enum("rrn_recurrent_init", "uniform", ["uniform", "orthogonal"], "RRN U_k init.")
    flags.DEFINE_float("rrn_f_bias", 0.0, "Initial bias of the RRN's last F layer (paper: 0).")
    flags.DEFINE_integer("skip", 20, "SC-LSTM skip length L (eq. 5).")
    flags.DEFINE_float("forget_bias", 1.0, "Initial LSTM forget-gate bias.")
    flags.DEFINE_float("init_scale", 0.1, "Uniform initialisation half-width.")
    flags.DEFINE_float("drop", 0.5, "Dropout probability on the final representation.")
    flags.DEFINE_float("input_drop", 0.0, "Dropout probability on the embedded inputs.")
    flags.DEFINE_boolean("freeze_embeddings", False, "Keep the (pre-trained) embedding fixed.")
    flags.DEFINE_integer("batch_size", 32, "Sequences per step.")
    flags.DEFINE_integer("max_len", 400, "Steps kept per sequence.")
    flags.DEFINE_enum("keep", "last", ["last", "first"], "Which steps a longer sequence keeps.")
    flags.DEFINE_integer("buckets", 4, "Padded lengths: max_len / 2^k, k < buckets.")
    flags.DEFINE_float("lr", 1.0, "Adadelta learning rate.")
    flags.DEFINE_float("adadelta_eps", 1e-6, "Adadelta's epsilon.")
    flags.DEFINE_float("max_grad_norm", 5.0, "Global-norm gradient clipping.")
    flags.DEFINE_integer("epochs", 10, "Epochs.")
    flags.DEFINE_integer("subset", None, "Train on this many training sequences (screening).")
    flags.DEFINE_float("coverage", 0.95, "Vocabulary: most frequent words covering this fraction "
                       "of the training tokens; the rest is <unk>.")
    flags.DEFINE_integer("dev_seed", 0, "Seed of the 15 % dev split.")
    flags.DEFINE_boolean("permute", True, "P-MNIST: the fixed pixel permutation (--nopermute: "
                         "sequential MNIST).")
    flags.DEFINE_string("embeddings", "word2vec", "Text: 'word2vec' (trained on the training "
                        "split, cached), 'random' (learned from scratch) or a word2vec file.")
    flags.DEFINE_enum("scan_impl", "auto", ["auto", "fused", "reference"], "Time scan: 'fused' "
                      "(hand-written backward pass, rhnzoo.cells.gated_fused), 'reference' "
                      "(lax.scan + autodiff); auto: fused where the cell has it.")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Matmul inputs of the "
                      "recurrent layer, float32 accumulation: float32 (computed at "
                      "--matmul_precision: TF32 / bfloat16 passes by default on GPUs / TPUs) or "
                      "bfloat16 (float32 state and parameters).")
    cli.define_presets({name: {} for name in presets.PRESETS})
    cli.define_run_flags()
    cli.define_distributed_flags()
    sweep.define_flags()


def experiment() -> None:
    """The script's body: one model, the ``--table`` models or a ``--study``
    (:func:`rhnzoo.training.rrl.run_experiment`), from the flags."""
    cli.apply_preset(presets.overrides(FLAGS.preset, FLAGS.dataset))
    root = pathlib.Path(FLAGS.workdir or f"runs/rrl_{FLAGS.dataset}_{FLAGS.preset or 'custom'}")
    settings = {**cli.flag_values(CONFIG_FLAGS + cli.RUN_FLAGS + cli.DATA_FLAGS,
                                  unless_default=("scan_impl", "dtype")),
                "preset": FLAGS.preset}  # a resumable key: earlier workdirs (without it) resume
    models = FLAGS.models if FLAGS.table else [FLAGS.model]
    jobs, seeds = sweep.from_flags()  # before JAX touches a device
    if FLAGS.distributed and jobs.n > 1:
        raise ValueError("--jobs > 1 and --distributed do not go together")
    if FLAGS.distributed:
        cli.initialize_distributed()
    primary = jax.process_index() == 0  # prints; the engine writes the files from it alone
    title = f"{FLAGS.dataset}, preset {FLAGS.preset or 'custom'}" + (
        f", {seeds} seeds" if seeds > 1 else "")  # fmt: skip
    configs = presets.runs(settings, models, FLAGS.study)  # every run checked: one line
    text = rrl.run_experiment(configs, root, study=FLAGS.study, table=FLAGS.table,
                              run_missing=FLAGS.run_missing, load=_dataset, title=title,
                              log=print if primary else None, seeds=seeds, jobs=jobs)
    if text and primary:
        print(text)


@functools.cache
def _dataset() -> data.sequences.Dataset:
    """The data set, loaded once (and only when a run trains)."""
    return data.load_dataset(
        FLAGS.dataset, data_dir=FLAGS.data_dir, download=FLAGS.download,
        verify=FLAGS.verify_data, source=FLAGS.data_source, coverage=FLAGS.coverage,
        dev_seed=FLAGS.dev_seed, permute=FLAGS.permute)  # fmt: skip
