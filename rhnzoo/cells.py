"""Recurrent cells as pure functions, all in one protocol.

A cell is a small frozen dataclass that holds only static hyperparameters. Its
parameters are a plain pytree of arrays, and it exposes four pure functions:

* ``init(key, input_size) -> params``
* ``initial_carry(batch_size, dtype=float32) -> carry``
* ``project_inputs(params, xs [T, B, m]) -> x_proj [T, B, k]``: the input-to-hidden
  matmul for every time step at once, outside the recurrence (one large matmul);
* ``step(params, carry, x_proj_t [B, k], mask=None) -> (carry, y_t)``: one time step.

so that a cell drops into a user's own scan with nothing else from rhnzoo::

    x_proj = cell.project_inputs(params, xs)
    carry, ys = jax.lax.scan(functools.partial(cell.step, params), carry, x_proj)

``mask`` is the cell's variational-dropout mask on the recurrent state (shape of
the state, ``[B, n]``), sampled once per minibatch and shared by all time steps
(see :mod:`rhnzoo.dropout`); ``None`` means no dropout (evaluation).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Protocol

import jax
import jax.numpy as jnp

Array = jax.Array
Params = Any
Carry = Any


class Cell(Protocol):
    """The protocol every rhnzoo cell follows (RHN, HSG, and later LSTM, GRU, ...)."""

    hidden_size: int

    def init(self, key: Array, input_size: int) -> Params: ...

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Carry: ...

    def project_inputs(self, params: Params, xs: Array) -> Array: ...

    def step(
        self, params: Params, carry: Carry, x_proj: Array, mask: Array | None = None
    ) -> tuple[Carry, Array]: ...


def unroll(
    cell: Cell,
    params: Params,
    carry: Carry,
    xs: Array,
    mask: Array | None = None,
    *,
    unroll: int = 1,
    remat: bool = False,
) -> tuple[Carry, Array]:
    """Runs ``cell`` over a time-major sequence with ``jax.lax.scan``.

    Args:
      cell: any cell of the protocol above.
      params: the cell's parameters (``cell.init``).
      carry: initial carry, e.g. ``cell.initial_carry(B)`` (``[B, n]`` for RHN).
      xs: ``[T, B, m]`` float inputs, time-major.
      mask: the cell's recurrent dropout mask (``[B, n]``) or ``None``.
      unroll: time steps per scan iteration (``lax.scan``'s ``unroll``).

    Returns:
      ``(carry, ys)``: the final carry and the outputs ``[T, B, n]``.
    """
    x_proj = cell.project_inputs(params, xs)
    step = functools.partial(cell.step, params, mask=mask)
    step = jax.checkpoint(step) if remat else step
    return jax.lax.scan(step, carry, x_proj, unroll=unroll)


def _uniform(key: Array, shape: tuple[int, ...], scale: float) -> Array:
    return jax.random.uniform(key, shape, jnp.float32, -scale, scale)


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RHN:
    """Recurrent Highway Network cell (Zilly et al., ICML 2017, eqs. 6-9).

    At time t, with s^[0]_t = s^[L]_{t-1} and micro-layers l = 1..L:

      h^[l] = tanh(W_H x_t 1{l=1} + R_Hl s^[l-1] + b_Hl)          (eq. 7)
      T^[l] = sigmoid(W_T x_t 1{l=1} + R_Tl s^[l-1] + b_Tl)       (eq. 8)
      C^[l] = sigmoid(W_C x_t 1{l=1} + R_Cl s^[l-1] + b_Cl)       (eq. 9)
      s^[l] = h^[l] * T^[l] + s^[l-1] * C^[l]                      (eq. 6)

    With ``coupled=True`` (the default and the paper's experiments) C = 1 - T, so
    s^[l] = s^[l-1] + T (h - s^[l-1]). The input enters only micro-layer 1.

    Parameters (a dict): ``W [m, k n]`` input weights of micro-layer 1, fused
    H|T(|C); ``R [L, n, k n]`` recurrent weights, one fused H|T(|C) matrix per
    micro-layer, stacked so that the loop over micro-layers is a ``lax.scan``
    (compile time does not grow with L); ``b [L, k n]`` biases. k = 2 when
    coupled, 3 otherwise. Initialisation follows the reference code: every weight
    and the H bias uniform in [-init_scale, init_scale], the T bias ``init_bias``;
    the C bias (uncoupled only) is ``-init_bias`` so that C starts near 1 - T.

    The recurrent dropout ``mask`` ([B, n]) multiplies the state entering every
    micro-layer, the same mask for all micro-layers and for H, T and C, as in the
    reference code; the highway update itself uses the undropped state.

    Attributes:
      hidden_size: n, units per micro-layer.
      depth: recurrence depth L (>= 1).
      coupled: use C = 1 - T.
      init_scale: half-width of the uniform weight initialisation.
      init_bias: initial T-gate bias (negative: carry behaviour at the start).

    Raises:
      ValueError: if hidden_size < 1 or depth < 1.
    """

    hidden_size: int
    depth: int = 1
    coupled: bool = True
    init_scale: float = 0.04
    init_bias: float = -2.0

    def __post_init__(self):
        _check_positive("hidden_size", self.hidden_size)
        _check_positive("depth", self.depth)

    @property
    def num_gates(self) -> int:
        """k: number of fused blocks per matmul (H, T and, if uncoupled, C)."""
        return 2 if self.coupled else 3

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, k n], 'R': [L, n, k n], 'b': [L, k n]}`` float32."""
        _check_positive("input_size", input_size)
        n, k, L = self.hidden_size, self.num_gates, self.depth
        kw, kr, kb = jax.random.split(key, 3)
        b_h = _uniform(kb, (L, n), self.init_scale)
        b_t = jnp.full((L, n), self.init_bias, jnp.float32)
        b = [b_h, b_t] + ([] if self.coupled else [jnp.full((L, n), -self.init_bias, jnp.float32)])
        return {
            "W": _uniform(kw, (input_size, k * n), self.init_scale),
            "R": _uniform(kr, (L, n, k * n), self.init_scale),
            "b": jnp.concatenate(b, axis=-1),
        }

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the zero state ``[B, n]``."""
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., k n]``: W x for all time steps in one matmul."""
        return xs @ params["W"].astype(xs.dtype)

    def micro_layer(self, s: Array, R: Array, b: Array, mask: Array | None) -> tuple[Array, Array]:
        """One micro-layer: ``s [B, n]`` -> ``(s_next [B, n], T [B, n])`` (eqs. 6-9).

        ``b`` is the bias ``[k n]``, with W x_t already added for micro-layer 1.
        """
        n = self.hidden_size
        s_in = s if mask is None else s * mask
        z = s_in @ R.astype(s.dtype) + b
        h = jnp.tanh(z[..., :n])
        t = jax.nn.sigmoid(z[..., n : 2 * n])
        if self.coupled:
            s_next = s + t * (h - s)
        else:
            s_next = h * t + s * jax.nn.sigmoid(z[..., 2 * n :])
        return s_next, t

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry [B, n]``, ``x_proj [B, k n]`` -> ``(s_L, s_L)``."""
        s, _ = self.step_with_gates(params, carry, x_proj, mask)
        return s, s

    def step_with_gates(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step that also returns every micro-layer's T gate.

        Returns ``(s_L [B, n], T [L, B, n])``; used for gate analysis (Zilly et al.,
        section 6). Under ``jit`` the unused gates of ``step`` are dead code.
        """
        s, t1 = self.micro_layer(carry, params["R"][0], params["b"][0] + x_proj, mask)

        def body(s, layer):
            R, b = layer
            return self.micro_layer(s, R, b, mask)

        s, ts = jax.lax.scan(body, s, (params["R"][1:], params["b"][1:]))
        return s, jnp.concatenate([t1[None], ts], axis=0)


@dataclasses.dataclass(frozen=True)
class HSG:
    """Highway State Gating around a cell (Shoham & Permuter, eqs. 5-6).

    With s_L,t the wrapped cell's new state computed from ŝ_{t-1}:

      g_t = sigmoid(W_R ŝ_{t-1} + W_F s_L,t + b_G)               (eq. 6)
      ŝ_t = g_t * ŝ_{t-1} + (1 - g_t) * s_L,t                    (eq. 5)

    ŝ_t is both the output and the state fed to the wrapped cell at t + 1 (paper,
    Fig. 5). Works around any cell whose carry is a single ``[B, n]`` vector; the
    recurrent dropout ``mask`` is passed to the wrapped cell unchanged.

    Parameters: ``{'cell': <wrapped cell's params>, 'W_R': [n, n], 'W_F': [n, n],
    'b_G': [n]}``; weights uniform in [-init_scale, init_scale], b_G = ``init_bias``
    (paper: -2.5, so the gate starts mostly open to the new state).
    """

    cell: Any
    init_scale: float = 0.04
    init_bias: float = -2.5

    @property
    def hidden_size(self) -> int:
        return self.cell.hidden_size

    def init(self, key: Array, input_size: int) -> Params:
        kc, kr, kf = jax.random.split(key, 3)
        n = self.hidden_size
        return {
            "cell": self.cell.init(kc, input_size),
            "W_R": _uniform(kr, (n, n), self.init_scale),
            "W_F": _uniform(kf, (n, n), self.init_scale),
            "b_G": jnp.full((n,), self.init_bias, jnp.float32),
        }

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        return self.cell.initial_carry(batch_size, dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        return self.cell.project_inputs(params["cell"], xs)

    def gate(self, params: Params, s_prev: Array, s_new: Array) -> Array:
        """The HSG gate g ``[B, n]`` (eq. 6)."""
        dt = s_prev.dtype
        return jax.nn.sigmoid(
            s_prev @ params["W_R"].astype(dt) + s_new @ params["W_F"].astype(dt) + params["b_G"]
        )

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry`` ŝ_{t-1} ``[B, n]`` -> ``(ŝ_t, ŝ_t)``."""
        s_new, _ = self.cell.step(params["cell"], carry, x_proj, mask)
        g = self.gate(params, carry, s_new)
        s_hat = s_new + g * (carry - s_new)
        return s_hat, s_hat


@dataclasses.dataclass(frozen=True)
class _DeepTransitionRNN:
    """Shared code of :class:`DTRNN` and :class:`DTSRNN` (see their docstrings)."""

    hidden_size: int
    depth: int = 1
    init_scale: float = 0.04

    shortcuts = False  # class constant, not a field: DT(S)-RNN sets it

    def __post_init__(self):
        _check_positive("hidden_size", self.hidden_size)
        _check_positive("depth", self.depth)

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, n], 'R': [L, n, n], 'b': [L, n]}`` (+ ``'S': [L-1, n, n]`` for
        DT(S)-RNN), float32, every entry uniform in [-init_scale, init_scale]."""
        _check_positive("input_size", input_size)
        n, L = self.hidden_size, self.depth
        kw, kr, kb, ks = jax.random.split(key, 4)
        params = {
            "W": _uniform(kw, (input_size, n), self.init_scale),
            "R": _uniform(kr, (L, n, n), self.init_scale),
            "b": _uniform(kb, (L, n), self.init_scale),
        }
        if self.shortcuts:
            params["S"] = _uniform(ks, (L - 1, n, n), self.init_scale)
        return params

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the zero state ``[B, n]``."""
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., n]``: W x for all time steps in one matmul."""
        return xs @ params["W"].astype(xs.dtype)

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry`` h_{t-1} ``[B, n]``, ``x_proj`` W x_t ``[B, n]`` ->
        ``(h_t, h_t)``, both ``[B, n]`` in the dtype of ``carry``."""
        dt = carry.dtype

        def dropped(h):
            return h if mask is None else h * mask

        h_prev = dropped(carry)
        h = jnp.tanh(x_proj + h_prev @ params["R"][0].astype(dt) + params["b"][0])
        layers = (params["R"][1:].astype(dt), params["b"][1:])
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
