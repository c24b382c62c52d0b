"""Shared test helpers (imported by test modules as ``helpers``)."""

import jax
import numpy as np


def random_params(params, key, scale=0.5):
    """Replaces every leaf by random values, so biases and gates are not at their init."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(
        tree, [jax.random.normal(k, l.shape, l.dtype) * scale for k, l in zip(keys, leaves)]
    )


def np_tree(t):
    """The pytree as float64 NumPy arrays (for NumPy transcriptions of the equations)."""
    return jax.tree.map(lambda a: np.asarray(a, np.float64), t)
