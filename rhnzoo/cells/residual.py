"""Recurrent residual learning (Wang & Tian, "Recurrent Residual Learning for
Sequence Classification", EMNLP 2016) as cells of the :mod:`rhnzoo.cells` protocol:
the recurrent residual network RRN (eqs. 3-4) and :class:`Parallel`, the combinator
behind the hybrid residual LSTM, HRL (eqs. 6-7).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rhnzoo.cells.base import (
    Array,
    Carry,
    Params,
    check_param_shapes,
    check_positive,
    project,
    uniform,
)

_ACTIVATIONS = {"sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh}


@dataclasses.dataclass(frozen=True)
class RRN:
    """Recurrent residual network cell (Wang & Tian 2016, eqs. 3-4).

    The new state is the old one plus a learned residual F, squashed::

      h_t = tanh(h_{t-1} + F(h_{t-1}, x_t))                          (eq. 3)

    where F is a K-layer transition in which the input enters every layer::

      y_1 = σ(W_1 x_t + U_1 h_{t-1} + b_1)
      y_k = σ(W_k x_t + U_k y_{k-1} + b_k),   k = 2..K                (eq. 4)
      F   = y_K

    σ is the inner ``activation``: ``'sigmoid'`` (the default) is the logistic function,
    as the paper defines σ. Note that a sigmoid F lies in (0, 1), so at initialisation
    (F ≈ 1/2) the state drifts to the fixed point of h = tanh(h + 1/2), h ≈ 0.88, where
    tanh' ≈ 0.22. ``'tanh'`` (F in (-1, 1), F ≈ 0 at init, so h_t ≈ tanh(h_{t-1})) is a
    common alternative; it is not the paper's definition.

    Parameters (a dict, row-vector convention ``x @ W``): ``W [m, K n]`` the K input
    matrices side by side (layer k in columns (k-1)n .. kn), so ``project_inputs`` does
    all K input projections in one matmul; ``b [K n]`` likewise (added in the step);
    ``U [K, n, n]`` stacked so that layers 2..K are one ``lax.scan`` (compile time does
    not grow with K). Weights uniform in [-init_scale, init_scale], biases zero.
    Parameter count K(m n + n² + n), half an LSTM's for K = 2.

    Carry: h ``[B, n]``; output h_t. The recurrent dropout ``mask`` ([B, n]) multiplies
    h_{t-1} where it enters U_1; the residual term of eq. 3 uses the undropped h_{t-1}.

    Attributes:
      hidden_size: n, units of h and of every layer of F.
      depth: K, layers in F (>= 1; paper: 2).
      activation: the inner σ, ``'sigmoid'`` or ``'tanh'``.
      init_scale: half-width of the uniform weight initialisation.
      recurrent_init: ``'uniform'`` (the default: U like W) or ``'orthogonal'`` (each
        U_k a random orthogonal matrix). Not specified by the paper; a flag of the RRN
        recipe study (docs/rrl.md).
      f_bias: initial bias b_K of F's last layer (default 0, eq. 4 as written). A
        negative value (highway-style) starts F near 0 with σ, so h_t ≈ h_{t-1} at
        initialisation instead of drifting to tanh's flat region. A deviation from
        the paper when non-zero (docs/rrl.md).

    Raises:
      ValueError: if hidden_size < 1, depth < 1, or activation or recurrent_init is
        unknown.
    """

    hidden_size: int
    depth: int = 2
    activation: str = "sigmoid"
    init_scale: float = 0.04
    recurrent_init: str = "uniform"
    f_bias: float = 0.0

    def __post_init__(self):
        check_positive("hidden_size", self.hidden_size)
        check_positive("depth", self.depth)
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.recurrent_init not in ("uniform", "orthogonal"):
            raise ValueError(
                f"recurrent_init must be 'uniform' or 'orthogonal', got {self.recurrent_init!r}"
            )

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, K n], 'U': [K, n, n], 'b': [K n]}`` float32.

        Raises ValueError if input_size < 1.
        """
        check_positive("input_size", input_size)
        n, K = self.hidden_size, self.depth
        kw, ku = jax.random.split(key)
        if self.recurrent_init == "orthogonal":
            ortho = jax.nn.initializers.orthogonal()
            U = jax.vmap(lambda k: ortho(k, (n, n), jnp.float32))(jax.random.split(ku, K))
        else:
            U = uniform(ku, (K, n, n), self.init_scale)
        return {
            "W": uniform(kw, (input_size, K * n), self.init_scale),
            "U": U,
            "b": jnp.zeros((K * n,), jnp.float32).at[(K - 1) * n :].set(self.f_bias),
        }

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the zero state ``[B, n]``."""
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., K n]``: W_k x of every layer, for all time steps, in one
        matmul. Raises ValueError (one line) if ``params`` are not this cell's for input
        size m (:meth:`check_params`)."""
        self.check_params(params, xs.shape[-1])
        return project(xs, params["W"])

    def check_params(self, params: Params, input_size: int | None = None) -> None:
        """Raises ValueError (one line) unless ``params`` are ``{'W': [m, K n], 'U':
        [K, n, n], 'b': [K n]}`` for this cell (m = ``input_size`` where given)."""
        n, K = self.hidden_size, self.depth
        want = {"W": (input_size, K * n), "U": (K, n, n), "b": (K * n,)}
        check_param_shapes(self, params, want, f"hidden size {n} and depth {K}")

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry`` h_{t-1} ``[B, n]``, ``x_proj [B, K n]`` -> ``(h_t, h_t)``,
        computed in the dtype of ``carry``."""
        self.check_params(params)
        n, K, dt = self.hidden_size, self.depth, carry.dtype
        act = _ACTIVATIONS[self.activation]
        U = params["U"].astype(dt)
        # [B, K n] -> [K, B, n]: layer k's input term W_k x_t + b_k.
        x_proj = x_proj.astype(dt) + params["b"].astype(dt)
        x_layers = jnp.moveaxis(x_proj.reshape(x_proj.shape[:-1] + (K, n)), -2, 0)
        h_in = carry if mask is None else carry * mask.astype(carry.dtype)
        y = act(x_layers[0] + h_in @ U[0])

        def layer(y, inputs):
            U_k, x_k = inputs
            return act(x_k + y @ U_k), None

        y, _ = jax.lax.scan(layer, y, (U[1:], x_layers[1:]))
        h = jnp.tanh(carry + y)
        return h, h


# σ' as a function of σ's output y, for each inner activation.
_DERIVATIVES = {"sigmoid": lambda y: y * (1 - y), "tanh": lambda y: 1 - y * y}


class RRNCoefficients(NamedTuple):
    """The local derivatives of one RRN step (Wang & Tian 2016, eqs. 3-4,
    differentiated): ∂h_t/∂s for eq. 3's pre-activation s = h_{t-1} + y_K, and each
    layer's ∂y_k/∂z_k, z_k its pre-activation. With dh the cotangent of h_t::

      ds = dh ⊙ dh_ds,  dz_K = ds ⊙ dy_dz[K-1],  dz_k = (U_{k+1} dz_{k+1}) ⊙ dy_dz[k-1]
      dh_{t-1} = ds + m ⊙ (U_1 dz_1)
    """

    dh_ds: Array  # 1 - h_t²
    dy_dz: tuple  # σ'(z_k) = y_k (1 - y_k) (sigmoid) or 1 - y_k² (tanh), k = 1..K


def rrn_coefficients(h: Array, ys: Sequence[Array], activation: str) -> RRNCoefficients:
    """The RRN step's derivative coefficients (:class:`RRNCoefficients`) from its values
    (eqs. 3-4; tanh' = 1 - tanh², σ' = σ (1 - σ)).

    Args:
      h: the step's new state h_t = tanh(h_{t-1} + y_K).
      ys: the layers' outputs y_1, ..., y_K (eq. 4).
      activation: the inner σ, ``'sigmoid'`` or ``'tanh'`` (:class:`RRN`).

    Every array of one shape (``[..., n]`` or feature-major ``[n, B]``, elementwise) and
    float dtype; returns that shape and dtype, ``dy_dz`` a tuple of K arrays.

    Raises:
      ValueError: for an unknown ``activation``.
    """
    if activation not in _DERIVATIVES:
        raise ValueError(f"activation must be one of {sorted(_DERIVATIVES)}, got {activation!r}")
    dact = _DERIVATIVES[activation]
    return RRNCoefficients(1 - h * h, tuple(dact(y) for y in ys))


@dataclasses.dataclass(frozen=True)
class Parallel:
    """Cells run side by side on the same input; the output is the mean of theirs.

    Wang & Tian's hybrid residual LSTM (HRL, 2016, eqs. 6-7) runs an LSTM and an RRN in
    parallel over the same input sequence and averages their hidden states at every step::

      h_t = (h^LSTM_t + h^RRN_t) / 2

    each cell keeping its own recurrence. ``Parallel((LSTM(n), RRN(n)))`` is HRL;
    ``Parallel((LSTM(n), GRU(n)))`` is the paper's LSTM+GRU baseline. Any number of
    cells of the protocol works; nothing is special-cased.

    Parameters: the tuple of the cells' params. Carry: the tuple of their carries.
    ``project_inputs`` returns the tuple of their projections (a pytree whose leaves all
    have time as the leading axis, so ``lax.scan`` and :func:`rhnzoo.cells.unroll` slice
    it like an array). Output: mean of the cells' outputs ``[B, n]``. The dropout
    ``mask`` ([B, n]) is passed to every cell.

    Attributes:
      cells: the cells (a tuple; a list is converted), all with the same hidden_size.

    Raises:
      ValueError: if there are no cells or their hidden sizes differ.
    """

    cells: tuple

    def __post_init__(self):
        object.__setattr__(self, "cells", tuple(self.cells))
        if not self.cells:
            raise ValueError("Parallel needs at least one cell")
        sizes = [c.hidden_size for c in self.cells]
        if len(set(sizes)) != 1:
            raise ValueError(f"Parallel cells must have the same hidden_size, got {sizes}")

    @property
    def hidden_size(self) -> int:
        return self.cells[0].hidden_size

    def init(self, key: Array, input_size: int) -> Params:
        """Returns the tuple of the cells' params (one key each).

        Raises ValueError if input_size < 1.
        """
        keys = jax.random.split(key, len(self.cells))
        return tuple(c.init(k, input_size) for c, k in zip(self.cells, keys))

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> tuple[Carry, ...]:
        """Returns the tuple of the cells' initial carries."""
        return tuple(c.initial_carry(batch_size, dtype) for c in self.cells)

    def project_inputs(self, params: Params, xs: Array) -> tuple[Array, ...]:
        """``xs [T, B, m]`` -> tuple of each cell's ``project_inputs`` (``[T, B, k_i]``)."""
        return tuple(c.project_inputs(p, xs) for c, p in zip(self.cells, params))

    def step(
        self, params: Params, carry: tuple, x_proj: tuple, mask: Array | None = None
    ) -> tuple[tuple, Array]:
        """One time step of every cell -> ``(tuple of carries, mean output [B, n])``."""
        new_carry, ys = [], []
        for cell, p, c, x in zip(self.cells, params, carry, x_proj):
            c, y = cell.step(p, c, x, mask)
            new_carry.append(c)
            ys.append(y)
        return tuple(new_carry), sum(ys) / len(ys)
