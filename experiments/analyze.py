r"""Analyse a trained PTB run: gate heatmap, layer lesions, HSG gates, MC dropout.

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

import pathlib
import sys
import time

import jax
import numpy as np
from absl import flags

from rhnzoo import analysis, cells, cli, data, dropout
from rhnzoo.analysis import flow
from rhnzoo.training import engine
from rhnzoo.training import lm as lm_training

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
flags.DEFINE_integer("seed", 0, "Seed of the MC masks and the histogram's time steps.")
flags.DEFINE_string("data_dir", None, "PTB directory (default: the run's data_dir setting).")
flags.DEFINE_boolean("verify", True, "Check the PTB files' sha256 (off for your own corpora).")
flags.DEFINE_boolean("flow", False, "Draw the information-flow figures (gradient_flow.png, and "
                     "gersgorin.png for a --workdir) instead of the gate analysis.")
flags.DEFINE_integer("flow_hidden", 64, "Units of the cells compared at initialisation.")
flags.DEFINE_integer("flow_steps", 100, "Time steps T of the gradient-flow sequences.")
flags.DEFINE_integer("flow_tokens", 50, "Tokens read before the Gersgorin Jacobian is taken.")
FLAGS = flags.FLAGS

# The cell families compared at initialisation: label -> (registered cell, its settings),
# each with its own default initialisation (rhnzoo.cells.make).
FAMILIES = {
    "RHN depth 1": ("rhn", {"depth": 1}),
    "RHN depth 5": ("rhn", {"depth": 5}),
    "RHN depth 10": ("rhn", {"depth": 10}),
    "HSG-RHN depth 5": ("hsg_rhn", {"depth": 5}),
    "DT-RNN depth 5": ("dtrnn", {"depth": 5}),
    "LSTM": ("lstm", {}),
    "GRU": ("gru", {}),
    "RRN": ("rrn", {}),
    "SC-LSTM (L=20)": ("sc_lstm_i", {"skip": 20}),
    "HRL": ("hrl", {}),
}


def flow_figures(workdir: pathlib.Path | None, out: pathlib.Path) -> dict:
    """gradient_flow.png (and gersgorin.png for a run); returns the numbers."""
    n, steps, batch, m = FLAGS.flow_hidden, FLAGS.flow_steps, 4, 32
    xs = jax.random.normal(jax.random.PRNGKey(FLAGS.seed), (steps, batch, m))
    curves, results = {}, {"hidden": n, "steps": steps, "batch": batch, "input": m}
    for label, (name, settings) in FAMILIES.items():
        cell = cells.make(name, n, **settings)
        params = cell.init(jax.random.PRNGKey(FLAGS.seed + 1), m)
        curves[label] = flow.gradient_norms_through_time(cell, params, cell.initial_carry(batch), xs)
        print(f"{label:>16}: gradient norm {curves[label][10]:.2e} at 10 steps back, "
              f"{curves[label][-1]:.2e} at {steps}")
    results["gradient_norms_at_init"] = {k: v.tolist() for k, v in curves.items()}
    if workdir is not None:
        model, trained, config = analysis.load_run(workdir)
        corpus = data.load_ptb(FLAGS.data_dir or config.get("data_dir"), download=False,
                               verify=FLAGS.verify)  # fmt: skip
        init = model.init(jax.random.split(jax.random.PRNGKey(int(config.get("seed", 0))))[0])
        label = analysis.run_label(config)
        tokens = getattr(corpus, FLAGS.split)[: max(FLAGS.flow_tokens, steps) + 1]
        panels, run_numbers = [], {}
        for name, params in (("initialisation", init), ("trained", trained)):
            cell, cp = model.cell, params["cell"]
            embed = lambda toks: params["embed"][np.asarray(toks)][:, None, :]  # [T, 1, m]
            curves[f"{label}, {name} (PTB {FLAGS.split})"] = flow.gradient_norms_through_time(
                cell, cp, model.initial_carry(1), embed(tokens[:steps]))
            a = flow.jacobians_along(cell, cp, model.initial_carry(1),
                                     embed(tokens[: FLAGS.flow_tokens + 1]))[:, 0]  # fmt: skip
            last = np.asarray(a[-1])
            centres, radii = flow.gersgorin_discs(last)
            panels.append({"title": f"{label}, {name}: after {FLAGS.flow_tokens} tokens",
                           "centres": centres, "radii": radii,
                           "eigenvalues": flow.eigenvalues(last)})  # fmt: skip
            run_numbers[name] = {
                "spectral_radius": flow.spectral_radius(a).tolist(),
                "largest_singular_value": flow.largest_singular_value(a).tolist(),
                "disc_radius_mean": float(radii.mean()), "disc_centre_mean": float(centres.mean()),
            }  # fmt: skip
            rho = np.asarray(run_numbers[name]["spectral_radius"])
            print(f"{label}, {name}: spectral radius along {len(rho)} tokens: mean {rho.mean():.3f}, "
                  f"max {rho.max():.3f}; mean disc radius {radii.mean():.3f}")
        results["run"] = {"workdir": str(workdir), "label": label, **run_numbers}
        path = analysis.plot_gersgorin(panels, out / "gersgorin.png",
                                       title="Gersgorin discs of the temporal Jacobian")  # fmt: skip
        print(f"wrote {path}")
    path = analysis.plot_gradient_flow(
        curves, out / "gradient_flow.png",
        title=f"Gradient flow: cells at initialisation ({n} units)"
        + (" and a PTB run" if workdir is not None else ""),
    )  # fmt: skip
    print(f"wrote {path}")
    engine.write_json(out / "flow.json", results)
    return results


def analyze(workdir: pathlib.Path, out: pathlib.Path) -> dict:
    model, params, config = analysis.load_run(workdir)
    corpus = data.load_ptb(
        FLAGS.data_dir or config.get("data_dir"), download=False, verify=FLAGS.verify
    )
    if corpus.vocab_size != model.vocab_size:
        raise ValueError(
            f"the run has a {model.vocab_size}-word vocabulary but the data has "
            f"{corpus.vocab_size}; pass the run's --data_dir"
        )
    stream = getattr(corpus, FLAGS.split)
    if FLAGS.max_eval_tokens:
        stream = stream[: FLAGS.max_eval_tokens]
    label = analysis.run_label(config)
    results = {"workdir": str(workdir), "model": label, "split": FLAGS.split}
    out.mkdir(parents=True, exist_ok=True)
    print(f"{label}: {sum(p.size for p in jax.tree.leaves(params))} parameters")

    # Transform gates over an example sequence (Zilly et al. Fig. 5b).
    example = stream[: FLAGS.heatmap_steps]
    gates = analysis.gate_activity(model, params, example[None])
    layer_mean = gates.t.mean(axis=(0, 2, 3))
    results["t_gate_mean_per_layer"] = [float(v) for v in layer_mean]
    print("mean T gate per micro-layer:", " ".join(f"{v:.3f}" for v in layer_mean))
    path = analysis.plot_gate_heatmap(
        gates.t,
        out / "gate_heatmap.png",
        labels=[corpus.vocab[i] for i in example],
        title=f"{label}: mean T-gate activity ({FLAGS.split}, first {len(example)} tokens)",
    )
    print(f"wrote {path}")

    # Lesions (Zilly et al. sec. 6).
    lesion = analysis.lesion_layers(
        model,
        params,
        corpus.train[: FLAGS.lesion_tokens],
        batch_size=FLAGS.lesion_batch_size,
        num_steps=FLAGS.eval_num_steps,
    )
    results["lesion"] = {
        "num_tokens": lesion.num_tokens,
        "intact_nll": lesion.base_nll,
        "intact_ppl": lesion.base_ppl,
        "nll": lesion.nll.tolist(),
        "ppl": lesion.ppl.tolist(),
    }
    print(
        f"lesions on {lesion.num_tokens} training tokens: intact {lesion.base_nll:.4f} "
        f"nats/token, perplexity {lesion.base_ppl:.2f}"
    )
    for layer, (nll, ppl, d) in enumerate(zip(lesion.nll, lesion.ppl, lesion.delta_nll)):
        print(
            f"  lesion micro-layer {layer + 1}: {nll:.4f} nats/token (Δ {d:+.4f}), "
            f"perplexity {ppl:.2f} (Δ {ppl - lesion.base_ppl:+.2f})"
        )
    path = analysis.plot_lesion(
        lesion, out / "lesion.png", title=f"{label}: lesioning (intact ppl {lesion.base_ppl:.1f})"
    )
    print(f"wrote {path}")

    # HSG gate histogram (Shoham & Permuter Fig. 7).
    if gates.g is not None:
        hist_stream = stream[: FLAGS.hist_tokens]
        values = analysis.hsg_gate_sample(
            model,
            params,
            hist_stream[None],
            min(FLAGS.hist_times, len(hist_stream)),
            seed=FLAGS.seed,
        )
        results["hsg_gate"] = {
            "num_values": int(values.size),
            "mean": float(values.mean()),
            "fraction_below_0.1": float((values < 0.1).mean()),
            "fraction_above_0.9": float((values > 0.9).mean()),
        }
        print(
            f"HSG gate over {values.size} values: mean {values.mean():.3f}, "
            f"< 0.1: {(values < 0.1).mean():.1%}, > 0.9: {(values > 0.9).mean():.1%}"
        )
        path = analysis.plot_gate_histogram(
            values, out / "hsg_gates.png", title=f"{label}: HSG gate values ({FLAGS.split})"
        )
        print(f"wrote {path}")

    # Deterministic vs MC-dropout perplexity.
    if FLAGS.mc_samples:
        t0 = time.perf_counter()
        nll, count = lm_training.make_evaluate(model)(
            params, stream, FLAGS.mc_batch_size, FLAGS.eval_num_steps
        )
        det_s = time.perf_counter() - t0
        rates = dropout.Rates(*(float(config.get(f"drop_{s}", 0.0)) for s in "xiho"))
        mc = analysis.mc_dropout_perplexity(
            model,
            params,
            stream,
            rates,
            FLAGS.mc_samples,
            seed=FLAGS.seed,
            batch_size=FLAGS.mc_batch_size,
            num_steps=FLAGS.eval_num_steps,
        )
        results["deterministic"] = {"ppl": lm_training.perplexity(nll, count), "seconds": det_s}
        results["mc_dropout"] = {
            "samples": FLAGS.mc_samples,
            "rates": [rates.x, rates.i, rates.h, rates.o],
            "ppl": mc.perplexity,
            "sample_ppls": list(mc.sample_perplexities),
            "num_tokens": mc.num_tokens,
            "compile_s": mc.compile_s,
            "pass_s": list(mc.pass_s),
            "seconds": mc.seconds,
        }
        print(
            f"{FLAGS.split} perplexity, batch {FLAGS.mc_batch_size}, {mc.num_tokens} tokens: "
            f"deterministic {lm_training.perplexity(nll, count):.3f} ({det_s:.1f} s incl. compile); "
            f"MC dropout K={FLAGS.mc_samples} {mc.perplexity:.3f} "
            f"({mc.seconds:.1f} s: compile {mc.compile_s:.1f} s + "
            f"{sum(mc.pass_s) / len(mc.pass_s):.1f} s per pass)"
        )
        print("  single-pass perplexities:", " ".join(f"{p:.2f}" for p in mc.sample_perplexities))

    engine.write_json(out / "analysis.json", results)
    print(f"wrote {out / 'analysis.json'}")
    return results


def run() -> None:
    workdir = pathlib.Path(FLAGS.workdir) if FLAGS.workdir else None
    if workdir is None and not (FLAGS.flow and FLAGS.out):
        raise ValueError("--workdir is required (or --flow with --out)")
    out = pathlib.Path(FLAGS.out) if FLAGS.out else workdir
    out.mkdir(parents=True, exist_ok=True)
    if FLAGS.flow:
        flow_figures(workdir, out)
    else:
        analyze(workdir, out)


def main(argv) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    cli.main(run)


if __name__ == "__main__":
    cli.run_app(main)
