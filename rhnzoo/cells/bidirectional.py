"""Bidirectional layers that are right on padded batches: :class:`Bidirectional` and
:func:`reverse_within`.

The backward cell starts from its initial carry at each row's **last real step**, not
at the padded end of the batch (flipping the padded batch whole would start each short
row on padding): each row is reversed within its own length (:func:`reverse_within`),
both directions run through :func:`rhnzoo.cells.scan.unroll` with ``lengths``, and the
backward outputs are reversed back. This is PyTorch's ``nn.LSTM(bidirectional=True)`` on
a ``PackedSequence`` (tested against a NumPy transcription of it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.cells.base import Array, Carry, Params, check_lengths

MERGES = ("concat", "sum")


def reverse_within(xs: Array, lengths: Array | None = None) -> Array:
    """Each row of ``xs`` reversed within its own length; padded steps stay in place.

    Row b's real steps 0..len_b-1 become len_b-1..0: ``out[t, b] = xs[len_b - 1 - t, b]``
    for t < len_b, ``out[t, b] = xs[t, b]`` for t >= len_b. Its own inverse. Without
    ``lengths``, ``xs[::-1]``. Differentiable (a gather).

    Args:
      xs: ``[T, B, ...]`` time-major, any dtype.
      lengths: optional ``[B]`` int real steps per row, each in [0, T].

    Returns:
      ``[T, B, ...]``, ``xs``'s dtype.

    Raises:
      ValueError: (one line) ``xs`` with fewer than 2 axes, or ``lengths`` not ``[B]``
        int in [0, T] (:func:`check_lengths`).
    """
    if jnp.ndim(xs) < 2:
        raise ValueError(f"reverse_within needs xs [T, B, ...], got shape {list(jnp.shape(xs))}")
    T, B = xs.shape[:2]
    lengths = check_lengths(lengths, T, B)
    if lengths is None:
        return xs[::-1]
    t = jnp.arange(T)[:, None]
    src = jnp.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)  # [T, B]
    return xs[src, jnp.arange(B)[None, :]]


@dataclasses.dataclass(frozen=True)
class Bidirectional:
    """A bidirectional recurrent layer of two cells of the :mod:`rhnzoo.cells` protocol.

    ``Bidirectional(cells.LSTM(n))`` runs two LSTMs (the backward one a copy of the
    forward's settings, with parameters of its own); ``Bidirectional(f, b)`` any two
    cells (``merge='sum'`` needs equal hidden sizes). Pure functions of a parameter
    pytree, like the cells: ``init``, ``initial_carry`` and ``unroll``. It is a layer,
    not a cell: the backward direction needs the whole sequence, so it has no ``step``
    (put it in a ``lax.scan`` over layers or batches, not over time).

    Parameters: ``{'forward': <forward cell's>, 'backward': <backward cell's>}``.
    Carry: ``(forward carry, backward carry)``, each its cell's (e.g.
    :class:`~rhnzoo.cells.LSTMState`). Output ``[T, B, n_f + n_b]`` (``'concat'``:
    forward features first) or ``[T, B, n]`` (``'sum'``), zero at padded steps.

    Attributes:
      forward: the cell run over steps 0..len-1.
      backward: the cell run over steps len-1..0 (None: ``forward``'s settings).
      merge: ``'concat'`` (feature axis) or ``'sum'``.

    Raises:
      ValueError: an unknown ``merge``, or ``'sum'`` with hidden sizes that differ.
    """

    forward: Any
    backward: Any = None
    merge: str = "concat"

    def __post_init__(self):
        if self.backward is None:
            object.__setattr__(self, "backward", self.forward)
        if self.merge not in MERGES:
            raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        sizes = (self.forward.hidden_size, self.backward.hidden_size)
        if self.merge == "sum" and sizes[0] != sizes[1]:
            raise ValueError(
                f"merge='sum' needs equal hidden sizes, got forward {sizes[0]} and "
                f"backward {sizes[1]}"
            )

    @property
    def hidden_size(self) -> int:
        """The output width: n_f + n_b (``'concat'``) or n (``'sum'``)."""
        n_f, n_b = self.forward.hidden_size, self.backward.hidden_size
        return n_f + n_b if self.merge == "concat" else n_f

    def init(self, key: Array, input_size: int) -> Params:
        """``{'forward': ..., 'backward': ...}``: each cell's ``init`` with its own half of
        ``jax.random.split(key)``. Raises ValueError if input_size < 1."""
        k_f, k_b = jax.random.split(key)
        return {
            "forward": self.forward.init(k_f, input_size),
            "backward": self.backward.init(k_b, input_size),
        }

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> tuple[Carry, Carry]:
        """``(forward carry, backward carry)``, each its cell's ``initial_carry``."""
        return (
            self.forward.initial_carry(batch_size, dtype),
            self.backward.initial_carry(batch_size, dtype),
        )

    def unroll(
        self,
        params: Params,
        carry: tuple[Carry, Carry],
        xs: Array,
        mask: tuple[Array | None, Array | None] | None = None,
        *,
        lengths: Array | None = None,
        impl: str = "auto",
        outputs: bool | str = "all",
        **scan_options: Any,
    ) -> tuple[tuple[Carry, Carry], Array | None]:
        """Runs both directions over a padded batch.

        Args:
          params: ``init``'s.
          carry: ``(forward carry, backward carry)`` (``initial_carry``): the forward
            cell starts from its carry at step 0, the backward cell from its carry at
            each row's last real step.
          xs: ``[T, B, m]`` float inputs, time-major; padded steps must be finite (the
            RHN's fused scan runs them).
          mask: None, or ``(forward mask, backward mask)``, each ``[B, n]`` or None: the
            cells' recurrent dropout masks.
          lengths: optional ``[B]`` int real steps per row, each in [0, T] (None: all T).
            A row of length 0 keeps both initial carries and outputs zeros.
          impl: the scan of both directions, one of
            :data:`rhnzoo.cells.scan.CHOICES` (:func:`rhnzoo.cells.scan.unroll`).
          outputs: ``"all"`` (True); ``"none"`` (False): no outputs (``(carries,
            None)``); ``"last"``: ``[B, hidden_size]``, the forward output at each row's
            last real step beside (or plus) the backward output after reading step 0, as
            a classifier reads it.
          **scan_options: the other fields of :class:`rhnzoo.cells.scan_options.Options`,
            passed to :func:`rhnzoo.cells.scan.unroll` for both directions (``dtype``,
            ``unroll``, ``remat``, ``project_per_step``, ``save_matmuls``, the backend
            options).

        Returns:
          ``((forward carry, backward carry), ys)``: the forward carry after each row's
          last real step, the backward carry after reading step 0, and ``ys [T, B,
          hidden_size]`` (the forward output at step t beside, or plus, the backward
          output at step t; zero at padded steps), None with ``outputs="none"``, or ``[B,
          hidden_size]`` with ``outputs="last"``.

        Raises:
          ValueError: (one line) ``lengths`` not ``[B]`` int in [0, T], a ``mask`` that
            is not None or a pair, ``resets`` (episodes have no backward direction),
            or what :func:`rhnzoo.cells.scan.unroll` raises.
        """
        from rhnzoo.cells import scan  # the dispatcher imports every scan: import late

        if "resets" in scan_options:
            raise ValueError("Bidirectional takes no resets: an episode has no backward pass")
        T, B = xs.shape[:2]
        lengths = check_lengths(lengths, T, B)
        if mask is None:
            mask = (None, None)
        if not (isinstance(mask, (tuple, list)) and len(mask) == 2):
            raise ValueError(
                "Bidirectional's mask must be None or (forward mask, backward mask), got "
                f"{type(mask).__name__}"
            )
        outputs = {True: "all", False: "none"}.get(outputs, outputs)  # as Options takes them
        run = dict(impl=impl, lengths=lengths, outputs=outputs, **scan_options)
        carry_f, ys_f = scan.unroll(self.forward, params["forward"], carry[0], xs, mask[0], **run)
        carry_b, ys_b = scan.unroll(
            self.backward, params["backward"], carry[1], reverse_within(xs, lengths), mask[1], **run
        )
        if outputs == "none":
            return (carry_f, carry_b), None
        if outputs != "last":  # "last": the backward's last real step is after step 0
            ys_b = reverse_within(ys_b, lengths)
        if self.merge == "sum":
            return (carry_f, carry_b), ys_f + ys_b
        return (carry_f, carry_b), jnp.concatenate([ys_f, ys_b], axis=-1)
