"""Benchmarks that survive a noisy machine.

A figure of record here is a *ratio taken in one process*: rhnzoo's step and a peer's
(the code a user would otherwise write, or Flax's built-in), timed alternately, each
reported as the minimum (and median) over rounds, the ratio also as the median of the
rounds' paired ratios, with the dense-matmul peak read between rounds. Absolute numbers
on a shared machine drift by tens of percent within minutes; ratios of interleaved minima
much less, but under heavy load still by up to ~20% between runs
(``docs/bench_cpu_2core_noisy.jsonl``): quote ranges over runs. Every record names its
``matmul_precision`` (``--matmul_precision``, :mod:`rhnzoo.precision`).

* :func:`matmul_peak`: best FLOP/s of a large square matmul.
* :func:`alternate`: time several zero-argument callables in interleaved rounds.
* :func:`ratios`: one candidate's time over another's from those rounds.
* :func:`memory_estimate`, :func:`host_info`, :func:`compile_donated`, :func:`stepper`: a
  record's compiled memory and machine, a donated step compiled and as a zero-argument
  callable.
* ``python -m rhnzoo.bench.lm``: the RHN / HSG language-model train step against a
  plain-JAX peer (``python -m rhnzoo.bench`` runs it too);
* ``python -m rhnzoo.bench.highway``: a depth-100 highway net epoch against Flax NNX (a
  Python loop of layers, and ``nnx.vmap`` + ``nnx.scan``);
* ``python -m rhnzoo.bench.rnn``: the gated cells' classifier step (fused scan) against Flax
  (``OptimizedLSTMCell``, ``GRUCell``) and their own reference scan;
* ``python -m rhnzoo.bench.trace``: that step's time per XLA op, from a profiler trace;
* ``python -m rhnzoo.bench.seeds``: K seeds as a batch dimension of one train step.
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp


@functools.lru_cache(maxsize=None)
def _square(dtype_name: str, size: int):
    """A compiled ``a @ a`` (float32 accumulation) and its operand, made once."""
    a = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.dtype(dtype_name))
    f = jax.jit(lambda a: jnp.dot(a, a, preferred_element_type=jnp.float32))
    f(a).block_until_ready()
    return f, a


def matmul_peak(dtype=jnp.float32, size: int | None = None, reps: int = 5) -> float:
    """Best FLOP/s of a large square matmul on the default device (float32 accumulation).

    Args:
      dtype: input dtype of the matmul (float32 or bfloat16).
      size: side of the square matrices (default 2048 on CPU, 8192 otherwise).
      reps: timed repetitions; the fastest one is reported.

    Returns:
      ``2 size**3 / (fastest seconds)``, FLOP/s (compiled once per dtype and size).
    """
    size = size or (2048 if jax.default_backend() == "cpu" else 8192)
    f, a = _square(jnp.dtype(dtype).name, size)
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
    peak_size: int | None = None,
    peak_reps: int = 3,
    warmup: bool = True,
) -> dict[str, Any]:
    """Times ``candidates`` in interleaved rounds: A, B, ..., [peak], B, ..., A, [peak], ...

    Each callable runs one unit of work and returns something to block on. Round r times
    the candidates in their order rotated by r (so that no candidate always runs right
    after the peak read or a given rival), each ``repeats`` times in a row, then reads
    the matmul peak.

    Args:
      candidates: name -> zero-argument callable.
      rounds: timed rounds; each round times every candidate ``repeats`` times.
      repeats: consecutive timed calls of a candidate per round.
      peak_dtype: dtype of the matmul peak read after every round (None: skip).
      peak_size: side of the peak's square matmul (default: :func:`matmul_peak`'s).
      peak_reps: repetitions per peak read (the fastest counts).
      warmup: call each candidate once untimed first (False only if the caller has).

    Returns:
      ``{'seconds': {name: {'min', 'median', 'all': [...]}}, 'peak_flops_per_s':
      {'max', 'min', 'all': [...]}}``: wall seconds per call (``all`` has
      ``rounds * repeats`` entries, in time order) and one peak per round
      (FLOP/s; ``peak_flops_per_s`` only if measured).

    Raises:
      ValueError: if there are no candidates, or rounds or repeats < 1.
    """
    if not candidates or rounds < 1 or repeats < 1:
        raise ValueError(
            f"alternate needs candidates, rounds >= 1 and repeats >= 1, got "
            f"{len(candidates)} candidates, rounds={rounds}, repeats={repeats}"
        )
    if warmup:
        for fn in candidates.values():
            jax.block_until_ready(fn())
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    peaks: list[float] = []
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = candidates[name]
            for _ in range(repeats):
                t = time.perf_counter()
                jax.block_until_ready(fn())
                times[name].append(time.perf_counter() - t)
        if peak_dtype is not None:
            peaks.append(matmul_peak(peak_dtype, size=peak_size, reps=peak_reps))
    out: dict[str, Any] = {
        "seconds": {
            name: {"min": min(ts), "median": statistics.median(ts), "all": ts}
            for name, ts in times.items()
        }
    }
    if peaks:
        out["peak_flops_per_s"] = {"max": max(peaks), "min": min(peaks), "all": peaks}
    return out


def ratios(seconds: Mapping[str, Mapping[str, Any]], a: str, b: str) -> dict[str, float]:
    """``a``'s time over ``b``'s (> 1: ``b`` is faster) from :func:`alternate`'s
    ``seconds``: ``min`` (of the minima), ``median`` (of the medians) and
    ``paired_median``, the median of the per-call ratios in time order. A round runs
    each candidate back to back, so load that drifts between rounds moves the paired
    median least."""
    x, y = seconds[a], seconds[b]
    return {
        "min": x["min"] / y["min"],
        "median": x["median"] / y["median"],
        "paired_median": statistics.median(p / q for p, q in zip(x["all"], y["all"])),
    }


def memory_estimate(compiled, prefix: str = "") -> dict:
    """The compiled step's memory from XLA's analysis: ``<prefix>temp_bytes`` and
    ``<prefix>peak_bytes_estimate`` (arguments + outputs + temporaries - aliased); ``{}``
    where the backend reports none."""
    try:
        m = compiled.memory_analysis()
        est = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        return {
            f"{prefix}temp_bytes": int(m.temp_size_in_bytes),
            f"{prefix}peak_bytes_estimate": int(est - m.alias_size_in_bytes),
        }
    except Exception:  # not every backend reports it
        return {}


def host_info() -> dict:
    """The device, backend, CPU model and count, JAX versions: every record's machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__,
    }


def compile_donated(step, state, batch, key):
    """``(compiled, seconds)``: ``step(state, batch, key)`` jitted with the state donated,
    compiled for these arguments."""
    t = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=0).lower(state, batch, key).compile()
    return compiled, time.perf_counter() - t


def stepper(compiled, state, batch, key):
    """``(call, box)``: ``call()`` runs one donated train step on the state in ``box[0]``."""
    box = [state]

    def call():
        box[0], sums = compiled(box[0], batch, key)
        return box[0], sums

    return call, box
