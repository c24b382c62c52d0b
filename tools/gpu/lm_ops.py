"""The XLA op table of one LM train step (``measure.sh lm``, issue 57): does each
micro-layer step copy its weight slice out of the stacked weights?

Compiles rhnzoo.bench.lm's train step of a configuration (the optimized HLO, as the
device runs it) and prints: the step's op counts by opcode (all computations, and the
while loops' bodies alone), then every ``copy`` / ``dynamic-slice`` / ``slice`` /
``transpose`` whose result has the shape of one micro-layer's recurrent weights
``[hidden, 2 hidden]`` (HSG / RHN: H and T fused) or bigger, with the computation it is
in: one inside the time loop's body per micro-layer is the copy the question is about.

  python tools/gpu/lm_ops.py [--config=ptb_d40_hsg] [--dtype=float32|bfloat16]
"""

import argparse
import collections
import re

import jax
import numpy as np

from rhnzoo.bench import lm as bench_lm
from rhnzoo.tasks import lm as train
from rhnzoo.data import common as data

OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*([\w\[\]{},:\s\d]+?)\s+([a-z][\w\-]*)\(")
SHAPE = re.compile(r"\[([\d,]*)\]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="ptb_d40_hsg", choices=list(bench_lm.CONFIGS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    # The configuration's preset (rhnzoo.bench.lm.config), its model on the reference scan.
    cfg, vocab = bench_lm.config(args.config, dtype=args.dtype, scan_impl="reference")
    model = cfg.model(vocab)
    rows, window = bench_lm.random_batch(cfg, vocab, windows=4, seed=0)
    tx = train.make_optimizer(cfg, data.num_windows(rows.shape[1], cfg.num_steps))
    state = train.init_state(model, cfg, tx, jax.random.PRNGKey(0))
    step = train.make_train_step(model, cfg, tx)
    compiled = (
        jax.jit(step, donate_argnums=0)
        .lower(state, (rows, window), jax.random.PRNGKey(1))
        .compile()
    )
    hlo = compiled.as_text()
    n = cfg.hidden_size
    # The computations, by name; a while body's, with what it calls (fusions, to_apply),
    # transitively, count as the loop's.
    comps: dict[str, list[str]] = {}
    name = ""
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            name = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
            comps[name] = []
        elif name:
            comps[name].append(line)
    bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    todo = list(bodies)
    while todo:
        for line in comps.get(todo.pop(), []):
            for callee in re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", line):
                if callee not in bodies:
                    bodies.add(callee)
                    todo.append(callee)
    all_ops, body_ops, big = collections.Counter(), collections.Counter(), []
    for computation, lines in comps.items():
        for line in lines:
            m = OP.match(line)
            if not m:
                continue
            shape, opcode = m.group(1), m.group(2)
            all_ops[opcode] += 1
            if computation in bodies:
                body_ops[opcode] += 1
            found = SHAPE.search(shape)
            dims = [int(d) for d in found.group(1).split(",") if d] if found else []
            if (
                opcode in ("copy", "dynamic-slice", "slice", "transpose")
                and dims
                and np.prod(dims) >= n * n
            ):
                where = "loop" if computation in bodies else "outside"
                big.append(f"{opcode:14s} {shape.strip():40s} {where:7s} in {computation}")
    print(
        f"{args.config} (hidden {n}, depth {cfg.depth}, {args.dtype}), "
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}: "
        f"{len(hlo.splitlines())} HLO lines, "
        f"{len(re.findall(r'body=', hlo))} while loops"
    )
    print("\nops, all computations:")
    for op, k in all_ops.most_common(args.top):
        print(f"{k:7d}  {op}")
    print("\nops, inside while loops (their bodies and what those call):")
    for op, k in body_ops.most_common(args.top):
        print(f"{k:7d}  {op}")
    print(f"\ncopies and slices of >= {n}x{n} elements ({len(big)}):")
    for line in big[: 4 * args.top]:
        print(line)


if __name__ == "__main__":
    main()
