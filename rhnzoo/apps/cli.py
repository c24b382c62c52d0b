"""absl flags and the main wrapper shared by every experiment in ``experiments/``.

* :func:`define_run_flags`: the run engine's flags (``--workdir``, ``--seed``,
  ``--max_steps``, ``--max_epochs``, ``--checkpoint_every_steps``, ``--log_every``,
  ``--progress``, ``--tensorboard``, ``--divergence_factor``, ``--patience``,
  ``--matmul_precision``) and the data flags (``--data_dir``, ``--download``,
  ``--verify_data``), the same names and meanings in every script; :func:`run_config`
  turns them into an engine ``RunConfig``.
* :func:`define_presets` / :func:`apply_preset`: ``--preset=NAME`` overrides
  defaults; flags given explicitly still win.
* :func:`main`: what every script's ``main`` runs in: signals caught first, orbax
  logging quiet, and one ``error: ...`` line (exit 1) for any error a user can
  cause; exit 128 + N after signal N (the state saved). ``RHNZOO_TRACEBACK=1``
  shows the traceback instead.
* :func:`define_lm_flags` / :func:`lm_config` / :func:`run_lm`: the language-model
  experiments (``experiments/ptb.py``, ``experiments/char.py``; their presets in
  :mod:`rhnzoo.configs.lm`).

Scripts call ``flags.adopt_module_key_flags(cli)`` so that ``--help`` lists these
flags with their own.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import flags, logging

from rhnzoo import cells, data, precision
from rhnzoo.data.common import DataError
from rhnzoo.configs import lm as lm_configs
from rhnzoo.training import engine
from rhnzoo.training import lm as lm_training
from rhnzoo.training.lm import LMConfig

FLAGS = flags.FLAGS

# The run flags: the workdir and the engine's settings (engine.RunSettings, declared once).
RUN_FLAGS = ("workdir", *engine.RUN_SETTINGS)
DATA_FLAGS = ("data_dir", "download", "verify_data")
_PRESETS: dict[str, dict[str, Any]] = {}


def define_run_flags(*, log_every: int = 100, data: bool = True) -> None:
    """Defines the run engine's flags (and the data flags); call once, at import."""
    flags.DEFINE_string("workdir", None, "Run directory; rerunning with it resumes "
                        "(default: runs/<dataset>_<settings>).")  # fmt: skip
    flags.DEFINE_integer("seed", 0, "Random seed (initialisation, dropout, batch order).")
    flags.DEFINE_integer("max_steps", None, "Stop after this many train steps in all "
                         "(>= 1; evaluation is then batched unless --eval_batch_size).")  # fmt: skip
    flags.DEFINE_integer("max_epochs", None, "Stop after this many epochs in all (>= 1).")
    flags.DEFINE_integer("checkpoint_every_steps", 0, "Also checkpoint every N steps "
                         "(0: at the end of every epoch only).")  # fmt: skip
    flags.DEFINE_integer("log_every", log_every, "Steps between training-loss lines.")
    flags.DEFINE_boolean("progress", True, "Show progress bars (training and evaluation).")
    flags.DEFINE_boolean("tensorboard", False, "Also write TensorBoard event files to "
                         "<workdir>/tensorboard (pip install 'rhnzoo[tensorboard]').")  # fmt: skip
    flags.DEFINE_float("divergence_factor", 3.0, "F: the run stops as diverged (one error "
                       "line; the last checkpoint is kept) at a NaN/inf loss, or when, from "
                       "step 70 on, the mean training loss of the last 50 steps is more than "
                       "ln F nats above the chance level (a uniform guess) or above the run's "
                       "best such mean, or a validation loss is more than ln F above chance. "
                       "0: only NaN/inf stop the run.")  # fmt: skip
    flags.DEFINE_integer("patience", None, "Early stopping: end training after this many "
                         "epochs without a better validation metric (default: never).")  # fmt: skip
    define_precision_flag()
    if data:
        define_data_flags()


class _PrecisionParser(flags.ArgumentParser):
    """Parses a matmul precision to its level (``float32`` -> ``highest``)."""

    def parse(self, argument):
        return precision.normalize(argument)

    def flag_type(self):
        return "string"


def define_precision_flag() -> None:
    """``--matmul_precision`` (:mod:`rhnzoo.precision`), once per process (the experiments,
    through :func:`define_run_flags`, and the benchmarks). Its default is JAX's setting
    when the flag is defined: ``$JAX_DEFAULT_MATMUL_PRECISION``, else ``default``."""
    if "matmul_precision" in FLAGS:
        return
    flags.DEFINE(_PrecisionParser(), "matmul_precision", precision.current(),
                 "Precision of float32 matmuls (jax.default_matmul_precision), recorded in "
                 "config.json: 'default' is the backend's fastest (CPU: float32; NVIDIA GPU: "
                 "TensorFloat-32 inputs, about 1e-3 relative error; TPU: one bfloat16 pass), "
                 "'high' (GPU: TF32; TPU: 3 bfloat16 passes), 'highest' (float32; TPU: 6 "
                 "passes); also JAX's names bfloat16, tensorfloat32, float32. Default: "
                 "$JAX_DEFAULT_MATMUL_PRECISION, else 'default'.")  # fmt: skip


def define_data_flags() -> None:
    """``--data_dir``, ``--download``, ``--verify_data`` (call once, at import)."""
    flags.DEFINE_string("data_dir", None, "Directory with the data files (default: "
                        "$RHNZOO_DATA/<dataset>, else the user cache).")  # fmt: skip
    flags.DEFINE_boolean("download", True, "Download the data when the files are absent.")
    flags.DEFINE_boolean("verify_data", True, "Check the sha256 of data files already on "
                         "disk (--noverify_data: files of your own).")  # fmt: skip


def flag_values(names: Sequence[str]) -> dict[str, Any]:
    """``{name: value}`` of the flags ``names`` (the settings of a run's config; the
    config's ``ADDED_KEYS`` leave those at their default out of ``config.json``)."""
    return {name: FLAGS[name].value for name in names}


def run_config(epochs: int, **overrides: Any) -> engine.RunConfig:
    """The engine settings from the run flags (``overrides`` win, e.g. a sweep's
    ``patience``). Raises ValueError for a bad value."""
    return engine.RunConfig(epochs=epochs, **{**flag_values(engine.RUN_SETTINGS), **overrides})


def define_presets(presets: dict[str, dict[str, Any]]) -> None:
    flags.DEFINE_enum("preset", None, list(presets) or ["none"], "Named setting overriding "
                      "the defaults (flags given explicitly still win).")  # fmt: skip
    _PRESETS.clear()
    _PRESETS.update(presets)


def apply_preset(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sets the preset's values (``values``, or those `define_presets` registered for
    ``--preset``) on flags not given explicitly; returns them."""
    preset = _PRESETS.get(FLAGS.preset, {}) if values is None else values
    for name, value in preset.items():
        if not FLAGS[name].present:
            FLAGS[name].value = value
    return preset


def define_config_flags(
    defaults: Any, specs: Sequence[tuple[Any, str, str]], module_name: str | None = None
) -> list[str]:
    """Defines a flag per ``(kind, name, help)`` of ``specs``, its default the field
    ``name`` of the config ``defaults``: ``kind`` an absl kind (``'integer'``,
    ``'float'``, ``'boolean'``, ``'string'``) or the list of an enum's choices.
    ``module_name``: the module ``--help`` lists them under (default: this one). Returns
    the names, in order."""
    for kind, name, help_ in specs:
        default = getattr(defaults, name)
        if isinstance(kind, list):
            flags.DEFINE_enum(name, default, kind, help_, module_name=module_name)
        else:
            getattr(flags, f"DEFINE_{kind}")(name, default, help_, module_name=module_name)
    return [name for _, name, _ in specs]


def run_app(main_fn: Callable[[list[str]], Any], positional: bool = False) -> None:
    """``absl.app.run(main_fn)`` whose flag errors (an unknown flag or enum value, a
    malformed number, a non-finite float: no float flag means anything at NaN or inf) are
    one ``error: ...`` line and exit status 1, like every other error; so are positional
    arguments unless ``positional`` (then ``main_fn`` gets them in ``argv[1:]``)."""
    from absl import app

    def parse(argv):
        try:
            argv = FLAGS(argv)
        except flags.Error as e:
            sys.exit(f"error: {' '.join(str(e).split())}")
        if len(argv) > 1 and not positional:
            sys.exit(f"error: unexpected arguments {' '.join(argv[1:])}")
        for name in FLAGS:
            flag = FLAGS[name]
            if (isinstance(flag.parser, flags.FloatParser) and flag.value is not None
                    and not math.isfinite(flag.value)):  # fmt: skip
                sys.exit(f"error: --{flag.name} must be a finite number, got {flag.value}")
        return argv

    app.run(main_fn, flags_parser=parse)


def main(fn: Callable[[], Any]) -> Any:
    """Runs an experiment's body with the shared error, signal and logging handling."""
    engine.catch_signals()
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    try:
        return fn()
    except (ValueError, DataError, engine.RunError) as e:
        if os.environ.get("RHNZOO_TRACEBACK"):
            raise
        sys.exit(f"error: {' '.join(str(e).split())}")
    except engine.Interrupted as e:
        sys.exit(128 + e.signum)


# ----------------------------------------------------------------- language models

_LM_FLAGS: list[str] = []
# The language-model flags after --cell: (absl kind, name, help); each defaults to the
# field of the same name of the script's config (rhnzoo.configs.lm).
_LM_FLAG_SPECS = (
    ("integer", "depth", "Recurrence depth L (micro-layers per time step; cells with a depth: "
     "rhn, dtrnn, dtsrnn, rrn, hrl)."),
    ("integer", "hidden_size", "Units per micro-layer."),
    ("boolean", "hsg", "Add the Highway State Gate (Shoham & Permuter) around --cell; the RHN "
     f"T bias then defaults to {lm_configs.HSG_RHN_INIT_BIAS} as in the paper."),
    ("float", "hsg_init_bias", "Initial HSG gate bias b_G."),
    ("boolean", "coupled", "Coupled carry gate C = 1 - T (RHN)."),
    ("boolean", "tied", "Tie the embedding and softmax weights."),
    ("float", "init_scale", "Uniform initialisation half-width."),
    ("float", "init_bias", "Initial RHN transform-gate bias (with --hsg: "
     f"{lm_configs.HSG_RHN_INIT_BIAS} unless given)."),
    ("float", "lr", "Initial SGD learning rate (loss summed over time / batch)."),
    ("float", "lr_decay", "Learning-rate divisor per epoch after max_epoch."),
    ("integer", "max_epoch", "Epochs at constant learning rate."),
    ("integer", "max_max_epoch", "Total epochs of the schedule (alias --epochs)."),
    ("float", "weight_decay", "L2 coefficient (on 0.5 ||theta||^2)."),
    ("float", "max_grad_norm", "Global-norm gradient clipping."),
    ("integer", "num_steps", "Truncated-BPTT window length."),
    ("integer", "batch_size", "Batch size (rows of the token stream)."),
    ("float", "drop_x", "Word-dropout probability on the embedding."),
    ("float", "drop_i", "Dropout probability on the cell input."),
    ("float", "drop_h", "Dropout probability on the recurrent state."),
    ("float", "drop_o", "Dropout probability on the cell output."),
    ("integer", "unroll", "Time steps per lax.scan iteration."),
    (["auto", "fused", "reference"], "scan_impl", "Time-scan implementation: 'fused' "
     "(hand-written backward pass, coupled RHN/HSG), 'reference' (plain autodiff, any cell), "
     "or 'auto' (fused where supported)."),
    ("boolean", "remat", "Recompute time steps in the backward pass (less memory)."),
    (["float32", "bfloat16"], "dtype", "Matmul input dtype, float32 accumulation: float32 "
     "(computed at --matmul_precision, whose default on GPUs and TPUs rounds the inputs to "
     "TF32 / bfloat16) or bfloat16 (needs the fused scan)."),
    ("integer", "eval_batch_size", "Final evaluation batch size (default: 1, the reference "
     "protocol, for a full run; the training batch for a run cut short)."),
    ("integer", "eval_num_steps", "Window length of evaluation scans."),
)  # fmt: skip


def define_lm_flags(defaults: LMConfig, presets: dict[str, dict[str, Any]]) -> None:
    """Defines every language-model flag, its default from ``defaults`` (a config of
    :mod:`rhnzoo.configs.lm`), and ``--preset`` from ``presets`` (call once, at import)."""
    define_presets(presets)
    define_run_flags()
    flags.DEFINE_enum("cell", defaults.cell, list(cells.registry.NAMES), "Recurrent cell "
                      "(rhnzoo.cells registry); RHN uses the fused scan, the others the "
                      "reference scan.")  # fmt: skip
    _LM_FLAGS.extend(define_config_flags(defaults, _LM_FLAG_SPECS))
    flags.DEFINE_alias("epochs", "max_max_epoch")
    define_distributed_flags()
    _LM_FLAGS.extend(DISTRIBUTED_FLAGS)


DISTRIBUTED_FLAGS = ("distributed", "coordinator_address", "num_processes", "process_id")


def define_distributed_flags() -> None:
    """``--distributed`` and its settings (call once, at import); the script then calls
    :func:`initialize_distributed` before JAX touches a device when it is given."""
    flags.DEFINE_boolean("distributed", False, "Call jax.distributed.initialize() first "
                         "(several processes/hosts: settings from --coordinator_address, "
                         "--num_processes, --process_id when given, else from the "
                         "TPU/SLURM/MPI/Kubernetes runtime). Only process 0 prints and "
                         "writes files.")  # fmt: skip
    flags.DEFINE_string("coordinator_address", None, "With --distributed: host:port of "
                        "process 0.")  # fmt: skip
    flags.DEFINE_integer("num_processes", None, "With --distributed: number of processes.")
    flags.DEFINE_integer("process_id", None, "With --distributed: this process's index.")


def initialize_distributed() -> None:
    """``jax.distributed.initialize`` with the --coordinator_address / --num_processes /
    --process_id flags that are given (the rest from the cluster runtime). On CPU the
    cross-process collectives use gloo."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    given = {k: FLAGS[k].value for k in ("coordinator_address", "num_processes", "process_id")
             if FLAGS[k].value is not None}  # fmt: skip
    try:
        jax.distributed.initialize(**given)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"--distributed: jax.distributed.initialize failed: {e}") from None


def lm_config(dataset: str, **overrides: Any) -> LMConfig:
    """The language-model flags as one :class:`~rhnzoo.training.lm.LMConfig` (checked;
    ``to_dict()`` is ``config.json``), ``overrides`` (e.g. ``depth``, ``hsg``, ``workdir``
    of a sweep's run) applied. With HSG the RHN's T bias defaults to -2.5 (Shoham &
    Permuter). Raises ValueError (one line) for a bad setting, or a cell flag given to a
    cell without it."""
    apply_preset()
    values = flag_values(["cell", *_LM_FLAGS, *RUN_FLAGS, *DATA_FLAGS])
    if not FLAGS["init_bias"].present:
        del values["init_bias"]  # the preset's, else the default (with --hsg the paper's)
    given = [f"--{k}" for k in lm_training.CELL_KEYS
             if FLAGS[k].present and k not in cells.options(FLAGS.cell)]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given)} does not apply to --cell={FLAGS.cell} (its "
                         f"options: {', '.join(cells.options(FLAGS.cell))})")  # fmt: skip
    return lm_configs.get_config(FLAGS.preset, dataset, **{**values, **overrides})


def run_lm(dataset: str, load_corpus: Callable[..., Any] | None = None) -> None:
    """The language-model experiments' main: the flags as one config (:func:`lm_config`,
    checked before any data is read) -> data ->
    :func:`rhnzoo.training.lm.train_and_evaluate`.

    Args:
      dataset: a registered language-model data set (``'ptb'``, ``'enwik8'``...); it
        gives the metric (perplexity or bits per character) and the default workdir.
      load_corpus: ``load_corpus(data_dir, download=..., verify=...) -> Corpus``
        (default: the data set's registered loader).
    """
    config = lm_config(dataset)
    if FLAGS.distributed:
        initialize_distributed()
    load = load_corpus or data.DATASETS[dataset].load
    corpus = load(FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)
    lm_training.train_and_evaluate(config, corpus)
