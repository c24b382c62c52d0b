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
# The flags of a run's settings: (absl kind or enum choices, name, help); each defaults to
# the RRLConfig field of its name.
_CONFIG_FLAG_SPECS = (
    (["imdb", *(name for name in data.names("sequences") if name != "imdb")], "dataset",
     "Data set."),  # the default data set first, then the registry's order
    ("integer", "embed_size", "Embedding width (P-MNIST: 1, the pixel)."),
    ("integer", "hidden_size", "Hidden units (LSTM, GRU, RRN, SC-LSTM)."),
    ("integer", "hybrid_hidden_size", "Hidden units per cell of HRL / LSTM+GRU."),
    ("integer", "hybrid_embed_size", "Embedding width of HRL / LSTM+GRU (default: "
     "--embed_size)."),
    ("integer", "rrn_depth", "K, layers of the RRN transition F (eq. 4)."),
    (["sigmoid", "tanh"], "rrn_activation", "Inner activation of the RRN transition (the "
     "paper's σ is the logistic function)."),
    (["uniform", "orthogonal"], "rrn_recurrent_init", "RRN U_k init."),
    ("float", "rrn_f_bias", "Initial bias of the RRN's last F layer (paper: 0)."),
    ("integer", "skip", "SC-LSTM skip length L (eq. 5)."),
    ("float", "forget_bias", "Initial LSTM forget-gate bias."),
    ("float", "init_scale", "Uniform initialisation half-width."),
    ("float", "drop", "Dropout probability on the final representation."),
    ("float", "input_drop", "Dropout probability on the embedded inputs."),
    ("integer", "batch_size", "Sequences per step."),
    ("integer", "max_len", "Steps kept per sequence."),
    (["last", "first"], "keep", "Which steps a longer sequence keeps."),
    ("integer", "buckets", "Padded lengths: max_len / 2^k, k < buckets."),
    ("float", "lr", "Adadelta learning rate."),
    ("float", "adadelta_eps", "Adadelta's epsilon."),
    ("float", "max_grad_norm", "Global-norm gradient clipping."),
    ("integer", "epochs", "Epochs."),
    ("integer", "subset", "Train on this many training sequences (screening)."),
    ("float", "coverage", "Vocabulary: most frequent words covering this fraction of the "
     "training tokens; the rest is <unk>."),
    ("integer", "dev_seed", "Seed of the 15 % dev split."),
    ("boolean", "permute", "P-MNIST: the fixed pixel permutation (--nopermute: sequential "
     "MNIST)."),
    ("string", "embeddings", "Text: 'word2vec' (trained on the training split, cached), "
     "'random' (learned from scratch) or a word2vec file."),
    ("boolean", "freeze_embeddings", "Keep the (pre-trained) embedding fixed."),
    (list(data.SOURCES), "data_source", "Original files (download, checksum, cache) or "
     "TensorFlow Datasets (pip install 'rhnzoo[tfds]')."),
    (["auto", "fused", "reference"], "scan_impl", "Time scan: 'fused' (hand-written backward "
     "pass, rhnzoo.cells.gated_fused), 'reference' (lax.scan + autodiff); auto: fused where "
     "the cell has it."),
    (["float32", "bfloat16"], "dtype", "Matmul inputs of the recurrent layer, float32 "
     "accumulation: float32 (computed at --matmul_precision: TF32 / bfloat16 passes by "
     "default on GPUs / TPUs) or bfloat16 (float32 state and parameters)."),
)  # fmt: skip
CONFIG_FLAGS = tuple(name for _, name, _ in _CONFIG_FLAG_SPECS)


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script); the settings'
    defaults are :class:`~rhnzoo.training.rrl.RRLConfig`'s."""
    d = rrl.RRLConfig()
    flags.DEFINE_string("model", d.model, "Recurrent layer: a cell of rhnzoo.cells (Wang & "
                        f"Tian's: {', '.join(rrl.MODELS)}; also rhn, hsg_rhn, dtrnn, ...).")
    flags.DEFINE_list("models", list(rrl.MODELS), "With --table: the models of the table.")
    flags.DEFINE_boolean("table", False, "Train the --models not finished under the root, then "
                         "print the Table 3 layout (--norun_missing: only print).")
    flags.DEFINE_enum("study", None, sorted({s for s, _ in presets.STUDIES}), "A study of what the "
                      "paper leaves open, screened on dev at a reduced budget "
                      "(rhnzoo.configs.rrl.STUDIES): 'rrn' the RRN recipe, 'skip' SC-LSTM's L; "
                      "then its table.")
    flags.DEFINE_boolean("run_missing", True, "With --table / --study: train unfinished runs.")
    cli.define_config_flags(d, _CONFIG_FLAG_SPECS, module_name=__name__)
    cli.define_presets({name: {} for name in presets.PRESETS})
    cli.define_run_flags()
    cli.define_distributed_flags()
    sweep.define_flags()


def experiment() -> None:
    """The script's body: one model, the ``--table`` models or a ``--study``
    (:func:`rhnzoo.training.rrl.run_experiment`), from the flags."""
    cli.apply_preset(presets.overrides(FLAGS.preset, FLAGS.dataset))
    root = pathlib.Path(FLAGS.workdir or f"runs/rrl_{FLAGS.dataset}_{FLAGS.preset or 'custom'}")
    settings = {**cli.flag_values(CONFIG_FLAGS + cli.RUN_FLAGS + cli.DATA_FLAGS),
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
