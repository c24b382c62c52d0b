"""Next-step prediction of polyphonic music (piano rolls) with any rhnzoo cell.

The task of Boulanger-Lewandowski, Bengio & Vincent (ICML 2012) as used for the
optimisation study of Zilly et al. (2017, sec. 5.1, Fig. 4): at every time step the
model outputs 88 independent Bernoulli probabilities, one per piano key, for the next
frame. Input frame t (a 0/1 vector ``[88]``) predicts frame t + 1, so a sequence of
T frames gives T - 1 predictions, the first made from the zero state after one frame.

Loss: the negative log-likelihood of frame t + 1 under the 88 Bernoullis, i.e. the
binary cross-entropy summed over the notes, in nats; the reported figure is that sum
averaged over every prediction of a split (``NLL per time step``, the measure of
Boulanger-Lewandowski et al., Table 1). Training (:mod:`rhnzoo.tasks.polyphonic`)
uses whole-sequence BPTT on zero-padded minibatches; padded steps are masked out.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo import cells
from rhnzoo.cells import scan
from rhnzoo.data.music import NUM_NOTES

Array = jax.Array
Params = Any


@dataclasses.dataclass(frozen=True)
class PianoRollModel:
    """Cell -> linear -> 88 sigmoid logits.

    ``logits(params, x [T, B, 88]) -> [T, B, 88]``: the cell runs over the frames from
    the zero state; output t holds the logits of frame t + 1 (apply sigmoid for the note
    probabilities). Parameters: ``{'cell': <cell params>, 'W_out': [n, 88], 'b_out':
    [88]}``; ``W_out`` uniform in ±``cell.init_scale`` (like the cell), ``b_out`` zero.

    Attributes:
      cell: any cell of the :mod:`rhnzoo.cells` protocol (e.g. ``cells.make(name, n)``)
        whose output is ``[B, n]`` with n = ``cell.hidden_size``.
      num_notes: piano-roll width (88).
      scan_impl: the time scan, one of :data:`rhnzoo.cells.scan.CHOICES`
        (:func:`rhnzoo.cells.scan.unroll`; default ``'reference'``, plain autodiff;
        ``'auto'``: :func:`rhnzoo.cells.scan.resolve`'s rule). They compute the same
        function.

    Raises:
      ValueError: an unknown ``scan_impl`` or one the cell does not have (one line).
    """

    cell: Any
    num_notes: int = NUM_NOTES
    scan_impl: str = "reference"

    def __post_init__(self):
        scan.resolve(self.scan_impl, self.cell)

    def init(self, key: Array) -> Params:
        kc, ko = jax.random.split(key)
        scale = getattr(self.cell, "init_scale", 0.04)
        n = self.cell.hidden_size
        return {
            "cell": self.cell.init(kc, self.num_notes),
            "W_out": cells.base.uniform(ko, (n, self.num_notes), scale),
            "b_out": jnp.zeros((self.num_notes,), jnp.float32),
        }

    def logits(self, params: Params, x: Array) -> Array:
        """``x [T, B, 88]`` frames (float; 0/1 integers or bools as float32) -> ``[T, B,
        88]`` logits of the frames t + 1."""
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.float32)
        carry = self.cell.initial_carry(x.shape[1], x.dtype)
        _, ys = scan.unroll(self.cell, params["cell"], carry, x, impl=self.scan_impl)
        return ys @ params["W_out"].astype(ys.dtype) + params["b_out"]


def nll_sums(model: PianoRollModel, params: Params, x: Array, mask: Array) -> tuple[Array, Array]:
    """Summed next-step NLL and the number of predictions in a padded batch.

    Args:
      x: ``[T, B, 88]`` 0/1 frames, zero-padded; mask: ``[T, B]``, 1 on real frames
        (a prefix of each column).
    Returns:
      ``(total, count)``, float32 scalars: ``total`` = Σ over predictions t -> t + 1 with
      mask[t + 1] = 1 of Σ_notes BCE(sigmoid(logit), frame_{t+1}) in nats; ``count`` =
      the number of such predictions (Σ_b (T_b - 1)).
    """
    z = model.logits(params, x[:-1])
    y = x[1:]
    # -log p(y | z) for a Bernoulli with logit z: softplus(z) - y z (stable for any z).
    bce = jnp.sum(jax.nn.softplus(z) - y * z, axis=-1)
    w = mask[1:]
    return jnp.sum(bce * w), jnp.sum(w)
