"""Deep Transition RNNs, DT-RNN and DT(S)-RNN (Pascanu et al., ICLR 2014), the
baselines of the JSB Chorales optimisation study (Zilly et al. 2017, sec. 5.1)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells.base import (
    Array,
    Params,
    check_param_shapes,
    check_positive,
    project,
    uniform,
)


@dataclasses.dataclass(frozen=True)
class _DeepTransitionRNN:
    """Shared code of :class:`DTRNN` and :class:`DTSRNN` (see their docstrings)."""

    hidden_size: int
    depth: int = 1
    init_scale: float = 0.04

    shortcuts = False  # class constant, not a field: DT(S)-RNN sets it

    def __post_init__(self):
        check_positive("hidden_size", self.hidden_size)
        check_positive("depth", self.depth)

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, n], 'R': [L, n, n], 'b': [L, n]}`` (+ ``'S': [L-1, n, n]`` for
        DT(S)-RNN), float32, every entry uniform in [-init_scale, init_scale]."""
        check_positive("input_size", input_size)
        n, L = self.hidden_size, self.depth
        kw, kr, kb, ks = jax.random.split(key, 4)
        params = {
            "W": uniform(kw, (input_size, n), self.init_scale),
            "R": uniform(kr, (L, n, n), self.init_scale),
            "b": uniform(kb, (L, n), self.init_scale),
        }
        if self.shortcuts:
            params["S"] = uniform(ks, (L - 1, n, n), self.init_scale)
        return params

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the zero state ``[B, n]``."""
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., n]``: W x for all time steps in one matmul.

        Raises ValueError (one line) if ``params`` are not this cell's for input size m
        (:meth:`check_params`)."""
        self.check_params(params, xs.shape[-1])
        return project(xs, params["W"])

    def check_params(self, params: Params, input_size: int | None = None) -> None:
        """Raises ValueError (one line) unless ``params`` have :meth:`init`'s keys and
        shapes for this cell (m = ``input_size`` where given); shapes only."""
        n, L = self.hidden_size, self.depth
        want = {"W": (input_size, n), "R": (L, n, n), "b": (L, n)}
        if self.shortcuts:
            want["S"] = (L - 1, n, n)
        check_param_shapes(self, params, want, f"hidden size {n} and depth {L}")

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry`` h_{t-1} ``[B, n]``, ``x_proj`` W x_t ``[B, n]`` ->
        ``(h_t, h_t)``, both ``[B, n]`` in the dtype of ``carry``."""
        self.check_params(params)
        dt = carry.dtype

        def dropped(h):
            return h if mask is None else h * mask.astype(dt)

        h_prev = dropped(carry)
        h = jnp.tanh(
            x_proj.astype(dt) + h_prev @ params["R"][0].astype(dt) + params["b"][0].astype(dt)
        )
        layers = (params["R"][1:].astype(dt), params["b"][1:].astype(dt))
        if self.shortcuts:
            # S_l h_{t-1} for every layer l >= 2 at once: [L-1, B, n].
            layers += (jnp.einsum("bn,lnk->lbk", h_prev, params["S"].astype(dt)),)

        def body(h, layer):
            z = dropped(h) @ layer[0] + layer[1]
            if self.shortcuts:
                z = z + layer[2]
            return jnp.tanh(z), None

        h, _ = jax.lax.scan(body, h, layers)
        return h, h


@dataclasses.dataclass(frozen=True)
class DTRNN(_DeepTransitionRNN):
    """Deep Transition RNN (Pascanu, Gulcehre, Cho & Bengio, "How to Construct Deep
    Recurrent Neural Networks", ICLR 2014, arXiv:1312.6026, sec. 3.2.3 and Fig. 2(b)).

    The transition h_{t-1} -> h_t is an L-layer tanh MLP; the input enters the first
    layer. With h^[0] = h_{t-1}:

      h^[1] = tanh(W x_t + R_1 h_{t-1} + b_1)
      h^[l] = tanh(R_l h^[l-1] + b_l),            l = 2..L
      h_t   = h^[L]

    i.e. the paper's h_t = φ_L(W_L φ_{L-1}(... φ_1(W_1 h_{t-1} + U x_t))) with tanh for
    every φ and a bias per layer, as in the authors' GroundHog implementation
    (``RecurrentMultiLayer``, whose docstring calls it "a DT-RNN model"). L = 1 is the
    plain tanh RNN. Only h^[L] is carried to t + 1.

    Parameters (a dict, row-vector convention ``x @ W``): ``W [m, n]`` input weights,
    ``R [L, n, n]`` the layers' weights stacked so that layers 2..L are one ``lax.scan``
    (compile time does not grow with L; layer 1 is peeled off because it adds W x_t),
    ``b [L, n]`` biases. Everything is initialised uniform in [-init_scale, init_scale],
    like :class:`RHN`. Parameter count: m n + L n² + L n.

    The recurrent dropout ``mask`` ([B, n]) multiplies the state entering every layer,
    h_{t-1} and h^[1..L-1], as :class:`RHN` does for its micro-layers.

    Attributes:
      hidden_size: n, units per layer (every layer has n units).
      depth: transition depth L (>= 1), the number of tanh layers per time step.
      init_scale: half-width of the uniform initialisation.

    Raises:
      ValueError: if hidden_size < 1 or depth < 1.
    """


@dataclasses.dataclass(frozen=True)
class DTSRNN(_DeepTransitionRNN):
    """Deep Transition RNN with shortcut connections, DT(S)-RNN (Pascanu et al., ICLR 2014,
    arXiv:1312.6026, sec. 3.2.3 and Fig. 2(b*)).

    The paper adds to the DT-RNN "shortcut connections" from h_{t-1} that skip the
    intermediate layers of the deep transition, so the gradient has a one-layer path
    back in time. We implement the authors' GroundHog layer
    ``RecurrentMultiLayerShortPath`` ("shortcut connections in the MLP representing the
    transition from previous hidden state to the next"): every layer after the first
    also sees h_{t-1} through its own matrix S_l; the input enters only layer 1:

      h^[1] = tanh(W x_t + R_1 h_{t-1} + b_1)
      h^[l] = tanh(R_l h^[l-1] + S_l h_{t-1} + b_l),   l = 2..L
      h_t   = h^[L]

    For L = 2 (the only depth the paper trains) this is exactly Fig. 2(b*): one shortcut
    h_{t-1} -> h_t around the intermediate layer. For L > 2 the intermediate layers get
    shortcuts too (GroundHog's choice). L = 1 is the plain tanh RNN, identical to
    ``DTRNN(n, 1)``.

    Parameters: those of :class:`DTRNN` plus ``S [L-1, n, n]`` (uniform in
    [-init_scale, init_scale]); the L-1 shortcut products S_l h_{t-1} are one einsum per
    time step. Parameter count: m n + (2L - 1) n² + L n. The dropout ``mask`` multiplies
    the state entering every layer, including h_{t-1} on the shortcuts.

    Attributes:
      hidden_size: n, units per layer.
      depth: transition depth L (>= 1).
      init_scale: half-width of the uniform initialisation.

    Raises:
      ValueError: if hidden_size < 1 or depth < 1.
    """

    shortcuts = True
