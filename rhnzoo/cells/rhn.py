"""Recurrent Highway Networks (Zilly et al., ICML 2017) and Highway State Gating
(Shoham & Permuter) as cells of the :mod:`rhnzoo.cells` protocol.

The fast fused unroll with a hand-written backward pass for these two cells is
in :mod:`rhnzoo.cells.rhn_fused`.
"""

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
        check_positive("hidden_size", self.hidden_size)
        check_positive("depth", self.depth)

    @property
    def num_gates(self) -> int:
        """k: number of fused blocks per matmul (H, T and, if uncoupled, C)."""
        return 2 if self.coupled else 3

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, k n], 'R': [L, n, k n], 'b': [L, k n]}`` float32."""
        check_positive("input_size", input_size)
        n, k, L = self.hidden_size, self.num_gates, self.depth
        kw, kr, kb = jax.random.split(key, 3)
        b_h = uniform(kb, (L, n), self.init_scale)
        b_t = jnp.full((L, n), self.init_bias, jnp.float32)
        b = [b_h, b_t] + ([] if self.coupled else [jnp.full((L, n), -self.init_bias, jnp.float32)])
        return {
            "W": uniform(kw, (input_size, k * n), self.init_scale),
            "R": uniform(kr, (L, n, k * n), self.init_scale),
            "b": jnp.concatenate(b, axis=-1),
        }

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the zero state ``[B, n]``."""
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., k n]``: W x for all time steps in one matmul.

        Raises ValueError (one line) if ``params`` are not this cell's for input size m
        (:meth:`check_params`)."""
        self.check_params(params, xs.shape[-1])
        return project(xs, params["W"])

    def check_params(self, params: Params, input_size: int | None = None) -> None:
        """Raises ValueError (one line) unless ``params`` are ``{'W': [m, k n], 'R':
        [L, n, k n], 'b': [L, k n]}`` for this cell (m = ``input_size`` where given);
        shapes only (trace time)."""
        n, k, L = self.hidden_size, self.num_gates, self.depth
        want = {"W": (input_size, k * n), "R": (L, n, k * n), "b": (L, k * n)}
        check_param_shapes(self, params, want, f"hidden size {n} and depth {L}")

    def micro_layer(self, s: Array, R: Array, b: Array, mask: Array | None) -> tuple[Array, Array]:
        """One micro-layer: ``s [B, n]`` -> ``(s_next [B, n], T [B, n])`` (eqs. 6-9).

        ``b`` is the bias ``[k n]``, with W x_t already added for micro-layer 1.
        """
        n = self.hidden_size
        s_in = s if mask is None else s * mask.astype(s.dtype)
        z = s_in @ R.astype(s.dtype) + b.astype(s.dtype)
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
        """One time step: ``carry [B, n]``, ``x_proj [B, k n]`` -> ``(s_L, s_L)``, both in
        the dtype of ``carry``."""
        s, _ = self.step_with_gates(params, carry, x_proj, mask)
        return s, s

    def step_with_gates(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step that also returns every micro-layer's T gate.

        Returns ``(s_L [B, n], T [L, B, n])``; used for gate analysis (Zilly et al.,
        section 6). Under ``jit`` the unused gates of ``step`` are dead code.
        """
        self.check_params(params)
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

    Attributes:
      cell: the wrapped cell (``hidden_size`` n, carry one ``[B, n]`` vector).
      init_scale: half-width of the uniform initialisation of W_R and W_F.
      init_bias: initial gate bias b_G.

    Raises:
      ValueError: (one line) if the cell's carry is not one ``[B, n]`` array (an LSTM's
        ``(c, h)``, a ``Parallel`` pair).
    """

    cell: Any
    init_scale: float = 0.04
    init_bias: float = -2.5

    def __post_init__(self):
        carry = jax.eval_shape(lambda: self.cell.initial_carry(1))
        if not (isinstance(carry, jax.ShapeDtypeStruct) and carry.shape == (1, self.hidden_size)):
            kind = type(carry).__name__
            raise ValueError(
                f"HSG needs a cell whose carry is one [B, n] vector; {type(self.cell).__name__}'s "
                f"carry is a {kind} of {len(jax.tree.leaves(carry))} arrays (HSG wraps RHN, "
                "DT-RNN, DT(S)-RNN, GRU, RRN)"
            )

    @property
    def hidden_size(self) -> int:
        """n, the wrapped cell's hidden size."""
        return self.cell.hidden_size

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'cell': <the cell's init(key, m)>, 'W_R': [n, n], 'W_F': [n, n],
        'b_G': [n]}`` (HSG's own parameters float32).

        Raises ValueError (one line) where the wrapped cell's ``init`` does (input_size
        m < 1 for RHN)."""
        kc, kr, kf = jax.random.split(key, 3)
        n = self.hidden_size
        return {
            "cell": self.cell.init(kc, input_size),
            "W_R": uniform(kr, (n, n), self.init_scale),
            "W_F": uniform(kf, (n, n), self.init_scale),
            "b_G": jnp.full((n,), self.init_bias, jnp.float32),
        }

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the wrapped cell's zero state ``[B, n]`` in ``dtype``."""
        return self.cell.initial_carry(batch_size, dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., k]``: the wrapped cell's input projection (``k n`` for
        RHN), with ``params['cell']``; HSG adds none (its gate reads states only).

        Raises ValueError (one line) where the wrapped cell's ``project_inputs`` does
        (params not the cell's for input size m)."""
        return self.cell.project_inputs(params["cell"], xs)

    def gate(self, params: Params, s_prev: Array, s_new: Array) -> Array:
        """The HSG gate g ``[B, n]`` (eq. 6)."""
        dt = s_prev.dtype
        return jax.nn.sigmoid(
            s_prev @ params["W_R"].astype(dt)
            + s_new @ params["W_F"].astype(dt)
            + params["b_G"].astype(dt)
        )

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry`` ŝ_{t-1} ``[B, n]`` -> ``(ŝ_t, ŝ_t)``, in the dtype of
        ``carry``."""
        s_new, _ = self.cell.step(params["cell"], carry, x_proj, mask)
        g = self.gate(params, carry, s_new)
        s_hat = s_new + g * (carry - s_new)
        return s_hat, s_hat
