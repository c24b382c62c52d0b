"""Analysis of the fully connected highway and plain nets (Srivastava et al.).

Pure functions over ``(net, params)`` pairs (figures: :mod:`rhnzoo.analysis.plots`):

* :func:`gate_statistics`: the four columns of the gate heatmaps ("Training Very
  Deep Networks", Fig. 2; the ECBM4040 report's heatmaps): trained T biases, mean
  T over many training images, T and the block outputs for one image, per
  highway layer x unit;
* :func:`highway_lesion_params` / :func:`highway_lesions` / :func:`iter_highway_lesions`:
  remove one highway layer at a time by forcing its transform gate to 0 (y = x: the
  layer becomes the identity) and measure the training cross-entropy (Fig. 4); a plain
  net's layers are removed the same way, the layer passing its input through unchanged
  (:func:`lesioned_logits`);
* :func:`activation_statistics`, :func:`gradient_norms`, :func:`plain_diagnostics`:
  mean and variance of every layer's activations and the L2 norm of every
  layer's gradient, for plain nets with several activations and
  initialisations (the report's figures on why plain nets fail);
* :func:`load_highway_run`: rebuild a trained net from its workdir (the depth sweep's
  table and figures, which draw on these: :mod:`rhnzoo.studies.highway`).

Images are ``uint8 [N, m]`` (flattened, as :func:`rhnzoo.evaluation.split_data`
gives them); the nets see pixel / 255. The gate statistics and lesions take the engine's
``track`` (:func:`rhnzoo.engine.signals.track`): a progress bar over their batches and a
signal check before each, which raises :class:`~rhnzoo.engine.signals.Interrupted`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo import evaluation
from rhnzoo.analysis import flow
from rhnzoo.analysis.lm import LESION_BIAS, LesionResult, Track, lesion_snapshots
from rhnzoo.models.highway import FeedForwardNet
from rhnzoo.configs import highway as highway_configs
from rhnzoo.engine import evaluate as engine_evaluate
from rhnzoo.engine import workdir as workdir_lib

Array = jax.Array
Params = Any
PathLike = str | os.PathLike

__all__ = [
    "net_from_config",
    "load_highway_run",
    "GateStats",
    "gate_statistics",
    "highway_lesion_params",
    "lesioned_logits",
    "highway_lesions",
    "iter_highway_lesions",
    "activation_statistics",
    "gradient_norms",
    "plain_diagnostics",
]

# ----------------------------------------------------------------------------- runs


def net_from_config(config: Mapping[str, Any]) -> FeedForwardNet:
    """The :class:`FeedForwardNet` of a run's ``config.json`` (its
    :class:`~rhnzoo.configs.highway.HighwayConfig`; keys that are no field are ignored,
    fields it lacks take their defaults).

    Raises:
      ValueError: (one line) if it is not a highway-net run's config or a value is invalid.
    """
    try:
        return highway_configs.HighwayConfig.from_dict(config, strict=False).net()
    except ValueError as e:
        raise ValueError(f"not a highway-net run's config ({e})") from None


def load_highway_run(workdir: PathLike) -> tuple[FeedForwardNet, Params, dict[str, Any]]:
    """``(net, params, config)`` of a trained run: the best-validation parameters
    (else the latest checkpoint's) as jax arrays.

    Raises:
      ValueError: (one line) no config.json, not a highway-net config, no checkpoint,
        or checkpoint shapes that do not match the config.
    """
    workdir = pathlib.Path(workdir)
    config = workdir_lib.read_config(workdir)
    net = net_from_config(config)
    params = workdir_lib.restore_params(workdir)
    if params is None:
        raise ValueError(f"{workdir} has no checkpoint; train it first")
    params = jax.tree.map(jnp.asarray, params)
    shapes = lambda tree: jax.tree.map(lambda a: tuple(a.shape), tree)
    if shapes(jax.eval_shape(net.init, jax.random.key(0))) != shapes(params):
        raise ValueError(f"the checkpoint in {workdir} does not match its config.json")
    return net, params, config


# ---------------------------------------------------------------------------- gates


class GateStats(NamedTuple):
    """Per highway layer (rows, layers 2 .. depth) x unit (columns), float32 numpy.

    Attributes:
      t_bias: ``[depth - 1, n]`` the T-gate biases b_T.
      mean_t: ``[depth - 1, n]`` T averaged over ``num_examples`` images.
      sample_t: ``[depth - 1, n]`` T for one image.
      sample_output: ``[depth - 1, n]`` the layer outputs y for that image.
      num_examples: images averaged in ``mean_t``.
    """

    t_bias: np.ndarray
    mean_t: np.ndarray
    sample_t: np.ndarray
    sample_output: np.ndarray
    num_examples: int


@functools.lru_cache(maxsize=8)
def _stats_fn(net: FeedForwardNet):
    def f(params, images):
        return net.apply_with_stats(params, evaluation.inputs(images))[1]

    return jax.jit(f)


def split_batches(arrays: tuple[np.ndarray, ...], batch_size: int) -> engine_evaluate.Batches:
    """The batches ``(*parts, weights)`` of ``arrays`` (:func:`rhnzoo.evaluation.padded_slices`,
    the last one zero-padded with weight 0) for the engine's evaluation loop."""
    n = -(-len(arrays[0]) // batch_size)
    return engine_evaluate.Batches(
        n, lambda i: next(evaluation.padded_slices(arrays, batch_size, [i * batch_size]))
    )


@functools.lru_cache(maxsize=8)
def _gate_step(net: FeedForwardNet):
    """``eval_step(params, (images, weights))``: the weighted sum of the gates, ``[L, n]``."""

    def f(params, batch):
        images, weights = batch
        gates = net.apply_with_stats(params, evaluation.inputs(images))[1]["gates"]
        return jnp.einsum("lbn,b->ln", gates, weights)

    return f


def gate_statistics(
    net: FeedForwardNet,
    params: Params,
    images: np.ndarray,
    *,
    sample: int = 0,
    batch_size: int = 1000,
    track: Track | None = None,
) -> GateStats:
    """The four heatmap columns of Srivastava et al. Fig. 2 for a trained highway net.

    Args:
      net, params: a highway :class:`FeedForwardNet` and its parameters.
      images: ``uint8 [N, m]``; T is averaged over all N (the papers: 10,000
        training images).
      sample: index in ``images`` of the single image of columns 3 and 4.
      batch_size: images per jit call (the last batch is padded, weight 0).
      track: the engine's tracker over the batches (progress, signal check), if any.

    Returns:
      :class:`GateStats`.

    Raises:
      ValueError: for a plain net, no images, or ``sample`` outside [0, N).
      Interrupted: from ``track``, on a signal (between batches).
    """
    if net.kind != "highway":
        raise ValueError("gate statistics need a highway net")
    images = np.asarray(images)
    if not 0 <= sample < len(images):
        raise ValueError(f"sample must be in [0, {len(images)}), got {sample}")
    batches = split_batches((images,), batch_size)
    total = engine_evaluate.evaluate(_gate_step(net), params, batches, track=track)
    one = _stats_fn(net)(params, images[sample : sample + 1])
    n = net.width
    return GateStats(
        t_bias=np.asarray(params["layers"]["b"][:, n : 2 * n]),
        mean_t=np.asarray(total) / len(images),
        sample_t=np.asarray(one["gates"][:, 0]),
        sample_output=np.asarray(one["hidden"][1:, 0]),
        num_examples=len(images),
    )


# -------------------------------------------------------------------------- lesions


def highway_lesion_params(
    net: FeedForwardNet, params: Params, layer: int | Array, bias: float = LESION_BIAS
) -> Params:
    """Parameters with highway layer ``layer`` removed: its T bias set to ``bias``.

    With the default -1e4, T = sigmoid(x W_T - 1e4) is exactly 0 in float32 for
    any moderate x W_T, so y = x + T (H - x) = x: the layer is the identity, as
    when Srivastava et al. (Fig. 4) and the report remove it. The same bias closes
    the RHN micro-layers in :func:`rhnzoo.analysis.lm.lesion_params`.

    Args:
      net: a highway :class:`FeedForwardNet`; params: its parameters (not modified).
      layer: 0-based index among the ``depth - 1`` highway layers (network layer
        ``layer + 2``); may be a traced integer.
      bias: the T bias of the removed layer.

    Raises:
      ValueError: for a plain net or a (concrete) layer outside [0, depth - 1).
    """
    if net.kind != "highway":
        raise ValueError("lesioning needs a highway net (plain layers have no gate)")
    if isinstance(layer, int) and not 0 <= layer < net.depth - 1:
        raise ValueError(f"layer must be in [0, {net.depth - 1}), got {layer}")
    n = net.width
    b = params["layers"]["b"]
    row = jax.lax.dynamic_update_slice(b[layer], jnp.full((n,), bias, b.dtype), (n,))
    return {**params, "layers": {**params["layers"], "b": b.at[layer].set(row)}}


def lesioned_logits(net: FeedForwardNet, params: Params, layer: int | Array, x: Array) -> Array:
    """``x [B, m] float -> logits [B, C]`` of the net with layer ``layer`` removed (y = x).

    A highway net: :func:`highway_lesion_params` (its T gate forced to 0). A plain net:
    layer ``layer`` passes its input through unchanged (its output is its input, exactly),
    the only way to remove a layer of a plain net that keeps the rest as trained (its
    width in and out is the same, n).

    Args:
      layer: 0-based index among the ``depth - 1`` layers after the first (network layer
        ``layer + 2``); may be a traced integer.

    Raises:
      ValueError: for a (concrete) layer outside [0, depth - 1).
    """
    if isinstance(layer, int) and not 0 <= layer < net.depth - 1:
        raise ValueError(f"layer must be in [0, {net.depth - 1}), got {layer}")
    if net.kind == "highway":
        return net.apply(highway_lesion_params(net, params, layer), x)
    stack, layers = net.stack, params["layers"]

    def body(h, i_w_b):
        i, w, b = i_w_b
        return jnp.where(i == layer, h, stack.layer(h, w, b)[0]), None

    first = net.apply_with_stats(params, x)[1]["hidden"][0]  # h_1, the first (plain) layer
    steps = (jnp.arange(net.depth - 1), layers["W"], layers["b"])
    h = jax.lax.scan(body, first, steps)[0]
    return h @ params["output"]["W"] + params["output"]["b"]


@functools.lru_cache(maxsize=8)
def _lesioned_step(net: FeedForwardNet):
    """``eval_step((params, layer), (images, labels, weights)) -> xent_sums`` of ``net``
    with ``layer`` lesioned (:func:`lesioned_logits`; None: intact)."""

    def f(params_layer, batch):
        (params, layer), (images, labels, weights) = params_layer, batch
        if layer is None:
            return evaluation.highway_sums(net, params, batch)
        logits = lesioned_logits(net, params, layer, evaluation.inputs(images))
        return evaluation.xent_sums(logits, labels, weights)

    return f


def iter_highway_lesions(
    net: FeedForwardNet,
    params: Params,
    split: tuple[np.ndarray, np.ndarray],
    *,
    batch_size: int = 1000,
    track: Track | None = None,
) -> Iterator[LesionResult]:
    """:func:`highway_lesions` as it goes (:func:`rhnzoo.analysis.lm.lesion_snapshots`): a
    :class:`LesionResult` after the intact net's evaluation and after each removed layer's.

    Args:
      net, params: a highway or plain :class:`FeedForwardNet` and its parameters.
      split: ``(images uint8 [N, m], labels [N])``.
      batch_size: images per call.
      track: the engine's tracker: one bar over all ``depth x ceil(N / batch_size)``
        batches, a signal check before each.

    Raises:
      Interrupted: from ``track``, on a signal (between batches).
    """
    step, batches = _lesioned_step(net), split_batches(split, batch_size)

    def evaluate(layer: int | None, sub: Track | None) -> tuple[float, int]:
        lesion = None if layer is None else jnp.int32(layer)
        totals = engine_evaluate.evaluate(step, (params, lesion), batches, track=sub)
        sums = engine_evaluate.seed_rows(totals)[0]
        return sums["loss"] / sums["count"], int(sums["count"])

    return lesion_snapshots(evaluate, net.depth - 1, len(batches), track=track)


def highway_lesions(
    net: FeedForwardNet, params: Params, split: tuple[np.ndarray, np.ndarray], **options: Any
) -> LesionResult:
    """Removes each highway (or plain) layer in turn (:func:`lesioned_logits`) and
    measures the mean cross-entropy on ``split`` (Srivastava et al. Fig. 4: the training
    set): the last result of :func:`iter_highway_lesions` (``options``: its keywords,
    ``batch_size=1000``, ``track``).

    One jit-compiled evaluation, the removed layer a traced argument, serves the
    ``depth - 1`` lesions; the intact net is evaluated the same way.

    Returns:
      :class:`rhnzoo.analysis.lm.LesionResult`: ``base_nll`` the intact net's and
      ``nll [depth - 1]`` each lesion's mean cross-entropy (nats per image),
      ``num_tokens`` = N images.

    Raises:
      Interrupted: from ``track``, on a signal (keep the finished lesions with
        :func:`iter_highway_lesions`).
    """
    return collections.deque(iter_highway_lesions(net, params, split, **options), maxlen=1)[0]


# --------------------------------------------------------- activations and gradients


@functools.lru_cache(maxsize=16)
def _layer_stats_fn(net: FeedForwardNet):
    def f(params, images, labels):
        x = evaluation.inputs(images)
        hidden = net.apply_with_stats(params, x)[1]["hidden"]  # [depth, B, n]
        grads = jax.grad(
            lambda p: evaluation.xent_sums(net.apply(p, x), labels)["loss"] / labels.shape[0]
        )(params)
        # The input layer, then the depth - 1 stacked layers (rhnzoo.analysis.flow).
        norms = flow.per_layer_norms(
            [jax.tree.map(lambda a: a[None], grads["input"]), grads["layers"]]
        )
        return {
            "mean": hidden.mean(axis=(1, 2)),
            "variance": hidden.var(axis=(1, 2)),
            "grad_norm": norms,
        }

    return jax.jit(f)


@functools.lru_cache(maxsize=16)
def _init_fn(net: FeedForwardNet):
    return jax.jit(net.init)


def activation_statistics(
    net: FeedForwardNet, params: Params, images: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of each hidden layer's activations over the images and units.

    Args:
      net, params: any :class:`FeedForwardNet`; images: ``uint8 [B, m]``, one batch.

    Returns:
      ``(mean [depth], variance [depth])`` float32: for layer l, the mean and
      (population) variance of h_l over all B x n values.
    """
    labels = np.zeros(len(images), np.int32)
    out = _layer_stats_fn(net)(params, np.asarray(images), labels)
    return np.asarray(out["mean"]), np.asarray(out["variance"])


def gradient_norms(
    net: FeedForwardNet, params: Params, images: np.ndarray, labels: np.ndarray
) -> np.ndarray:
    """L2 norm of each hidden layer's gradient of the batch's mean cross-entropy.

    Layer 1 is the input layer (W_in, b_in); layer l >= 2 the l-th layer's W and
    b (for highway, H and T together). Returns ``[depth]`` float32.
    """
    out = _layer_stats_fn(net)(params, np.asarray(images), np.asarray(labels, np.int32))
    return np.asarray(out["grad_norm"])


def plain_diagnostics(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    depth: int,
    width: int = 71,
    num_classes: int = 10,
    activations: Sequence[str] = ("relu", "sigmoid", "tanh"),
    kernel_inits: Sequence[str] = ("glorot_uniform", "he_normal"),
    seed: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
    """Layer statistics of freshly initialised plain nets, activation x initialisation.

    The ECBM4040 report's diagnosis of plain nets (mean and variance of every
    layer's activations, L2 norm of every layer's gradient, for relu, sigmoid and
    tanh with Glorot or He initialisation), computed here at initialisation on
    one batch: a net that starts with vanishing or exploding activations and
    gradients cannot be rescued by a small learning rate.

    Args:
      images, labels: one batch, ``uint8 [B, m]`` and ``int [B]``.
      depth, width, num_classes: the plain nets' shape.
      activations, kernel_inits: the grid.
      seed: every net is initialised from ``PRNGKey(seed)``.

    Returns:
      ``{'<activation>, <init>': {'mean': [depth], 'variance': [depth],
      'grad_norm': [depth]}}``.
    """
    images = np.asarray(images)
    out = {}
    for act in activations:
        for init in kernel_inits:
            net = FeedForwardNet("plain", depth, width, images.shape[1], num_classes, act, init)
            # One compilation per initialisation (the activation does not enter init) and
            # one per activation (the statistics do not depend on how params were drawn).
            params = _init_fn(dataclasses.replace(net, activation="tanh"))(jax.random.key(seed))
            same = dataclasses.replace(net, kernel_init=kernel_inits[0])
            stats = _layer_stats_fn(same)(params, images, np.asarray(labels, np.int32))
            out[f"{act}, {init.split('_')[0].capitalize()}"] = {
                k: np.asarray(v) for k, v in stats.items()
            }
    return out
