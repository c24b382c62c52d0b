"""``experiments/analyze.py``'s flags and body: the analyses of a trained run
(:func:`rhnzoo.analysis.report.analyze`) or the information-flow figures
(:func:`rhnzoo.analysis.report.flow_figures`), at the run's recorded matmul precision.
"""

from __future__ import annotations

import dataclasses
import pathlib

from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script)."""
    flags.DEFINE_string("workdir", None, "Training workdir (config.json + best/ checkpoint).")
    flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
    flags.DEFINE_enum("split", "valid", ["train", "valid", "test"], "Split for gates and MC.")
    flags.DEFINE_integer("mc_samples", 0, "MC-dropout passes K (0: skip MC evaluation).")
    flags.DEFINE_integer("mc_batch_size", 1, "Rows of the MC evaluation (1: reference).")
    flags.DEFINE_integer("max_eval_tokens", None, "Evaluate only the first N tokens of "
                         "--split.")
    flags.DEFINE_integer("eval_num_steps", 200, "Window length of evaluation scans.")
    flags.DEFINE_integer("lesion_tokens", 20000, "Training tokens for the lesion study.")
    flags.DEFINE_integer("lesion_batch_size", 20, "Rows of the lesion evaluation.")
    flags.DEFINE_integer("heatmap_steps", 40, "Time steps shown in the gate heatmap.")
    flags.DEFINE_integer("hist_tokens", 2000, "Tokens of --split run for the HSG histogram.")
    flags.DEFINE_integer("hist_times", 200, "Random time steps in the HSG histogram.")
    flags.DEFINE_integer("heatmap_examples", 1000, "Highway runs: images in the gate "
                         "heatmap.")
    flags.DEFINE_integer("lesion_examples", 10000, "Highway runs: images in the lesion "
                         "study.")
    flags.DEFINE_integer("seed", 0, "Seed of the MC masks and the histogram's time steps.")
    flags.DEFINE_string("data_dir", None, "Data directory (default: the run's data_dir "
                        "setting).")
    flags.DEFINE_boolean("verify", True, "Check the data files' sha256 (off for your own "
                         "corpora).")
    flags.DEFINE_boolean("flow", False, "Draw the information-flow figures (gradient_flow.png, "
                         "and gersgorin.png for a --workdir) instead of the gate analysis.")
    flags.DEFINE_integer("flow_hidden", 64, "Units of the cells compared at initialisation.")
    flags.DEFINE_integer("flow_steps", 100, "Time steps T of the gradient-flow sequences.")
    flags.DEFINE_integer("flow_tokens", 50, "Tokens read before the Gersgorin Jacobian is "
                         "taken.")


def run() -> None:
    """The script's body: the analyses from the flags into ``--out`` (default: the workdir)."""
    from rhnzoo import precision
    from rhnzoo.analysis import report
    from rhnzoo.training import engine

    workdir = pathlib.Path(FLAGS.workdir) if FLAGS.workdir else None
    if workdir is None and not (FLAGS.flow and FLAGS.out):
        raise ValueError("--workdir is required (or --flow with --out)")
    out = pathlib.Path(FLAGS.out) if FLAGS.out else workdir
    out.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in dataclasses.fields(report.Options) if f.name != "track"]
    track = lambda it, total=None, desc="": engine.track(it, total=total, desc=desc)
    opts = report.Options(**{name: FLAGS[name].value for name in names}, track=track)
    recorded = report.read_config(workdir).get("matmul_precision", "default") if workdir else None
    with precision.context(recorded):
        if FLAGS.flow:
            report.flow_figures(workdir, out, opts)
        else:
            report.analyze(workdir, out, opts)
