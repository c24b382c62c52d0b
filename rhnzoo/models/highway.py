"""Feed-forward Highway layers and their plain counterpart (Srivastava et al.).

Srivastava, Greff & Schmidhuber, "Training Very Deep Networks" (NeurIPS 2015).
Each Highway layer maps ``x [..., n] -> y [..., n]`` with (eq. 3)

  H = activation(x W_H + b_H),  T = sigmoid(x W_T + b_T)
  y = H * T + x * (1 - T)

and the plain layer of the paper's comparison is ``y = activation(x W + b)``.
Like the cells of :mod:`rhnzoo.cells`, a layer stack is a frozen dataclass of
hyperparameters with pure ``init``/``apply`` functions over a params dict. The
``depth`` layers' weights are stacked (``W [depth, n, k n]``, ``b [depth, k n]``)
and the depth loop is a ``jax.lax.scan``, so compile time does not grow with
depth. Weights are He-normal (truncated normal, variance 2 / n, fan-in of each
layer's matrix, ``jax.nn.initializers.he_normal``); biases are 0 except the T
bias, which starts at ``init_bias`` (negative: layers start close to identity).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rhnzoo.cells import check_positive

Array = jax.Array
Params = Any

# batch_axis=0: the layer axis of [depth, n, k n] is not part of the fan-in.
_kernel_init = jax.nn.initializers.he_normal(batch_axis=0)


@dataclasses.dataclass(frozen=True)
class _Stack:
    """Shared by Plain and Highway: hyperparameters, stacked init, the depth scan."""

    size: int
    depth: int = 1
    activation: Callable[[Array], Array] = jax.nn.relu

    def __post_init__(self):
        check_positive("size", self.size)
        check_positive("depth", self.depth)

    def _init(self, key: Array, biases: list[float]) -> Params:
        """Stacked ``{'W': [depth, n, k n], 'b': [depth, k n]}``; block i of b is biases[i]."""
        n, k = self.size, len(biases)
        b = jnp.repeat(jnp.asarray(biases, jnp.float32), n)
        return {
            "W": _kernel_init(key, (self.depth, n, k * n), jnp.float32),
            "b": jnp.tile(b, (self.depth, 1)),
        }

    def _scan(self, params: Params, x: Array) -> tuple[Array, Any]:
        """Applies ``self.layer(x, W_l, b_l) -> (x, aux)`` for l = 1..depth (``lax.scan``)."""
        return jax.lax.scan(lambda x, wb: self.layer(x, *wb), x, (params["W"], params["b"]))


@dataclasses.dataclass(frozen=True)
class Plain(_Stack):
    """A plain deep network: ``depth`` layers of ``y = activation(x W + b)``.

    Parameters: ``{'W': [depth, n, n], 'b': [depth, n]}`` float32, b = 0.

    Attributes:
      size: n, the width of every layer (input and output).
      depth: number of layers (>= 1).
      activation: elementwise nonlinearity (default ReLU).

    Raises:
      ValueError: if size < 1 or depth < 1.
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
      size, depth, activation: as for :class:`Plain`.
      init_bias: initial T bias (paper: -1 to -3; -inf makes every layer identity).
      coupled: use C = 1 - T.

    Raises:
      ValueError: if size < 1 or depth < 1.
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
