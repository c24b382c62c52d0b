"""Sequence classifier: embedding (or raw features) -> one recurrent layer -> final
state -> dropout -> softmax regression (Wang & Tian, EMNLP 2016, sec. 4).

Any cell of :mod:`rhnzoo.cells` fits: LSTM, GRU, RRN, SC-LSTM, ``Parallel`` (HRL), RHN,
... The representation of a sequence is the cell's output at the sequence's last real
step (for ``Parallel`` the mean of its cells' hidden states, eq. 7); padded steps do not
change the state (``cells.unroll(..., lengths=...)``). With ``bidirectional`` the layer is
:class:`rhnzoo.cells.Bidirectional` of two such cells and the representation the forward
cell's output at the last real step beside the backward cell's after reading step 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo import cells, dropout
from rhnzoo.cells import scan

Array = jax.Array
Params = Any


@dataclasses.dataclass(frozen=True)
class SequenceClassifier(scan.ScannedModel):
    """``logits(params, inputs, lengths) -> [B, C]``.

    Attributes:
      cell: the recurrent cell (hidden size n).
      num_classes: C.
      input_size: m: the embedding width (text) or the features per step (P-MNIST: 1).
      vocab_size: V for token inputs (learned embedding ``[V, m]``); None for float
        features ``[B, T, m]``.
      drop: dropout probability on the final representation (Wang & Tian sec. 4).
      input_drop: dropout probability on the inputs (the embedded words or the
        features), drawn independently per step and unit: the paper's "dropout on
        non-recurrent layers" (Zaremba et al. 2014) also covers this layer.
      init_scale: half-width of the uniform initialisation of the embedding and the
        output layer (the cell initialises itself).
      unroll: time steps per ``lax.scan`` iteration; None: the scan's own default
        (:func:`rhnzoo.cells.gated_fused.default_unroll` for the gated fused scan, else 1).
      remat: recompute time steps in the backward pass (long sequences); the gated fused
        scan has no remat, so with it ``auto`` picks the reference scan for a gated cell.
      project_per_step: project the inputs inside the time scan (see
        :func:`rhnzoo.cells.unroll`); None: the scan's own default, and True in the
        reference scan when the input is at most 8 wide (P-MNIST).
      scan_impl: the time scan, one of :data:`rhnzoo.cells.scan.CHOICES` (default
        ``'auto'``: :func:`rhnzoo.cells.scan.resolve`'s rule, at the batch of each call),
        called with ``outputs="last"``: the gated scans then write no ``[T, B, n]``
        output stack nor its cotangent.
      dtype: ``'float32'`` or ``'bfloat16'``: matmul inputs of the recurrent layer
        (input projection included) in bfloat16 with float32 accumulation
        (``preferred_element_type``); parameters, state, gates and the softmax layer stay
        float32. bfloat16 needs the fused or pallas scan.
      bidirectional: a :class:`~rhnzoo.cells.Bidirectional` layer (a forward and a
        backward copy of ``cell``, parameters ``params['cell'] = {'forward': ...,
        'backward': ...}``), each row's backward pass from its last real step; the
        representation ``[B, 2n]`` is both directions' final outputs side by side.

    Raises:
      ValueError: for num_classes < 2, input_size < 1, vocab_size < 2, a drop
        probability outside [0, 1), an unknown scan_impl or dtype, or a scan the cell
        does not have with these settings (:func:`rhnzoo.cells.scan.resolve`: e.g.
        ``'fused'`` for a DT-RNN, ``'fused'`` with remat for an LSTM, bfloat16 with the
        reference scan; one line).
    """

    cell: Any
    num_classes: int
    input_size: int
    vocab_size: int | None = None
    drop: float = 0.0
    input_drop: float = 0.0
    init_scale: float = 0.1
    unroll: int | None = None
    remat: bool = False
    project_per_step: bool | None = None
    scan_impl: str = "auto"
    dtype: str = "float32"
    bidirectional: bool = False

    def __post_init__(self):
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        cells.check_positive("input_size", self.input_size)
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        dropout.check_rate("drop", self.drop)
        dropout.check_rate("input_drop", self.input_drop)
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        self.resolved_scan()  # an unknown scan_impl, or one this cell does not have: one line

    @property
    def scan_input_size(self) -> int:
        """m, the width of the inputs the scan runs over (:meth:`resolved_scan`)."""
        return self.input_size

    def layer(self) -> Any:
        """The recurrent layer: ``cell``, or ``Bidirectional(cell)`` with ``bidirectional``."""
        return cells.Bidirectional(self.cell) if self.bidirectional else self.cell

    def init(self, key: Array) -> Params:
        """``{'cell': ..., 'W_out': [n, C], 'b_out': [C]}`` (+ ``'embed': [V, m]``), float32
        (``W_out [2n, C]`` with ``bidirectional``)."""
        ke, kc, ko = jax.random.split(key, 3)
        u = lambda k, shape: cells.base.uniform(k, shape, self.init_scale)
        layer = self.layer()
        params = {
            "cell": layer.init(kc, self.input_size),
            "W_out": u(ko, (layer.hidden_size, self.num_classes)),
            "b_out": jnp.zeros((self.num_classes,), jnp.float32),
        }
        if self.vocab_size is not None:
            params["embed"] = u(ke, (self.vocab_size, self.input_size))
        return params

    def features(
        self, params: Params, inputs: Array, lengths: Array, key: Array | None = None
    ) -> Array:
        """The sequence representations ``[B, n]`` (``[B, 2n]`` with ``bidirectional``).

        Args:
          inputs: ``[B, T]`` int token ids (``vocab_size`` set) or ``[B, T, m]`` float
            (integer or bool values, such as pixels, are taken as float32).
          lengths: ``[B]`` int real steps per row (0 allowed: the zero vector).
          key: PRNG key of the input dropout (training); None: no dropout.
        """
        if self.vocab_size is not None:
            xs = params["embed"][inputs.T]  # [T, B, m]
        else:
            xs = jnp.swapaxes(inputs, 0, 1)
            if not jnp.issubdtype(xs.dtype, jnp.inexact):
                xs = xs.astype(jnp.float32)
        if key is not None and self.input_drop:
            xs = xs * dropout.mask(key, xs.shape, self.input_drop, xs.dtype)
        batch = xs.shape[1]
        layer = self.layer()
        per_step = self.project_per_step
        if per_step is None and self.input_size <= 8:  # narrow inputs: measured faster
            per_step = True
        _, last = scan.unroll(
            layer,
            params["cell"],
            layer.initial_carry(batch, xs.dtype),
            xs,
            impl=self.scan_impl,
            lengths=lengths,
            unroll=self.unroll,
            remat=self.remat,
            project_per_step=per_step,
            save_matmuls=True,  # the reference scan's (the others write their backward)
            dtype=jnp.bfloat16 if self.dtype == "bfloat16" else None,
            outputs="last",  # the gated scans then write no [T, B, n] output stack
        )
        return last

    def logits(
        self, params: Params, inputs: Array, lengths: Array, key: Array | None = None
    ) -> Array:
        """``[B, C]`` unnormalised log-probabilities; dropout on the inputs and on the
        representation when ``key`` is given (training; their masks from the two halves
        of ``jax.random.split(key)``), none otherwise."""
        # One key per dropout site, always split: each site's mask is the same whether
        # or not the other site drops anything.
        k_in, k_out = (None, None) if key is None else jax.random.split(key)
        h = self.features(params, inputs, lengths, k_in)
        if k_out is not None and self.drop:
            h = h * dropout.mask(k_out, h.shape, self.drop, h.dtype)
        return h @ params["W_out"] + params["b_out"]
