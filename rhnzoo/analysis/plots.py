"""matplotlib figures of the analyses (no pyplot, no global state, works headless).

Plots are drawn on a bare :class:`matplotlib.figure.Figure` and saved without
``bbox_inches='tight'``, so a PNG is exactly ``figsize * dpi`` pixels; each is written to a
temporary file renamed over the target, so an interrupted save never leaves half a PNG. One plot
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
from matplotlib.ticker import MaxNLocator

if TYPE_CHECKING:
    from rhnzoo.analysis.lm import LesionResult

PathLike = str | os.PathLike

__all__ = [
    "plot_gate_heatmap",
    "plot_lesion",
    "plot_gate_histogram",
    "plot_learning_curves",
    "plot_ppl_vs_depth",
    "plot_curve_panels",
    "plot_highway_gates",
    "plot_lesion_curve",
    "plot_layer_statistics",
    "plot_gersgorin",
    "plot_gradient_flow",
    "plot_trial_swarm",
]


def _figure(figsize: tuple[float, float], dpi: int) -> tuple[Figure, Any]:
    """A constrained-layout figure of ``figsize`` inches at ``dpi`` and its one axes."""
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    return fig, fig.add_subplot()


def _panels(
    rows: int, cols: int, panel_size: tuple[float, float], dpi: int
) -> tuple[Figure, np.ndarray]:
    """``(fig, axes [rows, cols])``: a constrained-layout figure of ``panel_size`` panels."""
    figsize = (cols * panel_size[0], rows * panel_size[1])
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def _save(fig: Figure, path: PathLike, title: str | None = None) -> pathlib.Path:
    """Writes ``fig`` at its dpi to ``path`` atomically (a hidden temporary file in the same
    directory, then a rename; the format from the suffix, PNG without one); a ``title``
    becomes the figure's title (font size 10)."""
    if title:
        fig.suptitle(title, fontsize=10)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=fig.dpi, format=path.suffix[1:] or "png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _heatmap(
    fig: Figure,
    ax,
    matrix: np.ndarray,
    *,
    ylabel: str,
    xlabel: str,
    colorbar: str,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
) -> None:
    """``matrix [layers, columns]`` as an image, layer 1 on top, with 1-based layer
    ticks (at most about ten) and a colour bar: the gate heatmaps of both papers."""
    num_layers = matrix.shape[0]
    image = ax.imshow(
        matrix, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax
    )
    ticks = range(0, num_layers, max(1, num_layers // 10))
    ax.set_yticks(ticks, [str(l + 1) for l in ticks])
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    fig.colorbar(image, ax=ax, label=colorbar)


def _curves(
    ax, curves: Mapping[str, Sequence[Mapping[str, Any]]], key: str, x: str = "epoch", **style
) -> None:
    """One line per label of ``key`` vs ``x`` (``'epoch'`` or ``'step'``; records without
    ``key`` skipped), log-scale y, legend if any line."""
    for label, records in curves.items():
        records = [r for r in records if r.get(key) is not None]
        if records:
            ax.plot(
                [r[x] for r in records],
                [r[key] for r in records],
                label=label,
                **style.get(label, {}),
            )
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(x)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


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
    num_steps = activity.shape[1]
    fig, ax = _figure(figsize, dpi)
    xlabel = "input token (time step t)" if labels is not None else "time step t"
    _heatmap(
        fig, ax, activity, ylabel="micro-layer l", xlabel=xlabel, colorbar="mean transform gate T"
    )
    if labels is not None:
        ax.set_xticks(range(num_steps), list(labels), rotation=90, fontsize=7)
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
    annotated with the lesioned perplexity (said in the x-axis label, clear of the
    bars; the y range leaves room for the labels). The PNG is ``figsize * dpi`` pixels.
    """
    return _save(_lesion_figure(result, title, figsize, dpi), path)


def _lesion_figure(
    result: LesionResult, title: str | None, figsize: tuple[float, float], dpi: int
) -> Figure:
    delta = result.delta_nll
    layers = np.arange(1, delta.size + 1)
    fig, ax = _figure(figsize, dpi)
    bars = ax.bar(layers, delta, color="tab:red")
    ax.bar_label(bars, [f"{p:.0f}" if p < 1e6 else f"{p:.1e}" for p in result.ppl], fontsize=7)
    ax.margins(y=0.12)  # room for the bar labels inside the axes, below the title
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(layers)
    ax.set_xlabel(
        "lesioned micro-layer l (T gate bias set to -1e4)\n"
        "bar labels: perplexity with that micro-layer lesioned"
    )
    ax.set_ylabel("Δ loss (nats/token)")
    ax.set_title(title or f"Lesioning: intact perplexity {result.base_ppl:.1f}")
    return fig


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
    fig, ax = _figure(figsize, dpi)
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
    style: Mapping[str, Mapping[str, Any]] | None = None,
    x: str = "epoch",
) -> pathlib.Path:
    """Validation perplexity vs epoch, one line per run (Shoham & Permuter, Fig. 6).

    Args:
      curves: label (e.g. :func:`run_label`) -> records (:func:`read_metrics`); runs
        without records are skipped.
      path: PNG file; the image is ``figsize * dpi`` pixels.
      key: the record field on the y axis (log scale).
      style: label -> ``Axes.plot`` keywords of its line (e.g. ``{'marker': 'o'}``).
      x: the record field on the x axis, ``'epoch'`` or ``'step'`` (the step count).
    """
    fig, ax = _figure(figsize, dpi)
    _curves(ax, curves, key, x, **(style or {}))
    ax.set_ylabel(key.replace("_", " "))
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
    fig, ax = _figure(figsize, dpi)
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


# ------------------------------------------------------------- feed-forward highway nets

_KIND_STYLE = {
    "plain": {"color": "tab:blue", "marker": "o", "markersize": 2.5},
    "highway": {"color": "tab:red", "marker": "o", "markersize": 2.5},
}


def plot_curve_panels(
    panels: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    path: PathLike,
    *,
    key: str = "train_xent",
    ylabel: str | None = None,
    title: str | None = None,
    panel_size: tuple[float, float] = (3.2, 3.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Learning curves in side-by-side panels (Srivastava et al. Fig. 1: one panel per
    depth, plain vs highway, mean training cross-entropy on a log scale).

    Args:
      panels: panel title (e.g. ``'depth 10'``) -> label (e.g. ``'plain'``) ->
        per-epoch records (:func:`read_metrics`); labels ``'plain'`` and
        ``'highway'`` get fixed colours in every panel.
      path: PNG file; the image is ``(len(panels) * panel_size[0], panel_size[1]) * dpi``.
      key: the record field on the y axis.
    """
    fig, (axes,) = _panels(1, max(len(panels), 1), panel_size, dpi)
    for ax, (name, curves) in zip(axes, panels.items()):
        _curves(ax, curves, key, **_KIND_STYLE)
        ax.set_title(name, fontsize=10)
    axes[0].set_ylabel(ylabel or key.replace("_", " "))
    return _save(fig, path, title)


def plot_highway_gates(
    rows: Mapping[str, Any],
    path: PathLike,
    *,
    title: str | None = None,
    panel_size: tuple[float, float] = (3.2, 3.0),
    dpi: int = 100,
) -> pathlib.Path:
    """The four gate heatmaps of a trained highway net per row (Srivastava et al. Fig. 2).

    Columns: trained T biases, mean T over many images, T for one image, the layer
    outputs for that image; rows of each panel are highway layers (1 = the first
    highway layer, network layer 2), columns units.

    Args:
      rows: row label (e.g. ``'MNIST'`` or ``'depth 50'``) ->
        :class:`rhnzoo.analysis.highway.GateStats` (``t_bias``, ``mean_t``,
        ``sample_t``, ``sample_output``, each ``[layers, units]``).
      path: PNG file; the image is ``(4 * panel_size[0], len(rows) * panel_size[1]) * dpi``.
    """
    columns = [
        ("t_bias", "transform gate biases", "coolwarm", None, None),
        ("mean_t", "mean transform gate T", "viridis", 0.0, 1.0),
        ("sample_t", "T, one example", "viridis", 0.0, 1.0),
        ("sample_output", "block outputs, one example", "coolwarm", None, None),
    ]
    fig, axes = _panels(max(len(rows), 1), 4, panel_size, dpi)
    for r, (name, stats) in enumerate(rows.items()):
        for c, (field, label, cmap, vmin, vmax) in enumerate(columns):
            matrix = np.asarray(getattr(stats, field))
            if vmin is None:  # symmetric around 0 for biases and outputs
                bound = float(np.abs(matrix).max()) or 1.0
                vmin, vmax = -bound, bound
            _heatmap(
                fig,
                axes[r, c],
                matrix,
                ylabel=f"{name}: highway layer" if c == 0 else "",
                xlabel="unit (block)",
                colorbar="",
                cmap=cmap,
                vmin=vmin,
                vmax=vmax,
            )
            axes[r, c].set_title(label, fontsize=9)
    return _save(fig, path, title)


def plot_lesion_curve(
    results: Mapping[str, LesionResult],
    path: PathLike,
    *,
    ylabel: str = "mean cross-entropy on the training images (nats)",
    title: str | None = None,
    figsize: tuple[float, float] = (6.4, 4.0),
    dpi: int = 100,
) -> pathlib.Path:
    """Loss when each highway layer in turn is removed, the intact net as a dotted line
    of the same colour (Srivastava et al. Fig. 4); log scale when the values span more
    than a factor of 10.

    Args:
      results: label -> :class:`LesionResult` (``nll [layers]``: loss with highway
        layer l removed; ``base_nll``: intact).
      path: PNG file; the image is ``figsize * dpi`` pixels.
    """
    fig, ax = _figure(figsize, dpi)
    values = np.concatenate([np.append(r.nll, r.base_nll) for r in results.values()])
    values = values[np.isfinite(values) & (values > 0)]
    if values.size and values.max() > 10 * values.min():
        ax.set_yscale("log")
    for label, result in results.items():
        layers = np.arange(1, result.nll.size + 1)
        (line,) = ax.plot(
            layers,
            result.nll,
            "o-",
            markersize=3,
            linewidth=0.8,
            label=f"{label}: one layer removed",
        )
        ax.axhline(
            result.base_nll,
            color=line.get_color(),
            linestyle=":",
            label=f"{label}: intact ({result.base_nll:.3g})",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("removed highway layer (T forced to 0: identity)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.set_title(title or "Lesioning", fontsize=10)
    return _save(fig, path)


def plot_layer_statistics(
    stats: Mapping[str, Mapping[str, np.ndarray]],
    path: PathLike,
    *,
    title: str | None = None,
    panel_size: tuple[float, float] = (4.0, 3.4),
    dpi: int = 100,
) -> pathlib.Path:
    """Per-layer mean and variance of the activations and L2 norm of the gradient,
    one line per net (the ECBM4040 report's plain-net diagnostics).

    Args:
      stats: label (e.g. ``'tanh, Glorot'``) -> ``{'mean': [depth], 'variance':
        [depth], 'grad_norm': [depth]}`` (:func:`plain_diagnostics`).
      path: PNG file; the image is ``(3 * panel_size[0], panel_size[1]) * dpi``.
    """
    panels = [
        ("mean", "mean activation", "linear"),
        ("variance", "variance of activations", "log"),
        ("grad_norm", "gradient L2 norm", "log"),
    ]
    fig, (axes,) = _panels(1, 3, panel_size, dpi)
    for ax, (key, label, scale) in zip(axes, panels):
        for name, values in stats.items():
            v = np.asarray(values[key], np.float64)
            ax.plot(np.arange(1, v.size + 1), v, label=name, linewidth=1.0)
        ax.set_yscale(scale)
        ax.set_xlabel("layer")
        ax.set_title(label, fontsize=10)
    axes[-1].legend(fontsize=7)
    return _save(fig, path, title)


def plot_gersgorin(
    panels: Sequence[Mapping[str, Any]],
    path: PathLike,
    *,
    title: str | None = None,
    figsize_per_panel: float = 4.5,
    dpi: int = 100,
) -> pathlib.Path:
    """Gersgorin discs and eigenvalues of temporal Jacobians (Zilly et al. 2017, Fig. 2).

    Args:
      panels: one dict per panel with ``'title'``, ``'centres' [d]``, ``'radii' [d]``
        (:func:`rhnzoo.analysis.flow.gersgorin_discs` of one Jacobian) and
        ``'eigenvalues' [d]`` complex; discs are shaded, eigenvalues marked x, the unit
        circle dashed.
      path: PNG file; ``len(panels) * figsize_per_panel`` x ``figsize_per_panel`` inches.
    """
    from matplotlib.patches import Circle

    fig, (axes,) = _panels(1, len(panels), (figsize_per_panel, figsize_per_panel), dpi)
    reach = max(
        1.1,
        *(float(np.max(np.abs(p["centres"]) + p["radii"])) * 1.05 for p in panels),
        *(float(np.max(np.abs(p["eigenvalues"]))) * 1.05 for p in panels),
    )
    for ax, panel in zip(axes, panels):
        for c, r in zip(np.real(panel["centres"]), panel["radii"]):
            ax.add_patch(Circle((c, 0.0), r, color="tab:blue", alpha=0.08, lw=0))
            ax.add_patch(Circle((c, 0.0), r, fill=False, color="tab:blue", alpha=0.4, lw=0.5))
        ev = np.asarray(panel["eigenvalues"])
        ax.plot(np.real(ev), np.imag(ev), "x", color="tab:red", ms=4, label="eigenvalues")
        ax.plot(
            np.real(panel["centres"]),
            np.zeros(len(panel["centres"])),
            ".",
            color="tab:blue",
            ms=2,
            label="disc centres",
        )
        ax.add_patch(Circle((0, 0), 1.0, fill=False, ls="--", color="k", lw=0.8))
        ax.set_xlim(-reach, reach)
        ax.set_ylim(-reach, reach)
        ax.set_aspect("equal")
        ax.axhline(0, color="k", lw=0.3)
        ax.axvline(0, color="k", lw=0.3)
        ax.set_xlabel("real")
        ax.set_ylabel("imaginary")
        ax.set_title(panel["title"], fontsize=9)
    axes[0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_gradient_flow(
    curves: Mapping[str, np.ndarray],
    path: PathLike,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (7.0, 4.5),
    dpi: int = 100,
) -> pathlib.Path:
    """Gradient norm vs steps back in time, one line per cell (log scale), the legend to
    the right of the axes (never over a curve).

    Args:
      curves: label -> ``[K + 1]`` norms ``‖∂L_T/∂s_{T-k}‖`` for k = 0..K
        (:func:`rhnzoo.analysis.flow.gradient_norms_through_time`).
      path: PNG file; the image is ``figsize * dpi`` pixels.
    """
    return _save(_gradient_flow_figure(curves, title, figsize, dpi), path)


def _gradient_flow_figure(
    curves: Mapping[str, np.ndarray], title: str | None, figsize: tuple[float, float], dpi: int
) -> Figure:
    import matplotlib

    fig, ax = _figure(figsize, dpi)
    colors = matplotlib.colormaps["tab20"].colors
    for i, (label, norms) in enumerate(curves.items()):
        norms = np.asarray(norms, np.float64)
        style = "--" if "trained" in label else "-"
        ax.plot(
            np.arange(len(norms)),
            np.maximum(norms, 1e-30),
            style,
            label=label,
            color=colors[(2 * i) % 20 + (i // 10) % 2],
        )
    ax.set_yscale("log")
    ax.set_xlabel("steps back in time k")
    ax.set_ylabel(r"$\Vert\partial L_T / \partial s_{T-k}\Vert$")
    if curves:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3)
    fig.suptitle(title or "Gradient flow through time")  # centred over axes and legend
    return fig


def plot_trial_swarm(
    points: Mapping[str, Mapping[Any, Sequence[float]]],
    path: PathLike,
    *,
    xlabel: str = "recurrence depth",
    ylabel: str = "test NLL per time step (nats)",
    title: str = "JSB Chorales, random search over SGD hyperparameters",
    colors: Mapping[str, str] | None = None,
) -> pathlib.Path:
    """Zilly et al. Fig. 4 style: ``points[label][x]`` the values of every trial (one dot
    each, jittered in one column per label), a bar at each median; 7 x 4.5 in, 120 dpi."""
    fig = Figure(figsize=(7, 4.5), dpi=120)
    ax = fig.subplots()
    xs = sorted({x for per_x in points.values() for x in per_x})
    width = 0.8 / max(len(points), 1)
    rng = np.random.default_rng(0)
    for a, (label, per_x) in enumerate(points.items()):
        for d, x in enumerate(xs):
            ys = np.array([v for v in per_x.get(x, ()) if np.isfinite(v)])
            x0 = d + (a - (len(points) - 1) / 2) * width
            if ys.size:
                jitter = x0 + rng.uniform(-0.35, 0.35, ys.size) * width
                color = (colors or {}).get(label, f"C{a}")
                ax.scatter(
                    jitter, ys, s=14, color=color, alpha=0.8, lw=0, label=label if d == 0 else None
                )
                ax.hlines(np.median(ys), x0 - 0.4 * width, x0 + 0.4 * width, color="k", lw=1)
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
