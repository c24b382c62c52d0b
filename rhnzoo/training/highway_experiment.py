"""``experiments/highway.py``'s body: one highway or plain net, or the depth sweep on the
multi-run runner, with its table and figures (Srivastava et al. 2015; the ECBM4040
reproduction). ``F`` holds the script's flags (attribute access: ``F.depth``...).
"""

from __future__ import annotations

import os
import pathlib
import platform
import time

from rhnzoo import data
from rhnzoo.cli import DATA_FLAGS, RUN_FLAGS

DEFAULT_WIDTH = {"highway": 50, "plain": 71}
TRAIN_FLAGS = ("dataset", "data_source", "momentum", "lr_decay_rate", "lr_decay_steps",
               "batch_size", "eval_batch_size", "epochs", "valid_size")  # fmt: skip
CONFIG_KEYS = TRAIN_FLAGS + RUN_FLAGS + DATA_FLAGS  # config.json besides the net


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


def experiment(F, run_cfg, jobs=None, seeds: int = 1) -> None:
    """``jobs`` (:class:`rhnzoo.training.sweep.Jobs`) and ``seeds``: the sweep's
    (``--jobs``, ``--seeds``); a single net takes neither."""
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
    from rhnzoo.analysis.highway import NET_KEYS

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
    from rhnzoo.training import sweep

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
