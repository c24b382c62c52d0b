"""``experiments/analyze.py``'s flags and body: the analyses of a trained run
(:func:`rhnzoo.analysis.report.analyze`) or the information-flow figures
(:func:`rhnzoo.analysis.report.flow_figures`), at the run's recorded matmul precision;
:class:`rhnzoo.analysis.report.Phases` says how they show progress, stop on a signal and
resume.
"""

from __future__ import annotations

import pathlib

from absl import flags

from rhnzoo import precision
from rhnzoo.analysis import report
from rhnzoo.apps import cli
from rhnzoo.data.common import removed_if_left_empty
from rhnzoo.engine import workdir as workdir_lib

FLAGS = flags.FLAGS
_OPTIONS: list[str] = []  # the flags of report.AnalysisOptions' fields


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script); the analyses'
    defaults are :class:`~rhnzoo.analysis.report.AnalysisOptions`'."""
    flags.DEFINE_string("workdir", None, "Training workdir (config.json + best/ checkpoint).")
    flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
    flags.DEFINE_boolean(
        "flow",
        False,
        "Draw the information-flow figures (gradient_flow.png, "
        "and gersgorin.png for a --workdir) instead of the gate analysis.",
    )
    _OPTIONS.extend(cli.define_config_flags(report.AnalysisOptions(), module_name=__name__))


def run() -> None:
    """The script's body: the analyses from the flags into ``--out`` (default: the workdir)."""
    workdir = pathlib.Path(FLAGS.workdir) if FLAGS.workdir else None
    if workdir is None and not (FLAGS.flow and FLAGS.out):
        raise ValueError("--workdir is required (or --flow with --out)")
    # A workdir without config.json is an error before anything is written.
    recorded = (
        workdir_lib.read_config(workdir).get("matmul_precision", "default") if workdir else None
    )
    opts = report.AnalysisOptions(**cli.given(_OPTIONS))  # tracker: signals.track with --progress
    out = pathlib.Path(FLAGS.out) if FLAGS.out else workdir
    cli.check_out(out)
    # A run refused for its data or checkpoint leaves no empty --out behind.
    with removed_if_left_empty(out), precision.context(recorded):
        out.mkdir(parents=True, exist_ok=True)
        if FLAGS.flow:
            report.flow_figures(workdir, out, opts)
        else:
            report.analyze(workdir, out, opts)
