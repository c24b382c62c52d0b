r"""Where a train step's time goes: XLA's ops, timed from a profiler trace.

  python -m rhnzoo.bench.trace --cell=lstm --config=pmnist          # fused scan
  python -m rhnzoo.bench.trace --cell=gru --config=imdb_cpu --scan_impl=reference

Runs :mod:`rhnzoo.bench.rnn`'s classifier train step (value and gradient) a few times
under ``jax.profiler.trace`` and prints, per XLA op (fusion, dot, copy, while loop),
its total time per step and how often it ran, largest first: the table behind the
profiles in docs/runs/cpu/levers.md. On CPU the per-op events need
``--xla_cpu_enable_xprof_traceme=true`` in ``XLA_FLAGS`` before JAX starts; the CLI sets
it. An op inside a time scan shows up once per step (``count`` = T); ops of nested
loops are also inside their loop's own total, so the column does not add up to the
step time.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any


def op_times(fn: Callable[[], Any], *, steps: int = 3) -> list[tuple[str, float, int]]:
    """Profiles ``steps`` calls of ``fn`` (after one untimed call).

    Args:
      fn: a zero-argument callable returning jax arrays (a jitted step, its inputs bound).
      steps: profiled calls.

    Returns:
      ``[(op name, milliseconds per call, events per call)]``, largest time first, from
      the trace's complete events: XLA ops and runtime events (Python frames left out).
    """
    import jax

    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(steps):
                jax.block_until_ready(fn())
        (path,) = glob.glob(os.path.join(tmp, "**", "perfetto_trace.json.gz"), recursive=True)
        with gzip.open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith("$"):  # "$": Python frames
            total[e["name"]][0] += e.get("dur", 0.0)
            total[e["name"]][1] += 1
    rows = [(name, us / 1e3 / steps, n // steps) for name, (us, n) in total.items()]
    return sorted(rows, key=lambda r: -r[1])


def main(argv):
    del argv
    import functools

    import jax

    from rhnzoo import precision
    from rhnzoo.bench import rnn

    if FLAGS.config not in rnn.CONFIGS or FLAGS.cell not in rnn.CELLS:
        raise SystemExit(
            f"error: choose --config from {list(rnn.CONFIGS)}, --cell from {list(rnn.CELLS)}"
        )
    cell, params, xs, labels = rnn.problem(FLAGS.cell, rnn.CONFIGS[FLAGS.config])
    step = rnn.loss_of(functools.partial(rnn.rhnzoo_logits, cell, scan_impl=FLAGS.scan_impl))
    with precision.context(FLAGS.matmul_precision):
        rows = op_times(lambda: step(params, xs, labels), steps=FLAGS.steps)
    print(
        f"{FLAGS.cell} {FLAGS.config} ({FLAGS.scan_impl}), {jax.devices()[0].device_kind}, "
        f"matmul precision {FLAGS.matmul_precision}: ms per train step, events per step"
    )
    for name, ms, count in rows[: FLAGS.top]:
        print(f"{ms:10.2f} {count:7d}  {name}")


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
    ).strip()
    from absl import app, flags

    from rhnzoo.apps import cli

    cli.define_precision_flag()
    flags.adopt_module_key_flags(cli)
    flags.DEFINE_string("cell", "lstm", "Cell of rhnzoo.bench.rnn.CELLS.")
    flags.DEFINE_string("config", "pmnist", "Shape of rhnzoo.bench.rnn.CONFIGS.")
    flags.DEFINE_enum("scan_impl", "fused", ["fused", "reference"], "rhnzoo's scan.")
    flags.DEFINE_integer("steps", 3, "Profiled train steps.")
    flags.DEFINE_integer("top", 30, "Rows printed.")
    FLAGS = flags.FLAGS
    app.run(main)
