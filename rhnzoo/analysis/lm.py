"""Analysis of trained RHN / HSG language models: gates, lesions, MC dropout.

Pure functions over ``(model, params)`` pairs (plots: :mod:`rhnzoo.analysis.plots`):

* :func:`load_run`: rebuild the :class:`~rhnzoo.models.lm.LanguageModel` of a training
  workdir (:func:`rhnzoo.tasks.lm.train`) and restore its best parameters;
* :func:`gate_activity`: every micro-layer's transform gate T (and the HSG gate
  g) over a token sequence; :func:`plot_gate_heatmap` draws the mean T-gate
  activity per micro-layer over time (Zilly et al. 2017, sec. 6, Fig. 5b);
* :func:`lesion_params` / :func:`lesion_layers` / :func:`iter_lesions`: switch off one
  micro-layer at a time by forcing its transform gate shut (T = 0, so s^[l] = s^[l-1])
  and measure the loss (Zilly et al. 2017, sec. 6); :func:`plot_lesion`;
* :func:`hsg_gate_sample` / :func:`plot_gate_histogram`: HSG gate values at
  random time steps (Shoham & Permuter, Fig. 7);
* :func:`mc_dropout_perplexity`: Monte-Carlo dropout evaluation as in the
  reference code's ``evaluate_mc`` (``rhn_train.py``, ``mc_steps``).

The long ones (lesions, the HSG sample, MC dropout) run window by window and take the
engine's ``track`` (:func:`rhnzoo.engine.signals.track`): one progress bar per call
(:func:`shared_bar`) and a signal check before every window, which raises
:class:`~rhnzoo.engine.signals.Interrupted`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo import cells, dropout
from rhnzoo.models import lm
from rhnzoo import evaluation
from rhnzoo.configs import lm as lm_configs
from rhnzoo.engine import evaluate as engine_evaluate
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.engine.signals import Track  # track(iterable, total=None, desc='') -> iterator

Array = jax.Array
Params = Any
PathLike = str | os.PathLike

__all__ = [
    "LESION_BIAS",
    "load_run",
    "run_label",
    "Gates",
    "gate_activity",
    "hsg_gate_sample",
    "lesion_params",
    "LesionResult",
    "lesion_snapshots",
    "iter_lesions",
    "lesion_layers",
    "MCResult",
    "MCPass",
    "mc_dropout_perplexity",
    "shared_bar",
    "stream_nll",
]

# config.json keys forwarded to lm.language_model when present (cell options only when
# the run's cell takes them).
_MODEL_KEYS = ("tied", "init_scale", "hsg_init_bias", "unroll")

# Bias that closes a transform gate: sigmoid(-1e4 + anything moderate) is exactly
# 0.0 in float32, so the lesioned micro-layer passes its input through unchanged.
LESION_BIAS = -1e4


@functools.lru_cache(maxsize=16)
def _window_step(model: lm.LanguageModel):
    """The ``eval_step`` of ``model``'s windows (:func:`rhnzoo.evaluation.window_sums`):
    one function object per model, so its evaluations share one compilation."""
    return functools.partial(evaluation.window_sums, model)


def stream_nll(
    model: lm.LanguageModel,
    params: Params,
    tokens: np.ndarray,
    batch_size: int,
    num_steps: int,
    track: Track | None = None,
) -> tuple[float, float]:
    """``(nll_sum, count)`` of the token stream ``tokens`` without dropout: the engine's
    evaluation loop (:func:`rhnzoo.engine.evaluate.evaluate`: one jit-compiled call per
    window, at most two in flight, a signal check per window with ``track``) over the
    windows of ``num_steps`` (:func:`rhnzoo.evaluation.eval_windows`), ``batch_size`` rows,
    the state carried across windows. Nats per symbol are ``nll_sum / count``;
    :data:`rhnzoo.evaluation.METRICS` turns them into the metric."""
    x, y, w = evaluation.eval_windows(np.asarray(tokens), batch_size, num_steps)
    batches = engine_evaluate.Batches(len(x), lambda i: (x[i], y[i], w[i]))
    totals = engine_evaluate.evaluate(
        _window_step(model),
        params,
        batches,
        model.initial_carry(batch_size),
        carried=True,
        track=track,
    )
    return float(totals["loss"]), float(w.sum())


@contextlib.contextmanager
def shared_bar(track: Track | None, total: int, desc: str = "") -> Iterator[Track | None]:
    """One ``track`` bar of ``total`` items, advanced by several loops in turn.

    Yields a tracker ``(iterable, total=None, desc='') -> iterator`` for those loops: it
    passes ``iterable``'s items through, taking one item of the shared bar before each
    (so the engine's tracker checks for a signal there and raises
    :class:`~rhnzoo.engine.signals.Interrupted`); the bar is closed on exit. With
    ``track`` None, yields None (no bar, no checks).
    """
    if track is None:
        yield None
        return
    items = iter(track(range(total), total=total, desc=desc))

    def advance(iterable: Iterable, total: int | None = None, desc: str = "") -> Iterator:
        del total, desc  # the shared bar's
        for item in iterable:
            next(items, None)
            yield item

    try:
        yield advance
    finally:
        getattr(items, "close", lambda: None)()


# ----------------------------------------------------------------------------- runs


def load_run(workdir: PathLike) -> tuple[lm.LanguageModel, Params, dict[str, Any]]:
    """Rebuilds a trained model from its workdir and restores its best parameters.

    The model comes from ``config.json`` (the run's flag values: ``cell`` (default
    ``rhn``), ``hidden_size``, ``depth``, ``hsg`` and, when present, ``tied``,
    ``coupled``, ``init_scale``, ``init_bias``, ``hsg_init_bias``, ``unroll``) through
    :func:`rhnzoo.models.lm.language_model`; the vocabulary size V is read from the
    checkpointed embedding ``[V, m]``, so no data is needed. Parameters come from
    ``best/`` (best validation perplexity), else from the latest state in
    ``checkpoints/`` (a run stopped before its first validation).

    Args:
      workdir: a directory written by :func:`rhnzoo.tasks.lm.train`.

    Returns:
      ``(model, params, config)``: the model, its float32 parameter pytree (the
      structure of ``model.init``) and the ``config.json`` dict.

    Raises:
      ValueError: (one line) if there is no ``config.json``, it lacks
        ``hidden_size``/``depth``, there is no checkpoint, or the checkpoint's
        shapes do not match the configured model.
    """
    workdir = pathlib.Path(workdir)
    config = workdir_lib.read_config(workdir)
    missing = [k for k in ("hidden_size", "depth") if k not in config]
    if missing:
        raise ValueError(
            f"{workdir / 'config.json'} lacks {', '.join(missing)}; cannot rebuild the model"
        )
    params = workdir_lib.restore_params(workdir)
    if params is None:
        raise ValueError(
            f"{workdir} has no checkpoint (neither best/ nor checkpoints/ holds a step); "
            "train it first"
        )
    params = jax.tree.map(jnp.asarray, params)
    cell = config.get("cell", "rhn")
    model = lm.language_model(
        cell,
        int(params["embed"].shape[0]),
        int(config["hidden_size"]),
        hsg=bool(config.get("hsg", False)),
        **{k: config[k] for k in _MODEL_KEYS if k in config},
        **cells.applicable(cell, {k: config[k] for k in lm_configs.CELL_KEYS if k in config}),
    )
    expected = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    shapes = lambda tree: jax.tree.map(lambda a: tuple(a.shape), tree)
    if shapes(expected) != shapes(params):
        raise ValueError(
            f"the checkpoint in {workdir} does not match its config.json "
            f"(hidden_size={config['hidden_size']}, depth={config['depth']}, "
            f"hsg={config.get('hsg', False)})"
        )
    return model, params, config


def run_label(config: Mapping[str, Any]) -> str:
    """``'RHN depth 10'``, ``'RHN+HSG depth 40'`` or ``'LSTM'`` from a run's config."""
    cell = config.get("cell", "rhn")
    name = cells.label(cell) + ("+HSG" if config.get("hsg") else "")
    return f"{name} depth {config.get('depth', '?')}" if "depth" in cells.options(cell) else name


# ---------------------------------------------------------------------------- gates


class Gates(NamedTuple):
    """Gate activations over a sequence.

    Attributes:
      t: ``[T, L, B, n]`` float32 transform gates T^[l]_t of every micro-layer
        (Zilly et al. 2017, eq. 8), time-major.
      g: ``[T, B, n]`` float32 HSG gates g_t (Shoham & Permuter, eq. 6), or
        ``None`` when the cell has no HSG.
    """

    t: Array
    g: Array | None


def _rhn_parts(model: lm.LanguageModel, params: Params):
    """``(rhn_cell, rhn_params, hsg_cell_or_None, hsg_params_or_None)``.

    Raises:
      ValueError: if the model's cell is neither RHN nor HSG(RHN).
    """
    cell = model.cell
    if isinstance(cell, cells.RHN):
        return cell, params["cell"], None, None
    if isinstance(cell, cells.HSG) and isinstance(cell.cell, cells.RHN):
        return cell.cell, params["cell"]["cell"], cell, params["cell"]
    raise ValueError(f"gate analysis needs an RHN or HSG(RHN) cell, got {type(cell).__name__}")


@functools.partial(jax.jit, static_argnums=0)
def _gate_scan(model: lm.LanguageModel, params: Params, carry: Array, tokens: Array):
    rhn, rhn_params, hsg, hsg_params = _rhn_parts(model, params)
    x_proj = rhn.project_inputs(rhn_params, params["embed"][tokens.T])  # [T, B, k n]

    def body(s, xp):
        s_new, t = rhn.step_with_gates(rhn_params, s, xp)
        if hsg is None:
            return s_new, (t, None)
        g = hsg.gate(hsg_params, s, s_new)
        return s_new + g * (s - s_new), (t, g)

    return jax.lax.scan(body, carry, x_proj)


def _gate_windows(
    model: lm.LanguageModel,
    params: Params,
    tokens: Array,
    num_steps: int | None,
    track: Track | None = None,
    carry: Array | None = None,
) -> Iterator[Gates]:
    """:class:`Gates` of ``tokens [B, T]`` in windows of ``num_steps`` time steps (None: one
    window), the state carried across them; the last window is padded to ``num_steps``
    (one compilation) and the padding cut off. ``track`` iterates the windows."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    _rhn_parts(model, params)
    length = tokens.shape[1]
    num_steps = num_steps or length
    if carry is None:
        carry = model.initial_carry(tokens.shape[0])
    starts = range(0, length, num_steps)
    for start in starts if track is None else track(starts, total=len(starts)):
        window = tokens[:, start : start + num_steps]
        n = window.shape[1]
        window = np.pad(window, ((0, 0), (0, num_steps - n)))
        carry, (t, g) = _gate_scan(model, params, carry, jnp.asarray(window))
        yield Gates(t[:n], None if g is None else g[:n])


def gate_activity(
    model: lm.LanguageModel, params: Params, tokens: Array, carry: Array | None = None
) -> Gates:
    """Every micro-layer's transform gate (and the HSG gate) while reading ``tokens``.

    One jit-compiled ``lax.scan`` over time of the RHN's ``step_with_gates``; for
    HSG(RHN) the HSG gate is applied on top (ŝ_t = g ŝ_{t-1} + (1 - g) s_L,t), so
    the state follows the model exactly. No dropout (evaluation mode).

    Args:
      model: a language model whose cell is ``RHN`` or ``HSG(RHN)``.
      params: its parameters.
      tokens: ``[B, T]`` int token ids.
      carry: initial state ``[B, n]``; zeros if ``None``.

    Returns:
      :class:`Gates` with ``t [T, L, B, n]`` and ``g [T, B, n]`` (or ``None``),
      values in (0, 1).

    Raises:
      ValueError: for another cell type or ``tokens`` that is not 2-D.
    """
    (gates,) = _gate_windows(model, params, tokens, None, carry=carry)
    return gates


def hsg_gate_sample(
    model: lm.LanguageModel,
    params: Params,
    tokens: Array,
    num_times: int,
    seed: int = 0,
    *,
    num_steps: int | None = None,
    track: Track | None = None,
) -> np.ndarray:
    """HSG gate values at ``num_times`` random time steps (Shoham & Permuter, Fig. 7).

    Args:
      model, params: an HSG(RHN) language model.
      tokens: ``[B, T]`` int ids; the gates are computed from a zero state.
      num_times: time steps drawn uniformly without replacement (at most T).
      seed: NumPy seed of the draw.
      num_steps: the gates are computed in windows of this many time steps, the state
        carried across them (None: one window of T).
      track: the engine's tracker over the windows (progress, signal check), if any.

    Returns:
      ``[num_times * B * n]`` float32 gate values g in (0, 1).

    Raises:
      ValueError: if the model has no HSG, or ``num_times`` is not in [1, T].
      Interrupted: from ``track``, on a signal.
    """
    if _rhn_parts(model, params)[2] is None:
        raise ValueError("the model has no HSG gate")
    num_steps_total = np.shape(tokens)[-1]
    if not 1 <= num_times <= num_steps_total:
        raise ValueError(f"num_times must be in [1, {num_steps_total}], got {num_times}")
    windows = _gate_windows(model, params, tokens, num_steps, track)
    g = np.concatenate([np.asarray(gates.g) for gates in windows])
    times = np.random.default_rng(seed).choice(num_steps_total, num_times, replace=False)
    return g[np.sort(times)].reshape(-1)


# -------------------------------------------------------------------------- lesions


def lesion_params(
    model: lm.LanguageModel, params: Params, layer: int, bias: float = LESION_BIAS
) -> Params:
    """Parameters with micro-layer ``layer``'s transform gate forced shut (Zilly et al. sec. 6).

    Sets the T block of ``b[layer]`` (columns n..2n of the RHN bias ``b [L, k n]``,
    laid out H|T(|C)) to ``bias``; with the default -1e4, T^[layer] = 0 exactly in
    float32 and, coupled, s^[layer] = s^[layer - 1]: the micro-layer is bypassed.
    For an uncoupled RHN the carry gate's bias is set to ``-bias`` as well (C = 1).
    Lesioning layer 0 also removes the input (it enters micro-layer 1 only).

    Args:
      model: RHN or HSG(RHN) language model (depth L).
      params: its parameters (not modified).
      layer: micro-layer index in [0, L).
      bias: the gate bias to set.

    Returns:
      A new parameter pytree sharing every other array with ``params``.

    Raises:
      ValueError: for another cell type or a layer outside [0, L).
    """
    rhn, rhn_params, hsg, _ = _rhn_parts(model, params)
    if not 0 <= layer < rhn.depth:
        raise ValueError(f"layer must be in [0, {rhn.depth}), got {layer}")
    n = rhn.hidden_size
    b = rhn_params["b"].at[layer, n : 2 * n].set(bias)
    if not rhn.coupled:
        b = b.at[layer, 2 * n :].set(-bias)
    new_rhn = dict(rhn_params, b=b)
    new_cell = new_rhn if hsg is None else dict(params["cell"], cell=new_rhn)
    return dict(params, cell=new_cell)


@dataclasses.dataclass(frozen=True)
class LesionResult:
    """Loss of the intact model and of each single-micro-layer lesion.

    Attributes:
      base_nll: intact model's loss, nats/token.
      nll: ``[L]`` loss with micro-layer l lesioned, nats/token.
      num_tokens: predictions evaluated.
    """

    base_nll: float
    nll: np.ndarray
    num_tokens: int

    @property
    def base_ppl(self) -> float:
        return evaluation.METRICS["ppl"](self.base_nll)

    @property
    def ppl(self) -> np.ndarray:
        """``[L]`` perplexity with micro-layer l lesioned (inf on overflow)."""
        with np.errstate(over="ignore"):
            return np.exp(self.nll)

    @property
    def delta_nll(self) -> np.ndarray:
        """``[L]`` loss increase (nats/token) = log(ppl_lesioned / ppl_intact)."""
        return self.nll - self.base_nll


def lesion_snapshots(
    evaluate: Callable[[int | None, Track | None], tuple[float, int]],
    num_layers: int,
    chunks: int,
    *,
    track: Track | None = None,
    desc: str = "lesion",
) -> Iterator[LesionResult]:
    """A lesion study as it goes: the intact model, then each of ``num_layers`` lesions.

    Yields a :class:`LesionResult` after the intact evaluation (``nll`` empty) and after
    each lesion (``nll [l + 1]`` for layers 0..l), so a consumer stopped by a signal
    keeps the evaluations that finished.

    Args:
      evaluate: ``(layer, track) -> (mean loss in nats, count)`` with ``layer`` lesioned
        (None: intact), iterating its ``chunks`` chunks (windows, batches) with ``track``.
      num_layers: the lesions, layers 0 .. num_layers - 1.
      chunks: chunks per evaluation; the one bar (:func:`shared_bar`) has
        ``(num_layers + 1) * chunks`` items.
      track: the engine's tracker, if any.

    Raises:
      Interrupted: from ``track``, on a signal (between chunks).
    """
    with shared_bar(track, (num_layers + 1) * chunks, desc) as sub:
        base, count = evaluate(None, sub)
        nll: list[float] = []
        yield LesionResult(base, np.zeros(0), count)
        for layer in range(num_layers):
            nll.append(evaluate(layer, sub)[0])
            yield LesionResult(base, np.asarray(nll), count)


def iter_lesions(
    model: lm.LanguageModel,
    params: Params,
    tokens: np.ndarray,
    *,
    batch_size: int = 20,
    num_steps: int = 35,
    bias: float = LESION_BIAS,
    track: Track | None = None,
) -> Iterator[LesionResult]:
    """:func:`lesion_layers` as it goes (:func:`lesion_snapshots`): a :class:`LesionResult`
    after the intact evaluation and after each micro-layer's lesion.

    Args:
      model, params: RHN or HSG(RHN) language model and its parameters.
      tokens: ``[N]`` int token stream (e.g. a slice of the training set).
      batch_size, num_steps: evaluation rows and window length.
      bias: the T-gate bias of a lesioned layer (:func:`lesion_params`).
      track: the engine's tracker: one bar over the ``(L + 1) x W`` windows, a signal
        check before each.

    Raises:
      ValueError: (at the call) for another cell type, or ``tokens`` too short for
        ``batch_size``.
      Interrupted: from ``track``, on a signal (between windows).
    """
    rhn, *_ = _rhn_parts(model, params)
    tokens = np.asarray(tokens)
    windows = len(evaluation.eval_windows(tokens, batch_size, num_steps)[0])

    def evaluate(layer: int | None, sub: Track | None) -> tuple[float, int]:
        p = params if layer is None else lesion_params(model, params, layer, bias)
        total, count = stream_nll(model, p, tokens, batch_size, num_steps, sub)
        return total / count, int(count)

    return lesion_snapshots(evaluate, rhn.depth, windows, track=track)


def lesion_layers(
    model: lm.LanguageModel, params: Params, tokens: np.ndarray, **options: Any
) -> LesionResult:
    """Lesions each micro-layer in turn and measures the loss on ``tokens`` (Zilly et al.
    sec. 6): the last :class:`LesionResult` of :func:`iter_lesions` (``options``: its
    keywords, ``batch_size=20``, ``num_steps=35``, ``bias``, ``track``).

    Evaluation is :func:`stream_nll` (no dropout, ``batch_size`` rows, carry across
    windows of ``num_steps``), compiled once and reused for the intact and the L
    lesioned parameter sets. Returns nats/token (perplexities via its properties).

    Raises:
      ValueError: as :func:`iter_lesions`.
      Interrupted: from ``track``, on a signal (the finished lesions are lost; keep
        them with :func:`iter_lesions`).
    """
    return collections.deque(iter_lesions(model, params, tokens, **options), maxlen=1)[0]


# ------------------------------------------------------------------------ MC dropout


@dataclasses.dataclass(frozen=True)
class MCResult:
    """Monte-Carlo dropout evaluation.

    Attributes:
      perplexity: exp(nll).
      nll: mean over tokens of -log(mean over samples of p(target)), nats/token.
      sample_perplexities: ``[K]`` perplexity of each dropout pass on its own.
      num_tokens: predictions evaluated.
      compile_s: seconds spent compiling the pass (once).
      pass_s: ``[K]`` wall-clock seconds of each pass (excluding compilation).
    """

    perplexity: float
    nll: float
    sample_perplexities: tuple[float, ...]
    num_tokens: int
    compile_s: float
    pass_s: tuple[float, ...]

    @property
    def seconds(self) -> float:
        """Total cost: compilation plus all K passes."""
        return self.compile_s + sum(self.pass_s)


def _mc_window(model: lm.LanguageModel, params, carry, x, y, masks):
    """One window of an MC-dropout pass: ``(carry, log p of the targets [B, T])``."""
    carry, ys = model.hidden(params, carry, x, masks)
    logp = jax.nn.log_softmax(model.logits(params, ys))  # [T, B, V]
    target = jnp.take_along_axis(logp, y.T[..., None], axis=-1)[..., 0]
    return carry, target.T


class MCPass:
    """``mc_pass(params, x, y, key, track=None) -> log p [W, B, T]``: one Monte-Carlo
    dropout pass over the windows ``x, y [W, B, T]`` of
    :func:`rhnzoo.evaluation.eval_windows`.

    One set of dropout masks (:func:`rhnzoo.dropout.lm_masks`, ``rates``) is drawn from
    ``key`` for the whole pass: the word mask per (row, word type), the input/state/output
    masks per row, shared by every window, as the reference code draws them once per
    pass over the data. The carry runs across windows, one jit-compiled call per window
    (at most two in flight), so ``track`` (the engine's tracker) shows progress and stops
    the pass at a window boundary on a signal (:class:`~rhnzoo.engine.signals.Interrupted`).
    Output: log-probability (nats) of each target under that mask draw.
    """

    def __init__(self, model: lm.LanguageModel, rates: dropout.Rates):
        self.model = model

        def masks(key, x):
            num_windows, batch, num_steps = x.shape
            rows = x.transpose(1, 0, 2).reshape(batch, num_windows * num_steps)
            drawn = model.dropout_masks(key, rows, rates)
            by_window = drawn["x"].reshape(batch, num_windows, num_steps).transpose(1, 0, 2)
            return dict(drawn, x=by_window)  # x [W, B, T]

        self._masks = jax.jit(masks)
        self._window = jax.jit(functools.partial(_mc_window, model))

    def compile(self, params: Params, x: np.ndarray, y: np.ndarray, key: Array) -> float:
        """Compiles the pass for these shapes ahead of time (later calls use it); returns
        the seconds it took."""
        t0 = time.perf_counter()
        masks = jax.eval_shape(self._masks, key, x)
        window_masks = dict(masks, x=jax.ShapeDtypeStruct(masks["x"].shape[1:], masks["x"].dtype))
        carry = self.model.initial_carry(x.shape[1])
        self._masks = self._masks.lower(key, x).compile()
        self._window = self._window.lower(params, carry, x[0], y[0], window_masks).compile()
        return time.perf_counter() - t0

    def __call__(
        self, params: Params, x: np.ndarray, y: np.ndarray, key: Array, track: Track | None = None
    ) -> Array:
        masks = self._masks(key, x)
        carry = self.model.initial_carry(x.shape[1])
        windows = range(len(x)) if track is None else track(range(len(x)), total=len(x))
        logp: list[Array] = []
        for i in windows:
            carry, out = self._window(params, carry, x[i], y[i], dict(masks, x=masks["x"][i]))
            if logp:
                logp[-1].block_until_ready()
            logp.append(out)
        return jnp.stack(logp)


def mc_dropout_perplexity(
    model: lm.LanguageModel,
    params: Params,
    tokens: np.ndarray,
    rates: dropout.Rates,
    num_samples: int,
    *,
    seed: int = 0,
    batch_size: int = 1,
    num_steps: int = 100,
    track: Track | None = None,
) -> MCResult:
    """Perplexity with dropout ON, averaging predicted probabilities over mask draws.

    The reference code's MC evaluation (``rhn_train.py``, ``run_mc_epoch``): K
    passes over the stream, each with its own dropout masks drawn once for the
    whole pass, batch size 1 by default; per token the probabilities of the
    target (not the losses) are averaged over the K passes, and perplexity =
    exp(mean over tokens of -log(mean_k p_k)). The average is taken in log space
    (logsumexp - log K), the same number without underflow. Pass k's masks come
    from ``fold_in(PRNGKey(seed), k)``.

    Differences from the reference: its batch-1, window-1 pass reuses a single
    scalar word mask for the whole pass (so a pass either keeps every word or
    drops every word) and discards passes whose perplexity is >= 500; here the
    word mask is drawn per word type (the training distribution) and every pass
    counts.

    Args:
      model, params: a language model (any cell) and its parameters.
      tokens: ``[N]`` int token stream (N - 1 predictions at batch size 1).
      rates: dropout probabilities (usually the run's training rates).
      num_samples: K >= 1.
      seed: seeds the mask draws.
      batch_size: rows of the stream (1: reference protocol).
      num_steps: window length (any value gives the same result up to float
        rounding: the masks are per pass, not per window).
      track: the engine's tracker: one bar over the K x W windows, a signal check
        before each.

    Returns:
      :class:`MCResult` with the perplexity and its cost in seconds.

    Raises:
      ValueError: if ``num_samples < 1`` or the stream is too short.
      Interrupted: from ``track``, on a signal (between windows; nothing is returned).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    x, y, w = evaluation.eval_windows(np.asarray(tokens), batch_size, num_steps)
    w = jnp.asarray(w)
    key = jax.random.PRNGKey(seed)
    mc_pass = MCPass(model, rates)
    compile_s = mc_pass.compile(params, x, y, key)
    count, ppl = float(w.sum()), evaluation.METRICS["ppl"]
    lse, sample_ppl, pass_s = None, [], []
    with shared_bar(track, num_samples * len(x), "mc_dropout") as sub:
        for k in range(num_samples):
            t0 = time.perf_counter()
            logp = mc_pass(params, x, y, jax.random.fold_in(key, k), sub)
            logp.block_until_ready()
            pass_s.append(time.perf_counter() - t0)
            sample_ppl.append(ppl(-float((logp * w).sum()) / count))
            lse = logp if lse is None else jnp.logaddexp(lse, logp)
    nll = -float(((lse - math.log(num_samples)) * w).sum()) / count
    return MCResult(
        perplexity=ppl(nll),
        nll=nll,
        sample_perplexities=tuple(sample_ppl),
        num_tokens=int(count),
        compile_s=compile_s,
        pass_s=tuple(pass_s),
    )
