"""Data parallelism over a 1-D ``Mesh(("data",))``, multi-host safe.

Batch rows (and anything per row, such as a truncated-BPTT carry) are sharded
over the ``"data"`` axis; parameters and optimizer state are replicated; XLA's
SPMD partitioner inserts the gradient all-reduce. Arrays are built with
``jax.make_array_from_callback``, so each process supplies only its addressable
shards from its own (identical) host copy.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def data_mesh(devices=None) -> jax.sharding.Mesh:
    """A 1-D ``Mesh(("data",))`` over ``devices`` (default: every device of every host)."""
    return jax.sharding.Mesh(np.asarray(devices or jax.devices()), ("data",))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def by_rows(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Leading axis split over the ``"data"`` devices."""
    return NamedSharding(mesh, P("data"))


def put(x: Any, sharding: NamedSharding) -> jax.Array:
    """``x`` (host or device array) as a global array with ``sharding``, multi-host safe."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_tree(tree: Any, sharding: NamedSharding) -> Any:
    return jax.tree.map(lambda x: put(x, sharding), tree)


def check_divisible(batch_size: int, mesh: jax.sharding.Mesh) -> None:
    """Raises ValueError unless the batch splits evenly over the mesh's devices."""
    if batch_size % mesh.size:
        raise ValueError(f"batch_size {batch_size} is not divisible by the {mesh.size} devices")


def put_rows(
    arrays: Any, mesh: jax.sharding.Mesh, *, pad: bool = False, stacked: bool = False
) -> Any:
    """Every array of the pytree ``arrays`` with its leading (batch) axis split over the
    ``"data"`` devices; ``stacked``: arrays ``[K, rows, ...]`` of K stacked seeds, whose
    rows (axis 1) are split and seed axis is not.

    ``pad=True``: zero rows are first appended up to a multiple of the device count,
    for evaluation batches whose zero rows weigh nothing (a weights array among
    ``arrays``, or a recurrent carry whose extra rows no weighted loss reads), so that
    an evaluation batch of 1 or 20 runs split over 8 devices rather than whole on each.
    Raises ValueError (``pad=False``) if the device count does not divide the rows.
    """
    leaves = jax.tree.leaves(arrays)
    rows = np.shape(leaves[0])[1 if stacked else 0] if leaves else 0
    extra = -rows % mesh.size
    if stacked:
        check_divisible(rows, mesh)
        return put_tree(arrays, NamedSharding(mesh, P(None, "data")))
    if extra and pad:
        rows_only = lambda a: [(0, extra)] + [(0, 0)] * (np.ndim(a) - 1)
        arrays = jax.tree.map(lambda a: np.pad(np.asarray(a), rows_only(a)), arrays)
    elif extra:
        check_divisible(rows, mesh)
    return put_tree(arrays, by_rows(mesh))
