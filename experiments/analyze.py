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
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import jax
from absl import app, flags, logging

from rhnzoo import analysis, data, dropout
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
FLAGS = flags.FLAGS


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

    (out / "analysis.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'analysis.json'}")
    return results


def main(argv) -> None:
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}")
    if not FLAGS.workdir:
        sys.exit("error: --workdir is required")
    workdir = pathlib.Path(FLAGS.workdir)
    out = pathlib.Path(FLAGS.out) if FLAGS.out else workdir
    try:
        analyze(workdir, out)
    except (ValueError, data.DataError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
