"""Analysis of trained RHN / HSG language models: gates, lesions, MC dropout.

Pure functions over ``(model, params)`` pairs (plots: :mod:`rhnzoo.analysis.plots`):

* :func:`load_run`: rebuild the :class:`~rhnzoo.models.lm.LanguageModel` of a training
  workdir (:func:`rhnzoo.training.lm.train`) and restore its best parameters;
* :func:`gate_activity`: every micro-layer's transform gate T (and the HSG gate
  g) over a token sequence; :func:`plot_gate_heatmap` draws the mean T-gate
  activity per micro-layer over time (Zilly et al. 2017, sec. 6, Fig. 5b);
* :func:`lesion_params` / :func:`lesion_layers`: switch off one micro-layer at a
  time by forcing its transform gate shut (T = 0, so s^[l] = s^[l-1]) and
  measure the loss (Zilly et al. 2017, sec. 6); :func:`plot_lesion`;
* :func:`hsg_gate_sample` / :func:`plot_gate_histogram`: HSG gate values at
  random time steps (Shoham & Permuter, Fig. 7);
* :func:`mc_dropout_perplexity`: Monte-Carlo dropout evaluation as in the
  reference code's ``evaluate_mc`` (``rhn_train.py``, ``mc_steps``).

"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo import cells, dropout
from rhnzoo.models import lm
from rhnzoo.training import engine
from rhnzoo.training import lm as lm_training
from rhnzoo.training import workdir as workdir_lib

Array = jax.Array
Params = Any
PathLike = str | os.PathLike

__all__ = ["LESION_BIAS", "load_run", "run_label", "Gates", "gate_activity", "hsg_gate_sample",
           "lesion_params", "LesionResult", "lesion_layers", "MCResult", "make_mc_pass",
           "mc_dropout_perplexity"]  # fmt: skip

# config.json keys forwarded to lm.language_model when present (cell options only when
# the run's cell takes them).
_MODEL_KEYS = ("tied", "init_scale", "hsg_init_bias", "unroll")

# Bias that closes a transform gate: sigmoid(-1e4 + anything moderate) is exactly
# 0.0 in float32, so the lesioned micro-layer passes its input through unchanged.
LESION_BIAS = -1e4


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
      workdir: a directory written by :func:`rhnzoo.training.lm.train`.

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
        raise ValueError(f"{workdir / 'config.json'} lacks {', '.join(missing)}; cannot "
                         "rebuild the model")  # fmt: skip
    params = engine.restore_params(workdir)
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
        **cells.applicable(cell, {k: config[k] for k in lm_training.CELL_KEYS if k in config}),
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
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    _rhn_parts(model, params)
    if carry is None:
        carry = model.initial_carry(tokens.shape[0])
    _, (t, g) = _gate_scan(model, params, carry, tokens)
    return Gates(t, g)


def hsg_gate_sample(
    model: lm.LanguageModel, params: Params, tokens: Array, num_times: int, seed: int = 0
) -> np.ndarray:
    """HSG gate values at ``num_times`` random time steps (Shoham & Permuter, Fig. 7).

    Args:
      model, params: an HSG(RHN) language model.
      tokens: ``[B, T]`` int ids; the gates are computed from a zero state.
      num_times: time steps drawn uniformly without replacement (at most T).
      seed: NumPy seed of the draw.

    Returns:
      ``[num_times * B * n]`` float32 gate values g in (0, 1).

    Raises:
      ValueError: if the model has no HSG, or ``num_times`` is not in [1, T].
    """
    gates = gate_activity(model, params, tokens)
    if gates.g is None:
        raise ValueError("the model has no HSG gate")
    num_steps = gates.g.shape[0]
    if not 1 <= num_times <= num_steps:
        raise ValueError(f"num_times must be in [1, {num_steps}], got {num_times}")
    times = np.random.default_rng(seed).choice(num_steps, num_times, replace=False)
    return np.asarray(gates.g)[np.sort(times)].reshape(-1)


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
        return math.exp(self.base_nll)

    @property
    def ppl(self) -> np.ndarray:
        """``[L]`` perplexity with micro-layer l lesioned (inf on overflow)."""
        with np.errstate(over="ignore"):
            return np.exp(self.nll)

    @property
    def delta_nll(self) -> np.ndarray:
        """``[L]`` loss increase (nats/token) = log(ppl_lesioned / ppl_intact)."""
        return self.nll - self.base_nll

    @property
    def delta_ppl(self) -> np.ndarray:
        return self.ppl - self.base_ppl


def lesion_layers(
    model: lm.LanguageModel,
    params: Params,
    tokens: np.ndarray,
    *,
    batch_size: int = 20,
    num_steps: int = 35,
    bias: float = LESION_BIAS,
) -> LesionResult:
    """Lesions each micro-layer in turn and measures the loss on ``tokens`` (Zilly et al. sec. 6).

    Evaluation is :func:`rhnzoo.training.lm.make_evaluate` (no dropout, ``batch_size``
    rows, carry across windows of ``num_steps``), compiled once and reused for
    the intact and the L lesioned parameter sets.

    Args:
      model, params: RHN or HSG(RHN) language model and its parameters.
      tokens: ``[N]`` int token stream (e.g. a slice of the training set).
      batch_size, num_steps: evaluation rows and window length.
      bias: the T-gate bias of a lesioned layer (:func:`lesion_params`).

    Returns:
      :class:`LesionResult` (nats/token; perplexities via its properties).

    Raises:
      ValueError: for another cell type, or ``tokens`` too short for ``batch_size``.
    """
    rhn, *_ = _rhn_parts(model, params)
    evaluate = lm_training.make_evaluate(model)
    base, count = evaluate(params, tokens, batch_size, num_steps)
    nll = [
        evaluate(lesion_params(model, params, layer, bias), tokens, batch_size, num_steps)[0]
        for layer in range(rhn.depth)
    ]
    return LesionResult(base / count, np.asarray(nll) / count, int(count))


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


def make_mc_pass(model: lm.LanguageModel, rates: dropout.Rates):
    """Returns ``mc_pass(params, x, y, key) -> log p [W, B, T]``, jit-compiled.

    ``x, y [W, B, T]`` are the windows of :func:`rhnzoo.training.lm.eval_windows`. One
    set of dropout masks (:func:`rhnzoo.dropout.lm_masks`, ``rates``) is drawn
    from ``key`` for the whole pass: the word mask per (row, word type), the
    input/state/output masks per row, shared by every window, as the reference
    code draws them once per pass over the data. The carry runs across windows.
    Output: log-probability (nats) of each target under that mask draw.
    """
    @jax.jit
    def mc_pass(params, x, y, key):
        num_windows, batch, num_steps = x.shape
        rows = x.transpose(1, 0, 2).reshape(batch, num_windows * num_steps)
        masks = model.dropout_masks(key, rows, rates)
        mask_x = masks["x"].reshape(batch, num_windows, num_steps).transpose(1, 0, 2)

        def body(carry, window):
            xw, yw, mxw = window
            carry, ys = model.hidden(params, carry, xw, dict(masks, x=mxw))
            logp = jax.nn.log_softmax(model.logits(params, ys))  # [T, B, V]
            target = jnp.take_along_axis(logp, yw.T[..., None], axis=-1)[..., 0]
            return carry, target.T

        _, logp = jax.lax.scan(body, model.initial_carry(batch), (x, y, mask_x))
        return logp

    return mc_pass


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
      num_steps: window length of the scan (any value gives the same result up
        to float rounding: the masks are per pass, not per window).

    Returns:
      :class:`MCResult` with the perplexity and its cost in seconds.

    Raises:
      ValueError: if ``num_samples < 1`` or the stream is too short.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    x, y, w = lm_training.eval_windows(np.asarray(tokens), batch_size, num_steps)
    x, y, w = jnp.asarray(x), jnp.asarray(y), jnp.asarray(w)
    key = jax.random.PRNGKey(seed)
    t0 = time.perf_counter()
    mc_pass = make_mc_pass(model, rates).lower(params, x, y, key).compile()
    compile_s = time.perf_counter() - t0
    count = float(w.sum())
    lse, sample_ppl, pass_s = None, [], []
    for k in range(num_samples):
        t0 = time.perf_counter()
        logp = mc_pass(params, x, y, jax.random.fold_in(key, k))
        logp.block_until_ready()
        pass_s.append(time.perf_counter() - t0)
        sample_ppl.append(lm_training.perplexity(-float((logp * w).sum()), count))
        lse = logp if lse is None else jnp.logaddexp(lse, logp)
    nll = -float(((lse - math.log(num_samples)) * w).sum()) / count
    return MCResult(
        perplexity=lm_training.perplexity(nll, 1.0),
        nll=nll,
        sample_perplexities=tuple(sample_ppl),
        num_tokens=int(count),
        compile_s=compile_s,
        pass_s=tuple(pass_s),
    )
