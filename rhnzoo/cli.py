"""absl flags and main function shared by the language-model experiments.

``experiments/ptb.py`` (word level) and ``experiments/char.py`` (character
level) differ only in their data set, defaults, presets and metric; everything
else (flags, validation, model construction, training) lives here.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import jax
from absl import flags, logging

from rhnzoo import cells, data, dropout, lm, train

FLAGS = flags.FLAGS

# The reference code's ``ptb_sota`` configuration (Zilly et al., rhn_train.py).
PTB_SOTA = dict(
    depth=10, hidden_size=830, init_scale=0.04, init_bias=-2.0, lr=0.2, lr_decay=1.02,
    max_epoch=20, max_max_epoch=500, weight_decay=1e-7, max_grad_norm=10.0, num_steps=35,
    batch_size=20, drop_x=0.25, drop_i=0.75, drop_h=0.25, drop_o=0.75, tied=True,
)  # fmt: skip

_FLAG_NAMES: list[str] = []


def define_flags(defaults: dict[str, Any], presets: dict[str, dict[str, Any]]) -> None:
    """Defines every language-model flag with the given defaults (call once, at import)."""
    d = defaults

    def define(kind, name, default, help_):
        if kind == "enum_auto":
            flags.DEFINE_enum(name, default, ["auto", "fused", "reference"], help_)
        elif kind == "enum_dtype":
            flags.DEFINE_enum(name, default, ["float32", "bfloat16"], help_)
        else:
            getattr(flags, f"DEFINE_{kind}")(name, default, help_)
        _FLAG_NAMES.append(name)

    flags.DEFINE_enum("preset", None, list(presets), "Named setting overriding the defaults "
                      "(flags given explicitly still win).")  # fmt: skip
    _FLAG_NAMES.append("preset")
    define("integer", "depth", d["depth"], "Recurrence depth L (micro-layers per time step).")
    define("integer", "hidden_size", d["hidden_size"], "Units per micro-layer.")
    define("boolean", "hsg", False, "Add the Highway State Gate (Shoham & Permuter).")
    define("float", "hsg_init_bias", -2.5, "Initial HSG gate bias b_G.")
    define("boolean", "coupled", True, "Coupled carry gate C = 1 - T.")
    define("boolean", "tied", d["tied"], "Tie the embedding and softmax weights.")
    define("float", "init_scale", d["init_scale"], "Uniform initialisation half-width.")
    define("float", "init_bias", d["init_bias"], "Initial transform-gate bias.")
    define("float", "lr", d["lr"], "Initial SGD learning rate (loss summed over time / batch).")
    define("float", "lr_decay", d["lr_decay"], "Learning-rate divisor per epoch after max_epoch.")
    define("integer", "max_epoch", d["max_epoch"], "Epochs at constant learning rate.")
    define("integer", "max_max_epoch", d["max_max_epoch"], "Total epochs.")
    define("float", "weight_decay", d["weight_decay"], "L2 coefficient (on 0.5 ||theta||^2).")
    define("float", "max_grad_norm", d["max_grad_norm"], "Global-norm gradient clipping.")
    define("integer", "num_steps", d["num_steps"], "Truncated-BPTT window length.")
    define("integer", "batch_size", d["batch_size"], "Batch size (rows of the token stream).")
    define("float", "drop_x", d["drop_x"], "Word-dropout probability on the embedding.")
    define("float", "drop_i", d["drop_i"], "Dropout probability on the cell input.")
    define("float", "drop_h", d["drop_h"], "Dropout probability on the recurrent state.")
    define("float", "drop_o", d["drop_o"], "Dropout probability on the cell output.")
    define("integer", "unroll", 1, "Time steps per lax.scan iteration.")
    define("enum_auto", "scan_impl", "auto", "Time-scan implementation: 'fused' (hand-written "
           "backward pass, coupled RHN/HSG), 'reference' (plain autodiff, any cell), or 'auto' "
           "(fused where supported).")  # fmt: skip
    define("boolean", "remat", False, "Recompute time steps in the backward pass (less memory).")
    define("enum_dtype", "dtype", "float32", "Matmul input dtype (float32 accumulation); "
           "bfloat16 needs the fused scan.")  # fmt: skip
    define("boolean", "distributed", False, "Call jax.distributed.initialize() first "
           "(multi-host: coordinator settings from the environment or the TPU/SLURM runtime).")  # fmt: skip
    define("integer", "seed", 0, "Random seed (initialisation and dropout).")
    define("string", "data_dir", None, "Directory with the data files (default: "
           "$RHNZOO_DATA/<dataset>, else the user cache; downloaded if absent).")  # fmt: skip
    define("boolean", "download", True, "Download the data when the files are absent.")
    define("string", "workdir", None, "Run directory (default: runs/<dataset>_<settings>).")
    define("integer", "max_steps", None, "Stop after this many train steps.")
    define("integer", "max_epochs", None, "Stop after this many epochs.")
    define("integer", "checkpoint_every_steps", 0, "Also checkpoint every N steps.")
    define("integer", "eval_batch_size", 1, "Final evaluation batch size (1: reference).")
    define("integer", "eval_num_steps", 100, "Window length of evaluation scans.")
    define("integer", "log_every", 100, "Steps between loss readouts.")
    define("boolean", "progress", True, "Show a progress bar.")
    _PRESETS.update(presets)


_PRESETS: dict[str, dict[str, Any]] = {}


def _apply_preset() -> None:
    for name, value in _PRESETS.get(FLAGS.preset, {}).items():
        if not FLAGS[name].present:
            FLAGS[name].value = value


def run(dataset: str, load_corpus: Callable[..., data.Corpus], metric: str = "ppl") -> None:
    """The experiments' main: validate flags, load data, build the model, train.

    Args:
      dataset: name used in the default workdir, e.g. ``'ptb'``.
      load_corpus: ``load_corpus(data_dir, download=...) -> Corpus``.
      metric: ``'ppl'`` (perplexity) or ``'bpc'`` (bits per character).

    Exits with one ``error: ...`` line on stderr for invalid flags, missing data,
    an incompatible workdir or a diverged run.
    """
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    _apply_preset()
    config = {"dataset": dataset, **{name: FLAGS[name].value for name in _FLAG_NAMES}}
    try:
        cells.RHN(FLAGS.hidden_size, FLAGS.depth)  # validates depth and size before any work
        rates = dropout.Rates(FLAGS.drop_x, FLAGS.drop_i, FLAGS.drop_h, FLAGS.drop_o)
        cfg = train.TrainConfig(
            lr=FLAGS.lr, lr_decay=FLAGS.lr_decay, max_epoch=FLAGS.max_epoch,
            max_max_epoch=FLAGS.max_max_epoch, weight_decay=FLAGS.weight_decay,
            max_grad_norm=FLAGS.max_grad_norm, batch_size=FLAGS.batch_size,
            num_steps=FLAGS.num_steps, rates=rates, seed=FLAGS.seed, max_steps=FLAGS.max_steps,
            max_epochs=FLAGS.max_epochs, checkpoint_every_steps=FLAGS.checkpoint_every_steps,
            eval_batch_size=FLAGS.eval_batch_size, eval_num_steps=FLAGS.eval_num_steps,
            log_every=FLAGS.log_every, progress=FLAGS.progress,
        )  # fmt: skip
        scan_impl = FLAGS.scan_impl
        if scan_impl == "auto":
            scan_impl = "fused" if FLAGS.coupled else "reference"
        if FLAGS.distributed:
            jax.distributed.initialize()
        corpus = load_corpus(FLAGS.data_dir, download=FLAGS.download)
        model = lm.rhn_language_model(
            corpus.vocab_size, FLAGS.hidden_size, FLAGS.depth, hsg=FLAGS.hsg, tied=FLAGS.tied,
            coupled=FLAGS.coupled, init_scale=FLAGS.init_scale, init_bias=FLAGS.init_bias,
            hsg_init_bias=FLAGS.hsg_init_bias, unroll=FLAGS.unroll, scan_impl=scan_impl,
            remat=FLAGS.remat, dtype=FLAGS.dtype,
        )  # fmt: skip
        workdir = FLAGS.workdir or (
            f"runs/{dataset}_{FLAGS.preset or 'default'}_d{FLAGS.depth}_n{FLAGS.hidden_size}"
            f"{'_hsg' if FLAGS.hsg else ''}"
        )
        train.train(model, corpus, cfg, workdir, run_config=config, metric_name=metric)
    except (ValueError, data.DataError, train.TrainingDiverged) as e:
        sys.exit(f"error: {e}")
