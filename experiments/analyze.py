r"""Analyse a trained run: gates, lesions, HSG gates, MC dropout, information flow.

The data set and the model come from the run's config.json (rhnzoo.analysis.report):
language models (PTB, PTB-char, text8, enwik8; any cell) get the gate analyses below
(RHN cells) and MC dropout; highway nets (MNIST, CIFAR-100) their gate heatmaps and
lesions; sequence classifiers (IMDB, P-MNIST, ...) the flow figures of their cell.

  python experiments/analyze.py --workdir=runs/ptb_small_d3_n256    # after ptb.py --preset=small
  python experiments/analyze.py --workdir=runs/ptb_default_d10_n830 --mc_samples=10 --split=test

Writes into the workdir (or ``--out``):

* ``gate_heatmap.png``: mean transform-gate activity per micro-layer over the
  first ``--heatmap_steps`` tokens of ``--split`` (Zilly et al. 2017, Fig. 5b);
* ``lesion.png``: loss change when each micro-layer's T gate is forced shut,
  measured on the first ``--lesion_tokens`` training tokens (Zilly et al. sec. 6);
* ``hsg_gates.png`` (HSG runs only): histogram of HSG gate values at
  ``--hist_times`` random time steps of ``--split`` (Shoham & Permuter, Fig. 7);
* ``analysis.json``: every number printed, which checkpoint was read (``checkpoint``:
  ``best`` at its step, or ``latest`` at its step for a run stopped before its first
  validation; also printed), and the phases run (``phases``: status, seconds, figures).

Every evaluation runs at the run's recorded ``--matmul_precision`` (``default`` for a
run recorded before the flag; ``--flow`` without a run: JAX's setting).

Each phase (gate_heatmap, lesion, hsg_gate, deterministic, mc_dropout; gradient_flow,
run_flow with ``--flow``) prints one line when it starts and one with its time left once
a few chunks are timed, under a progress bar with an ETA (``--noprogress``: no bars).
Ctrl-C or SIGTERM stops the analysis at the next chunk (an evaluation window, a batch, a
cell): ``analysis.json`` (``flow.json``) is rewritten with the phases done and their
figures, the stopped phase marked ``interrupted`` (a lesion study keeps its finished
lesions; other phases keep nothing), one line says so, and the script exits with status
128 + signal. Files are written atomically (temporary file, then rename), and
``analysis.json`` after every phase, so a second Ctrl-C (immediate exit) loses only the
phase under way.

A rerun into the same ``--out`` keeps the earlier analysis of the same checkpoint: a phase
it finished with the same settings (those its numbers depend on) and whose figures are
still there is skipped, one line saying ``kept from the earlier analysis``; ``--redo``
runs it again. The phases a rerun does not reach stay in ``analysis.json``, and a rerun
stopped in a phase the earlier analysis had finished keeps that earlier result. An
analysis of another checkpoint (e.g. a newer best) replaces the file, one line saying so.

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

from absl import flags

from rhnzoo.apps import analyze, cli

analyze.define_flags()
flags.adopt_module_key_flags(analyze)


def main(argv) -> None:
    del argv
    cli.main(analyze.run)


if __name__ == "__main__":
    cli.run_app(main)
