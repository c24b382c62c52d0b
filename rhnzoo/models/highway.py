"""Feed-forward Highway networks and their plain counterpart (Srivastava et al.).

Srivastava, Greff & Schmidhuber, "Highway Networks" (arXiv:1505.00387, 2015) and
"Training Very Deep Networks" (NeurIPS 2015). Each Highway layer maps
``x [..., n] -> y [..., n]`` with (eq. 3)

  H = activation(x W_H + b_H),  T = sigmoid(x W_T + b_T)
  y = H * T + x * (1 - T)

and the plain layer of the paper's comparison is ``y = activation(x W + b)``.
Like the cells of :mod:`rhnzoo.cells`, a layer stack is a frozen dataclass with pure
``init``/``apply`` functions over a params dict; the ``depth`` layers' weights are
stacked and the depth loop is a ``jax.lax.scan``, so compile time does not grow with
depth. Weights are He-normal by default (truncated normal, variance 2 / fan-in) or
Glorot-uniform (``kernel_init='glorot_uniform'``: U(-a, a), a = sqrt(6 / (n + n)), per
n x n block H, T, C, as Keras initialises each of a layer's matrices); biases are 0
except the T bias, ``init_bias`` (negative: layers start close to identity).
:class:`FeedForwardNet` is the fully connected classifier of the papers' depth experiments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rhnzoo.cells import check_positive
from rhnzoo.cells.base import flat_draw, uniform
from rhnzoo.models import num_params as count_params

Array = jax.Array
Params = Any

# Weight initialisers by name: jax.nn.initializers' numbers to the bit (a test holds
# this), drawn flat (`flat_draw`: faster to compile on the CPU). `shape` is [..., fan_in,
# fan_out], leading axes batch axes (stacked weights: [depth, k, n, n], then H|T(|C)).


def _he_normal(key: Array, shape: tuple[int, ...]) -> Array:
    """He et al. 2015: truncated at +-2 sd, then scaled to variance 2 / fan_in."""
    std = jnp.sqrt(jnp.float32(2.0 / shape[-2])) / jnp.float32(0.87962566103423978)
    return (
        flat_draw(jax.random.truncated_normal, key, shape, lower=-2, upper=2, dtype=jnp.float32)
        * std
    )


def _glorot_uniform(key: Array, shape: tuple[int, ...]) -> Array:
    """Glorot & Bengio 2010, eq. 16: U(-a, a), a = sqrt(6 / (fan_in + fan_out))."""
    variance = jnp.float32(1.0 / ((shape[-2] + shape[-1]) / 2))
    return uniform(key, shape, 1.0) * jnp.sqrt(3 * variance)


INITS = {"he_normal": _he_normal, "glorot_uniform": _glorot_uniform}
ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "sigmoid": jax.nn.sigmoid}


def check_choice(name: str, value: str, choices) -> None:
    """Raises ValueError (one line) unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


@dataclasses.dataclass(frozen=True)
class _Stack:
    """Shared by Plain and Highway: hyperparameters, stacked init, the depth scan."""

    size: int
    depth: int = 1
    activation: Callable[[Array], Array] | str = jax.nn.relu
    kernel_init: str = "he_normal"

    def __post_init__(self):
        check_positive("size", self.size)
        check_positive("depth", self.depth)
        check_choice("kernel_init", self.kernel_init, INITS)
        if isinstance(self.activation, str):  # a name of ACTIVATIONS: its function
            check_choice("activation", self.activation, ACTIVATIONS)
            object.__setattr__(self, "activation", ACTIVATIONS[self.activation])
        elif not callable(self.activation):
            raise ValueError(
                f"activation must be a callable or one of {', '.join(ACTIVATIONS)}; "
                f"got {self.activation!r}"
            )

    def _init(self, key: Array, biases: list[float]) -> Params:
        """Stacked ``{'W': [depth, n, k n], 'b': [depth, k n]}``; block i of b is biases[i]."""
        n, k = self.size, len(biases)
        b = jnp.repeat(jnp.asarray(biases, jnp.float32), n)
        w = INITS[self.kernel_init](key, (self.depth, k, n, n))  # block j: [n, n]
        return {
            "W": w.transpose(0, 2, 1, 3).reshape(self.depth, n, k * n),
            "b": jnp.tile(b, (self.depth, 1)),
        }

    def _scan(self, params: Params, x: Array, outputs: bool = False) -> tuple[Array, Any]:
        """Applies ``self.layer(x, W_l, b_l) -> (x, aux)`` for l = 1..depth (one
        ``lax.scan``; an integer ``x`` in W's dtype): ``(y, auxs)``, or ``(y, (ys,
        auxs))`` with every layer's output if ``outputs`` (a trace-time switch: without it
        nothing else is stacked)."""

        def body(x, wb):
            y, aux = self.layer(x, *wb)
            return y, ((y, aux) if outputs else aux)

        if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):  # integer pixels: W's dtype
            x = jnp.asarray(x, params["W"].dtype)
        return jax.lax.scan(body, x, (params["W"], params["b"]))

    def apply_with_outputs(self, params: Params, x: Array) -> tuple[Array, tuple[Array, Any]]:
        """``x [..., n] -> (y [..., n], (ys [depth, ..., n], aux))``: every layer's
        output (``ys[-1] = y``) and its aux (T gates ``[depth, ..., n]`` for Highway,
        None for Plain)."""
        return self._scan(params, x, outputs=True)


@dataclasses.dataclass(frozen=True)
class Plain(_Stack):
    """A plain deep network: ``depth`` layers of ``y = activation(x W + b)``.

    Parameters: ``{'W': [depth, n, n], 'b': [depth, n]}`` float32, b = 0.

    Attributes:
      size: n, the width of every layer (input and output).
      depth: number of layers (>= 1).
      activation: elementwise nonlinearity ``[..., n] -> [..., n]`` (default ReLU): a
        callable, or a name of :data:`ACTIVATIONS` (``'tanh'``, ``'relu'``,
        ``'sigmoid'``), which construction replaces by its function.
      kernel_init: ``'he_normal'`` (default) or ``'glorot_uniform'`` (see the module docstring).

    Raises:
      ValueError: (one line) if size < 1, depth < 1, kernel_init is unknown, or
        activation is neither callable nor a name of :data:`ACTIVATIONS`.
    """

    def init(self, key: Array) -> Params:
        """Returns ``{'W': [depth, n, n], 'b': [depth, n]}`` float32."""
        return self._init(key, [0.0])

    def layer(self, x: Array, W: Array, b: Array) -> tuple[Array, None]:
        """One layer ``x [..., n] -> (y [..., n], None)``; computes in ``x.dtype``."""
        return self.activation(x @ W.astype(x.dtype) + b.astype(x.dtype)), None

    def apply(self, params: Params, x: Array) -> Array:
        """``x [..., n] -> y [..., n]`` through all ``depth`` layers."""
        return self._scan(params, x)[0]


@dataclasses.dataclass(frozen=True)
class Highway(_Stack):
    """``depth`` Highway layers (Srivastava et al. 2015, eq. 3; eq. 2 if uncoupled).

    With ``coupled=True`` (eq. 3, the paper's choice) the carry gate is C = 1 - T,
    computed as y = x + T (H - x). With ``coupled=False`` (eq. 2) a separate gate
    C = sigmoid(x W_C + b_C) gives y = H T + x C; b_C starts at ``-init_bias``.

    Parameters: ``{'W': [depth, n, k n], 'b': [depth, k n]}`` float32, with H|T(|C)
    fused into one matmul per layer; k = 2 if coupled, 3 otherwise.

    Attributes:
      size, depth, activation, kernel_init: as for :class:`Plain`.
      init_bias: initial T bias (paper: -1 to -3; -inf makes every layer identity).
      coupled: use C = 1 - T.

    Raises:
      ValueError: (one line) as for :class:`Plain`: size < 1, depth < 1, an unknown
        kernel_init, or an activation neither callable nor a name of :data:`ACTIVATIONS`.
    """

    init_bias: float = -2.0
    coupled: bool = True

    def init(self, key: Array) -> Params:
        """Returns ``{'W': [depth, n, k n], 'b': [depth, k n]}`` float32."""
        t_bias = self.init_bias
        return self._init(key, [0.0, t_bias] if self.coupled else [0.0, t_bias, -t_bias])

    def layer(self, x: Array, W: Array, b: Array) -> tuple[Array, Array]:
        """One layer ``x [..., n] -> (y [..., n], T [..., n])``; computes in ``x.dtype``."""
        n = self.size
        z = x @ W.astype(x.dtype) + b.astype(x.dtype)
        h = self.activation(z[..., :n])
        t = jax.nn.sigmoid(z[..., n : 2 * n])
        if self.coupled:
            return x + t * (h - x), t
        return h * t + x * jax.nn.sigmoid(z[..., 2 * n :]), t

    def apply_with_gates(self, params: Params, x: Array) -> tuple[Array, Array]:
        """``x [..., n] -> (y [..., n], T [depth, ..., n])``, every layer's T gate.

        For gate heatmaps and lesioning (Srivastava et al., section 4). Under ``jit``
        the gates that ``apply`` drops are dead code.
        """
        return self._scan(params, x)

    def apply(self, params: Params, x: Array) -> Array:
        """``x [..., n] -> y [..., n]`` through all ``depth`` layers."""
        return self.apply_with_gates(params, x)[0]


KINDS = ("highway", "plain")


@dataclasses.dataclass(frozen=True)
class FeedForwardNet:
    """The fully connected classifier of the papers' depth experiments.

    Srivastava et al., "Training Very Deep Networks", sec. 3.1 and Fig. 1 (and the
    ECBM4040 reproduction by Yarali & Kostic 2021): ``x [B, m] -> logits [B, C]`` with

      h_1 = activation(x W_in + b_in)            plain layer, m -> n
      h_l = layer(h_{l-1}),  l = 2 .. depth      highway (eq. 3) or plain, n -> n
      logits = h_depth W_out + b_out             linear, n -> C (softmax in the loss)

    Parameters (float32): ``{'input': {'W': [m, n], 'b': [n]}, 'layers': {'W':
    [depth - 1, n, k n], 'b': [depth - 1, k n]}, 'output': {'W': [n, C], 'b': [C]}}``
    with k = 2 (H|T, see :class:`Highway`) or 1 (plain). Every weight matrix is drawn
    by ``kernel_init``; biases are 0 except the T biases, ``transform_bias``.

    Attributes:
      kind: ``'highway'`` or ``'plain'``.
      depth: hidden layers in all, >= 2: the first (plain) layer and ``depth - 1``
        highway or plain layers (the paper's 10, 20, 50, 100 = 1 + 9, 19, 49, 99).
      width: n (the paper: 50 for highway, 71 for plain, about 5,000 parameters per
        layer either way).
      input_size: m, the flattened input (784 for MNIST, 3072 for CIFAR).
      num_classes: C >= 2.
      activation: ``'tanh'``, ``'relu'`` or ``'sigmoid'``: H and every plain layer,
        the first included.
      kernel_init: ``'glorot_uniform'`` or ``'he_normal'``.
      transform_bias: initial T bias b_T (papers: -1 to -10); unused for plain.

    Raises:
      ValueError: (one line) for an unknown kind, activation or kernel_init, depth <
        2, width or input_size < 1, or num_classes < 2.
    """

    kind: str = "highway"
    depth: int = 10
    width: int = 50
    input_size: int = 784
    num_classes: int = 10
    activation: str = "tanh"
    kernel_init: str = "glorot_uniform"
    transform_bias: float = -2.0

    def __post_init__(self):
        check_choice("kind", self.kind, KINDS)
        check_choice("activation", self.activation, ACTIVATIONS)
        check_choice("kernel_init", self.kernel_init, INITS)
        if not isinstance(self.depth, int) or self.depth < 2:
            raise ValueError(
                f"depth must be an integer >= 2 (a first layer and at least one "
                f"{self.kind} layer), got {self.depth!r}"
            )
        check_positive("width", self.width)
        check_positive("input_size", self.input_size)
        if not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {self.num_classes!r}")

    @property
    def stack(self) -> Highway | Plain:
        """The ``depth - 1`` highway or plain layers after the first."""
        act = ACTIVATIONS[self.activation]
        if self.kind == "highway":
            return Highway(
                self.width, self.depth - 1, act, self.kernel_init, init_bias=self.transform_bias
            )
        return Plain(self.width, self.depth - 1, act, self.kernel_init)

    def init(self, key: Array) -> Params:
        """Returns the parameter dict (see the class docstring)."""
        k_in, k_layers, k_out = jax.random.split(key, 3)
        m, n, c = self.input_size, self.width, self.num_classes
        return {
            "input": {
                "W": INITS[self.kernel_init](k_in, (m, n)),
                "b": jnp.zeros((n,), jnp.float32),
            },
            "layers": self.stack.init(k_layers),
            "output": {
                "W": INITS[self.kernel_init](k_out, (n, c)),
                "b": jnp.zeros((c,), jnp.float32),
            },
        }

    def num_params(self) -> int:
        """Number of scalar parameters (no allocation): :func:`rhnzoo.models.num_params`."""
        return count_params(self)

    def _first(self, params: Params, x: Array) -> Array:
        if x.shape[-1] != self.input_size:
            raise ValueError(f"inputs must be [B, {self.input_size}], got {x.shape}")
        p = params["input"]
        return ACTIVATIONS[self.activation](x @ p["W"] + p["b"])

    def _output(self, params: Params, h: Array) -> Array:
        return h @ params["output"]["W"] + params["output"]["b"]

    def apply(self, params: Params, x: Array) -> Array:
        """``x [B, m] float -> logits [B, C]`` (unnormalised log-probabilities)."""
        h = self.stack.apply(params["layers"], self._first(params, x))
        return self._output(params, h)

    def apply_with_stats(self, params: Params, x: Array) -> tuple[Array, dict[str, Array]]:
        """``x [B, m] -> (logits [B, C], stats)`` for the analyses (gate heatmaps,
        activation statistics).

        ``stats['hidden']``: ``[depth, B, n]``, every hidden layer's output h_1 ..
        h_depth; ``stats['gates']`` (highway only): ``[depth - 1, B, n]``, the T gate
        of layers 2 .. depth.
        """
        h1 = self._first(params, x)
        h, (hs, gates) = self.stack.apply_with_outputs(params["layers"], h1)
        stats = {"hidden": jnp.concatenate([h1[None], hs])}
        if gates is not None:
            stats["gates"] = gates
        return self._output(params, h), stats
