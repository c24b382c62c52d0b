"""Variational dropout (Gal & Ghahramani 2016), as used by RHNs (Zilly et al. 2017, sec. 4).

Masks are drawn from an explicit PRNG key once per minibatch and shared by all
time steps of that minibatch; they are drawn outside the time scan and passed
in. Rates are drop probabilities (as in the reference code's ``drop_*`` flags);
kept units are scaled by 1 / (1 - rate) ("inverted" dropout), so evaluation
simply uses no masks.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rhnzoo.cells.base import flat_draw

Array = jax.Array


def check_rate(name: str, rate: float) -> None:
    """Raises ValueError unless ``0 <= rate < 1``."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{name} must be a drop probability in [0, 1), got {rate}")


def mask(key: Array, shape: tuple[int, ...], rate: float, dtype=jnp.float32) -> Array:
    """A Bernoulli keep-mask of ``shape`` (e.g. ``(B, n)``; broadcast over time by the
    caller) and ``dtype``: 0 and 1 / (1 - rate), ``rate`` the drop probability. Raises
    ValueError unless 0 <= rate < 1."""
    check_rate("rate", rate)
    if rate == 0.0:
        return jnp.ones(shape, dtype)
    keep = flat_draw(jax.random.bernoulli, key, shape, p=1.0 - rate)
    return keep.astype(dtype) / (1.0 - rate)


def word_mask(key: Array, tokens: Array, vocab_size: int, rate: float, dtype=jnp.float32) -> Array:
    """Word (embedding) dropout: the ``[B, T]`` :func:`mask` of ``tokens [B, T]`` (ids <
    ``vocab_size``), one draw per word type per batch row: a word that occurs several times
    in a row is dropped at every occurrence (the reference code's ``noise_x``)."""
    per_type = mask(key, (tokens.shape[0], vocab_size), rate, dtype)
    return jnp.take_along_axis(per_type, tokens, axis=1)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Drop probabilities of the four RHN dropout sites (reference code's flags).

    x: word dropout on the embedding output; i: cell input; h: recurrent state
    entering every micro-layer; o: cell output before the softmax.
    """

    x: float = 0.0
    i: float = 0.0
    h: float = 0.0
    o: float = 0.0

    def __post_init__(self):
        for name in ("x", "i", "h", "o"):
            check_rate(f"drop_{name}", getattr(self, name))


def lm_masks(
    key: Array, tokens: Array, vocab_size: int, input_size: int, hidden_size: int, rates: Rates
) -> dict[str, Array]:
    """All four masks of a language-model minibatch.

    Args:
      key: PRNG key for this minibatch.
      tokens: ``[B, T]`` int input ids.
      vocab_size, input_size, hidden_size: V, embedding size m, state size n.
      rates: drop probabilities.

    Returns:
      ``{'x': [B, T], 'i': [B, m], 'h': [B, n], 'o': [B, n]}`` float32 masks.
    """
    kx, ki, kh, ko = jax.random.split(key, 4)
    b = tokens.shape[0]
    return {
        "x": word_mask(kx, tokens, vocab_size, rates.x),
        "i": mask(ki, (b, input_size), rates.i),
        "h": mask(kh, (b, hidden_size), rates.h),
        "o": mask(ko, (b, hidden_size), rates.o),
    }
