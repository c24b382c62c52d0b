"""What ``experiments/analyze.py`` draws for a trained run, by the kind of run.

The data set and the model come from the run's ``config.json``: its ``dataset`` names an
entry of :data:`rhnzoo.data.DATASETS`, whose task says what the run is.

* language models (PTB, PTB-char, text8, enwik8; any cell): T-gate heatmap (Zilly et
  al. Fig. 5b) and lesions (sec. 6) for RHN cells, the HSG gate histogram (Shoham &
  Permuter Fig. 7) for HSG(RHN), MC-dropout evaluation for any cell;
* feed-forward highway nets (MNIST, CIFAR-100): gate heatmaps and lesions
  (Srivastava et al. Figs. 2-4);
* sequence classifiers (IMDB, P-MNIST, AG News, 20NG): the information-flow figures of
  the run's cell (``flow=True``).

:func:`flow_figures` draws the gradient flow of every cell family at initialisation, and
for a recurrent run its trained cell's gradient flow and Gersgorin discs
(:mod:`rhnzoo.analysis.flow`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any

import jax
import numpy as np

from rhnzoo import cells, data, dropout
from rhnzoo.analysis import flow, plots
from rhnzoo.analysis import lm as lm_analysis
from rhnzoo.training import engine
from rhnzoo.training import lm as lm_training
from rhnzoo.training import workdir as workdir_lib


def _count(default: int | None, least: int = 1):
    """A count setting: ``default``, and the least value it takes (checked on construction;
    ``None``, where it is the default, means no limit)."""
    return dataclasses.field(default=default, metadata={"least": least})


@dataclasses.dataclass(frozen=True)
class Options:
    """The settings of the analyses (``experiments/analyze.py``'s flags).

    Raises:
      ValueError: (one line, named as the flag) for a count below its least value, e.g.
        ``lesion_tokens=-1`` or ``max_eval_tokens=0`` (``None`` means every token).
    """

    split: str = "valid"
    mc_samples: int = _count(0, least=0)
    mc_batch_size: int = _count(1)
    max_eval_tokens: int | None = _count(None)
    eval_num_steps: int = _count(200)
    lesion_tokens: int = _count(20000)
    lesion_batch_size: int = _count(20)
    heatmap_steps: int = _count(40)
    hist_tokens: int = _count(2000)
    hist_times: int = _count(200)
    seed: int = 0
    data_dir: str | None = None
    verify: bool = True
    flow_hidden: int = _count(64)
    flow_steps: int = _count(100)
    flow_tokens: int = _count(50)
    heatmap_examples: int = _count(1000)
    lesion_examples: int = _count(10000)
    track: Any = None  # the engine's progress/signal tracker for long evaluations

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value, least = getattr(self, field.name), field.metadata.get("least")
            if least is not None and value is not None and value < least:
                raise ValueError(f"--{field.name} must be >= {least}, got {value}")


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




def run_kind(config: dict) -> str:
    """``'lm'``, ``'images'`` or ``'sequences'``: the task of the run's data set (a run
    without ``dataset`` is a PTB run from before it was recorded)."""
    name = config.get("dataset", "ptb")
    if name not in data.DATASETS:
        raise ValueError(f"the run's data set {name!r} is not in the registry")
    return data.DATASETS[name].task


def _data_dir(config: dict, opts: Options):
    return opts.data_dir or config.get("data_dir")


def _is_rhn(cell) -> bool:
    return isinstance(cell.cell if isinstance(cell, cells.HSG) else cell, cells.RHN)


# ------------------------------------------------------------------ the run's cell


def run_cell(workdir: pathlib.Path, opts: Options, length: int):
    """``(label, cell, init_params, trained_params, xs_trained, xs_init)`` of a recurrent
    run: the cell at initialisation and trained, and the first ``length`` steps of the
    first ``opts.split`` sequence as their inputs ``[T, 1, m]`` (embedded by the trained
    and the initial embedding of a language model; by the trained one of a classifier)."""
    config = workdir_lib.read_config(workdir)
    kind = run_kind(config)
    seed = int(config.get("seed", 0))
    if kind == "lm":
        model, trained, config = lm_analysis.load_run(workdir)
        corpus = data.load(config.get("dataset", "ptb"), _data_dir(config, opts), download=False,
                           verify=opts.verify)  # fmt: skip
        init = model.init(jax.random.split(jax.random.PRNGKey(seed))[0])
        tokens = np.asarray(getattr(corpus, opts.split)[:length])
        embed = lambda p: p["embed"][tokens][:, None, :]
        return (lm_analysis.run_label(config), model.cell, init["cell"], trained["cell"],
                embed(trained), embed(init))  # fmt: skip
    if kind == "sequences":
        from rhnzoo.training import rrl

        name = config.get("model")
        if name is None:
            raise ValueError(f"{workdir}/config.json names no model")
        cell = rrl.RRLConfig.from_dict(config).cell()
        trained = engine.restore_params(workdir)
        if trained is None:
            raise ValueError(f"{workdir} has no checkpoint; train it first")
        trained = jax.tree.map(jax.numpy.asarray, trained)
        input_size = (trained["embed"].shape[1] if "embed" in trained
                      else data.DATASETS[config["dataset"]].input_size)  # fmt: skip
        kc = jax.random.split(jax.random.split(jax.random.PRNGKey(seed))[0], 3)[1]
        init_cell = cell.init(kc, input_size)
        dataset = data.load_dataset(config["dataset"], data_dir=_data_dir(config, opts),
                                    download=False, verify=opts.verify)  # fmt: skip
        split = {"valid": dataset.dev, "train": dataset.train, "test": dataset.test}[opts.split]
        seq = np.asarray(split.inputs[0])[:length]
        if "embed" in trained:  # the trained embedding feeds both cells
            xs = trained["embed"][seq][:, None, :]
        else:
            xs = jax.numpy.asarray(seq, jax.numpy.float32).reshape(len(seq), 1, -1)
        label = f"{cells.label(name) if name in cells.ALL_NAMES else name} ({config['dataset']})"
        return label, cell, init_cell, trained["cell"], xs, xs
    raise ValueError(f"{workdir} is a feed-forward run ({config.get('dataset')}); the flow "
                     "figures need a recurrent one")  # fmt: skip


def flow_figures(workdir: pathlib.Path | None, out: pathlib.Path, opts: Options) -> dict:
    """gradient_flow.png (and gersgorin.png for a run); returns the numbers."""
    n, steps, batch, m = opts.flow_hidden, opts.flow_steps, 4, 32
    xs = cells.base.flat_draw(jax.random.normal, jax.random.PRNGKey(opts.seed), (steps, batch, m))
    curves, results = {}, {"hidden": n, "steps": steps, "batch": batch, "input": m}
    for label, (name, settings) in FAMILIES.items():
        cell = cells.make(name, n, **settings)
        params = cell.init(jax.random.PRNGKey(opts.seed + 1), m)
        curves[label] = flow.gradient_norms_through_time(cell, params, cell.initial_carry(batch), xs)
        back = min(10, steps)
        print(f"{label:>16}: gradient norm {curves[label][back]:.2e} at {back} steps back, "
              f"{curves[label][-1]:.2e} at {steps}")  # fmt: skip
    results["gradient_norms_at_init"] = {k: v.tolist() for k, v in curves.items()}
    if workdir is not None:
        length = max(opts.flow_tokens, steps) + 1
        label, cell, init, trained, xs_trained, xs_init = run_cell(workdir, opts, length)
        panels, run_numbers = [], {}
        for name, cp, seq in (("initialisation", init, xs_init), ("trained", trained, xs_trained)):
            carry = cell.initial_carry(1)
            curves[f"{label}, {name} ({opts.split})"] = flow.gradient_norms_through_time(
                cell, cp, carry, seq[:steps])
            a = flow.jacobians_along(cell, cp, carry, seq[: opts.flow_tokens + 1])[:, 0]
            last = np.asarray(a[-1])
            centres, radii = flow.gersgorin_discs(last)
            panels.append({"title": f"{label}, {name}: after {opts.flow_tokens} steps",
                           "centres": centres, "radii": radii,
                           "eigenvalues": flow.eigenvalues(last)})  # fmt: skip
            run_numbers[name] = {
                "spectral_radius": flow.spectral_radius(a).tolist(),
                "largest_singular_value": flow.largest_singular_value(a).tolist(),
                "disc_radius_mean": float(radii.mean()), "disc_centre_mean": float(centres.mean()),
            }  # fmt: skip
            rho = np.asarray(run_numbers[name]["spectral_radius"])
            print(f"{label}, {name}: spectral radius along {len(rho)} steps: mean "
                  f"{rho.mean():.3f}, max {rho.max():.3f}; mean disc radius {radii.mean():.3f}")  # fmt: skip
        results["run"] = {"workdir": str(workdir), "label": label, **run_numbers}
        path = plots.plot_gersgorin(panels, out / "gersgorin.png",
                                    title="Gersgorin discs of the temporal Jacobian")  # fmt: skip
        print(f"wrote {path}")
    path = plots.plot_gradient_flow(
        curves, out / "gradient_flow.png",
        title=f"Gradient flow: cells at initialisation ({n} units)"
        + (" and a trained run" if workdir is not None else ""),
    )  # fmt: skip
    print(f"wrote {path}")
    engine.write_json(out / "flow.json", results)
    return results


# ------------------------------------------------------------------ the analyses


def analyze(workdir: pathlib.Path, out: pathlib.Path, opts: Options) -> dict:
    """The analysis of the run's kind (see the module docstring); writes analysis.json."""
    kind = run_kind(workdir_lib.read_config(workdir))
    out.mkdir(parents=True, exist_ok=True)
    if kind == "lm":
        results = analyze_lm(workdir, out, opts)
    elif kind == "images":
        results = analyze_highway(workdir, out, opts)
    else:
        print("a sequence classifier: its analysis is the information flow of its cell")
        results = flow_figures(workdir, out, opts)
    engine.write_json(out / "analysis.json", results)
    print(f"wrote {out / 'analysis.json'}")
    return results


def analyze_highway(workdir: pathlib.Path, out: pathlib.Path, opts: Options,
                    train_split=None) -> dict:  # fmt: skip
    """Gate heatmap and lesions of a feed-forward highway run (plain nets: lesions only),
    on the run's training images (``train_split``: ``(images, labels)`` already loaded)."""
    from rhnzoo.analysis import highway as hw_analysis
    from rhnzoo.training import highway as hw

    net, params, config = hw_analysis.load_highway_run(workdir)
    if train_split is None:
        images = data.load(config["dataset"], _data_dir(config, opts), download=False,
                           verify=opts.verify)  # fmt: skip
        train_split = hw.split_data(images.train_images, images.train_labels,
                                    images.test_images, images.test_labels,
                                    int(config.get("valid_size", 10000)))["train"]  # fmt: skip
    x, y = train_split
    results = {"workdir": str(workdir), "model": f"{net.kind} depth {net.depth}"}
    if net.kind == "highway":
        gates = hw_analysis.gate_statistics(net, params, x[: opts.heatmap_examples])
        path = plots.plot_highway_gates({f"depth {net.depth}": gates}, out / "gate_heatmaps.png")
        print(f"wrote {path}")
    n = opts.lesion_examples
    lesion = hw_analysis.highway_lesions(net, params, (x[:n], y[:n]), track=opts.track)
    path = plots.plot_lesion_curve({f"depth {net.depth}": lesion}, out / "lesion.png")
    results["lesion"] = {"intact_nll": lesion.base_nll, "nll": np.asarray(lesion.nll).tolist()}
    print(f"lesions: intact {lesion.base_nll:.4f} nats, removed layers "
          f"{lesion.nll.min():.4f} .. {lesion.nll.max():.4f}; wrote {path}")  # fmt: skip
    return results


def analyze_lm(workdir: pathlib.Path, out: pathlib.Path, opts: Options) -> dict:
    """Gates, lesions (RHN cells), HSG gates (HSG(RHN)) and MC dropout (any cell)."""
    model, params, config = lm_analysis.load_run(workdir)
    dataset = config.get("dataset", "ptb")
    corpus = data.load(dataset, _data_dir(config, opts), download=False, verify=opts.verify)
    if corpus.vocab_size != model.vocab_size:
        raise ValueError(f"the run has a {model.vocab_size}-symbol vocabulary but the data has "
                         f"{corpus.vocab_size}; pass the run's --data_dir")  # fmt: skip
    stream = getattr(corpus, opts.split)
    if opts.max_eval_tokens is not None:
        stream = stream[: opts.max_eval_tokens]
    label = lm_analysis.run_label(config)
    results = {"workdir": str(workdir), "model": label, "dataset": dataset, "split": opts.split}
    print(f"{label} on {dataset}: {sum(p.size for p in jax.tree.leaves(params))} parameters")
    if _is_rhn(model.cell):
        _rhn_gates(model, params, corpus, stream, label, out, opts, results)
    else:
        print(f"{label}: no transform gates (gate heatmap, lesions and HSG gates are for RHN cells)")
    if opts.mc_samples:
        _mc_dropout(model, params, config, stream, opts, results)
    return results


def _rhn_gates(model, params, corpus, stream, label, out, opts, results) -> None:
    # Transform gates over an example sequence (Zilly et al. Fig. 5b).
    example = stream[: opts.heatmap_steps]
    gates = lm_analysis.gate_activity(model, params, example[None])
    layer_mean = gates.t.mean(axis=(0, 2, 3))
    results["t_gate_mean_per_layer"] = [float(v) for v in layer_mean]
    print("mean T gate per micro-layer:", " ".join(f"{v:.3f}" for v in layer_mean))
    path = plots.plot_gate_heatmap(
        gates.t, out / "gate_heatmap.png", labels=[corpus.vocab[i] for i in example],
        title=f"{label}: mean T-gate activity ({opts.split}, first {len(example)} tokens)",
    )  # fmt: skip
    print(f"wrote {path}")

    # Lesions (Zilly et al. sec. 6).
    lesion = lm_analysis.lesion_layers(model, params, corpus.train[: opts.lesion_tokens],
                                       batch_size=opts.lesion_batch_size,
                                       num_steps=opts.eval_num_steps)  # fmt: skip
    results["lesion"] = {"num_tokens": lesion.num_tokens, "intact_nll": lesion.base_nll,
                         "intact_ppl": lesion.base_ppl, "nll": lesion.nll.tolist(),
                         "ppl": lesion.ppl.tolist()}  # fmt: skip
    print(f"lesions on {lesion.num_tokens} training tokens: intact {lesion.base_nll:.4f} "
          f"nats/token, perplexity {lesion.base_ppl:.2f}")  # fmt: skip
    for layer, (nll, ppl, d) in enumerate(zip(lesion.nll, lesion.ppl, lesion.delta_nll)):
        print(f"  lesion micro-layer {layer + 1}: {nll:.4f} nats/token (Δ {d:+.4f}), "
              f"perplexity {ppl:.2f} (Δ {ppl - lesion.base_ppl:+.2f})")  # fmt: skip
    path = plots.plot_lesion(lesion, out / "lesion.png",
                             title=f"{label}: lesioning (intact ppl {lesion.base_ppl:.1f})")  # fmt: skip
    print(f"wrote {path}")

    # HSG gate histogram (Shoham & Permuter Fig. 7).
    if gates.g is not None:
        hist_stream = stream[: opts.hist_tokens]
        values = lm_analysis.hsg_gate_sample(model, params, hist_stream[None],
                                             min(opts.hist_times, len(hist_stream)),
                                             seed=opts.seed)  # fmt: skip
        results["hsg_gate"] = {
            "num_values": int(values.size), "mean": float(values.mean()),
            "fraction_below_0.1": float((values < 0.1).mean()),
            "fraction_above_0.9": float((values > 0.9).mean()),
        }  # fmt: skip
        print(f"HSG gate over {values.size} values: mean {values.mean():.3f}, "
              f"< 0.1: {(values < 0.1).mean():.1%}, > 0.9: {(values > 0.9).mean():.1%}")  # fmt: skip
        path = plots.plot_gate_histogram(values, out / "hsg_gates.png",
                                         title=f"{label}: HSG gate values ({opts.split})")  # fmt: skip
        print(f"wrote {path}")


def _mc_dropout(model, params, config, stream, opts, results) -> None:
    """Deterministic vs MC-dropout perplexity (the reference code's ``evaluate_mc``)."""
    t0 = time.perf_counter()
    nll, count = lm_training.make_evaluate(model)(params, stream, opts.mc_batch_size,
                                                  opts.eval_num_steps)  # fmt: skip
    det_s = time.perf_counter() - t0
    rates = dropout.Rates(*(float(config.get(f"drop_{s}", 0.0)) for s in "xiho"))
    mc = lm_analysis.mc_dropout_perplexity(model, params, stream, rates, opts.mc_samples,
                                           seed=opts.seed, batch_size=opts.mc_batch_size,
                                           num_steps=opts.eval_num_steps)  # fmt: skip
    results["deterministic"] = {"ppl": lm_training.perplexity(nll, count), "seconds": det_s}
    results["mc_dropout"] = {
        "samples": opts.mc_samples, "rates": [rates.x, rates.i, rates.h, rates.o],
        "ppl": mc.perplexity, "sample_ppls": list(mc.sample_perplexities),
        "num_tokens": mc.num_tokens, "compile_s": mc.compile_s, "pass_s": list(mc.pass_s),
        "seconds": mc.seconds,
    }  # fmt: skip
    print(f"{opts.split} perplexity, batch {opts.mc_batch_size}, {mc.num_tokens} tokens: "
          f"deterministic {lm_training.perplexity(nll, count):.3f} ({det_s:.1f} s incl. compile); "
          f"MC dropout K={opts.mc_samples} {mc.perplexity:.3f} "
          f"({mc.seconds:.1f} s: compile {mc.compile_s:.1f} s + "
          f"{sum(mc.pass_s) / len(mc.pass_s):.1f} s per pass)")  # fmt: skip
    print("  single-pass perplexities:", " ".join(f"{p:.2f}" for p in mc.sample_perplexities))
