"""The one train step: gradient of a task's loss, the optimizer's update (clipping is in
``tx``), the new state.

Every task (language modelling, sequence classification, highway nets, piano rolls)
brings a loss and an optax transformation and gets its engine ``train_step`` here::

    step = make_train_step(loss_fn, tx)   # (state, batch, key) -> (state, sums)

The state is ``{'params', 'opt_state'}``, plus ``'carry'`` for a task that carries a
recurrent state from batch to batch (truncated BPTT): the loss receives the carry and
returns the next one in its aux.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

Array = jax.Array
LossFn = Callable[[Any, Any, Array, Any], tuple[Array, tuple[dict[str, Array], Any]]]


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation):
    """The engine's pure ``train_step(state, batch, key) -> (state, sums)``.

    Args:
      loss_fn: ``loss_fn(params, batch, key, carry) -> (loss, (sums, carry))``: the
        scalar loss to differentiate (float32), the batch's sums to report (a dict of
        scalars with ``'loss'`` and its count, see :class:`rhnzoo.engine.Task`)
        and the next carry (``carry`` is ``state['carry']``, None for a task without
        one). ``key`` is the step's PRNG key (dropout masks).
      tx: the optimizer (gradient clipping, schedule and weight decay chained in).

    Returns:
      ``train_step``; it keeps every key of ``state`` and replaces ``'params'``,
      ``'opt_state'`` and (when present) ``'carry'``. The returned sums are those before
      the update. The engine jit-compiles it with the state donated; to call it yourself,
      wrap it in ``jax.jit(..., donate_argnums=0)``.
    """

    def train_step(state, batch, key):
        grads, (sums, carry) = jax.grad(loss_fn, has_aux=True)(
            state["params"], batch, key, state.get("carry")
        )
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new = {
            **state,
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }
        if "carry" in state:
            new["carry"] = carry
        return new, sums

    return train_step
