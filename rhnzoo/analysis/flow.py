"""Information flow through time and depth, for any cell of :mod:`rhnzoo.cells`.

All four papers of the zoo argue about how information and gradients travel
through time (the RHN's Gersgorin analysis, HSG's short path through time, the
residual skips of RRN / SC-LSTM) and through depth (highway layers). JAX
differentiates a cell's ``step``, so the same functions serve every cell:

* :func:`temporal_jacobian`: the temporal Jacobian of one step, per batch row, in
  Zilly et al.'s layout (2017, eq. 2): ``A[b, j, i] = ∂s_t[i] / ∂s_{t-1}[j]``, where
  s is the carry flattened per row (for an LSTM, s = (h, c): d = 2n). With our row
  vectors (``s_t = tanh(s_{t-1} R + ...)`` for a one-layer tanh RNN) this layout makes
  eq. 2 read ``A = R diag(tanh')``: the paper's ``Rᵀ diag(f')`` with its R, which
  multiplies column vectors, being our ``Rᵀ``. :func:`jacobians_along` gives A at
  every step of a real input sequence.
* :func:`gersgorin_discs` (centres ``A_ii``, radii ``Σ_{j≠i} |A_ij|``: the paper's GCT
  statement, rows of its eq. 10's A; eq. 14 as printed indexes t, y, h by i, not j),
  :func:`eigenvalues`, :func:`spectral_radius`, :func:`largest_singular_value`.
* :func:`gradient_norms_through_time`: ``‖∂L_T / ∂s_{T-k}‖`` for k = 0..T in one
  backward pass (zero perturbations added to every carry are the inputs
  differentiated); :func:`layer_gradient_norms` / :func:`per_layer_norms`: per-layer
  gradient norms of a feed-forward stack through depth (Srivastava et al.; the highway
  experiments' Fig. 7 uses them).

Integer carry leaves (SC-LSTM's step counter) are not state a gradient can flow
through; they are held fixed and left out of s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Params = Any


def _is_float(leaf) -> bool:
    return jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)


def flatten_carry(carry: Any) -> tuple[Array, Callable[[Array], Any]]:
    """``carry -> (s [B, d], unflatten)``: the float leaves, flattened per batch row and
    concatenated in tree order; ``unflatten(s)`` rebuilds a carry (integer leaves as in
    ``carry``)."""
    leaves, tree = jax.tree.flatten(carry)
    floats = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]
    batch = leaves[floats[0]].shape[0]
    shapes = [leaves[i].shape for i in floats]
    sizes = [int(np.prod(s[1:])) for s in shapes]
    s = jnp.concatenate([leaves[i].reshape(batch, -1) for i in floats], axis=-1)

    def unflatten(flat: Array) -> Any:
        parts = jnp.split(flat, np.cumsum(sizes)[:-1], axis=-1)
        new = list(leaves)
        for i, part, shape in zip(floats, parts, shapes):
            new[i] = part.reshape((flat.shape[0],) + shape[1:])
        return jax.tree.unflatten(tree, new)

    return s, unflatten


def temporal_jacobian(
    cell: Any, params: Params, carry: Any, x_proj_t: Any, mask: Array | None = None
) -> Array:
    """The temporal Jacobian of one step, ``A [B, d, d]`` with ``A[b, j, i] = ∂s_t[i] /
    ∂s_{t-1}[j]``.

    Args:
      cell: any cell of the protocol; params: its parameters.
      carry: s_{t-1}, e.g. ``cell.initial_carry(B)`` or a state reached on real input.
      x_proj_t: the step's projected input (``cell.project_inputs(params, x)[t]``, ``[B, k]``).
      mask: the recurrent dropout mask, or None (evaluation).

    Returns:
      float32 ``[B, d, d]`` (d: the carry's float entries per row), Zilly et al.'s layout
      (eq. 2; see the module docstring): Gersgorin discs are taken over its rows.
    """
    s, unflatten = flatten_carry(carry)

    def step_row(s_row, carry_row, x_row, mask_row):
        full = unflatten(s_row[None])
        full = jax.tree.map(lambda new, old: new if _is_float(old) else old[None], full, carry_row)
        new, _ = cell.step(
            params,
            full,
            jax.tree.map(lambda a: a[None], x_row),
            None if mask_row is None else mask_row[None],
        )
        return flatten_carry(new)[0][0]

    def jac(s_row, carry_row, x_row, mask_row):
        return jax.jacfwd(step_row)(s_row, carry_row, x_row, mask_row)  # [d_out, d_in]

    rows = jax.vmap(jac, in_axes=(0, 0, 0, None if mask is None else 0))(s, carry, x_proj_t, mask)
    return jnp.swapaxes(rows, -1, -2)


@functools.partial(jax.jit, static_argnums=0)
def jacobians_along(cell: Any, params: Params, carry: Any, xs: Array) -> Array:
    """``A_t`` at every step while reading ``xs [T, B, m]`` from ``carry``: ``[T, B, d, d]``.

    Step t's Jacobian is taken at the carry reached after t steps (no dropout).
    Memory is T B d² floats; pick a short window for wide cells.
    """
    x_proj = cell.project_inputs(params, xs)

    def body(c, xp):
        a = temporal_jacobian(cell, params, c, xp)
        c, _ = cell.step(params, c, xp)
        return c, a

    return jax.lax.scan(body, carry, x_proj)[1]


def gersgorin_discs(a: Array) -> tuple[np.ndarray, np.ndarray]:
    """Gersgorin discs of the rows of ``a [..., d, d]`` (Zilly et al.'s GCT statement, for
    eq. 10's A): every eigenvalue lies in some disc ``|λ - A_ii| <= Σ_{j≠i} |A_ij|``.

    Returns ``(centres [..., d], radii [..., d])`` as NumPy arrays (centres real).
    """
    a = np.asarray(a)
    centres = np.diagonal(a, axis1=-2, axis2=-1)
    radii = np.abs(a).sum(-1) - np.abs(centres)
    return centres.copy(), radii


def eigenvalues(a: Array) -> np.ndarray:
    """Complex eigenvalues ``[..., d]`` of ``a [..., d, d]`` (NumPy, on the host)."""
    return np.linalg.eigvals(np.asarray(a, np.float64))


def spectral_radius(a: Array) -> np.ndarray:
    """``max |λ|`` over the eigenvalues of ``a [..., d, d]``: ``[...]``."""
    return np.abs(eigenvalues(a)).max(-1)


def largest_singular_value(a: Array) -> np.ndarray:
    """The spectral norm ``σ_max`` of ``a [..., d, d]`` (bounds the gain of one step): ``[...]``."""
    return np.linalg.norm(np.asarray(a, np.float64), ord=2, axis=(-2, -1))


def gradient_norms_through_time(
    cell: Any, params: Params, carry: Any, xs: Array, *, readout: Array | None = None, seed: int = 0
) -> np.ndarray:
    """``‖∂L_T / ∂s_{T-k}‖`` for k = 0..T: how far back in time a gradient reaches.

    ``L_T = mean_b u · s_T[b]`` with a fixed random unit vector u (``readout [d]``, or
    drawn from ``seed``), so ``‖∂L_T/∂s_T‖ = 1`` per row at k = 0 and every cell is
    measured the same way. One backward pass: a zero perturbation is added to the
    carry entering each step and the gradients with respect to all of them are taken
    at once.

    Args:
      cell, params: any cell and its parameters.
      carry: s_0 ``[B, ...]``; xs: ``[T, B, m]`` inputs (a real sequence or noise).

    Returns:
      float64 ``[T + 1]``: entry k is the gradient norm at s_{T-k}, averaged over rows.
    """
    x_proj = cell.project_inputs(params, xs)
    s0, unflatten = flatten_carry(carry)
    d = s0.shape[-1]
    if readout is None:
        readout = jax.random.normal(jax.random.PRNGKey(seed), (d,))
        readout = readout / jnp.linalg.norm(readout)

    def loss(deltas):  # deltas [T + 1, B, d]: added to s_0 .. s_T
        def body(c, inputs):
            xp, delta = inputs
            s, unflat = flatten_carry(c)
            c = unflat(s + delta)  # integer leaves (step counters) come back from c itself
            return cell.step(params, c, xp)[0], None

        c, _ = jax.lax.scan(body, carry, (x_proj, deltas[:-1]))
        s_T = flatten_carry(c)[0] + deltas[-1]
        return jnp.mean(s_T @ readout)

    deltas = jnp.zeros((xs.shape[0] + 1,) + s0.shape, s0.dtype)
    grads = jax.jit(jax.grad(loss))(deltas)  # [T + 1, B, d]; grads[t] = ∂L/∂s_t (mean over b)
    per_row = np.linalg.norm(np.asarray(grads, np.float64), axis=-1) * s0.shape[0]
    return per_row.mean(-1)[::-1]


def per_layer_norms(groups: Any) -> Array:
    """L2 norm of every layer's slice of a stack's gradients (traceable, for use under jit).

    Args:
      groups: a pytree whose leaves all have the layer as their leading axis (e.g.
        ``{'W': [L, n, k n], 'b': [L, k n]}``), or a list of such pytrees, concatenated in
        order (e.g. an input layer ``[1, ...]`` followed by the stack).

    Returns:
      ``[L]`` (summed over groups): entry l is ``sqrt(Σ_leaves ‖leaf[l]‖²)``.
    """
    groups = groups if isinstance(groups, list | tuple) else [groups]
    norms = [
        jnp.sqrt(
            sum(
                jnp.sum(jnp.square(leaf.reshape(leaf.shape[0], -1)), axis=-1)
                for leaf in jax.tree.leaves(group)
            )
        )
        for group in groups
    ]
    return jnp.concatenate(norms)


def layer_gradient_norms(
    loss_fn: Callable[[Params], Array], params: Params, layered: Callable[[Params], Any]
) -> np.ndarray:
    """Per-layer L2 norms ``‖∂loss/∂θ_l‖`` of a feed-forward stack (through depth).

    Args:
      loss_fn: ``params -> scalar`` loss.
      params: the parameters.
      layered: ``grads -> groups`` for :func:`per_layer_norms` (the stacked layers'
        gradients, e.g. ``lambda g: g['layers']``).

    Returns:
      ``[L]`` float64 norms, one per layer.
    """
    norms = jax.jit(lambda p: per_layer_norms(layered(jax.grad(loss_fn)(p))))(params)
    return np.asarray(norms, np.float64)
