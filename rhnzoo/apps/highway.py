"""``experiments/highway.py``'s flags and body: one highway or plain net, or the depth
sweep on the multi-run runner, with its table and figures (Srivastava et al. 2015; the
ECBM4040 reproduction). The flags, generated from
:class:`~rhnzoo.configs.highway.HighwayConfig`'s fields, become one config
(:func:`config_from_flags`: ``--preset``'s, the flags given over it), which
:func:`train_and_evaluate` reads.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import platform
import time

from absl import flags

from rhnzoo import config as config_lib
from rhnzoo import data, precision
from rhnzoo.apps import cli, runner
from rhnzoo.configs import highway as configs
from rhnzoo.engine import signals
from rhnzoo.studies import sweep
from rhnzoo.tasks import classify
from rhnzoo import evaluation
from rhnzoo.tasks import highway as hw
from rhnzoo.configs.highway import HighwayConfig

FLAGS = flags.FLAGS
_NAMES: list[str] = []  # the flags generated from HighwayConfig's fields


def define_flags() -> None:
    """Defines the script's flags (call once, at import of the script): one per
    :class:`HighwayConfig` field, their defaults :func:`rhnzoo.configs.highway.get_config`'s
    (``--plain_lrs``: its depth:rate pairs, :func:`rhnzoo.configs.highway.format_plain_lrs`),
    ``--preset``; the runner's ``--jobs``, ``--seeds``, ``--sweep_run``."""
    field = {f.name: f for f in dataclasses.fields(HighwayConfig)}["plain_lrs"]
    defaults = configs.get_config(None)
    flags.DEFINE_list(
        "plain_lrs",
        configs.format_plain_lrs(defaults.plain_lrs),
        config_lib.meta(field)["help"],
        module_name=__name__,
    )
    _NAMES.extend(cli.define_config_flags(defaults, list(configs.PRESETS), module_name=__name__))
    runner.define_flags()


def config_from_flags(jobs: sweep.Jobs, seeds: int) -> HighwayConfig:
    """``--preset``'s config with the flags given over it, checked with the runner's
    ``jobs`` / ``seeds`` (:func:`rhnzoo.apps.runner.from_flags`;
    :func:`rhnzoo.studies.highway.check`). Raises ValueError (one line) for a bad
    setting."""
    from rhnzoo.studies import highway as highway_study

    given = {}
    if FLAGS["plain_lrs"].present:  # {depth: rate}, parsed once here
        given["plain_lrs"] = configs.parse_plain_lrs(FLAGS.plain_lrs)
    cfg = cli.config_from_flags(configs.get_config, _NAMES, **given)
    highway_study.check(cfg, seeds, jobs.n)
    return cfg


def main(argv) -> None:
    """``experiments/highway.py``'s main: :func:`experiment` with the shared error and
    signal handling (:func:`rhnzoo.apps.cli.main`)."""
    del argv
    cli.main(experiment)


def experiment() -> None:
    """The script's body: :func:`train_and_evaluate` with every flag, at
    ``--matmul_precision`` (the figures' evaluations too)."""
    jobs, seeds = runner.from_flags()
    cfg = config_from_flags(jobs, seeds)
    if jobs.n == 1:  # this process trains (with --jobs > 1 each child checks its own)
        check_fits(cfg)
    with precision.context(cfg.matmul_precision):
        train_and_evaluate(cfg, jobs, seeds)


def check_fits(cfg: HighwayConfig) -> None:
    """Refuses (:func:`rhnzoo.apps.cli.check_fits`: one line) a net of ``cfg`` (with
    ``--sweep``: each kind at its deepest) whose parameters and SGD momentum cannot fit a
    device, before the data are read."""
    import jax

    from rhnzoo.studies import highway as highway_study

    deepest: dict[str, int] = {}
    for kind, depth in highway_study.plan(cfg):
        deepest[kind] = max(depth, deepest.get(kind, depth))
    tx, _ = hw.make_optimizer(cfg, 1.0)  # the rate shapes no state
    for kind, depth in deepest.items():
        net = cfg.net(kind, depth)
        cli.check_fits(
            lambda net=net: hw.init_state(net, tx, jax.random.PRNGKey(0)),
            f"--kind={kind}, --width={net.width}, --depth={depth}",
        )


def _load(cfg: HighwayConfig):
    from rhnzoo.data import images

    if cfg.data_source == "tfds":
        return images.load_tfds_images(cfg.dataset, cfg.data_dir, download=cfg.download)
    return data.load(cfg.dataset, cfg.data_dir, download=cfg.download, verify=cfg.verify_data)


def train_and_evaluate(cfg: HighwayConfig, jobs: sweep.Jobs | None = None, seeds: int = 1) -> None:
    """Trains one net (``cfg.kind``, ``cfg.depth``; its ``learning_curves.png``
    (:func:`rhnzoo.apps.cli.write_learning_curves`), a highway net's figures after it) or,
    with ``cfg.sweep``, every ``cfg.depths`` x (plain, highway) with ``seeds`` seeds each
    and the sweep's table and figures; ``jobs``: the sweep's ``--jobs``
    (:class:`rhnzoo.studies.sweep.Jobs`). Every setting was checked
    (:func:`config_from_flags`) before the data are read."""
    images = _load(cfg)
    splits = evaluation.split_data(
        images.train_images,
        images.train_labels,
        images.test_images,
        images.test_labels,
        cfg.valid_size,
    )
    classify.steps_per_epoch(len(splits["train"][0]), cfg.batch_size)  # batch fits
    if cfg.sweep:
        _sweep(cfg, splits, jobs, seeds)
        return
    run = cfg.narrow()  # its width and learning rate resolved: the run's config.json
    net, workdir = run.net(), run.output_dir()
    print(f"{net.kind} net, depth {net.depth}, width {net.width}: {net.num_params():,} parameters")
    result = hw.train_and_evaluate(run, splits, workdir)
    cli.write_learning_curves(workdir, "valid_xent", "train_xent")
    if net.kind == "highway" and cfg.analyze and not result.diverged:
        _figures(cfg, pathlib.Path(workdir), splits["train"])


def _figures(cfg: HighwayConfig, workdir: pathlib.Path, train_split) -> None:
    from rhnzoo.analysis import report

    opts = report.AnalysisOptions(
        heatmap_examples=cfg.heatmap_examples,
        lesion_examples=cfg.lesion_examples,
        track=functools.partial(signals.track, progress=cfg.progress),
    )
    report.analyze_highway(workdir, workdir, opts, train_split)


def _header(cfg: HighwayConfig, seeds: int, train_s: float) -> str:
    """``results.md``'s heading: the sweep's settings (``seeds``: seeds per net) and
    machine."""
    import jax

    last = cfg.seed + seeds - 1
    shown = (
        f"seed {cfg.seed}"
        if seeds == 1
        else f"seeds {cfg.seed}-{last} (mean ± sd over them; figures: seed {cfg.seed})"
    )
    return (
        f"# Highway vs plain nets on {cfg.dataset.upper()} (Srivastava et al. 2015)\n\n"
        f"Settings: {cfg.epochs} epochs (--max_epochs {cfg.max_epochs}, --max_steps "
        f"{cfg.max_steps}), batch {cfg.batch_size}, SGD momentum {cfg.momentum}, lr decay "
        f"{cfg.lr_decay_rate} every {cfg.lr_decay_steps:,} steps, {cfg.activation}, "
        f"{cfg.init}, T bias {cfg.transform_bias}, validation = last {cfg.valid_size:,} "
        f"training images, {shown}, preset {cfg.preset}.\n"
        f"Train CE: mean training cross-entropy over the last epoch (nats); test acc: "
        f"best-validation parameters.\n"
        f"Machine: {platform.machine()} {os.cpu_count()} cores, jax {jax.__version__} "
        f"{jax.devices()[0].device_kind}; training time (engine, all runs) {train_s / 60:.1f} min."
    )


def _sweep(cfg: HighwayConfig, splits, jobs, seeds: int) -> None:
    from rhnzoo.studies import highway as highway_study

    start = time.time()
    done = highway_study.sweep(cfg, splits, seeds=seeds, jobs=jobs)
    train_s = sum((r["history"][-1]["elapsed_s"] if r["history"] else 0.0) for r in done)
    for path in highway_study.sweep_report(
        cfg.output_dir(),
        done,
        splits["train"],
        header=_header(cfg, seeds, train_s),
        dataset=cfg.dataset.upper(),
        heatmap_examples=cfg.heatmap_examples,
        lesion_examples=cfg.lesion_examples,
        diagnostics_depth=cfg.diagnostics_depth,
        num_classes=data.DATASETS[cfg.dataset].num_classes,
        seed=cfg.seed,
        track=functools.partial(signals.track, progress=cfg.progress),
    ):
        print(f"wrote {path}")
    print(f"sweep done in {(time.time() - start) / 60:.1f} min (this invocation)")
