"""The seeds' layout: one seed (:class:`One`, every operation the identity) or K seeds of
one run as one program (:class:`Stacked`: states, keys and batches on a leading seed axis,
the step ``jax.vmap``-ped over it, the evaluation ``jax.lax.map``-ped); each seed's config,
and the stacked state's checkpoints (``<workdir>/stacked/``).

The engine's code is written once for K seeds against a layout; the one place where one
seed or K stacked is decided is :func:`layout`, where the compiled programs are chosen.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo.config import RunSettings
from rhnzoo.engine.workdir import Checkpoints, read_json, write_json


def seed_name(name: str, k: int) -> str:
    """The name (and workdir name) of seed ``k`` (0, 1, ...) of run ``name``: ``name``
    itself for k = 0, so a run of one seed keeps its workdir, else ``<name>_s<k>``."""
    return name if k == 0 else f"{name}_s{k}"


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
    """The config of seed ``k`` of :func:`rhnzoo.engine.run`'s ``seeds``: seed
    ``config.seed + k``, and a ``workdir`` setting that names the first seed's ``workdir``
    renamed to seed k's (:func:`seed_name`), as a run of that seed alone records it."""
    changes = {"seed": config.seed + k}
    own = getattr(config, "workdir", None)
    if k and workdir is not None and own and pathlib.Path(own).absolute() == workdir:
        changes["workdir"] = str(pathlib.Path(own).with_name(seed_name(workdir.name, k)))
    return config.replace(**changes)


STACKED = "stacked"  # the stacked seeds' checkpoints, in the first seed's workdir


@dataclasses.dataclass(frozen=True)
class One:
    """One seed, unstacked: the K = 1 layout, every operation the identity (hashable: a
    static argument of the compiled programs)."""

    k = 1  # the number of seeds
    seeds = None  # :func:`rhnzoo.engine.evaluate.evaluate`'s ``seeds``
    shown = ""  # what the run's first line says of its seeds

    def stack(self, trees: Sequence[Any], axes: Any = 0) -> Any:
        return trees[0]

    def row(self, tree: Any, k: int) -> Any:
        return tree

    def pack(self, metas: list[dict]) -> Any:
        """The seeds' bookkeeping as checkpointed with the state."""
        return metas[0]

    def unpack(self, meta: Any) -> list[dict]:
        return [meta]

    def repeat(self, tree: Any) -> Any:
        """``tree`` given to each seed (an evaluation's initial carry)."""
        return tree

    def mask(self, active: Sequence[bool]) -> Any:
        """The compiled step's ``active`` argument (the seeds that still train)."""
        return None

    def vmap(self, fn: Callable, in_axes: Any) -> Callable:
        return fn

    def map(self, fn: Callable, xs: Any) -> Any:
        return fn(xs)

    def keep(self, active: Any, new: Any, old: Any) -> Any:
        """``new``, except the seeds no longer ``active`` keep ``old``."""
        return new

    def voice(self, say: Callable[[str], None], seed: int) -> Callable[[str], None]:
        """A seed's printed lines."""
        return say

    def latest(self, seeds: Sequence[Any], root: pathlib.Path, configs, primary, say):
        """The checkpoints of the run's states: the seed's own (:class:`rhnzoo.engine.seeds.Seed`
        opened with ``latest=``:attr:`own_latest`)."""
        return seeds[0].ckpt

    own_latest = True  # each seed's workdir checkpoints its states

    def close(self, latest: Checkpoints | None) -> None:
        """Closes :meth:`latest`'s checkpoints (a seed's own: the seed closes them)."""


@dataclasses.dataclass(frozen=True)
class Stacked:
    """``k`` seeds stacked on a leading axis of the states, keys, batches and sums."""

    k: int

    @property
    def seeds(self) -> int:
        return self.k

    @property
    def shown(self) -> str:
        return f", {self.k} seeds stacked"

    def stack(self, trees: Sequence[Any], axes: Any = 0) -> Any:
        return stack(trees, axes)

    def row(self, tree: Any, k: int) -> Any:
        return row(tree, k)

    def pack(self, metas: list[dict]) -> Any:
        return metas

    def unpack(self, meta: Any) -> list[dict]:
        return meta

    def repeat(self, tree: Any) -> Any:
        return jax.tree.map(lambda a: jnp.stack([a] * self.k), tree)

    def mask(self, active: Sequence[bool]) -> Any:
        return jnp.asarray(active)

    def vmap(self, fn: Callable, in_axes: Any) -> Callable:
        return jax.vmap(fn, in_axes=in_axes)

    def map(self, fn: Callable, xs: Any) -> Any:
        return jax.lax.map(fn, xs)

    def keep(self, active: Any, new: Any, old: Any) -> Any:
        where = lambda n, o: jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
        return jax.tree.map(where, new, old)

    def voice(self, say: Callable[[str], None], seed: int) -> Callable[[str], None]:
        return lambda line: say(f"[seed {seed}] {line}")

    def latest(self, seeds: Sequence[Any], root: pathlib.Path, configs, primary, say):
        return open_stack(root / STACKED, configs, primary, say)

    own_latest = False  # the stacked states are checkpointed together

    def close(self, latest: Checkpoints | None) -> None:
        if latest is not None:
            latest.close()


def layout(seeds: int | None) -> One | Stacked:
    """The seeds' layout: None, one seed (:class:`One`); K, K seeds stacked (:class:`Stacked`).
    The one place where one seed or K stacked is decided."""
    return One() if seeds is None else Stacked(seeds)


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
    if primary:
        ckpt.remove_incomplete(say)
    return ckpt
