"""The engine's compiled train step: the task's step with the engine's step count and
per-step key, for one seed or K seeds stacked (:func:`rhnzoo.engine.stacking.stacked_step`),
jit-compiled with the state donated."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo.engine import stacking

Array = jax.Array


def engine_step(train_step, state, batch, run_key):
    """The task's step with the engine's step count and per-step key ``fold_in(run_key,
    step)``; module-level with ``train_step`` static, so runs of the same task step (a
    random search) share one compiled function."""
    key = jax.random.fold_in(run_key, state["step"])
    task_state, sums = train_step(state["task"], batch, key)
    return {"step": state["step"] + 1, "task": task_state}, sums


def scalar_like(tree: Any) -> Array:
    """An int32 0 placed like ``tree``: replicated over its mesh if it has one."""
    leaf_sharding = jax.tree.leaves(tree)[0].sharding
    if isinstance(leaf_sharding, jax.sharding.NamedSharding):
        replicated = jax.sharding.NamedSharding(leaf_sharding.mesh, jax.sharding.PartitionSpec())
        return jax.make_array_from_callback((), replicated, lambda _: np.zeros((), np.int32))
    return jnp.zeros((), jnp.int32)


def compile_step(train_step, batch_axes, state, batch, run_key, seeds: int | None = None):
    """``(step_fn, sums_shape)``: ``step_fn(state, batch, run_key, active) -> (state, sums)``
    jit-compiled with ``state`` donated and its shardings kept (``seeds``: K stacked seeds,
    ``active`` ``[K]`` bool, the seeds that still train; else ``active`` is ignored), and
    the shapes of its sums (from ``state``, ``batch`` and ``run_key`` like the run's)."""
    shardings = jax.tree.map(lambda a: a.sharding, state)
    if seeds is None:
        jitted = jax.jit(
            engine_step, static_argnums=0, donate_argnums=1, out_shardings=(shardings, None)
        )
        fn = lambda state, batch, key, active: jitted(train_step, state, batch, key)
        one = functools.partial(engine_step, train_step)
        return fn, jax.eval_shape(one, state, batch, run_key)[1]
    jitted = jax.jit(
        stacking.stacked_step,
        static_argnums=(0, 1),
        donate_argnums=2,
        out_shardings=(shardings, None),
    )
    many = functools.partial(stacking.stacked_step, train_step, batch_axes)
    mask = jnp.ones(seeds, bool)
    return functools.partial(jitted, train_step, batch_axes), jax.eval_shape(
        many, state, batch, run_key, mask
    )[1]
