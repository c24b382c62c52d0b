"""The depth sweep of Srivastava et al. (2015, Fig. 1, 2, 4; the ECBM4040 reproduction;
docs/highway.md): plain and highway nets at several depths, its runs (:func:`runs`,
checked by :func:`check`) trained on the multi-run runner (:func:`sweep`), its table
(:func:`sweep_table`) and report (:func:`sweep_report`, from :mod:`rhnzoo.analysis.highway`).
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rhnzoo.analysis import plots
from rhnzoo.analysis.highway import (
    gate_statistics,
    highway_lesions,
    load_highway_run,
    plain_diagnostics,
)
from rhnzoo.configs.highway import HighwayConfig
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.engine.stacking import seed_name
from rhnzoo.studies import sweep as runner
from rhnzoo.studies import tables
from rhnzoo.tasks import highway as hw
from rhnzoo.tasks.highway import Split

PathLike = str | os.PathLike
KINDS = ("plain", "highway")  # each depth's runs, in turn


def plan(cfg: HighwayConfig) -> list[tuple[str, int]]:
    """``[(kind, depth)]`` of the nets of ``cfg``: every ``depths`` x :data:`KINDS` for a
    sweep (``cfg.sweep``), else ``[(cfg.kind, cfg.depth)]``. Raises ValueError (one line)
    for a depth that is not an integer."""
    if not cfg.sweep:
        return [(cfg.kind, cfg.depth)]
    try:
        return [(kind, int(d)) for d in cfg.depths for kind in KINDS]
    except ValueError:
        raise ValueError(f"--depths must be integers, got {','.join(cfg.depths)}") from None


def runs(cfg: HighwayConfig, seeds: int = 1) -> list[tuple[str, HighwayConfig]]:
    """``[(name, config)]``: each net of the :func:`plan` and seed k < ``seeds``, in turn
    (rows of seeds), named ``<kind>_d<depth>`` (``_s<k>`` for k > 0), its config ``cfg``
    :meth:`~rhnzoo.configs.highway.HighwayConfig.narrow`-ed to it with seed ``cfg.seed +
    k`` and, for a sweep, ``workdir`` ``<cfg.output_dir()>/<name>``. Raises ValueError (one
    line) for a net out of range or without a learning rate."""
    out = []
    for kind, depth in plan(cfg):
        for k in range(seeds):
            name = seed_name(f"{kind}_d{depth}", k)
            own = {"workdir": str(pathlib.Path(cfg.output_dir()) / name)} if cfg.sweep else {}
            out.append((name, cfg.narrow(kind, depth, seed=cfg.seed + k, **own)))
    return out


def check(cfg: HighwayConfig, seeds: int = 1, jobs: int = 1) -> None:
    """Refuses what the sweep's flags cannot do together, before any data is read:
    ``seeds`` (``--seeds``) or ``jobs`` (``--jobs``) > 1 without ``cfg.sweep``, and
    (:func:`runs`) each net of the sweep out of range or without a learning rate.

    Raises:
      ValueError: one line naming the flag.
    """
    if not cfg.sweep and (seeds > 1 or jobs > 1):
        raise ValueError("--jobs and --seeds are for --sweep")
    runs(cfg, seeds)


def _train(
    cfg: HighwayConfig,
    splits: Mapping[str, Split],
    log,
    workdir: pathlib.Path,
    on_divergence: str,
    quiet: bool = False,
    seeds: int | None = None,
) -> dict[str, Any]:
    """A sweep's :attr:`rhnzoo.studies.sweep.Run.train` (the first three arguments,
    ``quiet`` and ``seeds`` bound): ``cfg`` trained in ``workdir`` (``seeds``: K stacked),
    its (first seed's) results; with ``quiet``, its lines go to its ``sweep.log``."""
    if quiet and log is not None:
        log = runner.run_log(workdir)
    out = hw.train_and_evaluate(
        cfg, splits, workdir, log=log, on_divergence=on_divergence, seeds=seeds
    )
    return out.results if seeds is None else out[0].results


def sweep(
    cfg: HighwayConfig,
    splits: Mapping[str, Split],
    *,
    seeds: int = 1,
    log: Callable[[str], None] | None = print,
    jobs: runner.Jobs | None = None,
) -> list[dict[str, Any]]:
    """Trains every run of ``cfg`` and ``seeds`` (:func:`runs`), each in its own workdir
    under ``cfg.output_dir()``, on the multi-run runner (:func:`rhnzoo.studies.sweep.run_all`,
    ``on_divergence='stop'``; ``jobs``: in child processes). Each run's lines go to its
    ``sweep.log``, the runner's to ``log`` (each run's size: its epochs x parameters).

    Returns:
      Per run: ``{'kind', 'depth', 'width', 'params', 'lr', 'seed', 'workdir',
      'results' (results.json), 'history' (epoch records), 'failed' (why its child
      failed, or None)}``.

    Raises:
      ValueError: an incompatible workdir, a bad net (:func:`check`); Interrupted:
      SIGTERM/SIGINT (the current run's state saved); RunError: a file could not be
      written.
    """
    root = pathlib.Path(cfg.output_dir())
    rows, quiet = runs(cfg, seeds), jobs is None or jobs.here
    trained = runner.seed_runs(
        rows,
        seeds,
        lambda r, k: functools.partial(_train, r, splits, log, quiet=quiet, seeds=k),
        stack=jobs is not None and jobs.stack_seeds,
        size=lambda r: r.epochs * r.net().num_params(),
    )
    runner.run_all(trained, root, log=log, jobs=jobs, on_divergence="stop", quiet=quiet)
    done = runner.collect(root, [name for name, _ in rows])
    out = []
    for name, r in rows:
        net, found = r.net(), done[name] or {}
        out.append(
            {
                "kind": net.kind,
                "depth": net.depth,
                "width": net.width,
                "params": net.num_params(),
                "lr": r.lr,
                "seed": r.seed,
                "workdir": root / name,
                **{k: found.get(k) for k in ("results", "history", "failed")},
            }
        )
    return out


def sweep_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of a depth sweep: one row per depth, plain and highway side by side.

    Each run: ``{'kind', 'depth', 'width', 'params', 'lr', 'history' (epoch records),
    'results' (results.json or None), 'failed' (optional: why its child failed)}``.
    Columns: epochs run, final training cross-entropy (mean over the last epoch, the
    curves' last point), and the test accuracy of the best-validation parameters.
    Several runs of one kind and depth (seeds): train CE and test accuracy as mean ± sd
    over them (:func:`rhnzoo.studies.tables.mean_sd`), epochs the mean. Unfinished runs
    show "—".
    """
    groups: dict[tuple[str, int], list] = {}
    for r in runs:
        groups.setdefault((r["kind"], r["depth"]), []).append(r)
    head = ["depth"]
    for kind in ("plain", "highway"):
        head += [
            f"{kind} params",
            f"{kind} lr",
            f"{kind} epochs",
            f"{kind} train CE",
            f"{kind} test acc",
        ]
    rows = []
    for depth in sorted({r["depth"] for r in runs}):
        row = [depth]
        for kind in ("plain", "highway"):
            group = groups.get((kind, depth))
            row += [None] * 5 if group is None else _sweep_cells(group)
        rows.append(row)
    return tables.markdown(head, rows, align="r" * len(head))


def _sweep_cells(group: Sequence[Mapping[str, Any]]) -> list[str]:
    """The five cells of one kind and depth (its runs: one per seed)."""
    lasts = [(r.get("history") or [{}])[-1] for r in group]
    results = [r.get("results") or {} for r in group]
    xents = [
        x for x in (last.get("train_xent") for last in lasts) if x is not None and math.isfinite(x)
    ]
    accs = [100 * res["test_acc"] for res in results if res.get("test_acc") is not None]
    diverged = sum(bool(res.get("diverged")) for res in results)
    acc = tables.mean_sd(accs, unit="%") or (
        "failed" if any(r.get("failed") for r in group) else "—"
    )
    if diverged:
        acc += " (diverged)" if len(group) == 1 else f" ({diverged} diverged)"
    epochs = [last.get("epoch", 0) for last in lasts]
    return [
        f"{group[0]['params']:,}",
        f"{group[0]['lr']:g}",
        f"{sum(epochs) / len(epochs):.0f}",
        tables.mean_sd(xents, ".4f") or "—",
        acc,
    ]


def sweep_report(
    root: PathLike,
    runs: Sequence[Mapping[str, Any]],
    train_split: tuple[np.ndarray, np.ndarray],
    *,
    header: str = "",
    dataset: str = "MNIST",
    heatmap_examples: int = 10000,
    lesion_examples: int = 10000,
    diagnostics_depth: int | None = 50,
    diagnostics_examples: int = 1000,
    num_classes: int = 10,
    seed: int = 0,
    track=None,
    log=print,
) -> list[pathlib.Path]:
    """Writes the sweep's table and figures into ``root``; returns the paths.

    * ``results.md``: ``header`` and :func:`sweep_table`;
    * ``training_curves.png``: mean training cross-entropy vs epoch, one panel per
      depth, plain vs highway (Srivastava et al. Fig. 1);
    * the figures below show the first run of each kind and depth (with several
      seeds: the first seed's);
    * per finished highway run: ``gate_heatmaps_d<depth>.png`` (Fig. 2, on the first
      ``heatmap_examples`` training images) and ``lesion_d<depth>.png`` (Fig. 4, on
      the first ``lesion_examples``);
    * ``plain_diagnostics.png``: activation mean / variance and gradient norms per
      layer of plain nets of ``diagnostics_depth`` at initialisation (None: skip);
    * ``analysis.json``: every number drawn.

    Args:
      runs: as for :func:`sweep_table`, plus ``'workdir'``.
      train_split: ``(images uint8 [N, m], labels [N])``, the training split.
      track: the engine's progress bar and signal check for the lesions
        (:func:`rhnzoo.engine.signals.track`); log: where the table and lesion lines go.
    """
    root = pathlib.Path(root)
    written, numbers = [], {"runs": [], "lesions": {}, "gates": {}}
    table = sweep_table(runs)
    written.append(
        tables.write_table(root / "results.md", (header + "\n\n" if header else "") + table)
    )
    log(table)
    first: dict[tuple[str, int], Mapping[str, Any]] = {}
    for r in runs:
        first.setdefault((r["kind"], r["depth"]), r)
    for r in sorted(runs, key=lambda r: (r["depth"], r["kind"])):
        numbers["runs"].append(
            {k: r.get(k) for k in ("kind", "depth", "width", "params", "lr", "results")}
        )
    written += _training_curves(first.values(), root, dataset)
    images, labels = train_split
    for r in first.values():
        if r["kind"] == "highway" and r.get("results"):
            split = (images[:lesion_examples], labels[:lesion_examples])
            written += _highway_figures(
                r["workdir"], images[:heatmap_examples], split, root, numbers, track, log
            )
    if diagnostics_depth:
        split = (images[:diagnostics_examples], labels[:diagnostics_examples])
        written.append(_plain_figure(split, diagnostics_depth, num_classes, seed, root, numbers))
    path = root / "analysis.json"
    workdir_lib.write_json(path, numbers)
    return [*written, path]


def _training_curves(
    first: Iterable[Mapping[str, Any]], root: pathlib.Path, dataset: str
) -> list[pathlib.Path]:
    """``training_curves.png`` (Fig. 1) of the ``first`` runs with epoch records, if any."""
    panels: dict[str, dict[str, list]] = {}
    for r in sorted(first, key=lambda r: (r["depth"], r["kind"])):
        if r.get("history"):
            panels.setdefault(f"depth {r['depth']}", {})[r["kind"]] = r["history"]
    if not panels:
        return []
    path = plots.plot_curve_panels(
        panels,
        root / "training_curves.png",
        key="train_xent",
        ylabel="mean training cross-entropy (nats)",
        title=f"{dataset}: plain vs highway, mean training cross-entropy per epoch",
    )
    return [path]


def _highway_figures(
    workdir: PathLike,
    heatmap_images: np.ndarray,
    lesion_split: tuple[np.ndarray, np.ndarray],
    root: pathlib.Path,
    numbers: dict[str, Any],
    track,
    log,
) -> list[pathlib.Path]:
    """The gate heatmaps (Fig. 2) and lesion curve (Fig. 4) of the highway net in
    ``workdir``; their numbers go into ``numbers['gates']`` and ``numbers['lesions']``."""
    net, params, _ = load_highway_run(workdir)
    depth = net.depth
    gates = gate_statistics(net, params, heatmap_images)
    numbers["gates"][depth] = {
        "mean_t_per_layer": gates.mean_t.mean(1).tolist(),
        "t_bias_per_layer": gates.t_bias.mean(1).tolist(),
    }
    heatmaps = plots.plot_highway_gates(
        {f"depth {depth}": gates},
        root / f"gate_heatmaps_d{depth}.png",
        title=f"Highway net, depth {depth}: transform gates (mean over "
        f"{gates.num_examples:,} training images; sample = image 0)",
    )
    lesion = highway_lesions(net, params, lesion_split, track=track)
    numbers["lesions"][depth] = {
        "intact": lesion.base_nll,
        "lesioned": lesion.nll.tolist(),
        "num_images": lesion.num_tokens,
    }
    worst = int(np.argmax(lesion.nll))
    log(
        f"lesions, depth {depth} ({lesion.num_tokens:,} training images): intact "
        f"{lesion.base_nll:.4f} nats; largest {lesion.nll[worst]:.4f} (layer {worst + 2}); "
        f"median {np.median(lesion.nll):.4f}"
    )
    curve = plots.plot_lesion_curve(
        {f"depth {depth}": lesion},
        root / f"lesion_d{depth}.png",
        title=f"Lesioning, highway net of depth {depth} ({lesion.num_tokens:,} training images)",
    )
    return [heatmaps, curve]


def _plain_figure(
    split: tuple[np.ndarray, np.ndarray],
    depth: int,
    num_classes: int,
    seed: int,
    root: pathlib.Path,
    numbers: dict[str, Any],
) -> pathlib.Path:
    """``plain_diagnostics.png`` (:func:`rhnzoo.analysis.highway.plain_diagnostics`); the
    numbers go into ``numbers['plain_diagnostics']``."""
    diag = plain_diagnostics(*split, depth=depth, num_classes=num_classes, seed=seed)
    numbers["plain_diagnostics"] = {
        "depth": depth,
        **{k: {s: v.tolist() for s, v in d.items()} for k, d in diag.items()},
    }
    return plots.plot_layer_statistics(
        diag,
        root / "plain_diagnostics.png",
        title=f"Plain nets of depth {depth} at initialisation ({len(split[1]):,} training images)",
    )
