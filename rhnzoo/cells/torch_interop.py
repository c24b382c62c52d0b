"""Weight conversion between rhnzoo's LSTM / GRU and PyTorch's ``nn.LSTM`` / ``nn.GRU``.

NumPy arrays in and out; torch is not imported (pass a state dict's tensors as arrays,
``{k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}``, and wrap
the result with ``torch.from_numpy``). One layer, one direction: PyTorch's
``weight_ih_l0 [G n, m]``, ``weight_hh_l0 [G n, n]``, ``bias_ih_l0 [G n]`` and
``bias_hh_l0 [G n]`` (G = 4 for the LSTM, 3 for the GRU; the biases absent with
``bias=False``), keys optionally under a ``prefix`` (``"rnn."`` for a submodule).

PyTorch computes (column-vector convention, W x; ``torch.nn.LSTM`` / ``torch.nn.GRU``
documentation)::

  LSTM, gates i | f | g | o:     GRU, gates r | z | n:
    i = σ(W_ii x + b_ii + W_hi h + b_hi)      r = σ(W_ir x + b_ir + W_hr h + b_hr)
    f = σ(W_if x + b_if + W_hf h + b_hf)      z = σ(W_iz x + b_iz + W_hz h + b_hz)
    g = tanh(W_ig x + b_ig + W_hg h + b_hg)   n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
    o = σ(W_io x + b_io + W_ho h + b_ho)      h' = (1 - z) ⊙ n + z ⊙ h
    c' = f ⊙ c + i ⊙ g,  h' = o ⊙ tanh(c')

which is :class:`~rhnzoo.cells.LSTM` (Wang & Tian 2016, eq. 1; c̃ = g) and
:class:`~rhnzoo.cells.GRU` with ``reset_after=True`` (not Cho et al.'s eq. 8, rhnzoo's
default GRU: that one has no PyTorch layout, and :func:`gru_to_torch` refuses it).
rhnzoo's layout (row-vector convention, x W): ``W [m, G n]`` = weight_ihᵀ, ``U [n, G n]``
= weight_hhᵀ, one bias ``b [G n]``; the LSTM's blocks are ordered i | f | o | c̃
(PyTorch's i | f | g | o permuted), the GRU's r | z | h̃ (PyTorch's own order), and the
GRU keeps b_hn apart (``b_hn [n]``).

Wherever PyTorch's two biases enter a pre-activation only as their sum (every LSTM gate,
the GRU's r and z) rhnzoo keeps the sum: ``*_from_torch`` adds them, ``*_to_torch`` writes
the whole bias to ``bias_ih_l0`` and zeros to that part of ``bias_hh_l0``. So
``*_from_torch(*_to_torch(params))`` returns ``params`` exactly, while torch -> rhnzoo ->
torch folds ``bias_hh`` into ``bias_ih`` there: the outputs are equal, the state dict is
not (``load_state_dict`` works; comparing the two key by key does not).

A module built with ``bias=False`` has no bias keys: ``*_from_torch`` reads zero biases,
and ``*_to_torch(params, bias=False)`` writes none back (so a strict ``load_state_dict``
into that module works), refusing biases that are not zero (dropping them would change
the function).

``gru_from_torch``'s parameters have ``b_hn``, which only ``GRU(n, reset_after=True)``
takes; Cho et al.'s ``GRU(n)`` refuses them (:func:`rhnzoo.cells.lstm.check_params`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

# rhnzoo's LSTM block k is PyTorch's block _LSTM_ORDER[k]: i, f, o, c̃ <- i, f, g, o.
_LSTM_ORDER = (0, 1, 3, 2)


def _blocks(a: np.ndarray, order: tuple[int, ...], axis: int) -> np.ndarray:
    """``a`` with its len(order) equal blocks along ``axis`` taken in ``order``."""
    parts = np.split(a, len(order), axis=axis)
    return np.concatenate([parts[k] for k in order], axis=axis)


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(k) for k in np.argsort(order))


def _read(state_dict: Mapping[str, Any], gates: int, prefix: str, what: str):
    """``(weight_ih [G n, m], weight_hh [G n, n], bias_ih [G n], bias_hh [G n], n)`` as
    NumPy arrays, missing biases as zeros; ValueError (one line) for a missing key, a
    shape that does not fit, or a layout other than one unidirectional layer."""
    keys = [k[len(prefix) :] for k in state_dict if k.startswith(prefix)]
    other = sorted(
        k for k in keys if k not in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    )
    if other:
        raise ValueError(
            f"{what}: only one unidirectional layer without projection "
            f"converts; unexpected keys {other} under prefix {prefix!r}"
        )
    for k in ("weight_ih_l0", "weight_hh_l0"):
        if k not in keys:
            raise ValueError(f"{what}: no {prefix}{k} in the state dict")
    w_ih = np.asarray(state_dict[prefix + "weight_ih_l0"])
    w_hh = np.asarray(state_dict[prefix + "weight_hh_l0"])
    n = w_hh.shape[-1] if w_hh.ndim == 2 else 0
    if w_hh.shape != (gates * n, n) or n < 1:
        raise ValueError(f"{what}: weight_hh_l0 must be [{gates} n, n], got {w_hh.shape}")
    if w_ih.ndim != 2 or w_ih.shape[0] != gates * n or w_ih.shape[1] < 1:
        raise ValueError(f"{what}: weight_ih_l0 must be [{gates * n}, m], got {w_ih.shape}")
    biases = []
    for k in ("bias_ih_l0", "bias_hh_l0"):
        b = np.asarray(state_dict[prefix + k]) if k in keys else np.zeros(gates * n, w_hh.dtype)
        if b.shape != (gates * n,):
            raise ValueError(f"{what}: {k} must be [{gates * n}], got {b.shape}")
        biases.append(b)
    return w_ih, w_hh, biases[0], biases[1], n


def _no_bias(
    state: dict[str, np.ndarray],
    params: Mapping[str, Any],
    keys: tuple[str, ...],
    prefix: str,
    what: str,
) -> dict[str, np.ndarray]:
    """``state`` without its two bias keys (``bias=False``); ValueError (one line) if any
    of the parameters ``keys`` is not zero."""
    for k in keys:
        if np.any(np.asarray(params[k]) != 0):
            big = float(np.max(np.abs(params[k])))
            raise ValueError(
                f"{what}: bias=False, but '{k}' is not zero (max |{k}| = {big:.3g}): "
                "a module without biases computes another function; convert "
                "with bias=True"
            )
    return {
        k: v for k, v in state.items() if k not in (prefix + "bias_ih_l0", prefix + "bias_hh_l0")
    }


def _check(params: Mapping[str, Any], gates: int, what: str, extra: tuple[str, ...] = ()):
    """``(W, U, b, n)`` of rhnzoo parameters as NumPy arrays; ValueError (one line) for
    missing keys or shapes that do not fit."""
    missing = [k for k in ("W", "U", "b") + extra if k not in params]
    if missing:
        raise ValueError(f"{what}: parameters lack {missing}")
    W, U, b = (np.asarray(params[k]) for k in ("W", "U", "b"))
    n = U.shape[0] if U.ndim == 2 else 0
    if (
        n < 1
        or U.shape != (n, gates * n)
        or W.ndim != 2
        or W.shape[1] != gates * n
        or b.shape != (gates * n,)
    ):
        raise ValueError(
            f"{what}: expected W [m, {gates} n], U [n, {gates} n], b "
            f"[{gates} n]; got {W.shape}, {U.shape}, {b.shape}"
        )
    return W, U, b, n


def lstm_from_torch(state_dict: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """Parameters of :class:`~rhnzoo.cells.LSTM` from a ``torch.nn.LSTM`` state dict.

    Args:
      state_dict: ``weight_ih_l0 [4n, m]``, ``weight_hh_l0 [4n, n]`` and optionally
        ``bias_ih_l0``, ``bias_hh_l0`` ``[4n]`` (gates i | f | g | o), array-likes, under
        ``prefix``.
      prefix: the keys' common prefix (e.g. ``"lstm."``); keys outside it are ignored.

    Returns:
      ``{'W': [m, 4n], 'U': [n, 4n], 'b': [4n]}`` in the input's dtype, blocks
      i | f | o | c̃, b = bias_ih + bias_hh (zeros without bias keys: convert back with
      ``lstm_to_torch(..., bias=False)``): the parameters of ``LSTM(n)`` (any
      ``forget_bias`` / ``init_scale``: those only set the initialisation).

    Raises:
      ValueError: (one line) a missing weight, a wrong shape, or keys of more layers,
        the reverse direction or a projection (``proj_size``).
    """
    w_ih, w_hh, b_ih, b_hh, _ = _read(state_dict, 4, prefix, "lstm_from_torch")
    return {
        "W": _blocks(w_ih, _LSTM_ORDER, 0).T.copy(),
        "U": _blocks(w_hh, _LSTM_ORDER, 0).T.copy(),
        "b": _blocks(b_ih + b_hh, _LSTM_ORDER, 0),
    }


def lstm_to_torch(
    params: Mapping[str, Any], prefix: str = "", *, bias: bool = True
) -> dict[str, np.ndarray]:
    """A ``torch.nn.LSTM(m, n, bias=bias)`` state dict from :class:`~rhnzoo.cells.LSTM`
    parameters.

    Round trip: ``lstm_to_torch(lstm_from_torch(sd))`` computes what ``sd`` computes,
    with ``bias_hh_l0`` folded into ``bias_ih_l0`` (module docstring).

    Args:
      params: ``{'W': [m, 4n], 'U': [n, 4n], 'b': [4n]}`` (blocks i | f | o | c̃); an
        SC-LSTM's ``alpha`` is not an LSTM parameter and is refused.
      prefix: prepended to every key.
      bias: False: for an ``nn.LSTM(..., bias=False)``, no bias keys (b must be zero).

    Returns:
      ``weight_ih_l0 [4n, m]``, ``weight_hh_l0 [4n, n]``, and with ``bias``
      ``bias_ih_l0 [4n]`` = b and ``bias_hh_l0 [4n]`` zeros (gates i | f | g | o), NumPy
      arrays in the parameters' dtype.

    Raises:
      ValueError: (one line) missing or unknown parameters, a wrong shape, or
        ``bias=False`` with a nonzero b.
    """
    unknown = sorted(set(params) - {"W", "U", "b"})
    if unknown:
        raise ValueError(f"lstm_to_torch: unexpected parameters {unknown}")
    W, U, b, _ = _check(params, 4, "lstm_to_torch")
    back = _inverse(_LSTM_ORDER)
    state = {
        prefix + "weight_ih_l0": _blocks(W.T, back, 0).copy(),
        prefix + "weight_hh_l0": _blocks(U.T, back, 0).copy(),
        prefix + "bias_ih_l0": _blocks(b, back, 0),
        prefix + "bias_hh_l0": np.zeros_like(b),
    }
    return state if bias else _no_bias(state, params, ("b",), prefix, "lstm_to_torch")


def gru_from_torch(state_dict: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """Parameters of ``GRU(n, reset_after=True)`` from a ``torch.nn.GRU`` state dict.

    Args:
      state_dict: ``weight_ih_l0 [3n, m]``, ``weight_hh_l0 [3n, n]`` and optionally
        ``bias_ih_l0``, ``bias_hh_l0`` ``[3n]`` (gates r | z | n), array-likes, under
        ``prefix``.
      prefix: the keys' common prefix (e.g. ``"gru."``); keys outside it are ignored.

    Returns:
      ``{'W': [m, 3n], 'U': [n, 3n], 'b': [3n], 'b_hn': [n]}`` in the input's dtype:
      W = weight_ihᵀ, U = weight_hhᵀ, b = (b_ir + b_hr | b_iz + b_hz | b_in), b_hn =
      PyTorch's b_hn: parameters of :class:`~rhnzoo.cells.GRU` with
      ``reset_after=True`` only (Cho et al.'s default ``GRU(n)`` refuses them).

    Raises:
      ValueError: (one line) a missing weight, a wrong shape, or keys of more layers or
        the reverse direction.
    """
    w_ih, w_hh, b_ih, b_hh, n = _read(state_dict, 3, prefix, "gru_from_torch")
    b = np.concatenate([b_ih[: 2 * n] + b_hh[: 2 * n], b_ih[2 * n :]])
    return {"W": w_ih.T.copy(), "U": w_hh.T.copy(), "b": b, "b_hn": b_hh[2 * n :].copy()}


def gru_to_torch(
    params: Mapping[str, Any], prefix: str = "", *, bias: bool = True
) -> dict[str, np.ndarray]:
    """A ``torch.nn.GRU(m, n, bias=bias)`` state dict from ``GRU(n, reset_after=True)``
    parameters.

    Round trip: ``gru_to_torch(gru_from_torch(sd))`` computes what ``sd`` computes,
    with r's and z's ``bias_hh_l0`` folded into ``bias_ih_l0`` (module docstring).

    Args:
      params: ``{'W': [m, 3n], 'U': [n, 3n], 'b': [3n], 'b_hn': [n]}`` (blocks r | z | h̃).
      prefix: prepended to every key.
      bias: False: for an ``nn.GRU(..., bias=False)``, no bias keys (b and b_hn must be
        zero).

    Returns:
      ``weight_ih_l0 [3n, m]`` = Wᵀ, ``weight_hh_l0 [3n, n]`` = Uᵀ, and with ``bias``
      ``bias_ih_l0 [3n]`` = b and ``bias_hh_l0 [3n]`` = (0 | 0 | b_hn), NumPy arrays in
      the parameters' dtype.

    Raises:
      ValueError: (one line) parameters without ``b_hn`` (Cho et al.'s GRU, which PyTorch
        cannot compute), other missing or unknown parameters, a wrong shape, or
        ``bias=False`` with a nonzero b or b_hn.
    """
    if "b_hn" not in params:
        raise ValueError(
            "gru_to_torch: no 'b_hn': these are parameters of Cho et al.'s GRU "
            "(reset gate before U), which torch.nn.GRU does not compute; "
            "convert a GRU(n, reset_after=True)"
        )
    unknown = sorted(set(params) - {"W", "U", "b", "b_hn"})
    if unknown:
        raise ValueError(f"gru_to_torch: unexpected parameters {unknown}")
    W, U, b, n = _check(params, 3, "gru_to_torch", ("b_hn",))
    b_hn = np.asarray(params["b_hn"])
    if b_hn.shape != (n,):
        raise ValueError(f"gru_to_torch: b_hn must be [{n}], got {b_hn.shape}")
    b_hh = np.concatenate([np.zeros(2 * n, b_hn.dtype), b_hn])
    state = {
        prefix + "weight_ih_l0": W.T.copy(),
        prefix + "weight_hh_l0": U.T.copy(),
        prefix + "bias_ih_l0": b.copy(),
        prefix + "bias_hh_l0": b_hh,
    }
    return state if bias else _no_bias(state, params, ("b", "b_hn"), prefix, "gru_to_torch")
