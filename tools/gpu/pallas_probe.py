"""Times the persistent LSTM kernels of rhnzoo.cells.kernels.gated on their own, at the
P-MNIST shape (1 -> 100, B 100, T 784: N = 128, two CTAs) and at n = 64: the forward
kernel, the backward kernel, the whole unroll forward and its value_and_grad, beside
the fused scan in bfloat16 (unroll 8), and the kernels again with ``approx_math``.
``--quick``: the backward kernel and value_and_grad only. One JSON line per figure on
stdout; min of 5 after a warm-up, same process. Run from the repository root on a GPU
(issue 45)."""

import json
import sys
import time

import jax
import jax.numpy as jnp

from rhnzoo import cells
from rhnzoo.cells import gated_fused
from rhnzoo.cells.kernels import Options, gated, persistent


def best(fn, *args, reps=5):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    dev = jax.devices()[0]
    for n, B, T, m in [(100, 100, 784, 1), (64, 100, 784, 1)]:
        N, MP = persistent.padded(n, m)
        Bp = -(-B // 64) * 64
        k = jax.random.split(jax.random.PRNGKey(0), 8)
        bf, f32 = jnp.bfloat16, jnp.float32
        fwd = jax.jit(
            lambda *a: persistent.forward_call(*a, step=gated.lstm_step(), interpret=False)
        )
        H = N // 64
        fargs = (
            jax.random.normal(k[0], (T, Bp, MP)).astype(bf),
            (0.1 * jax.random.normal(k[1], (4, H, N, 64))).astype(bf),
            (0.1 * jax.random.normal(k[2], (4, H, 64, MP))).astype(bf),
            jnp.zeros((4, H, 64), f32),
            jnp.zeros((H, Bp, 64), bf),
            (jnp.zeros((H, Bp, 64), f32),),
            jnp.full((Bp,), T, jnp.int32),
        )
        bwd = jax.jit(lambda *a: gated.backward_call(a[0], a[1], None, *a[2:], interpret=False))
        bargs = (
            jax.random.uniform(k[3], (T, 5, Bp, N)).astype(bf),
            jax.random.uniform(k[4], (T, Bp, N)),
            (0.1 * jax.random.normal(k[1], (4, N, N))).astype(bf),
            fargs[6],
            jnp.ones((Bp, N), f32),
            jnp.ones((Bp, N), f32),
        )
        cell = cells.LSTM(n)
        params = cell.init(k[5], m)
        carry = cell.initial_carry(B)
        xs = jax.random.normal(k[6], (T, B, m))

        def loss(unroll):
            def f(p, x):
                (h, c), _ = unroll(p, carry, x)
                return jnp.sum(h * h)

            return jax.jit(jax.value_and_grad(f))

        pallas = lambda p, c, x: gated.unroll(cell, p, c, x, None, Options(outputs="none"))
        bf16_none = Options(dtype=bf, outputs="none")
        fused = lambda p, c, x: gated_fused.unroll(cell, p, c, x, None, bf16_none)
        figures = {
            "forward_kernel": (fwd, fargs),
            "backward_kernel": (bwd, bargs),
            "pallas_forward": (jax.jit(lambda p, x: pallas(p, carry, x)[0]), (params, xs)),
            "fused_bf16_forward": (jax.jit(lambda p, x: fused(p, carry, x)[0]), (params, xs)),
            "pallas_value_and_grad": (loss(pallas), (params, xs)),
            "fused_bf16_value_and_grad": (loss(fused), (params, xs)),
        }
        runs = [(False, name) for name in figures]
        runs += [
            (True, name) for name in ("forward_kernel", "backward_kernel", "pallas_value_and_grad")
        ]
        if "--quick" in sys.argv:  # a second try in a short window: the backward and the whole
            runs = [
                (False, name)
                for name in (
                    "backward_kernel",
                    "pallas_value_and_grad",
                    "fused_bf16_value_and_grad",
                )
            ]
        for approx, name in runs:
            persistent.APPROX_MATH = approx  # read when a kernel is traced
            fn, args = figures[name]
            fn = jax.jit(lambda *a, _f=fn.__wrapped__: _f(*a))  # a new function: traced anew
            try:
                s = best(fn, *args)
                rec = {
                    "figure": name,
                    "ms": round(s * 1e3, 3),
                    "us_per_step": round(s * 1e6 / T, 2),
                }
            except Exception as e:
                rec = {"figure": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            rec.update(
                n=n, B=B, T=T, m=m, approx_math=approx, device=dev.device_kind, jax=jax.__version__
            )
            print(json.dumps(rec), flush=True)
        persistent.APPROX_MATH = False


if __name__ == "__main__":
    sys.exit(main())
