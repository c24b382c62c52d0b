"""The engine's evaluation: a task's pure ``eval_step`` summed over a split's batches,
for one seed or K stacked seeds (:func:`evaluate`), and how a run is reported
(:class:`Report`).

K stacked seeds are evaluated by ``jax.lax.map`` over the seed axis of the parameters (and
carry), one seed after another in one program, each formed as the unstacked step forms
it: on the CPU equal bit for bit to a separate run's, so a near-tie picks the same best
checkpoint (a ``jax.vmap`` rounded differently in the 8th digit at some shapes).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rhnzoo.engine import stacking


@dataclasses.dataclass(frozen=True)
class Report:
    """How a task's run is reported: the words of its lines and records.

    Attributes:
      select: the metric (a key of ``metrics``' dicts of the validation splits) that picks
        the best epoch.
      metrics: ``(split, sums) -> dict`` of named floats, from a split's summed eval sums
        (host floats), e.g. ``{'valid_ppl': ...}``.
      higher_is_better: direction of ``select``.
      train_metrics: ``sums -> dict`` of reported training metrics (e.g.
        ``{'train_ppl': ...}``) from the train step's sums over any span of steps.
      chance_loss: loss per unit of a uniform guess (log V, log C, 88 log 2), nats: a
        level of the divergence check (None: the check has only the run's best window).
      unit: name of one throughput unit in the log (``'tok'``, ``'img'``, ...).
      throughput_key: the key of the train sums counted for the throughput (None:
        ``'count'``), e.g. ``'tokens'`` when the loss is per sequence.
      learning_rate: ``step -> lr`` for the log, or None.
      validation: the splits evaluated after every epoch (their ``metrics`` merged; the
        first one's ``loss / count``, if its sums have both, is ``'valid_loss'``, nats
        per unit, for the divergence check).
      final: the splits of the final evaluation of the best parameters.
      timed: each final split's evaluation time is a result, ``'<split>_eval_s'``.
      final_label: shown in the final line, e.g. ``'eval batch 1'``.
      final_settings: the final evaluation's settings, written into its results (e.g.
        ``{'eval_batch_size': 1}``): a finished run whose ``results.json`` holds other
        values is not trained again but its best checkpoint is evaluated again.
    """

    select: str
    metrics: Callable[[str, Mapping[str, float]], dict[str, Any]]
    higher_is_better: bool = False
    train_metrics: Callable[[Mapping[str, float]], dict[str, float]] = lambda s: {
        "train_loss": s["loss"] / max(s["count"], 1.0)
    }
    chance_loss: float | None = None
    unit: str = "ex"
    throughput_key: str | None = None
    learning_rate: Callable[[int], float] | None = None
    validation: tuple[str, ...] = ("valid",)
    final: tuple[str, ...] = ("valid", "test")
    timed: bool = False
    final_label: str = ""
    final_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Batches(Sequence):
    """``n`` batches made when read: batch ``i`` is ``get(i)`` (a long evaluation's
    batches need not all exist at once)."""

    def __init__(self, n: int, get: Callable[[int], Any]):
        self.n, self.get = n, get

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.get(i)


def _one(eval_step, carried, params, batch, carry):
    return eval_step(params, batch, carry) if carried else (eval_step(params, batch), None)


def _sums(layout, eval_step, carried, params, batch, carry):
    """The layout's seeds' sums of ``batch`` and carries (K stacked: ``jax.lax.map`` over
    the seed axis of the parameters and carry)."""
    return layout.map(lambda pc: _one(eval_step, carried, pc[0], batch, pc[1]), (params, carry))


def _added(layout, eval_step, carried, params, batch, carry, totals):
    """:func:`_sums` added to ``totals`` in the same program (no eager op per batch)."""
    sums, carry = _sums(layout, eval_step, carried, params, batch, carry)
    return jax.tree.map(jnp.add, totals, sums), carry


# Module-level, the layout and the task's step static: runs of one task's step share one
# compilation.
_added_jit = jax.jit(_added, static_argnums=(0, 1, 2))


def evaluate(
    eval_step: Callable,
    params: Any,
    batches: Sequence[Any],
    carry: Any = None,
    *,
    carried: bool = False,
    seeds: int | None = None,
    track: Callable | None = None,
) -> dict[str, Any]:
    """The summed ``eval_step`` sums of ``params`` over ``batches`` (device float32 scalars;
    with ``seeds`` = K, each ``[K]``: K stacked seeds' parameters, ``carry`` the initial
    carry of one seed, given to each), added on the device in batch order with at most two
    batches in flight: the package's one evaluation loop (validation, final evaluation,
    analyses, benchmarks).

    ``carried``: ``eval_step(params, batch, carry) -> (sums, carry)``, the carry passed
    from batch to batch; else ``eval_step(params, batch) -> sums``. ``track``: the engine's
    progress/signal iterator (raises :class:`rhnzoo.engine.signals.Interrupted`).
    Raises ValueError if ``batches`` is empty.
    """
    if len(batches) == 0:
        raise ValueError("an evaluation split without batches")
    layout = stacking.layout(seeds)
    carry = layout.repeat(carry)
    step = functools.partial(_sums, layout, eval_step, carried)
    shapes = jax.eval_shape(lambda p, b, c: step(p, b, c)[0], params, batches[0], carry)
    totals = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    fn = functools.partial(_added_jit, layout, eval_step, carried)
    items = batches if track is None else track(batches, total=len(batches))
    for batch in items:
        previous = totals
        totals, carry = fn(params, batch, carry, totals)
        jax.block_until_ready(previous)  # at most two batches in flight
    return totals


def seed_rows(totals: Mapping[str, Any], seeds: int | None = None) -> list[dict[str, float]]:
    """Host floats of :func:`evaluate`'s totals: one dict per seed (one for ``seeds`` None)."""
    layout, totals = stacking.layout(seeds), jax.device_get(dict(totals))
    return [{k: float(layout.row(v, i)) for k, v in totals.items()} for i in range(layout.k)]


def valid_loss(sums: Mapping[str, float]) -> dict[str, float]:
    """``{'valid_loss': loss / count}`` (nats per unit) if the sums have both, else {}."""
    if "loss" in sums and "count" in sums:
        return {"valid_loss": sums["loss"] / sums["count"]}
    return {}


def splits(
    task, params: Any, *, final: bool, seeds: int | None = None, track: Callable | None = None
) -> list[dict[str, Any]]:
    """The metrics of ``params`` (K stacked seeds' with ``seeds``) on the task's validation
    splits (``task.report.validation``) or final ones (``final``: ``report.final``, with
    ``'<split>_eval_s'`` if ``report.timed``): one dict of ``report.metrics`` per seed, the
    validation's with ``'valid_loss'`` (:func:`valid_loss` of its first split).

    ``task``: an :class:`rhnzoo.engine.Task`; ``track``: the engine's progress/signal
    iterator (its ``desc`` set to the split's name).
    """
    report, carried = task.report, task.eval_carry is not None
    rows: list[dict[str, Any]] = [{} for _ in range(stacking.layout(seeds).k)]
    for i, split in enumerate(report.final if final else report.validation):
        start = time.perf_counter()
        carry = task.eval_carry(split, final) if carried else None
        shown = functools.partial(track, desc=f"final {split}" if final else split)
        totals = evaluate(
            task.eval_step,
            params,
            task.eval_batches(split, final),
            carry,
            carried=carried,
            seeds=seeds,
            track=None if track is None else shown,
        )
        for row, sums in zip(rows, seed_rows(totals, seeds), strict=True):
            row.update(report.metrics(split, sums))
            if final and report.timed:
                row[f"{split}_eval_s"] = time.perf_counter() - start
            elif i == 0:
                row.update(valid_loss(sums))
    return rows
