"""``experiments/analyze.py``'s flags and body: the analyses of a trained run
(:func:`rhnzoo.analysis.report.analyze`) or the information-flow figures
(:func:`rhnzoo.analysis.report.flow_figures`), at the run's recorded matmul precision.
"""

from __future__ import annotations

import pathlib

from absl import flags

from rhnzoo import precision
from rhnzoo.analysis import report
from rhnzoo.apps import cli
from rhnzoo.training import engine
from rhnzoo.training import workdir as workdir_lib

FLAGS = flags.FLAGS
# The analyses' settings: (absl kind or enum choices, name, help); each defaults to the
# report.Options field of its name.
_OPTION_FLAG_SPECS = (
    (["train", "valid", "test"], "split", "Split for gates and MC."),
    ("integer", "mc_samples", "MC-dropout passes K (0: skip MC evaluation)."),
    ("integer", "mc_batch_size", "Rows of the MC evaluation (1: reference)."),
    ("integer", "max_eval_tokens", "Evaluate only the first N tokens of --split."),
    ("integer", "eval_num_steps", "Window length of evaluation scans."),
    ("integer", "lesion_tokens", "Training tokens for the lesion study."),
    ("integer", "lesion_batch_size", "Rows of the lesion evaluation."),
    ("integer", "heatmap_steps", "Time steps shown in the gate heatmap."),
    ("integer", "hist_tokens", "Tokens of --split run for the HSG histogram."),
    ("integer", "hist_times", "Random time steps in the HSG histogram."),
    ("integer", "heatmap_examples", "Highway runs: images in the gate heatmap."),
    ("integer", "lesion_examples", "Highway runs: images in the lesion study."),
    ("integer", "seed", "Seed of the MC masks and the histogram's time steps."),
    ("string", "data_dir", "Data directory (default: the run's data_dir setting)."),
    ("boolean", "verify", "Check the data files' sha256 (off for your own corpora)."),
    ("integer", "flow_hidden", "Units of the cells compared at initialisation."),
    ("integer", "flow_steps", "Time steps T of the gradient-flow sequences."),
    ("integer", "flow_tokens", "Tokens read before the Gersgorin Jacobian is taken."),
)  # fmt: skip


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script); the analyses'
    defaults are :class:`~rhnzoo.analysis.report.Options`'."""
    flags.DEFINE_string("workdir", None, "Training workdir (config.json + best/ checkpoint).")
    flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
    flags.DEFINE_boolean("flow", False, "Draw the information-flow figures (gradient_flow.png, "
                         "and gersgorin.png for a --workdir) instead of the gate analysis.")
    cli.define_config_flags(report.Options(), _OPTION_FLAG_SPECS, module_name=__name__)


def run() -> None:
    """The script's body: the analyses from the flags into ``--out`` (default: the workdir)."""
    workdir = pathlib.Path(FLAGS.workdir) if FLAGS.workdir else None
    if workdir is None and not (FLAGS.flow and FLAGS.out):
        raise ValueError("--workdir is required (or --flow with --out)")
    # A workdir without config.json is an error before anything is written.
    recorded = (workdir_lib.read_config(workdir).get("matmul_precision", "default")
                if workdir else None)  # fmt: skip
    track = lambda it, total=None, desc="": engine.track(it, total=total, desc=desc)
    opts = report.Options(**cli.flag_values([name for _, name, _ in _OPTION_FLAG_SPECS]),
                          track=track)
    out = pathlib.Path(FLAGS.out) if FLAGS.out else workdir
    out.mkdir(parents=True, exist_ok=True)
    with precision.context(recorded):
        if FLAGS.flow:
            report.flow_figures(workdir, out, opts)
        else:
            report.analyze(workdir, out, opts)
