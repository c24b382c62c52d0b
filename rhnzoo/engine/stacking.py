"""K seeds of one run as one program, for :func:`rhnzoo.engine.run`'s ``seeds``:
the step ``jax.vmap``-ped over a leading seed axis of the state, batches stacked along it,
each seed's config, and the stacked state's checkpoints (``<workdir>/stacked/``)."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo.config import RunSettings
from rhnzoo.config import seed_name
from rhnzoo.engine.workdir import Checkpoints, read_json, write_json


def stacked_step(train_step, batch_axes, state, batch, run_keys, active):
    """:func:`rhnzoo.engine`'s step of K seeds at once: the task's step ``jax.vmap``-ped over the
    leading seed axis of the task state, the run keys and (``batch_axes``) the batch; a
    seed whose ``active`` entry is False keeps its state (it stopped)."""

    def one(task_state, seed_batch, run_key):
        return train_step(task_state, seed_batch, jax.random.fold_in(run_key, state["step"]))

    new, sums = jax.vmap(one, in_axes=(0, batch_axes, 0))(state["task"], batch, run_keys)
    keep = lambda n, o: jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
    return {"step": state["step"] + 1, "task": jax.tree.map(keep, new, state["task"])}, sums


def stack(trees: Sequence[Any], axes: Any = 0) -> Any:
    """The pytrees ``trees`` (K seeds' batches or states, of one structure) stacked along a
    new leading axis: :attr:`rhnzoo.engine.Task.batch_axes`' stacking.

    ``axes``: a prefix of the pytree in tuples (or lists): 0, the leaves below are stacked
    (leaves of one rank but other shapes zero-padded at the end of each axis to the
    largest, e.g. token buckets of other lengths); None, the first tree's leaves are kept,
    shared by all seeds. Leaves that are all host arrays are stacked on the host (one
    transfer each when used).
    """
    if axes is None:
        return trees[0]
    if isinstance(axes, (tuple, list)):
        parts = [stack([t[i] for t in trees], a) for i, a in enumerate(axes)]
        return type(trees[0])(parts)
    return jax.tree.map(lambda *xs: _stacked(xs), *trees)


def _stacked(xs: Sequence[Any]) -> Any:
    """``xs`` stacked on a new leading axis, each zero-padded to their largest shape."""
    shape = np.max([np.shape(x) for x in xs], axis=0) if np.ndim(xs[0]) else ()
    on_host = all(isinstance(x, np.ndarray) for x in xs)
    lib = np if on_host else jnp
    pad = lambda x: [(0, int(n) - m) for n, m in zip(shape, np.shape(x), strict=True)]
    xs = [x if np.shape(x) == tuple(shape) else lib.pad(x, pad(x)) for x in xs]
    return np.stack(xs) if on_host else jnp.stack(xs)


def row(tree: Any, k: int) -> Any:
    """Seed ``k``'s slice of a stacked pytree."""
    return jax.tree.map(lambda a: a[k], tree)


def seed_config(config: RunSettings, k: int, workdir: pathlib.Path | None) -> RunSettings:
    """The config of seed ``k`` of :func:`rhnzoo.engine.run`'s ``seeds``: seed ``config.seed + k``,
    and a
    ``workdir`` setting that names the first seed's ``workdir`` renamed to seed k's
    (:func:`seed_name`), as a run of that seed alone records it."""
    changes = {"seed": config.seed + k}
    own = getattr(config, "workdir", None)
    if k and workdir is not None and own and pathlib.Path(own).absolute() == workdir:
        changes["workdir"] = str(pathlib.Path(own).with_name(seed_name(workdir.name, k)))
    return config.replace(**changes)


STACKED = "stacked"  # the stacked seeds' checkpoints, in the first seed's workdir


def open_stack(stack: pathlib.Path, configs: list[RunSettings], primary: bool, say) -> Checkpoints:
    """The stacked seeds' checkpoints in ``stack``, whose ``seeds.json`` names their seeds.

    Raises:
      ValueError: ``stack`` holds the stacked state of other seeds.
    """
    seeds, path = [c.seed for c in configs], stack / "seeds.json"
    if path.is_file():
        old = read_json(path)
        if old != seeds:
            raise ValueError(
                f"{stack} holds the stacked state of seeds {old}, not {seeds}; "
                f"rerun with those seeds or delete {stack}"
            )
    elif primary:
        stack.mkdir(parents=True, exist_ok=True)
        write_json(path, seeds)
    ckpt = Checkpoints(stack, best=False)
    for tmp in ckpt.remove_incomplete() if primary else ():
        say(f"removed {tmp}: a checkpoint save that did not finish")
    return ckpt
