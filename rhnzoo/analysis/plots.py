"""matplotlib figures of the analyses (no pyplot, no global state, works headless).

Plots are drawn on a bare :class:`matplotlib.figure.Figure` and saved without
``bbox_inches='tight'``, so a PNG is exactly ``figsize * dpi`` pixels. One plot
function per figure kind, shared by the papers where the figure is the same
(gate heatmaps and lesioning for RHN micro-layers and highway layers).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from rhnzoo.analysis.lm import LesionResult

PathLike = str | os.PathLike

__all__ = ["plot_gate_heatmap", "plot_lesion", "plot_gate_histogram", "plot_learning_curves",
           "plot_ppl_vs_depth"]  # fmt: skip


def _save(fig: Figure, path: PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=fig.dpi)
    return path


def plot_gate_heatmap(
    t_gates: np.ndarray,
    path: PathLike,
    *,
    row: int = 0,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    figsize: tuple[float, float] = (10.0, 4.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Heatmap of the mean T-gate activity per micro-layer over time (Zilly et al. Fig. 5b).

    Args:
      t_gates: ``[T, L, B, n]`` transform gates (:func:`gate_activity`).
      path: PNG file to write (parent directories are created).
      row: which batch row (example sequence) to draw.
      labels: optional ``[T]`` input tokens as strings, shown under the x axis.
      title: figure title.
      figsize, dpi: the PNG is ``figsize[0] * dpi`` x ``figsize[1] * dpi`` pixels.

    Returns:
      ``path`` as a :class:`pathlib.Path`.
    """
    t_gates = np.asarray(t_gates)
    activity = t_gates[:, :, row, :].mean(-1).T  # [L, T], mean over the n units
    num_layers, num_steps = activity.shape
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(activity, aspect="auto", interpolation="nearest", cmap="viridis")
    ticks = range(0, num_layers, max(1, num_layers // 10))
    ax.set_yticks(ticks, [str(l + 1) for l in ticks])
    ax.set_ylabel("micro-layer l")
    if labels is not None:
        ax.set_xticks(range(num_steps), list(labels), rotation=90, fontsize=7)
        ax.set_xlabel("input token (time step t)")
    else:
        ax.set_xlabel("time step t")
    fig.colorbar(image, ax=ax, label="mean transform gate T")
    ax.set_title(title or "Mean T-gate activity per micro-layer")
    return _save(fig, path)


def plot_lesion(
    result: LesionResult,
    path: PathLike,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (6.4, 4.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Bar plot of the loss change per lesioned micro-layer (Zilly et al. sec. 6).

    Bars are Δ loss in nats/token (= log of the perplexity ratio, so a layer whose
    lesion multiplies perplexity by 20 does not hide the others); each bar is
    annotated with the lesioned perplexity. The PNG is ``figsize * dpi`` pixels.
    """
    delta = result.delta_nll
    layers = np.arange(1, delta.size + 1)
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar(layers, delta, color="tab:red")
    ax.bar_label(bars, [f"{p:.0f}" if p < 1e6 else f"{p:.1e}" for p in result.ppl], fontsize=7)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(layers)
    ax.set_xlabel("lesioned micro-layer l (T gate bias set to -1e4)")
    ax.set_ylabel("Δ loss (nats/token)")
    ax.text(
        0.99,
        0.98,
        "bar labels: lesioned perplexity",
        transform=ax.transAxes,
        ha="right",
        va="top",
        fontsize=7,
    )
    ax.set_title(title or f"Lesioning: intact perplexity {result.base_ppl:.1f}")
    return _save(fig, path)


def plot_gate_histogram(
    values: np.ndarray,
    path: PathLike,
    *,
    bins: int = 50,
    title: str | None = None,
    figsize: tuple[float, float] = (6.4, 4.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Histogram of HSG gate values in [0, 1] (Shoham & Permuter, Fig. 7).

    ``values``: any-shape gate values (:func:`hsg_gate_sample`). The y axis is the
    fraction of values per bin. The PNG is ``figsize * dpi`` pixels.
    """
    values = np.asarray(values).reshape(-1)
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    ax.hist(values, bins=bins, range=(0.0, 1.0), weights=np.full(values.size, 1.0 / values.size))
    ax.set_xlim(0.0, 1.0)
    ax.set_xlabel("HSG gate g (1: keep previous state, 0: take new RHN state)")
    ax.set_ylabel("fraction of values")
    ax.set_title(title or f"HSG gate values ({values.size} values, mean {values.mean():.3f})")
    return _save(fig, path)


def plot_learning_curves(
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    path: PathLike,
    *,
    key: str = "valid_ppl",
    title: str | None = None,
    figsize: tuple[float, float] = (6.4, 4.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Validation perplexity vs epoch, one line per run (Shoham & Permuter, Fig. 6).

    Args:
      curves: label (e.g. :func:`run_label`) -> per-epoch records
        (:func:`read_metrics`); runs without records are skipped.
      path: PNG file; the image is ``figsize * dpi`` pixels.
      key: the record field on the y axis (log scale).
    """
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    for label, records in curves.items():
        records = [r for r in records if key in r]
        if records:
            ax.plot([r["epoch"] for r in records], [r[key] for r in records], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel(key.replace("_", " "))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_title(title or "Learning curves")
    return _save(fig, path)


def plot_ppl_vs_depth(
    series: Mapping[str, Mapping[int, float]],
    path: PathLike,
    *,
    reference: Mapping[str, Mapping[int, float]] | None = None,
    ylabel: str = "test perplexity",
    title: str | None = None,
    figsize: tuple[float, float] = (6.4, 4.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Perplexity vs recurrence depth L (Shoham & Permuter, Fig. 8).

    Args:
      series: label -> {depth: perplexity} measured here (lines with dots).
      path: PNG file; the image is ``figsize * dpi`` pixels.
      reference: label -> {depth: perplexity} published numbers (star markers).
    """
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    for label, points in series.items():
        depths = sorted(points)
        ax.plot(depths, [points[d] for d in depths], "o-", label=label)
    for label, points in (reference or {}).items():
        depths = sorted(points)
        ax.plot(depths, [points[d] for d in depths], "*", markersize=12, label=label)
    ax.set_xlabel("recurrence depth L")
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_title(title or "Perplexity vs recurrence depth")
    return _save(fig, path)
