r"""Analyse a trained run: gates, lesions, HSG gates, MC dropout, information flow.

The data set and the model come from the run's config.json (rhnzoo.analysis.report):
language models (PTB, PTB-char, text8, enwik8; any cell) get the gate analyses below
(RHN cells) and MC dropout; highway nets (MNIST, CIFAR-100) their gate heatmaps and
lesions; sequence classifiers (IMDB, P-MNIST, ...) the flow figures of their cell.

  python experiments/analyze.py --workdir=runs/small_hsg
  python experiments/analyze.py --workdir=runs/ptb_sota_d10_n830 --mc_samples=10 --split=test

Writes into the workdir (or ``--out``):

* ``gate_heatmap.png``: mean transform-gate activity per micro-layer over the
  first ``--heatmap_steps`` tokens of ``--split`` (Zilly et al. 2017, Fig. 5b);
* ``lesion.png``: loss change when each micro-layer's T gate is forced shut,
  measured on the first ``--lesion_tokens`` training tokens (Zilly et al. sec. 6);
* ``hsg_gates.png`` (HSG runs only): histogram of HSG gate values at
  ``--hist_times`` random time steps of ``--split`` (Shoham & Permuter, Fig. 7);
* ``analysis.json``: every number printed.

Every evaluation runs at the run's recorded ``--matmul_precision`` (``default`` for a
run recorded before the flag; ``--flow`` without a run: JAX's setting).

With ``--mc_samples=K`` the ``--split`` stream is also evaluated with dropout
ON (the run's rates), K mask draws, probabilities averaged (the reference
code's MC evaluation), next to the deterministic batch-1 perplexity, with the
time each takes.

``--flow`` draws the information-flow figures instead (:mod:`rhnzoo.analysis.flow`):

* ``gradient_flow.png``: ``‖∂L_T/∂s_{T-k}‖`` against k for every cell family at
  initialisation on the same random input (RHN depth 1/5/10, HSG-RHN, DT-RNN, LSTM,
  GRU, RRN, SC-LSTM, HRL; ``--flow_hidden`` units), plus, with ``--workdir``, the run's
  cell at initialisation and trained, on the first ``--flow_tokens`` tokens of ``--split``;
* ``gersgorin.png`` (with ``--workdir``): Gersgorin discs and eigenvalues of the run's
  temporal Jacobian after reading ``--flow_tokens`` tokens, at initialisation and
  trained (Zilly et al. 2017, Fig. 2), with spectral radii along the sequence in
  ``flow.json``.

  python experiments/analyze.py --flow --out=runs/flow                    # cells at init
  python experiments/analyze.py --flow --workdir=runs/ptb_small_d3_n256   # + a trained run
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

from absl import flags

from rhnzoo import cli

flags.DEFINE_string("workdir", None, "Training workdir (config.json + best/ checkpoint).")
flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
flags.DEFINE_enum("split", "valid", ["train", "valid", "test"], "Split for gates and MC.")
flags.DEFINE_integer("mc_samples", 0, "MC-dropout passes K (0: skip MC evaluation).")
flags.DEFINE_integer("mc_batch_size", 1, "Rows of the MC evaluation (1: reference).")
flags.DEFINE_integer("max_eval_tokens", None, "Evaluate only the first N tokens of --split.")
flags.DEFINE_integer("eval_num_steps", 200, "Window length of evaluation scans.")
flags.DEFINE_integer("lesion_tokens", 20000, "Training tokens for the lesion study.")
flags.DEFINE_integer("lesion_batch_size", 20, "Rows of the lesion evaluation.")
flags.DEFINE_integer("heatmap_steps", 40, "Time steps shown in the gate heatmap.")
flags.DEFINE_integer("hist_tokens", 2000, "Tokens of --split run for the HSG histogram.")
flags.DEFINE_integer("hist_times", 200, "Random time steps in the HSG histogram.")
flags.DEFINE_integer("heatmap_examples", 1000, "Highway runs: images in the gate heatmap.")
flags.DEFINE_integer("lesion_examples", 10000, "Highway runs: images in the lesion study.")
flags.DEFINE_integer("seed", 0, "Seed of the MC masks and the histogram's time steps.")
flags.DEFINE_string("data_dir", None, "Data directory (default: the run's data_dir setting).")
flags.DEFINE_boolean("verify", True, "Check the data files' sha256 (off for your own corpora).")
flags.DEFINE_boolean("flow", False, "Draw the information-flow figures (gradient_flow.png, and "
                     "gersgorin.png for a --workdir) instead of the gate analysis.")
flags.DEFINE_integer("flow_hidden", 64, "Units of the cells compared at initialisation.")
flags.DEFINE_integer("flow_steps", 100, "Time steps T of the gradient-flow sequences.")
flags.DEFINE_integer("flow_tokens", 50, "Tokens read before the Gersgorin Jacobian is taken.")
FLAGS = flags.FLAGS


def run() -> None:
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


def main(argv) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    cli.main(run)


if __name__ == "__main__":
    cli.run_app(main)
