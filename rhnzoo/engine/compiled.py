"""The engine's compiled train step: the task's step with the engine's step count and
per-step key, for the seeds' layout (:mod:`rhnzoo.engine.stacking`: one seed, or K seeds
stacked and the step ``jax.vmap``-ped), jit-compiled with the state donated."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo.engine.stacking import One, Stacked

Array = jax.Array


def engine_step(layout: One | Stacked, train_step, batch_axes, state, batch, run_keys, active):
    """The task's step with the engine's step count and per-step key ``fold_in(run_key,
    step)``, over the layout's seeds (K stacked: ``jax.vmap``-ped over the leading seed
    axis of the task state, the run keys and, ``batch_axes``, the batch; a seed whose
    ``active`` entry is False keeps its state, it stopped). Module-level with the layout,
    ``train_step`` and ``batch_axes`` static, so runs of the same task step (a random
    search) share one compiled function."""

    def one(task_state, seed_batch, run_key):
        return train_step(task_state, seed_batch, jax.random.fold_in(run_key, state["step"]))

    new, sums = layout.vmap(one, in_axes=(0, batch_axes, 0))(state["task"], batch, run_keys)
    return {"step": state["step"] + 1, "task": layout.keep(active, new, state["task"])}, sums


def scalar_like(tree: Any) -> Array:
    """An int32 0 placed like ``tree``: replicated over its mesh if it has one."""
    leaf_sharding = jax.tree.leaves(tree)[0].sharding
    if isinstance(leaf_sharding, jax.sharding.NamedSharding):
        replicated = jax.sharding.NamedSharding(leaf_sharding.mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_callback((), replicated, lambda _: np.zeros((), np.int32))
    return jnp.zeros((), jnp.int32)


def compile_step(layout: One | Stacked, train_step, batch_axes, state, batch, run_key, active):
    """``(step_fn, sums_shape)``: ``step_fn(state, batch, run_key, active) -> (state, sums)``
    (:func:`engine_step` of ``layout``) jit-compiled with ``state`` donated and its
    shardings kept, and the shapes of its sums (from ``state``, ``batch``, ``run_key`` and
    ``active``, the layout's mask, like the run's)."""
    shardings = jax.tree.map(lambda a: a.sharding, state)
    jitted = jax.jit(
        engine_step, static_argnums=(0, 1, 2), donate_argnums=3, out_shardings=(shardings, None)
    )
    program = functools.partial(engine_step, layout, train_step, batch_axes)
    sums_shape = jax.eval_shape(program, state, batch, run_key, active)[1]
    return functools.partial(jitted, layout, train_step, batch_axes), sums_shape
