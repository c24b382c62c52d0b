"""The persistent LSTM kernel (rhnzoo.cells.kernels.gated) per size and compiler setting,
for ``measure.sh kernel`` (issue 57): at n = 64, 100, 128 and B = 32, 100, 300 (does a
second CTA cost anything?), the forward unroll and its value_and_grad (the backward: the
difference), min of 5 after a warm-up, of ``pallas`` (64 batch rows per CTA) and of
``pallas_bt16`` / ``pallas_bt32`` (``Options(batch_tile=16 / 32)``: the swap-AB forward
of rhnzoo.cells.kernels.swap_ab, Bt batch columns per CTA, the same backward; issue 59's
"more SMs per step"), beside the fused scan in bfloat16 (unroll 8); and at one size the
loss and gradient of each variant (``approx_math``, Pallas barrier elision
``unsafe_no_auto_barriers``, the swap-AB forward at Bt 16 and 32, the fused bfloat16
scan) against the float32 reference scan (max relative error). One JSON line per figure
on stdout; a figure that fails is a line with ``error`` (the others go on).

  python docs/runs/gpu/kernel_probe.py [--n=64,100,128] [--batch=32,100,300] [--length=784]
                                       [--variants] [--interpret] [--reps=5]

``--interpret``: Pallas's interpreter (slow); ``--stand_in``: the float32 fused scan in
every kernel candidate's place (measure.sh's CPU dry run: the script's figures without a
kernel). The compiler settings (``approx_math``, barrier elision) reach the 64-row
kernels only: the swap-AB forward is built without them. Run from
the repository root; ptxas's registers and spills come from measure.sh's
``MOSAIC_GPU_DUMP_PTXAS`` / ``MOSAIC_GPU_DUMP_TO`` around it.
"""

import argparse
import contextlib
import dataclasses
import json

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from rhnzoo import cells
from rhnzoo.cells import gated_fused
from rhnzoo.cells.kernels import Options, gated, persistent

from pallas_probe import best  # beside this script: min of `reps` timed calls after a warm-up


@contextlib.contextmanager
def compiler(approx_math=False, no_barriers=False):
    """The kernels traced inside use these Mosaic GPU compiler settings."""
    original = plgpu.CompilerParams
    persistent.APPROX_MATH = approx_math  # read when a kernel is traced
    if no_barriers:
        plgpu.CompilerParams = lambda **kw: dataclasses.replace(
            original(**kw), unsafe_no_auto_barriers=True
        )
    try:
        yield
    finally:
        plgpu.CompilerParams = original
        persistent.APPROX_MATH = False


def problem(n, B, T, m=1, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    cell = cells.LSTM(n)
    return cell, cell.init(k[0], m), cell.initial_carry(B), jax.random.normal(k[1], (T, B, m))


def loss_fn(unroll, cell, carry):
    def f(p, x):
        (h, c), _ = unroll(cell, p, carry, x)
        return jnp.sum(h * h)

    return f


def main():
    ap = argparse.ArgumentParser()
    ints = lambda s: [int(v) for v in s.split(",")]
    ap.add_argument("--n", type=ints, default=[64, 100, 128])
    ap.add_argument("--batch", type=ints, default=[32, 100, 300])
    ap.add_argument("--length", type=int, default=784)
    ap.add_argument("--variants", action="store_true", help="also the error of each setting")
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per figure (min)")
    ap.add_argument(
        "--stand_in",
        action="store_true",
        help="the float32 fused scan in the kernel's place (a CPU dry run of the "
        "script's figures, no kernel)",
    )
    args = ap.parse_args()
    dev = jax.devices()[0]
    bf = jnp.bfloat16

    def kernels(batch_tile=None):
        """The LSTM's kernels (``batch_tile`` Bt: with the swap-AB forward), or the
        stand-in."""
        if args.stand_in:
            return lambda c, p, h, x: gated_fused.unroll(
                c, p, h, x, dtype=jnp.float32, outputs=False
            )
        opts = Options(outputs=False, interpret=args.interpret or None, batch_tile=batch_tile)
        return lambda c, p, h, x: gated.unroll(c, p, h, x, None, opts)

    pallas, swap_ab = kernels(), {bt: kernels(bt) for bt in (16, 32)}
    candidates = [("pallas", pallas)] + [(f"pallas_bt{bt}", u) for bt, u in swap_ab.items()]
    fused = lambda c, p, h, x: gated_fused.unroll(c, p, h, x, dtype=bf, outputs=False)
    reference = lambda c, p, h, x: gated_fused.unroll(c, p, h, x, dtype=jnp.float32, outputs=False)
    base = dict(T=args.length, device=dev.device_kind, jax=jax.__version__, stand_in=args.stand_in)

    def emit(rec):
        print(json.dumps({**rec, **base}), flush=True)

    for n in args.n:
        for B in args.batch:
            cell, params, carry, xs = problem(n, B, args.length)
            for name, unroll in (*candidates, ("fused_bf16", fused)):
                f = loss_fn(unroll, cell, carry)
                for what, fn in (
                    ("forward", jax.jit(f)),
                    ("value_and_grad", jax.jit(jax.value_and_grad(f))),
                ):
                    try:
                        s = best(fn, params, xs, reps=args.reps)
                        rec = {
                            "ms": round(s * 1e3, 3),
                            "us_per_step": round(s * 1e6 / args.length, 2),
                        }
                    except Exception as e:
                        rec = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                    emit({"figure": f"{name}_{what}", "n": n, "B": B, **rec})
    if not args.variants:
        return
    n, B = args.n[-1], args.batch[0]
    cell, params, carry, xs = problem(n, B, args.length, seed=1)
    ref = jax.jit(jax.value_and_grad(loss_fn(reference, cell, carry)))(params, xs)
    variants = [
        ("pallas", pallas, {}),
        ("pallas_approx_math", pallas, {"approx_math": True}),
        ("pallas_no_auto_barriers", pallas, {"no_barriers": True}),
        *((name, unroll, {}) for name, unroll in candidates[1:]),
        ("fused_bf16", fused, {}),
    ]
    for name, unroll, settings in variants:
        with compiler(**settings):
            fn = jax.jit(jax.value_and_grad(loss_fn(unroll, cell, carry)))
            try:
                loss, grads = fn(params, xs)
                s = best(fn, params, xs, reps=args.reps)
                err = lambda a, b: float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))
                rec = {
                    "ms": round(s * 1e3, 3),
                    "loss_rel_err": err(loss, ref[0]),
                    "grad_rel_err": {k: err(grads[k], ref[1][k]) for k in ref[1]},
                }
            except Exception as e:
                rec = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        emit({"figure": f"error_{name}", "n": n, "B": B, **rec})


if __name__ == "__main__":
    main()
