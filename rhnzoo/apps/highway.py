"""``experiments/highway.py``'s flags and body: one highway or plain net, or the depth
sweep on the multi-run runner, with its table and figures (Srivastava et al. 2015; the
ECBM4040 reproduction). :func:`train_and_evaluate` reads the flags through ``F``
(attribute access: ``F.depth``...).
"""

from __future__ import annotations

import os
import pathlib
import platform
import time
import types

from absl import flags

from rhnzoo import data, precision
from rhnzoo.apps import cli
from rhnzoo.apps.cli import DATA_FLAGS, RUN_FLAGS
from rhnzoo.training import sweep

FLAGS = flags.FLAGS
DATASETS = data.names("images")  # mnist, cifar100 (rhnzoo.data registry: sizes, loader)
PRESETS = {
    # The whole MNIST sweep (4 depths x 2 kinds, 8 x 120 epochs) on 2 CPU cores in about
    # 35 minutes (36.1 measured, shared cores); measured results in BUILD_NOTES.md.
    # T bias -4 as for the papers' depth curves; the plain rates are the reproduction's.
    "cpu": dict(epochs=120, transform_bias=-4.0,
                plain_lrs=["10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5"]),
}  # fmt: skip
DEFAULT_WIDTH = {"highway": 50, "plain": 71}
TRAIN_FLAGS = ("dataset", "data_source", "momentum", "lr_decay_rate", "lr_decay_steps",
               "batch_size", "eval_batch_size", "epochs", "valid_size")  # fmt: skip
CONFIG_KEYS = TRAIN_FLAGS + RUN_FLAGS + DATA_FLAGS  # config.json besides the net


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script)."""
    cli.define_presets(PRESETS)
    cli.define_run_flags()
    flags.DEFINE_enum("kind", "highway", ["highway", "plain"], "Net.")
    flags.DEFINE_integer("depth", 10, "Hidden layers in all (>= 2): the first plain layer and "
                         "depth - 1 highway or plain layers.")
    flags.DEFINE_integer("width", None, "Units per layer (default 50 for highway, 71 for "
                         "plain).")
    flags.DEFINE_enum("dataset", "mnist", list(DATASETS), "Data set.")
    flags.DEFINE_enum("data_source", "files", ["files", "tfds"], "The original idx / python "
                      "pickle files, or TensorFlow Datasets (pip install 'rhnzoo[tfds]').")
    flags.DEFINE_enum("activation", "tanh", ["tanh", "relu", "sigmoid"], "H and plain-layer "
                      "nonlinearity.")
    flags.DEFINE_enum("init", "glorot_uniform", ["glorot_uniform", "he_normal"], "Weight "
                      "initialisation.")
    flags.DEFINE_float("transform_bias", -4.0, "Initial transform-gate bias b_T (papers: -1 "
                       "to -10; -2 for the MNIST heatmaps, -4 for the depth curves).")
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
    flags.DEFINE_boolean("sweep", False, "Train every --depths x (plain, highway), then write "
                         "the table and figures.")
    flags.DEFINE_list("depths", ["10", "20", "50", "100"], "Depths of --sweep.")
    flags.DEFINE_boolean("analyze", True, "After training a highway net, write its gate "
                         "heatmaps and lesioning figure.")
    flags.DEFINE_integer("heatmap_examples", 10000, "Training images averaged in the mean-T "
                         "heatmap.")
    flags.DEFINE_integer("lesion_examples", 10000, "Training images of the lesioning study.")
    flags.DEFINE_integer("diagnostics_depth", 50, "Depth of the plain nets of the sweep's "
                         "activation / gradient diagnostics (0: skip).")
    sweep.define_flags()


def experiment() -> None:
    """The script's body: :func:`train_and_evaluate` with every flag, at
    ``--matmul_precision`` (the figures' evaluations too)."""
    cli.apply_preset()
    jobs, seeds = sweep.from_flags()
    F = types.SimpleNamespace(**{name: FLAGS[name].value for name in FLAGS})  # every flag
    with precision.context(FLAGS.matmul_precision):
        train_and_evaluate(F, cli.run_config(FLAGS.epochs), jobs, seeds)


def _plain_lrs(F) -> dict[int, float]:
    try:
        pairs = [item.split(":") for item in F.plain_lrs]
        return {int(d): float(lr) for d, lr in pairs}
    except ValueError:
        raise ValueError(f"--plain_lrs must be depth:rate pairs, got {F.plain_lrs}") from None


def _lr(F, kind: str, depth: int) -> float:
    if F.lr is not None:
        return F.lr
    if kind == "highway":
        return 0.1
    rates = _plain_lrs(F)
    if depth not in rates:
        raise ValueError(f"no plain learning rate for depth {depth} in --plain_lrs "
                         f"({','.join(F.plain_lrs)}); pass --lr or add {depth}:rate")
    return rates[depth]


def _load(F, dataset: str):
    from rhnzoo.data import images

    if F.data_source == "tfds":
        return images.load_tfds_images(dataset, F.data_dir)
    return data.load(dataset, F.data_dir, download=F.download, verify=F.verify_data)


def train_and_evaluate(F, run_cfg, jobs=None, seeds: int = 1) -> None:
    """Trains one net (``F.kind``, ``F.depth``; a highway net's figures after it) or, with
    ``F.sweep``, every ``F.depths`` x (plain, highway) and the sweep's table and figures.
    ``jobs`` (:class:`rhnzoo.training.sweep.Jobs`) and ``seeds``: the sweep's (``--jobs``,
    ``--seeds``); a single net takes neither. Raises ValueError for a bad setting, before
    the data are read."""
    from rhnzoo.models.highway import FeedForwardNet
    from rhnzoo.training import classify
    from rhnzoo.training import highway as hw

    dataset, kind = F.dataset, F.kind
    if not F.sweep and (seeds > 1 or (jobs is not None and jobs.n > 1)):
        raise ValueError("--jobs and --seeds are for --sweep")
    if F.sweep:
        try:
            plan = [(k, int(d)) for d in F.depths for k in ("plain", "highway")]
        except ValueError:
            raise ValueError(f"--depths must be integers, got {','.join(F.depths)}") from None
    else:
        plan = [(kind, F.depth)]
    input_size, num_classes = data.DATASETS[dataset].input_size, data.DATASETS[dataset].num_classes
    runs = []
    for k, depth in plan:  # every setting is checked before the data are read
        width = F.width if F.width is not None else DEFAULT_WIDTH[k]
        net = FeedForwardNet(k, depth, width, input_size, num_classes, F.activation,
                             F.init, F.transform_bias)  # fmt: skip
        cfg = hw.TrainConfig(_lr(F, k, depth), F.momentum, F.lr_decay_rate,
                             F.lr_decay_steps, F.batch_size,
                             F.eval_batch_size)  # fmt: skip
        runs.append((net, cfg))
    for name in ("heatmap_examples", "lesion_examples"):
        if getattr(F, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(F, name)}")
    if F.diagnostics_depth == 1 or F.diagnostics_depth < 0:
        raise ValueError(f"--diagnostics_depth must be 0 or >= 2, got {F.diagnostics_depth}")

    images = _load(F, dataset)
    splits = hw.split_data(images.train_images, images.train_labels, images.test_images,
                           images.test_labels, F.valid_size)  # fmt: skip
    classify.steps_per_epoch(len(splits["train"][0]), F.batch_size)  # batch fits
    if F.sweep:
        root = pathlib.Path(F.workdir or f"runs/highway_{dataset}_{F.preset or 'full'}")
        _sweep(F, root, runs, splits, run_cfg, jobs, seeds)
        return
    net, cfg = runs[0]
    workdir = F.workdir or f"runs/highway_{dataset}_{net.kind}_d{net.depth}"
    print(f"{net.kind} net, depth {net.depth}, width {net.width}: {net.num_params():,} parameters")
    result = hw.train(net, splits, cfg, run_cfg, workdir, _config(F, net, cfg))
    if net.kind == "highway" and F.analyze and not result.diverged:
        _figures(F, pathlib.Path(workdir), splits["train"])


def _config(F, net, cfg) -> dict:
    from rhnzoo.models.highway import NET_KEYS

    return {**{k: getattr(net, k) for k in NET_KEYS}, "lr": cfg.lr,
            **{name: getattr(F, name) for name in CONFIG_KEYS},
            "preset": F.preset}  # fmt: skip


def _tracker(F):
    """The engine's progress bar and signal check for the analyses."""
    from rhnzoo.training import engine

    return lambda it, total=None, desc="": engine.track(it, total=total, desc=desc,
                                                        progress=F.progress)


def _figures(F, workdir: pathlib.Path, train_split) -> None:
    from rhnzoo.analysis import report

    opts = report.Options(heatmap_examples=F.heatmap_examples,
                          lesion_examples=F.lesion_examples, track=_tracker(F))  # fmt: skip
    report.analyze_highway(workdir, workdir, opts, train_split)


def _sweep(F, root: pathlib.Path, runs, splits, run_cfg, jobs, seeds: int) -> None:
    import jax

    from rhnzoo.analysis import highway as analysis
    from rhnzoo.training import highway as hw

    start = time.time()
    plan = [hw.SweepRun(net, cfg, root / sweep.seed_name(f"{net.kind}_d{net.depth}", k),
                        {**_config(F, net, cfg), "seed": F.seed + k}, F.seed + k)
            for net, cfg in runs for k in range(seeds)]  # fmt: skip
    done = hw.sweep(plan, splits, run_cfg, jobs=jobs)
    train_s = sum((r["history"][-1]["elapsed_s"] if r["history"] else 0.0) for r in done)
    header = (
        f"# Highway vs plain nets on {F.dataset.upper()} (Srivastava et al. 2015)\n\n"
        f"Settings: {F.epochs} epochs (--max_epochs {F.max_epochs}, --max_steps "
        f"{F.max_steps}), batch {F.batch_size}, SGD momentum {F.momentum}, lr decay "
        f"{F.lr_decay_rate} every {F.lr_decay_steps:,} steps, {F.activation}, "
        f"{F.init}, T bias {F.transform_bias}, validation = last {F.valid_size:,} "
        f"training images, "
        + (f"seed {F.seed}" if seeds == 1 else f"seeds {F.seed}-{F.seed + seeds - 1} (mean ± "
           f"sd over them; figures: seed {F.seed})")
        + f", preset {F.preset}.\n"
        f"Train CE: mean training cross-entropy over the last epoch (nats); test acc: "
        f"best-validation parameters.\n"
        f"Machine: {platform.machine()} {os.cpu_count()} cores, jax {jax.__version__} "
        f"{jax.devices()[0].device_kind}; training time (engine, all runs) {train_s / 60:.1f} min."
    )
    for path in analysis.sweep_report(
        root, done, splits["train"], header=header, dataset=F.dataset.upper(),
        heatmap_examples=F.heatmap_examples,
        lesion_examples=F.lesion_examples, diagnostics_depth=F.diagnostics_depth,
        num_classes=data.DATASETS[F.dataset].num_classes, seed=F.seed,
        track=_tracker(F),
    ):  # fmt: skip
        print(f"wrote {path}")
    print(f"sweep done in {(time.time() - start) / 60:.1f} min (this invocation)")
