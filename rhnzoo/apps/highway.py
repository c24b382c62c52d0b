"""``experiments/highway.py``'s flags and body: one highway or plain net, or the depth
sweep on the multi-run runner, with its table and figures (Srivastava et al. 2015; the
ECBM4040 reproduction). The flags become one
:class:`~rhnzoo.training.highway.HighwayConfig` (:func:`config_from_flags`), which
:func:`train_and_evaluate` reads.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import platform
import time

from absl import flags

from rhnzoo import data, precision
from rhnzoo.apps import cli
from rhnzoo.configs import highway as configs
from rhnzoo.models.highway import ACTIVATIONS, KINDS
from rhnzoo.training import classify, engine, sweep
from rhnzoo.training import highway as hw
from rhnzoo.training.highway import HighwayConfig

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script); their defaults
    are :func:`rhnzoo.configs.highway.get_config`'s."""
    d = configs.get_config()
    cli.define_presets(configs.PRESETS)
    cli.define_run_flags()
    flags.DEFINE_enum("kind", d.kind, list(KINDS), "Net.")
    flags.DEFINE_integer("depth", d.depth, "Hidden layers in all (>= 2): the first plain "
                         "layer and depth - 1 highway or plain layers.")  # fmt: skip
    flags.DEFINE_integer("width", d.width, "Units per layer (default 50 for highway, 71 for "
                         "plain).")  # fmt: skip
    flags.DEFINE_enum("dataset", d.dataset, list(data.names("images")), "Data set.")
    flags.DEFINE_enum("data_source", d.data_source, list(data.SOURCES), "The original idx / "
                      "python pickle files, or TensorFlow Datasets (pip install "
                      "'rhnzoo[tfds]').")  # fmt: skip
    flags.DEFINE_enum("activation", d.activation, list(ACTIVATIONS), "H and plain-layer "
                      "nonlinearity.")  # fmt: skip
    flags.DEFINE_enum("init", d.init, ["glorot_uniform", "he_normal"], "Weight initialisation.")
    flags.DEFINE_float("transform_bias", d.transform_bias, "Initial transform-gate bias b_T "
                       "(papers: -1 to -10; -2 for the MNIST heatmaps, -4 for the depth "
                       "curves).")  # fmt: skip
    flags.DEFINE_float("lr", d.lr, "Initial learning rate (default: 0.1 for highway nets, "
                       "--plain_lrs at the depth for plain nets).")  # fmt: skip
    flags.DEFINE_list("plain_lrs", list(d.plain_lrs), "depth:rate pairs, the plain nets' "
                      "learning rates when --lr is not given.")  # fmt: skip
    flags.DEFINE_float("momentum", d.momentum, "SGD momentum.")
    flags.DEFINE_float("lr_decay_rate", d.lr_decay_rate, "Learning-rate factor every "
                       "--lr_decay_steps.")  # fmt: skip
    flags.DEFINE_integer("lr_decay_steps", d.lr_decay_steps, "Steps between learning-rate "
                         "decays.")  # fmt: skip
    flags.DEFINE_integer("batch_size", d.batch_size, "Images per SGD step.")
    flags.DEFINE_integer("eval_batch_size", d.eval_batch_size, "Images per evaluation call.")
    flags.DEFINE_integer("epochs", d.epochs, "Training epochs (the papers: 400).")
    flags.DEFINE_integer("valid_size", d.valid_size, "Last training images held out for "
                         "validation.")  # fmt: skip
    flags.DEFINE_boolean("sweep", d.sweep, "Train every --depths x (plain, highway), then "
                         "write the table and figures.")  # fmt: skip
    flags.DEFINE_list("depths", list(d.depths), "Depths of --sweep.")
    flags.DEFINE_boolean("analyze", d.analyze, "After training a highway net, write its gate "
                         "heatmaps and lesioning figure.")  # fmt: skip
    flags.DEFINE_integer("heatmap_examples", d.heatmap_examples, "Training images averaged "
                         "in the mean-T heatmap.")  # fmt: skip
    flags.DEFINE_integer("lesion_examples", d.lesion_examples, "Training images of the "
                         "lesioning study.")  # fmt: skip
    flags.DEFINE_integer("diagnostics_depth", d.diagnostics_depth, "Depth of the plain nets "
                         "of the sweep's activation / gradient diagnostics (0: skip).")  # fmt: skip
    sweep.define_flags()


def config_from_flags() -> HighwayConfig:
    """The flags (a preset applied) as one :class:`HighwayConfig`. Raises ValueError (one
    line) for a bad setting."""
    values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(HighwayConfig)}
    values.update(plain_lrs=tuple(values["plain_lrs"]), depths=tuple(values["depths"]))
    return HighwayConfig.from_dict(values)


def main(argv) -> None:
    """``experiments/highway.py``'s main: :func:`experiment` with the shared error and
    signal handling (:func:`rhnzoo.apps.cli.main`)."""
    del argv
    cli.main(experiment)


def experiment() -> None:
    """The script's body: :func:`train_and_evaluate` with every flag, at
    ``--matmul_precision`` (the figures' evaluations too)."""
    cli.apply_preset()
    jobs, _ = sweep.from_flags()
    cfg = config_from_flags()
    with precision.context(cfg.matmul_precision):
        train_and_evaluate(cfg, jobs)


def _load(cfg: HighwayConfig):
    from rhnzoo.data import images

    if cfg.data_source == "tfds":
        return images.load_tfds_images(cfg.dataset, cfg.data_dir)
    return data.load(cfg.dataset, cfg.data_dir, download=cfg.download, verify=cfg.verify_data)


def train_and_evaluate(cfg: HighwayConfig, jobs: sweep.Jobs | None = None) -> None:
    """Trains one net (``cfg.kind``, ``cfg.depth``; a highway net's figures after it) or,
    with ``cfg.sweep``, every ``cfg.depths`` x (plain, highway) and the sweep's table and
    figures; ``jobs``: the sweep's ``--jobs`` (:class:`rhnzoo.training.sweep.Jobs`). Every
    setting was checked when ``cfg`` was made, before the data are read."""
    images = _load(cfg)
    splits = hw.split_data(images.train_images, images.train_labels, images.test_images,
                           images.test_labels, cfg.valid_size)  # fmt: skip
    classify.steps_per_epoch(len(splits["train"][0]), cfg.batch_size)  # batch fits
    if cfg.sweep:
        _sweep(cfg, splits, jobs)
        return
    net, workdir = cfg.net(), cfg.output_dir()
    print(f"{net.kind} net, depth {net.depth}, width {net.width}: {net.num_params():,} parameters")
    result = hw.train(net, splits, cfg, workdir, cfg.config_json())
    if net.kind == "highway" and cfg.analyze and not result.diverged:
        _figures(cfg, pathlib.Path(workdir), splits["train"])


def _tracker(cfg: HighwayConfig):
    """The engine's progress bar and signal check for the analyses."""
    return lambda it, total=None, desc="": engine.track(it, total=total, desc=desc,
                                                        progress=cfg.progress)


def _figures(cfg: HighwayConfig, workdir: pathlib.Path, train_split) -> None:
    from rhnzoo.analysis import report

    opts = report.Options(heatmap_examples=cfg.heatmap_examples,
                          lesion_examples=cfg.lesion_examples, track=_tracker(cfg))  # fmt: skip
    report.analyze_highway(workdir, workdir, opts, train_split)


def _header(cfg: HighwayConfig, train_s: float) -> str:
    """``results.md``'s heading: the sweep's settings and machine."""
    import jax

    last = cfg.seed + cfg.seeds - 1
    seeds = (f"seed {cfg.seed}" if cfg.seeds == 1 else f"seeds {cfg.seed}-{last} (mean ± sd "
             f"over them; figures: seed {cfg.seed})")  # fmt: skip
    return (
        f"# Highway vs plain nets on {cfg.dataset.upper()} (Srivastava et al. 2015)\n\n"
        f"Settings: {cfg.epochs} epochs (--max_epochs {cfg.max_epochs}, --max_steps "
        f"{cfg.max_steps}), batch {cfg.batch_size}, SGD momentum {cfg.momentum}, lr decay "
        f"{cfg.lr_decay_rate} every {cfg.lr_decay_steps:,} steps, {cfg.activation}, "
        f"{cfg.init}, T bias {cfg.transform_bias}, validation = last {cfg.valid_size:,} "
        f"training images, {seeds}, preset {cfg.preset}.\n"
        f"Train CE: mean training cross-entropy over the last epoch (nats); test acc: "
        f"best-validation parameters.\n"
        f"Machine: {platform.machine()} {os.cpu_count()} cores, jax {jax.__version__} "
        f"{jax.devices()[0].device_kind}; training time (engine, all runs) {train_s / 60:.1f} min."
    )  # fmt: skip


def _sweep(cfg: HighwayConfig, splits, jobs) -> None:
    from rhnzoo.analysis import highway as analysis

    start = time.time()
    done = hw.sweep(cfg, splits, jobs=jobs)
    train_s = sum((r["history"][-1]["elapsed_s"] if r["history"] else 0.0) for r in done)
    for path in analysis.sweep_report(
        cfg.output_dir(), done, splits["train"], header=_header(cfg, train_s),
        dataset=cfg.dataset.upper(), heatmap_examples=cfg.heatmap_examples,
        lesion_examples=cfg.lesion_examples, diagnostics_depth=cfg.diagnostics_depth,
        num_classes=data.DATASETS[cfg.dataset].num_classes, seed=cfg.seed,
        track=_tracker(cfg),
    ):  # fmt: skip
        print(f"wrote {path}")
    print(f"sweep done in {(time.time() - start) / 60:.1f} min (this invocation)")
