r"""Feed-forward Highway Networks vs plain nets at depths 10-100 (Srivastava et al. 2015).

  python experiments/highway.py --preset=cpu --sweep       # 2-core CPU: the whole sweep
  python experiments/highway.py --sweep                    # the papers' 400 epochs
  python experiments/highway.py --depth=50 --transform_bias=-2   # one net, + its figures
  python experiments/highway.py --kind=plain --depth=20 --activation=relu --init=he_normal

Nets: the flattened image, a plain layer to the width (50 for highway, 71 for
plain: about 5,000 parameters per layer either way), ``depth - 1`` highway or
plain layers, a softmax output; SGD with momentum 0.9, learning rate decayed by
0.96 every 100,000 steps, batches of 128 (the ECBM4040 reproduction). Highway
nets use --lr (0.1); plain nets use --plain_lrs at their depth unless --lr is
given (the reproduction: 1e-3 at depths 10 and 20, 1e-5 at 50 and 100). The last
--valid_size training images are held out; validation picks the epoch whose
parameters are tested.

A single run writes ``<workdir>/{config.json, metrics.jsonl, results.json}`` and,
for a highway net, ``gate_heatmaps.png`` and ``lesion.png``. ``--sweep`` trains
every depth in --depths x (plain, highway), each in ``<workdir>/<kind>_d<depth>``
(finished runs are skipped, interrupted ones resume), then writes into the
sweep's workdir ``results.md`` (table), ``training_curves.png``,
``gate_heatmaps_d<depth>.png``, ``lesion_d<depth>.png``,
``plain_diagnostics.png`` and ``analysis.json``.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
import time

from absl import flags

from rhnzoo import cli, data

DATASETS = data.names("images")  # mnist, cifar100 (rhnzoo.data registry: sizes, loader)
DEFAULT_WIDTH = {"highway": 50, "plain": 71}
PRESETS = {
    # The whole MNIST sweep (4 depths x 2 kinds, 8 x 120 epochs) on 2 CPU cores in about
    # 35 minutes (36.1 measured, shared cores); measured results in BUILD_NOTES.md.
    # T bias -4 as for the papers' depth curves; the plain rates are the reproduction's.
    "cpu": dict(epochs=120, transform_bias=-4.0,
                plain_lrs=["10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5"]),
}

cli.define_presets(PRESETS)
cli.define_run_flags()
flags.DEFINE_enum("kind", "highway", ["highway", "plain"], "Net.")
flags.DEFINE_integer("depth", 10, "Hidden layers in all (>= 2): the first plain layer and "
                     "depth - 1 highway or plain layers.")
flags.DEFINE_integer("width", None, "Units per layer (default 50 for highway, 71 for plain).")
flags.DEFINE_enum("dataset", "mnist", list(DATASETS), "Data set.")
flags.DEFINE_enum("data_source", "files", ["files", "tfds"], "The original idx / python "
                  "pickle files, or TensorFlow Datasets (pip install 'rhnzoo[tfds]').")
flags.DEFINE_enum("activation", "tanh", ["tanh", "relu", "sigmoid"], "H and plain-layer "
                  "nonlinearity.")
flags.DEFINE_enum("init", "glorot_uniform", ["glorot_uniform", "he_normal"], "Weight "
                  "initialisation.")
flags.DEFINE_float("transform_bias", -4.0, "Initial transform-gate bias b_T (papers: -1 to "
                   "-10; -2 for the MNIST heatmaps, -4 for the depth curves).")
flags.DEFINE_float("lr", None, "Initial learning rate (default: 0.1 for highway nets, "
                   "--plain_lrs at the depth for plain nets).")
flags.DEFINE_list("plain_lrs", ["10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5"],
                  "depth:rate pairs, the plain nets' learning rates when --lr is not given.")
flags.DEFINE_float("momentum", 0.9, "SGD momentum.")
flags.DEFINE_float("lr_decay_rate", 0.96, "Learning-rate factor every --lr_decay_steps.")
flags.DEFINE_integer("lr_decay_steps", 100_000, "Steps between learning-rate decays.")
flags.DEFINE_integer("batch_size", 128, "Images per SGD step.")
flags.DEFINE_integer("eval_batch_size", 1000, "Images per evaluation call.")
flags.DEFINE_integer("epochs", 400, "Training epochs (the papers: 400).")
flags.DEFINE_integer("valid_size", 10000, "Last training images held out for validation.")
flags.DEFINE_boolean("sweep", False, "Train every --depths x (plain, highway), then write the "
                     "table and figures.")
flags.DEFINE_list("depths", ["10", "20", "50", "100"], "Depths of --sweep.")
flags.DEFINE_boolean("analyze", True, "After training a highway net, write its gate heatmaps "
                     "and lesioning figure.")
flags.DEFINE_integer("heatmap_examples", 10000, "Training images averaged in the mean-T heatmap.")
flags.DEFINE_integer("lesion_examples", 10000, "Training images of the lesioning study.")
flags.DEFINE_integer("diagnostics_depth", 50, "Depth of the plain nets of the sweep's "
                     "activation / gradient diagnostics (0: skip).")
flags.adopt_module_key_flags(cli)
FLAGS = flags.FLAGS

TRAIN_FLAGS = ("dataset", "data_source", "momentum", "lr_decay_rate", "lr_decay_steps",
               "batch_size", "eval_batch_size", "epochs", "valid_size")  # fmt: skip


def _plain_lrs() -> dict[int, float]:
    try:
        pairs = [item.split(":") for item in FLAGS.plain_lrs]
        return {int(d): float(lr) for d, lr in pairs}
    except ValueError:
        raise ValueError(f"--plain_lrs must be depth:rate pairs, got {FLAGS.plain_lrs}") from None


def _lr(kind: str, depth: int) -> float:
    if FLAGS.lr is not None:
        return FLAGS.lr
    if kind == "highway":
        return 0.1
    rates = _plain_lrs()
    if depth not in rates:
        raise ValueError(f"no plain learning rate for depth {depth} in --plain_lrs "
                         f"({','.join(FLAGS.plain_lrs)}); pass --lr or add {depth}:rate")
    return rates[depth]


def _load(dataset: str):
    from rhnzoo.data import images

    if FLAGS.data_source == "tfds":
        return images.load_tfds_images(dataset, FLAGS.data_dir)
    return data.load(dataset, FLAGS.data_dir, download=FLAGS.download, verify=FLAGS.verify_data)


def experiment() -> None:
    from rhnzoo.models.highway import FeedForwardNet
    from rhnzoo.training import classify
    from rhnzoo.training import highway as hw

    cli.apply_preset()
    dataset, kind = FLAGS.dataset, FLAGS.kind
    if FLAGS.sweep:
        try:
            plan = [(k, int(d)) for d in FLAGS.depths for k in ("plain", "highway")]
        except ValueError:
            raise ValueError(f"--depths must be integers, got {','.join(FLAGS.depths)}") from None
    else:
        plan = [(kind, FLAGS.depth)]
    input_size, num_classes = data.DATASETS[dataset].input_size, data.DATASETS[dataset].num_classes
    run_cfg = cli.run_config(FLAGS.epochs)
    runs = []
    for k, depth in plan:  # every setting is checked before the data are read
        width = FLAGS.width if FLAGS.width is not None else DEFAULT_WIDTH[k]
        net = FeedForwardNet(k, depth, width, input_size, num_classes, FLAGS.activation,
                             FLAGS.init, FLAGS.transform_bias)  # fmt: skip
        cfg = hw.TrainConfig(_lr(k, depth), FLAGS.momentum, FLAGS.lr_decay_rate,
                             FLAGS.lr_decay_steps, FLAGS.batch_size,
                             FLAGS.eval_batch_size)  # fmt: skip
        runs.append((net, cfg))
    for name in ("heatmap_examples", "lesion_examples"):
        if FLAGS[name].value < 1:
            raise ValueError(f"--{name} must be >= 1, got {FLAGS[name].value}")
    if FLAGS.diagnostics_depth == 1 or FLAGS.diagnostics_depth < 0:
        raise ValueError(f"--diagnostics_depth must be 0 or >= 2, got {FLAGS.diagnostics_depth}")

    images = _load(dataset)
    splits = hw.split_data(images.train_images, images.train_labels, images.test_images,
                           images.test_labels, FLAGS.valid_size)  # fmt: skip
    classify.steps_per_epoch(len(splits["train"][0]), FLAGS.batch_size)  # batch fits
    if FLAGS.sweep:
        root = pathlib.Path(FLAGS.workdir or f"runs/highway_{dataset}_{FLAGS.preset or 'full'}")
        _sweep(root, runs, splits, run_cfg)
        return
    net, cfg = runs[0]
    workdir = FLAGS.workdir or f"runs/highway_{dataset}_{net.kind}_d{net.depth}"
    print(f"{net.kind} net, depth {net.depth}, width {net.width}: {net.num_params():,} parameters")
    result = hw.train(net, splits, cfg, run_cfg, workdir, _config(net, cfg))
    if net.kind == "highway" and FLAGS.analyze and not result.diverged:
        _figures(pathlib.Path(workdir), splits["train"])


def _config(net, cfg) -> dict:
    from rhnzoo.analysis.highway import NET_KEYS

    return {**{k: getattr(net, k) for k in NET_KEYS}, "lr": cfg.lr,
            **{name: FLAGS[name].value for name in TRAIN_FLAGS + cli.RUN_FLAGS + cli.DATA_FLAGS},
            "preset": FLAGS.preset}  # fmt: skip


def _track(iterable, total=None, desc=""):
    """The engine's progress bar and signal check for the analyses."""
    from rhnzoo.training import engine

    return engine.track(iterable, total=total, desc=desc, progress=FLAGS.progress)


def _figures(workdir: pathlib.Path, train_split) -> None:
    from rhnzoo.analysis import report

    opts = report.Options(heatmap_examples=FLAGS.heatmap_examples,
                          lesion_examples=FLAGS.lesion_examples, track=_track)  # fmt: skip
    report.analyze_highway(workdir, workdir, opts, train_split)


def _sweep(root: pathlib.Path, runs, splits, run_cfg) -> None:
    import jax

    from rhnzoo.analysis import highway as analysis
    from rhnzoo.training import highway as hw

    start = time.time()
    plan = [hw.SweepRun(net, cfg, root / f"{net.kind}_d{net.depth}", _config(net, cfg))
            for net, cfg in runs]  # fmt: skip
    done = hw.sweep(plan, splits, run_cfg)
    train_s = sum((r["history"][-1]["elapsed_s"] if r["history"] else 0.0) for r in done)
    header = (
        f"# Highway vs plain nets on {FLAGS.dataset.upper()} (Srivastava et al. 2015)\n\n"
        f"Settings: {FLAGS.epochs} epochs (--max_epochs {FLAGS.max_epochs}, --max_steps "
        f"{FLAGS.max_steps}), batch {FLAGS.batch_size}, SGD momentum {FLAGS.momentum}, lr decay "
        f"{FLAGS.lr_decay_rate} every {FLAGS.lr_decay_steps:,} steps, {FLAGS.activation}, "
        f"{FLAGS.init}, T bias {FLAGS.transform_bias}, validation = last {FLAGS.valid_size:,} "
        f"training images, seed {FLAGS.seed}, preset {FLAGS.preset}.\n"
        f"Train CE: mean training cross-entropy over the last epoch (nats); test acc: "
        f"best-validation parameters.\n"
        f"Machine: {platform.machine()} {os.cpu_count()} cores, jax {jax.__version__} "
        f"{jax.devices()[0].device_kind}; training time (engine, all runs) {train_s / 60:.1f} min."
    )
    for path in analysis.sweep_report(
        root, done, splits["train"], header=header, dataset=FLAGS.dataset.upper(),
        heatmap_examples=FLAGS.heatmap_examples,
        lesion_examples=FLAGS.lesion_examples, diagnostics_depth=FLAGS.diagnostics_depth,
        num_classes=data.DATASETS[FLAGS.dataset].num_classes, seed=FLAGS.seed,
        track=_track,
    ):  # fmt: skip
        print(f"wrote {path}")
    print(f"sweep done in {(time.time() - start) / 60:.1f} min (this invocation)")


def main(argv) -> None:
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {' '.join(argv[1:])}")
    cli.main(experiment)


if __name__ == "__main__":
    cli.run_app(main)
