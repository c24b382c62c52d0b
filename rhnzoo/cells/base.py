"""The cell protocol shared by every rhnzoo cell, and ``unroll``.

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

Every leaf of a carry has the batch as its leading axis, so that variable-length
batches can freeze finished rows (:func:`keep_state_after_end`) and episodes can restart
a row from its initial carry inside the scan (:func:`reset_before_step`,
``unroll(..., resets=...)``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Params = Any
Carry = Any


class Cell(Protocol):
    """The protocol every rhnzoo cell follows (RHN, HSG, DT-RNN, LSTM, GRU, RRN, ...)."""

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
    lengths: Array | None = None,
    unroll: int = 1,
    remat: bool = False,
    project_per_step: bool = False,
    save_matmuls: bool = False,
    resets: Array | None = None,
) -> tuple[Carry, Array]:
    """Runs ``cell`` over a time-major sequence with ``jax.lax.scan``.

    Args:
      cell: any cell of the protocol above.
      params: the cell's parameters (``cell.init``).
      carry: initial carry, e.g. ``cell.initial_carry(B)`` (``[B, n]`` for RHN).
      xs: ``[T, B, m]`` float inputs, time-major.
      mask: the cell's recurrent dropout mask (``[B, n]``) or ``None``.
      lengths: optional ``[B]`` int number of real steps per row (the rest is
        padding): padded steps leave the carry unchanged and output zeros, so the
        final carry of row b is its state after step ``lengths[b]``.
      unroll: time steps per scan iteration (``lax.scan``'s ``unroll``).
      remat: recompute each time step in the backward pass (less memory).
      project_per_step: apply ``cell.project_inputs`` inside the scan, one step at a
        time, instead of once for all steps (faster for an input much narrower than the
        projection, P-MNIST's 1 pixel).
      save_matmuls: run every step under :func:`save_matmuls_only`; ignored with
        ``remat``.
      resets: optional ``[T, B]`` bool episode starts: where ``resets[t, b]`` is True,
        row b's carry is replaced by row b of the initial ``carry`` (this call's
        argument, e.g. zeros from ``cell.initial_carry``, or any per-row state the caller
        passes) before step t runs, so each episode runs exactly as if unrolled on its
        own from ``carry`` (values and gradients: a reset cuts the gradient path to the
        steps before it; the initial carry receives the gradient of every episode that
        starts from it). With ``lengths``, resets on padded steps are ignored (padded
        steps keep the carry). An SC-LSTM's step counter restarts too.

    Returns:
      ``(carry, ys)``: the final carry and the outputs ``[T, B, n]``.

    Raises:
      ValueError: what :func:`check_inputs` raises (``xs`` not ``[T, B, m]``, a carry
        not of batch B, bad ``lengths`` or ``resets``).
    """
    lengths, resets = check_inputs(carry, xs, lengths, resets)
    step = functools.partial(cell.step, params, mask=mask)
    if project_per_step:
        step_after_projection = step
        step = lambda carry, x_t: step_after_projection(carry, cell.project_inputs(params, x_t))
        inputs = xs
    else:
        inputs = cell.project_inputs(params, xs)
    if lengths is not None:
        step = keep_state_after_end(step)
        valid = jnp.arange(xs.shape[0])[:, None] < jnp.asarray(lengths)[None, :]
        inputs = (inputs, valid)
        if resets is not None:
            resets = resets & valid
    if resets is not None:
        step = reset_before_step(step, carry)
        inputs = (inputs, resets)
    if remat:
        step = jax.checkpoint(step)
    elif save_matmuls:
        step = save_matmuls_only(step)
    return jax.lax.scan(step, carry, inputs, unroll=unroll)


def keep_state_after_end(step):
    """Wraps ``step(carry, x_t) -> (carry, y_t)`` for padded batches.

    The wrapped step takes ``(carry, (x_t, valid_t))`` with ``valid_t [B]`` bool:
    rows where ``valid_t`` is false keep their carry and output zeros. Use it in
    your own ``lax.scan`` with ``valid = arange(T)[:, None] < lengths[None, :]``.
    """

    def masked(carry, inputs):
        x_t, valid = inputs
        new, y = step(carry, x_t)

        def pick(a, b):
            v = valid.reshape(valid.shape + (1,) * (a.ndim - valid.ndim))
            return jnp.where(v, a, b)

        return jax.tree.map(pick, new, carry), pick(y, jnp.zeros_like(y))

    return masked


def reset_before_step(step, initial: Carry):
    """Wraps ``step(carry, x_t) -> (carry, y_t)`` for episode resets inside a scan.

    The wrapped step takes ``(carry, (x_t, reset_t))`` with ``reset_t [B]`` bool: rows
    where ``reset_t`` is True continue from their row of ``initial`` (a carry of the
    cell, every leaf ``[B, ...]``) instead of ``carry``, before the step runs. Use it in
    your own ``lax.scan`` as :func:`unroll` does for ``resets``::

      step = reset_before_step(functools.partial(cell.step, params), carry0)
      carry, ys = jax.lax.scan(step, carry0, (cell.project_inputs(params, xs), resets))
    """

    def restarted(carry, inputs):
        x_t, reset = inputs

        def pick(a, b):
            r = reset.reshape(reset.shape + (1,) * (a.ndim - reset.ndim))
            return jnp.where(r, a, b)

        return step(jax.tree.map(pick, initial, carry), x_t)

    return restarted


def check_resets(resets: Any, xs: Array) -> Array:
    """``resets`` as a ``[T, B]`` bool array for the inputs ``xs [T, B, ...]``.

    Raises:
      ValueError: (one line) if ``resets`` is not a bool array of shape ``[T, B]``.
    """
    T, B = xs.shape[:2]
    resets = jnp.asarray(resets)
    shape, dtype = tuple(resets.shape), resets.dtype
    if shape != (T, B) or dtype != jnp.bool_:
        raise ValueError(
            f"resets must be a [T, B] = [{T}, {B}] bool array (True: the row restarts "
            f"from its initial carry before that step), got shape {list(shape)} "
            f"dtype {dtype}"
        )
    return resets


def check_lengths(lengths: Any, T: int, B: int) -> Array | None:
    """``lengths`` as a ``[B]`` int array of real steps per row, each in [0, T]; None
    stays None (every row has T real steps).

    The values are checked where they are concrete (not under ``jit``).

    Raises:
      ValueError: (one line) a shape other than ``[B]``, a non-integer dtype, or a
        concrete length below 0 or above T.
    """
    if lengths is None:
        return None
    lengths = jnp.asarray(lengths)
    if lengths.shape != (B,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(
            f"lengths must be a [B] = [{B}] int array of real steps per row, got shape "
            f"{list(lengths.shape)} dtype {lengths.dtype}"
        )
    try:
        values = np.asarray(lengths)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return lengths  # traced: checked by shape only
    if values.size and (values.min() < 0 or values.max() > T):
        raise ValueError(
            f"lengths must lie in [0, T] = [0, {T}], got min {values.min()} max {values.max()}"
        )
    return lengths


def check_inputs(
    carry: Carry, xs: Array, lengths: Any = None, resets: Any = None
) -> tuple[Array | None, Array | None]:
    """``(lengths, resets)`` checked against ``xs [T, B, m]`` and ``carry`` (shapes at
    trace time; concrete lengths by value too): what :func:`unroll` and
    :func:`rhnzoo.cells.scan.unroll` check before they build a scan.

    Raises:
      ValueError: (one line) ``xs`` not of rank 3 (time-major ``[T, B, m]``), a carry
        leaf whose leading axis is not B, bad ``lengths`` (:func:`check_lengths`) or
        ``resets`` (:func:`check_resets`).
    """
    shape = tuple(jnp.shape(xs))
    if len(shape) != 3:
        raise ValueError(f"xs must be [T, B, m] (time-major), got shape {list(shape)}")
    T, B = shape[:2]
    for leaf in jax.tree.leaves(carry):
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != B:
            raise ValueError(
                f"every carry leaf must have the batch B = {B} of xs {list(shape)} as its "
                f"leading axis, got a leaf of shape {list(jnp.shape(leaf))}"
            )
    resets = None if resets is None else check_resets(resets, xs)
    return check_lengths(lengths, T, B), resets


def check_param_shapes(cell: Any, params: Params, want: dict[str, tuple], sizes: str = "") -> None:
    """Checks that ``params`` has exactly the keys of ``want`` and their shapes (``None``
    in a shape: any size, printed as m). Shapes only (trace time). ``sizes`` ends a shape
    error's line (``"hidden size 8 and depth 3"``).

    Raises:
      ValueError: (one line naming ``cell`` and the parameter) params not a dict, a
        missing or unknown key, or a shape other than ``want``'s.
    """
    if not hasattr(params, "keys"):
        raise ValueError(
            f"{cell!r}: parameters must be a dict with keys {sorted(want)}, "
            f"got {type(params).__name__}"
        )
    missing, unknown = sorted(set(want) - set(params)), sorted(set(params) - set(want))
    if missing or unknown:
        raise ValueError(
            f"{cell!r}: parameters {sorted(want)} expected; "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"unknown {unknown}" if unknown else "")
        )
    for key, shape in want.items():
        got = tuple(jnp.shape(params[key]))
        if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape)):
            text = ", ".join("m" if w is None else str(w) for w in shape)
            raise ValueError(
                f"{cell!r}: parameter '{key}' has shape {list(got)}, expected [{text}]"
                + (f" for {sizes}" if sizes else "")
            )


def project(xs: Array, W: Array) -> Array:
    """``xs @ W`` in ``xs``'s floating dtype (W cast to it), or in W's where ``xs`` is
    not floating (integer or bool inputs, as a data loader gives them, are promoted
    rather than truncating W)."""
    if not jnp.issubdtype(xs.dtype, jnp.inexact):
        xs = xs.astype(W.dtype)
    return xs @ W.astype(xs.dtype)


def save_matmuls_only(fn):
    """``fn`` under ``jax.checkpoint``, saving only matmul outputs for the backward pass.

    The backward pass recomputes the cheap gate nonlinearities from the saved ``h U``
    products instead of reading stored ``[T, B, n]`` residuals back (an LSTM keeps 6n
    floats per row and step instead of 11n): faster on the CPU at P-MNIST's
    memory-bound shape. No effect without differentiation.
    """
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_saveable, prevent_cse=False)


def flat_draw(sample, key: Array, shape: tuple[int, ...], **kwargs: Any) -> Array:
    """``sample(key, shape=shape, **kwargs)`` for a ``jax.random`` sampler (uniform,
    normal, truncated_normal, bernoulli, ...), drawn flat and reshaped.

    The same numbers as the draw in ``shape`` (threefry counts in row-major order; tested),
    but compiled faster for a stacked ``R [L, n, kn]`` (docs/runs/cpu/levers.md).
    """
    return sample(key, shape=(math.prod(shape),), **kwargs).reshape(shape)


def uniform(key: Array, shape: tuple[int, ...], scale: float) -> Array:
    """float32 ``shape`` array uniform in [-scale, scale] (:func:`flat_draw`)."""
    return flat_draw(jax.random.uniform, key, shape, dtype=jnp.float32, minval=-scale, maxval=scale)


def check_positive(name: str, value: int) -> None:
    """Raises ValueError unless ``value`` is an integer >= 1 (a Python or NumPy integer;
    not a bool)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
