"""Benchmarks that survive a noisy machine.

A figure of record here is a *ratio taken in one process*: rhnzoo's step and a
peer's (the code a user would otherwise write, or Flax's built-in), timed
alternately, each reported as the minimum (and median) over rounds, with the
device's dense-matmul throughput read between rounds so that a figure can be
set against the best peak seen in the same run. Absolute numbers on a shared
machine drift by tens of percent within minutes; ratios of interleaved minima do
not.

* :func:`matmul_peak`: best FLOP/s of a large square matmul.
* :func:`alternate`: time several zero-argument callables in interleaved rounds.
* ``python -m rhnzoo.bench.lm``: the RHN / HSG language-model train step
  (``python -m rhnzoo.bench`` runs it too).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp


def matmul_peak(dtype=jnp.float32, size: int | None = None, reps: int = 5) -> float:
    """Best FLOP/s of a large square matmul on the default device (float32 accumulation)."""
    size = size or (2048 if jax.default_backend() == "cpu" else 8192)
    a = jax.random.normal(jax.random.PRNGKey(0), (size, size), dtype)
    f = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def alternate(
    candidates: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    repeats: int = 1,
    peak_dtype: Any | None = jnp.float32,
) -> dict[str, Any]:
    """Times ``candidates`` in interleaved rounds: A, B, ..., [peak], A, B, ...

    Each callable runs one unit of work and returns something to block on (a jax
    array or pytree); it is called once untimed first (warm-up and compilation).

    Args:
      candidates: name -> zero-argument callable.
      rounds: timed rounds; each round times every candidate ``repeats`` times.
      peak_dtype: dtype of the matmul peak read after every round (None: skip).

    Returns:
      ``{'seconds': {name: {'min', 'median', 'all': [...]}}, 'peak_flops_per_s':
      {'max', 'min', 'all': [...]}}`` (``peak_flops_per_s`` only if measured).
    """
    for fn in candidates.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in candidates}
    peaks: list[float] = []
    for _ in range(rounds):
        for name, fn in candidates.items():
            for _ in range(repeats):
                t = time.perf_counter()
                jax.block_until_ready(fn())
                times[name].append(time.perf_counter() - t)
        if peak_dtype is not None:
            peaks.append(matmul_peak(peak_dtype, reps=2))
    out: dict[str, Any] = {
        "seconds": {name: {"min": min(ts), "median": statistics.median(ts), "all": ts}
                    for name, ts in times.items()}  # fmt: skip
    }
    if peaks:
        out["peak_flops_per_s"] = {"max": max(peaks), "min": min(peaks), "all": peaks}
    return out
