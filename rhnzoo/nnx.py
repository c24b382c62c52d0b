"""A thin Flax NNX adapter: any rhnzoo cell as an ``nnx.Module``.

rhnzoo cells are pure functions over a params pytree (:mod:`rhnzoo.cells`).
:class:`Recurrent` holds a cell (static) and its params as ``nnx.Param``
variables, one per array leaf, in the cell's own nested-dict layout, so that
``nnx.split``, ``nnx.state``, ``nnx.grad`` and ``nnx.Optimizer`` see every leaf
(state paths such as ``('params', 'cell', 'R')`` for ``HSG(RHN(...))``)::

    rnn = Recurrent(RHN(256, depth=3), 128, rngs=nnx.Rngs(0))
    carry, ys = rnn(xs)                 # xs [T, B, 128] -> ys [T, B, 256]
    Recurrent(RHN(256, depth=3), 128, time_major=False, rngs=nnx.Rngs(0))  # [B, T, 128]
    params = rnn.cell_params()          # back to the functional world
    rnn.set_cell_params(params)         # and into the module again
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rhnzoo import cells
from rhnzoo.cells import scan

Array = jax.Array
Params = Any


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


class Recurrent(nnx.Module):
    """An rhnzoo cell unrolled over time (:func:`rhnzoo.cells.unroll`) as an NNX module.

    Args:
      cell: any cell of the :class:`rhnzoo.cells.Cell` protocol (e.g. ``RHN``,
        ``HSG(RHN(...))``); kept as a static attribute (it is a hashable frozen
        dataclass, so it lives in the ``GraphDef``).
      input_size: m, the width of the inputs ``xs [T, B, m]``.
      rngs: ``nnx.Rngs``; the params are ``cell.init(rngs.params(), input_size)``.
      params: optional existing functional params (from ``cell.init``, a
        checkpoint, ...) to wrap instead of initialising; ``rngs`` is then unused.
      time_major: the layout of ``xs`` and ``ys``: ``True`` (the default, as
        :func:`rhnzoo.cells.unroll`), ``[T, B, ...]``; ``False``, ``[B, T, ...]``, the
        layout of Flax's ``nnx.RNN`` default. The shapes cannot tell the two apart:
        a batch-major input to a time-major module scans its batch axis.

    Raises:
      ValueError: if neither ``rngs`` nor ``params`` is given; whatever
        ``cell.init`` raises (e.g. input_size < 1).
    """

    def __init__(
        self,
        cell: cells.Cell,
        input_size: int,
        *,
        rngs: nnx.Rngs | None = None,
        params: Params | None = None,
        time_major: bool = True,
    ):
        if params is None:
            if rngs is None:
                raise ValueError("Recurrent needs rngs (to initialise the params) or params")
            params = cell.init(rngs.params(), input_size)
        self.cell = cell
        self.input_size = input_size
        self.time_major = time_major
        # Flax >= 0.12 treats a plain dict attribute as static unless it is marked as
        # data; nnx.data makes the nested dict of Params part of the module's state.
        self.params = nnx.data(jax.tree.map(nnx.Param, params))

    def cell_params(self) -> Params:
        """The plain functional params (same pytree as ``cell.init``), as arrays."""
        return jax.tree.map(lambda v: v.get_value(), self.params, is_leaf=_is_variable)

    def set_cell_params(self, params: Params) -> None:
        """Overwrites every Param in place with ``params`` (the same tree structure).

        Raises:
          ValueError: if ``params`` does not have the structure of ``cell_params()``.
        """
        own = jax.tree.structure(self.cell_params())
        if jax.tree.structure(params) != own:
            raise ValueError(f"params structure {jax.tree.structure(params)} != {own}")
        jax.tree.map(lambda v, a: v.set_value(a), self.params, params, is_leaf=_is_variable)

    def initial_carry(self, batch_size: int, dtype: Any = jnp.float32) -> cells.Carry:
        """The cell's initial (zero) carry, e.g. ``[B, n]``."""
        return self.cell.initial_carry(batch_size, dtype)

    def __call__(
        self,
        xs: Array,
        carry: cells.Carry | None = None,
        mask: Array | None = None,
        *,
        unroll: int = 1,
        scan_impl: str = "reference",
    ) -> tuple[cells.Carry, Array]:
        """Runs the cell over ``xs``.

        Args:
          xs: inputs ``[T, B, m]`` (``[B, T, m]`` if the module is not ``time_major``).
          carry: initial carry; ``None`` means the zero carry in ``xs.dtype``.
          mask: the cell's recurrent dropout mask (``[B, n]``) or ``None``.
          unroll: time steps per scan iteration.
          scan_impl: the time scan, one of :data:`rhnzoo.cells.scan.CHOICES`
            (:func:`rhnzoo.cells.scan.unroll`; default ``'reference'``, the cell's own
            ``step`` under autodiff). They compute the same function.

        Returns:
          ``(carry, ys)``: the final carry and the outputs ``[T, B, n]`` (``[B, T, n]``
          if not ``time_major``).

        Raises:
          ValueError: if ``xs`` is not rank 3 with last axis ``input_size``; a
            ``scan_impl`` the cell does not have (one line).
        """
        if xs.ndim != 3 or xs.shape[-1] != self.input_size:
            layout = "[T, B, m]" if self.time_major else "[B, T, m]"
            raise ValueError(
                f"xs must be {layout} with m = {self.input_size}, got shape {tuple(xs.shape)}"
            )
        if not self.time_major:
            xs = jnp.swapaxes(xs, 0, 1)
        if carry is None:
            carry = self.cell.initial_carry(xs.shape[1], xs.dtype)
        carry, ys = scan.unroll(
            self.cell, self.cell_params(), carry, xs, mask, impl=scan_impl, unroll=unroll
        )
        return carry, (ys if self.time_major else jnp.swapaxes(ys, 0, 1))
