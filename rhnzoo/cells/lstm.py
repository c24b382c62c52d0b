"""Gated baselines of Wang & Tian ("Recurrent Residual Learning for Sequence
Classification", EMNLP 2016) as cells of the :mod:`rhnzoo.cells` protocol: the LSTM
(their eq. 1), the GRU (Cho et al. 2014; ``reset_after=True``: PyTorch's / cuDNN's
variant) and the skip-connected LSTM, SC-LSTM (their eq. 5).

All three share one parameter layout (row-vector convention ``x @ W``): ``W [m, k n]``
input weights (``project_inputs``: every time step in one matmul), ``U [n, k n]``
recurrent weights and ``b [k n]`` biases, the k gate blocks fused (the reset-after GRU
adds ``b_hn [n]``). The bias is added inside the step, where it fuses with the gate
nonlinearities (adding it to the ``[T, B, k n]`` projection costs one more pass over
it). :mod:`rhnzoo.cells.gated_fused` is the fast unroll.

Each cell's gate math and derivative coefficients live here once, as pure elementwise
functions that every implementation calls with its own σ, tanh and layout (the cells'
``step``, the fused scans, the Pallas kernels' wrappers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from rhnzoo.cells.base import (
    Array,
    Params,
    check_param_shapes,
    check_positive,
    project,
    uniform,
)


class LSTMState(NamedTuple):
    """Carry of :class:`LSTM`: hidden state h and memory cell c, both ``[B, n]``."""

    h: Array
    c: Array


class SCLSTMState(NamedTuple):
    """Carry of :class:`SCLSTM`.

    ``h``, ``c``: the LSTM state ``[B, n]``; ``h_anchor [B, n]``: h at the row's last
    skip point (the last step τ with τ ≡ 1 mod L), zeros before the first step;
    ``t [B] int32``: steps this row has taken (τ - 1 for the step about to run).
    """

    h: Array
    c: Array
    h_anchor: Array
    t: Array


def _init_gated(key: Array, input_size: int, n: int, k: int, init_scale: float) -> Params:
    """``{'W': [m, k n], 'U': [n, k n], 'b': [k n] zeros}``, weights uniform ±init_scale."""
    check_positive("input_size", input_size)
    kw, ku = jax.random.split(key)
    return {
        "W": uniform(kw, (input_size, k * n), init_scale),
        "U": uniform(ku, (n, k * n), init_scale),
        "b": jnp.zeros((k * n,), jnp.float32),
    }


def _project(params: Params, xs: Array) -> Array:
    """``xs [..., m] -> [..., k n]``: W x for all time steps in one matmul."""
    return project(xs, params["W"])


def check_params(cell: Any, params: Params, input_size: int | None = None) -> None:
    """Checks that ``params`` are parameters of ``cell`` (an :class:`LSTM`,
    :class:`SCLSTM` or :class:`GRU`): its keys, and shapes that fit its hidden size
    (and ``input_size``, m, where given). Shapes only (trace time). The keys carry the
    convention: ``b_hn`` is the reset-after GRU's alone, ``alpha`` SC-LSTM-P's.

    Raises:
      ValueError: (one line naming the cell and the parameter) a missing or unknown
        parameter, or a shape other than ``W [m, k n]``, ``U [n, k n]``, ``b [k n]``
        (k = 4 for the LSTMs, 3 for the GRU), ``b_hn [n]``, ``alpha []``.
    """
    n = cell.hidden_size
    k = 3 if isinstance(cell, GRU) else 4
    want = {"U": (n, k * n), "b": (k * n,), "W": (input_size, k * n)}  # U first: it shows n
    if isinstance(cell, GRU) and cell.reset_after:
        want["b_hn"] = (n,)
    if isinstance(cell, SCLSTM) and cell.learn_alpha:
        want["alpha"] = ()
    has_b_hn = hasattr(params, "keys") and "b_hn" in params
    if isinstance(cell, GRU) and cell.reset_after != has_b_hn:
        if cell.reset_after:
            raise ValueError(
                f"{cell!r}: no 'b_hn' in the parameters: these are Cho et al.'s "
                f"GRU({n})'s (reset gate before U); the reset-after GRU (PyTorch's "
                "nn.GRU) needs b_hn"
            )
        raise ValueError(
            f"{cell!r}: a 'b_hn' parameter: these are parameters of GRU({n}, "
            "reset_after=True) (PyTorch's nn.GRU, torch_interop.gru_from_torch), "
            "which computes another function; run them with that cell"
        )
    m = f" and input size {input_size}" if input_size else ""
    check_param_shapes(cell, params, want, f"hidden size {n}{m}")


@dataclasses.dataclass(frozen=True)
class LSTM:
    """Long short-term memory cell, as written by Wang & Tian (2016, eq. 1)
    (Hochreiter & Schmidhuber 1997 with the forget gate of Gers et al. 2000)::

      i_t = σ(W_i x_t + U_i h_{t-1} + b_i)
      f_t = σ(W_f x_t + U_f h_{t-1} + b_f)
      o_t = σ(W_o x_t + U_o h_{t-1} + b_o)
      c̃_t = tanh(W_c x_t + U_c h_{t-1} + b_c)
      c_t = f_t ⊙ c_{t-1} + i_t ⊙ c̃_t
      h_t = o_t ⊙ tanh(c_t)

    σ is the logistic sigmoid. No peepholes.

    Parameters (a dict): ``W [m, 4n]``, ``U [n, 4n]``, ``b [4n]``, the blocks in the
    order i | f | o | c̃ (the three sigmoid gates first, so one sigmoid covers them;
    PyTorch's ``nn.LSTM`` orders them i | f | g=c̃ | o, transposed, with two biases that
    only enter as their sum: :mod:`rhnzoo.cells.torch_interop` converts).
    W and U uniform in [-init_scale, init_scale]; b zero except b_f = ``forget_bias``
    (default 1.0: the forget gate starts mostly open, Gers et al. 2000; Jozefowicz,
    Zaremba & Sutskever 2015). Parameter count 4(m n + n² + n).

    Carry: :class:`LSTMState` ``(h [B, n], c [B, n])``; output h_t ``[B, n]``. The
    recurrent dropout ``mask`` ([B, n]) multiplies h_{t-1} where it enters U.

    Attributes:
      hidden_size: n.
      forget_bias: initial forget-gate bias.
      init_scale: half-width of the uniform weight initialisation.

    Raises:
      ValueError: if hidden_size < 1.
    """

    hidden_size: int
    forget_bias: float = 1.0
    init_scale: float = 0.04

    def __post_init__(self):
        check_positive("hidden_size", self.hidden_size)

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, 4n], 'U': [n, 4n], 'b': [4n]}`` float32.

        Raises ValueError if input_size < 1.
        """
        n = self.hidden_size
        params = _init_gated(key, input_size, n, 4, self.init_scale)
        params["b"] = params["b"].at[n : 2 * n].set(self.forget_bias)
        return params

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> LSTMState:
        """Returns zero ``(h, c)``, each ``[B, n]``."""
        zeros = lambda: jnp.zeros((batch_size, self.hidden_size), dtype)
        return LSTMState(zeros(), zeros())  # two buffers: a donated carry may not alias

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., 4n]``: W x for all time steps in one matmul. Raises
        ValueError (:func:`check_params`) for parameters that are not this cell's."""
        check_params(self, params, xs.shape[-1])
        return _project(params, xs)

    def step(
        self, params: Params, carry: LSTMState, x_proj: Array, mask: Array | None = None
    ) -> tuple[LSTMState, Array]:
        """One time step: ``carry (h, c)``, ``x_proj [B, 4n]`` -> ``((h_t, c_t), h_t)``,
        computed in the dtype of ``h``. Raises ValueError (:func:`check_params`) for
        parameters that are not this cell's."""
        check_params(self, params)
        return self._step(params, carry, x_proj, mask)

    def _step(self, params, carry, x_proj, mask):
        h, c = carry
        dt = h.dtype
        h_in = h if mask is None else h * mask.astype(h.dtype)
        z = x_proj.astype(dt) + h_in @ params["U"].astype(dt) + params["b"].astype(dt)
        i, f, o, c_tilde = lstm_gates(z)
        c = f * c + i * c_tilde
        h = o * jnp.tanh(c)
        return LSTMState(h, c), h


class LSTMGates(NamedTuple):
    """The gates of one LSTM step (Wang & Tian 2016, eq. 1): i, f, o and c̃, each
    ``[..., n]`` (the layout of the pre-activations, one gate block less)."""

    i: Array
    f: Array
    o: Array
    c_tilde: Array


def lstm_gates(
    z: Array, axis: int = -1, sigmoid: Callable = jax.nn.sigmoid, tanh: Callable = jnp.tanh
) -> LSTMGates:
    """The gates from the pre-activations (Wang & Tian 2016, eq. 1):
    ``i, f, o = σ(z_i), σ(z_f), σ(z_o)`` and ``c̃ = tanh(z_c̃)``.

    Args:
      z: ``W x_t + U (h_{t-1} m) + b`` with the four gate blocks i | f | o | c̃ (each n
        wide) along ``axis``: ``[..., 4n]`` or, feature-major, ``[4n, B]``; any float
        dtype (the gates keep it).
      axis: the axis of the gate blocks.
      sigmoid, tanh: the elementwise σ and tanh to use (σ runs once over the three
        sigmoid blocks).

    Returns:
      :class:`LSTMGates`, each ``z``'s shape with n along ``axis``.

    Raises:
      ValueError: if ``z``'s extent along ``axis`` is not a multiple of 4.
    """
    size = z.shape[axis]
    if size % 4:
        raise ValueError(f"the LSTM's pre-activations hold 4 gate blocks, got {size} along {axis}")
    n = size // 4
    block = lambda a, k, count=1: lax.slice_in_dim(a, k * n, (k + count) * n, axis=axis)
    sig = sigmoid(block(z, 0, 3))
    return LSTMGates(block(sig, 0), block(sig, 1), block(sig, 2), tanh(block(z, 3)))


class LSTMCoefficients(NamedTuple):
    """The local derivatives of one LSTM step (Wang & Tian 2016, eq. 1, differentiated),
    each ``[..., n]``: ∂h_t/∂c_t and the derivatives of c_t and h_t by the gates'
    pre-activations z_i, z_f, z_c̃, z_o. With dh and dc the cotangents of h_t and c_t::

      dc' = dc + dh ⊙ dh_dc                   (the cotangent reaching c_t)
      dz_i = dc' ⊙ dc_dzi,  dz_f = dc' ⊙ dc_dzf,  dz_c̃ = dc' ⊙ dc_dzc,  dz_o = dh ⊙ dh_dzo
      dc_{t-1} = dc' ⊙ f,   dh_{t-1} = m ⊙ (U dz)

    The field order is the one :mod:`rhnzoo.cells.kernels.gated`'s backward kernel
    stacks."""

    dh_dc: Array  # o (1 - tanh² c_t)
    dc_dzi: Array  # c̃ i (1 - i)
    dc_dzf: Array  # c_{t-1} f (1 - f)
    dc_dzc: Array  # i (1 - c̃²)
    dh_dzo: Array  # tanh(c_t) o (1 - o)


def lstm_coefficients(
    i: Array, f: Array, o: Array, c_tilde: Array, c_prev: Array, tanh_c: Array
) -> LSTMCoefficients:
    """The LSTM step's derivative coefficients (:class:`LSTMCoefficients`) from its gate
    values (Wang & Tian 2016, eq. 1; σ' = σ (1 - σ), tanh' = 1 - tanh²).

    Args:
      i, f, o, c_tilde: the step's gates (:func:`lstm_gates`).
      c_prev: the memory cell entering the step, c_{t-1}.
      tanh_c: tanh(c_t) of the cell it leaves (the caller's tanh).

    All of one shape (``[..., n]`` or feature-major ``[n, B]``: pure elementwise math,
    broadcasting as ``jnp`` does) and float dtype; returns that shape and dtype.
    """
    return LSTMCoefficients(
        o * (1 - tanh_c * tanh_c),
        c_tilde * i * (1 - i),
        c_prev * f * (1 - f),
        i * (1 - c_tilde * c_tilde),
        tanh_c * o * (1 - o),
    )


@dataclasses.dataclass(frozen=True)
class GRU:
    """Gated recurrent unit (Cho et al., "Learning Phrase Representations using RNN
    Encoder-Decoder for Statistical Machine Translation", EMNLP 2014, eqs. 5-8), in
    either place of the reset gate.

    Default (``reset_after=False``), Cho et al.'s cell, the reset gate applied to
    h_{t-1} before the recurrent matmul::

      r_t = σ(W_r x_t + U_r h_{t-1} + b_r)                       (eq. 5)
      z_t = σ(W_z x_t + U_z h_{t-1} + b_z)                       (eq. 6)
      h̃_t = tanh(W_h x_t + U_h (r_t ⊙ h_{t-1}) + b_h)            (eq. 8)
      h_t = z_t ⊙ h_{t-1} + (1 - z_t) ⊙ h̃_t                      (eq. 7)

    The default: the GRU Wang & Tian (2016) cite for their LSTM+GRU baseline (sec. 4,
    Table 3).

    ``reset_after=True``: the variant of cuDNN, ``torch.nn.GRU``, Keras
    (``reset_after=True``) and Flax's ``GRUCell``, the reset gate applied after the
    recurrent matmul, to U_h h_{t-1} plus its own recurrent bias b_hn::

      h̃_t = tanh(W_h x_t + b_h + r_t ⊙ (U_h h_{t-1} + b_hn))

    (r_t, z_t and eq. 7 as above): a different function of the same weights, with n
    more parameters and one fused recurrent matmul per step;
    :mod:`rhnzoo.cells.torch_interop` converts PyTorch's.

    Sign convention: Cho et al.'s original eq. 7, z is the fraction of h_{t-1} kept
    (also PyTorch's and Flax's); Chung et al. (2014) write the same cell with z and
    1 - z swapped. Cho et al. have no biases; we add them (zero at init).

    Parameters (a dict, float32 from ``init``): ``W [m, 3n]``, ``U [n, 3n]``,
    ``b [3n]``, blocks in the order r | z | h̃, and with ``reset_after`` also
    ``b_hn [n]``; weights uniform in [-init_scale, init_scale], biases zero. Parameter
    count 3(m n + n² + n), + n with ``reset_after``.

    Carry: h ``[B, n]`` (float32 or float64: ``step`` computes in the carry's dtype);
    output h_t ``[B, n]``. The dropout ``mask`` ([B, n]) multiplies h_{t-1} where it
    enters U (both matmuls); the interpolation of eq. 7 uses the undropped h_{t-1}.

    Attributes:
      hidden_size: n.
      init_scale: half-width of the uniform weight initialisation.
      reset_after: apply the reset gate after the recurrent matmul (PyTorch / cuDNN /
        Flax); default False, Cho et al.'s before.

    Raises:
      ValueError: if hidden_size < 1.
    """

    hidden_size: int
    init_scale: float = 0.04
    reset_after: bool = False

    def __post_init__(self):
        check_positive("hidden_size", self.hidden_size)

    def init(self, key: Array, input_size: int) -> Params:
        """Returns ``{'W': [m, 3n], 'U': [n, 3n], 'b': [3n]}`` (+ ``'b_hn': [n]`` zeros
        with ``reset_after``) float32.

        Raises ValueError if input_size < 1.
        """
        params = _init_gated(key, input_size, self.hidden_size, 3, self.init_scale)
        if self.reset_after:
            params["b_hn"] = jnp.zeros((self.hidden_size,), jnp.float32)
        return params

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> Array:
        """Returns the zero state ``[B, n]``."""
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., 3n]``: W x for all time steps in one matmul. Raises
        ValueError (:func:`check_params`) for parameters that are not this cell's (Cho
        et al.'s GRU given the reset-after GRU's, or the other way round)."""
        check_params(self, params, xs.shape[-1])
        return _project(params, xs)

    def step(
        self, params: Params, carry: Array, x_proj: Array, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """One time step: ``carry`` h_{t-1} ``[B, n]``, ``x_proj [B, 3n]`` -> ``(h_t, h_t)``.
        Raises ValueError (:func:`check_params`) for parameters that are not this cell's."""
        check_params(self, params)
        n, dt = self.hidden_size, carry.dtype
        U = params["U"].astype(dt)
        x_proj = x_proj.astype(dt) + params["b"].astype(dt)
        h_in = carry if mask is None else carry * mask.astype(carry.dtype)
        if self.reset_after:
            hU = h_in @ U  # [B, 3n]: r's and z's recurrent terms and U_h h_{t-1}
            _, z, _, h_tilde = gru_reset_after_gates(x_proj, hU, params["b_hn"].astype(dt))
        else:
            rz = jax.nn.sigmoid(x_proj[..., : 2 * n] + h_in @ U[:, : 2 * n])
            r, z = rz[..., :n], rz[..., n:]
            h_tilde = jnp.tanh(x_proj[..., 2 * n :] + (r * h_in) @ U[:, 2 * n :])
        h = h_tilde + z * (carry - h_tilde)
        return h, h


class GRUResetAfterGates(NamedTuple):
    """The gates of one reset-after GRU step (:class:`GRU`, ``reset_after=True``), each
    ``[..., n]``: r, z, the candidate's recurrent term g = U_h h_{t-1} m + b_hn and the
    candidate h̃."""

    r: Array
    z: Array
    g: Array
    h_tilde: Array


def gru_reset_after_gates(
    x_part: Array,
    h_part: Array,
    b_hn: Array,
    axis: int = -1,
    sigmoid: Callable = jax.nn.sigmoid,
    tanh: Callable = jnp.tanh,
) -> GRUResetAfterGates:
    """The reset-after GRU's gates (PyTorch's ``nn.GRU``, cuDNN; Cho et al. 2014, eqs.
    5-6, with the reset gate after the recurrent matmul)::

      r | z = σ(x_rz + h_rz),  g = h_h + b_hn,  h̃ = tanh(x_h + r ⊙ g)

    Args:
      x_part: ``W x_t + b``, the blocks r | z | h̃ (each n wide) along ``axis``:
        ``[..., 3n]`` or, feature-major, ``[3n, B]``; a float dtype.
      h_part: ``U (h_{t-1} m)``, same shape and blocks.
      b_hn: the candidate's recurrent bias, broadcastable against one block (``[n]``
        batch-major, ``[n, 1]`` feature-major).
      axis: the axis of the gate blocks.
      sigmoid, tanh: the elementwise σ and tanh to use (σ runs once over r | z).

    Returns:
      :class:`GRUResetAfterGates`, each ``x_part``'s shape with n along ``axis``.

    Raises:
      ValueError: if the extent along ``axis`` is not a multiple of 3.
    """
    size = x_part.shape[axis]
    if size % 3:
        raise ValueError(f"the GRU's pre-activations hold 3 gate blocks, got {size} along {axis}")
    n = size // 3
    block = lambda a, k, count=1: lax.slice_in_dim(a, k * n, (k + count) * n, axis=axis)
    rz = sigmoid(block(x_part, 0, 2) + block(h_part, 0, 2))
    r, z = block(rz, 0), block(rz, 1)
    g = block(h_part, 2) + b_hn
    return GRUResetAfterGates(r, z, g, tanh(block(x_part, 2) + r * g))


class GRUResetAfterCoefficients(NamedTuple):
    """The local derivatives of one reset-after GRU step, each ``[..., n]``: h_t's by
    the pre-activations of r, z and h̃ (z_r, z_z, z_h̃ = x_h + r ⊙ g) and by g. With dh the
    cotangent of h_t::

      dz_r = dh ⊙ dh_dzr,  dz_z = dh ⊙ dh_dzz,  dz_h̃ = dh ⊙ dh_dzh,  dg = dh ⊙ dh_dg
      dh_{t-1} = dh ⊙ z + m ⊙ (U [dz_r; dz_z; dg])

    (W's and b's cotangent is ``[dz_r; dz_z; dz_h̃]``, U's and b_hn's
    ``[dz_r; dz_z; dg]``)."""

    dh_dzr: Array  # (1 - z)(1 - h̃²) g r (1 - r)
    dh_dzz: Array  # (h_{t-1} - h̃) z (1 - z)
    dh_dg: Array  # (1 - z)(1 - h̃²) r
    dh_dzh: Array  # (1 - z)(1 - h̃²)


def gru_reset_after_coefficients(
    r: Array, z: Array, g: Array, h_tilde: Array, h_prev: Array
) -> GRUResetAfterCoefficients:
    """The reset-after GRU step's derivative coefficients
    (:class:`GRUResetAfterCoefficients`) from its gate values (eq. 7, h_t = h̃ + z ⊙
    (h_{t-1} - h̃), differentiated; σ' = σ (1 - σ), tanh' = 1 - tanh²).

    Args:
      r, z, g, h_tilde: the step's gates (:func:`gru_reset_after_gates`).
      h_prev: the state entering the step, h_{t-1} (undropped: eq. 7's).

    All of one shape (``[..., n]`` or feature-major ``[n, B]``, elementwise) and float
    dtype; returns that shape and dtype.
    """
    dh_dzh = (1 - z) * (1 - h_tilde * h_tilde)
    return GRUResetAfterCoefficients(
        dh_dzh * g * r * (1 - r), (h_prev - h_tilde) * z * (1 - z), dh_dzh * r, dh_dzh
    )


class GRUCoefficients(NamedTuple):
    """The local derivatives of one step of Cho et al.'s GRU (2014, eqs. 5-8), each
    ``[..., n]``: h_t's by the pre-activations of h̃ and z, and the reset path's
    ∂a/∂z_r, a = r ⊙ h_{t-1} m being what enters U_h. With dh the cotangent of h_t::

      dz_h̃ = dh ⊙ dh_dzh,  da = U_h dz_h̃,  dz_r = da ⊙ da_dzr,  dz_z = dh ⊙ dh_dzz
      dh_{t-1} = dh ⊙ z + m ⊙ (da ⊙ r + U_rz [dz_r; dz_z])
    """

    dh_dzh: Array  # (1 - z)(1 - h̃²)
    dh_dzz: Array  # (h_{t-1} - h̃) z (1 - z)
    da_dzr: Array  # h_{t-1} m r (1 - r)


def gru_coefficients(
    r: Array, z: Array, h_tilde: Array, h_prev: Array, h_masked: Array
) -> GRUCoefficients:
    """Cho et al.'s GRU step's derivative coefficients (:class:`GRUCoefficients`) from
    its gate values (eqs. 5-8 differentiated; σ' = σ (1 - σ), tanh' = 1 - tanh²).

    Args:
      r, z, h_tilde: the step's reset and update gates (eqs. 5-6) and candidate (eq. 8).
      h_prev: the state entering the step, h_{t-1} (eq. 7's, undropped).
      h_masked: h_{t-1} m, the state as it entered U (m the recurrent dropout mask).

    All of one shape (``[..., n]`` or feature-major ``[n, B]``, elementwise) and float
    dtype; returns that shape and dtype.
    """
    return GRUCoefficients(
        (1 - z) * (1 - h_tilde * h_tilde), (h_prev - h_tilde) * z * (1 - z), h_masked * r * (1 - r)
    )


@dataclasses.dataclass(frozen=True)
class SCLSTM:
    """Skip-connected LSTM, SC-LSTM (Wang & Tian 2016, eq. 5).

    An :class:`LSTM` whose hidden state gets an identity (SC-LSTM-I) or scaled
    (SC-LSTM-P) skip connection from L steps back, every L steps. With time steps
    numbered τ = 1, 2, ... and L = ``skip``::

      h_τ = o_τ ⊙ tanh(c_τ) + α h_{τ-L}     if τ = 1 + kL for some k >= 1
      h_τ = o_τ ⊙ tanh(c_τ)                 otherwise

    so skips land at τ = L+1, 2L+1, ..., and each comes from the previous skip point
    (τ - L = 1 + (k-1)L), whose h includes its own skip. τ = 1 has no skip (there is no
    h_{1-L}); h_1 is the first anchor. The memory cell c is never skipped, and the gates
    at τ + 1 see the skipped h_τ. With L = 1 every step from τ = 2 on adds α h_{τ-1}.

    SC-LSTM-I (``learn_alpha=False``): α = 1, fixed. SC-LSTM-P (``learn_alpha=True``):
    α is a learned scalar ``params['alpha']``, initialised to 1.0 (so both variants
    start as the same function). The paper uses L = 20 and finds results insensitive to
    L over 10-75 on permuted MNIST.

    Parameters: those of :class:`LSTM` (``W``, ``U``, ``b``, same layout and init), plus
    ``alpha`` (a float32 scalar) for SC-LSTM-P.

    Carry: :class:`SCLSTMState` ``(h, c, h_anchor, t)``: only the h of the last skip
    point is kept, not L past states. ``t [B]`` counts the steps of each row separately,
    so under ``unroll(..., lengths=...)`` padded steps of a finished row freeze its
    whole carry, counter included, and it continues with the right phase. Output h_τ.
    The dropout ``mask`` ([B, n]) multiplies h_{τ-1} where it enters U; the skip adds
    the undropped h_{τ-L}.

    Attributes:
      hidden_size: n.
      skip: skip length L (>= 1).
      learn_alpha: learn α (SC-LSTM-P) instead of fixing α = 1 (SC-LSTM-I).
      forget_bias: initial forget-gate bias, as in :class:`LSTM`.
      init_scale: half-width of the uniform weight initialisation.

    Raises:
      ValueError: if hidden_size < 1 or skip < 1.
    """

    hidden_size: int
    skip: int = 20
    learn_alpha: bool = False
    forget_bias: float = 1.0
    init_scale: float = 0.04

    def __post_init__(self):
        check_positive("hidden_size", self.hidden_size)
        check_positive("skip", self.skip)

    @property
    def lstm(self) -> LSTM:
        """The underlying LSTM (same parameters, no skips)."""
        return LSTM(self.hidden_size, self.forget_bias, self.init_scale)

    def init(self, key: Array, input_size: int) -> Params:
        """Returns the LSTM's ``{'W', 'U', 'b'}`` (+ ``'alpha': 1.0`` float32 scalar if
        ``learn_alpha``). Raises ValueError if input_size < 1."""
        params = self.lstm.init(key, input_size)
        if self.learn_alpha:
            params["alpha"] = jnp.ones((), jnp.float32)
        return params

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> SCLSTMState:
        """Zero h, c and h_anchor ``[B, n]`` in ``dtype``, and t = 0 ``[B]`` int32."""
        h, c = self.lstm.initial_carry(batch_size, dtype)
        return SCLSTMState(h, c, jnp.zeros_like(h), jnp.zeros((batch_size,), jnp.int32))

    def project_inputs(self, params: Params, xs: Array) -> Array:
        """``xs [..., m] -> [..., 4n]``: W x for all time steps in one matmul. Raises
        ValueError (:func:`check_params`) for parameters that are not this cell's."""
        check_params(self, params, xs.shape[-1])
        return _project(params, xs)

    def step(
        self, params: Params, carry: SCLSTMState, x_proj: Array, mask: Array | None = None
    ) -> tuple[SCLSTMState, Array]:
        """One time step τ = t + 1: ``carry``, ``x_proj [B, 4n]`` -> ``(carry, h_τ [B, n])``.
        Raises ValueError (:func:`check_params`) for parameters that are not this cell's."""
        check_params(self, params)
        (h, c), _ = self.lstm._step(params, LSTMState(carry.h, carry.c), x_proj, mask)
        alpha = params["alpha"].astype(h.dtype) if self.learn_alpha else 1.0
        on_grid = (carry.t % self.skip == 0)[:, None]  # τ ≡ 1 (mod L)
        skipped = on_grid & (carry.t > 0)[:, None]  # ... and τ > 1
        h = jnp.where(skipped, h + alpha * carry.h_anchor, h)
        h_anchor = jnp.where(on_grid, h, carry.h_anchor)
        return SCLSTMState(h, c, h_anchor, carry.t + 1), h
