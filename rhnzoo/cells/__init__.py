"""Recurrent cells as pure functions, all in one protocol (see :mod:`rhnzoo.cells.base`).

Every cell has ``init``, ``initial_carry``, ``project_inputs`` and ``step`` and
drops into a user's own ``jax.lax.scan``; :func:`unroll` does exactly that.

* :mod:`rhnzoo.cells.rhn`: ``RHN`` (Zilly et al. 2017), ``HSG`` (Shoham & Permuter);
  :mod:`rhnzoo.cells.rhn_fused`: their fast unroll with a hand-written backward pass.
* :mod:`rhnzoo.cells.deep_transition`: ``DTRNN``, ``DTSRNN`` (Pascanu et al. 2014).
* :mod:`rhnzoo.cells.lstm`: ``LSTM``, ``GRU`` (Cho et al. 2014; ``reset_after=True``:
  PyTorch's / cuDNN's variant) and ``SCLSTM``, the skip-connected LSTM (Wang & Tian
  2016); :mod:`rhnzoo.cells.gated_fused`: their fast unroll;
  :mod:`rhnzoo.cells.torch_interop`: LSTM / GRU weights to and from ``torch.nn.LSTM`` /
  ``torch.nn.GRU`` state dicts (NumPy; torch not needed).
* :mod:`rhnzoo.cells.residual`: ``RRN``, the recurrent residual network, and
  ``Parallel``, cells side by side with averaged outputs (``Parallel((LSTM(n), RRN(n)))``
  is Wang & Tian's HRL).
* :mod:`rhnzoo.cells.bidirectional`: ``Bidirectional``, a forward and a backward cell
  over padded batches, each row reversed within its own length (``reverse_within``).
  Episode resets inside the scan: ``unroll(..., resets=[T, B] bool)`` (and the
  dispatcher's), or ``reset_before_step`` in a scan of your own.
* :mod:`rhnzoo.cells.scan`: the one scan dispatcher every model calls,
  ``scan.unroll(cell, ..., impl='auto'|'reference'|'fused'|'pallas', **options)``, and
  the rule for ``auto`` (``scan.resolve``); :mod:`rhnzoo.cells.kernels`: its ``pallas``
  backends, the Mosaic GPU kernels.
* :mod:`rhnzoo.cells.registry`: every cell by name, ``make(name, hidden_size, **kwargs)``
  (``NAMES``; ``hsg_<name>`` wraps one in HSG), the one registry every task uses.
"""

from rhnzoo.cells.base import (
    Carry,
    Cell,
    Params,
    check_positive,
    keep_state_after_end,
    reset_before_step,
    unroll,
)
from rhnzoo.cells.bidirectional import Bidirectional, reverse_within
from rhnzoo.cells.deep_transition import DTRNN, DTSRNN
from rhnzoo.cells.lstm import GRU, LSTM, SCLSTM, LSTMState, SCLSTMState
from rhnzoo.cells.residual import RRN, Parallel
from rhnzoo.cells.rhn import HSG, RHN
from rhnzoo.cells.registry import ALL_NAMES, HSG_NAMES, NAMES, applicable, label, make, options

__all__ = [
    "Carry",
    "Cell",
    "Params",
    "check_positive",
    "keep_state_after_end",
    "reset_before_step",
    "unroll",
    "Bidirectional",
    "reverse_within",
    "RHN",
    "HSG",
    "DTRNN",
    "DTSRNN",
    "LSTM",
    "GRU",
    "SCLSTM",
    "LSTMState",
    "SCLSTMState",
    "RRN",
    "Parallel",
    "make",
    "NAMES",
    "HSG_NAMES",
    "ALL_NAMES",
    "options",
    "applicable",
    "label",
]
