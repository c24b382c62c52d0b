"""The kernels' figures for a kernel window (``measure.sh kernels``, issue 68 item 3): one
JSON line per figure on stdout, each carrying what
``python -m tools.kernel_record OUT_DIR`` needs to make it a record entry
(:func:`tools.kernel_record.entries_from_lines`): ``backend``, ``cell``, ``n``,
``depth``, ``m``, ``B``, ``T``, ``dtype``, ``options``, ``digest`` (the backend's
:func:`~rhnzoo.cells.kernels.verified.digest`, of the source that ran), ``device`` (the
device kind), ``stand_in``, and ``ms`` (min of ``--reps`` timed calls after a warm-up)
and ``compile_s`` (the warm-up call: compilation and one run), or ``error`` (a figure
that fails is one line with its message; the others go on).

**The LSTM** (the persistent gated kernels, rhnzoo.cells.kernels.gated) at each ``--n``
x ``--batch`` (default: P-MNIST's 1 -> 100, B 100, T 784): the forward unroll and its
``value_and_grad`` of ``pallas`` (64 batch rows per CTA, the kernels ``auto`` runs),
``pallas_bt16`` / ``pallas_bt32`` (``Options(batch_tile=16 / 32)``: the swap-AB forward
of rhnzoo.cells.kernels.swap_ab, issue 59) and ``fused_bf16`` (the fused scan in
bfloat16); then, with ``--variants``, at the first shape, the loss and every gradient
against the float32 reference scan (``jax.default_matmul_precision('highest')``; max
relative error: max |a - b| / max |b|) of each of ``pallas``, ``pallas_approx_math``
(``tanh.approx``), ``pallas_no_auto_barriers`` (Pallas barrier elision,
``unsafe_no_auto_barriers``), ``pallas_bt16``, ``pallas_bt32`` and ``fused_bf16``: lines
``error_<candidate>`` with ``loss_rel_err``, ``grad_rel_err`` (per parameter) and ``ms``.
The timed candidates' errors come from the calls already compiled; only the two compiler
settings compile again (they reach the 64-row kernels only: the swap-AB forward is built
without them).

**The RHN** (``--rhn=ptb_sota,ptb_d40_hsg``: the micro-layer kernels of
rhnzoo.cells.kernels.rhn at bench.lm's shapes: n 830, m 830, B 20, T 35, depth 10, and
HSG(RHN) at depth 40, with a recurrent dropout mask as the language model runs them):
``pallas_value_and_grad`` and ``fused_bf16_value_and_grad`` of a loss of every output,
then ``error_pallas`` / ``error_fused_bf16`` against the float32 reference.

  python tools/gpu/kernel_probe.py [--n=100] [--batch=100] [--length=784] [--variants]
                                       [--rhn=ptb_sota,ptb_d40_hsg] [--no_lstm]
                                       [--stand_in] [--interpret] [--reps=5]

``--stand_in``: the float32 fused scan in every kernel candidate's place (measure.sh's
CPU dry run: the script's figures without a kernel; its lines say ``stand_in`` and
never verify anything). ``--rhn_n`` / ``--rhn_batch`` / ``--rhn_length``: other RHN
sizes (the dry run's tiny ones; depth and HSG kept). Run from the repository root.
"""

import argparse
import contextlib
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from rhnzoo import cells
from rhnzoo.bench import lm as bench_lm
from rhnzoo.cells import gated_fused, rhn_fused
from rhnzoo.cells.kernels import Options, gated, persistent, rhn, verified

bf16, f32 = jnp.bfloat16, jnp.float32


def timed(fn, *args, reps=5):
    """``(out, compile_s, best_s)``: the first call (compilation and one run), its
    output, then the min of ``reps`` timed calls."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return out, first, min(times)


@contextlib.contextmanager
def compiler(approx_math=False, no_barriers=False):
    """The persistent kernels traced inside use these Mosaic GPU compiler settings."""
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


def rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))


def errors(got, ref):
    """``{'loss_rel_err', 'grad_rel_err': {parameter path: error}}`` of a (loss, grads)."""
    paths = jax.tree_util.tree_flatten_with_path(ref[1])[0]
    mine = jax.tree.leaves(got[1])
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in paths]
    return {
        "loss_rel_err": rel_err(got[0], ref[0]),
        "grad_rel_err": {k: rel_err(a, b) for k, (_, b), a in zip(names, paths, mine)},
    }


def error_message(e):
    return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


class Probe:
    """Emits figure lines with the fields every line of one problem shares."""

    def __init__(self, args, **shape):
        self.args, self.shape = args, shape
        dev = jax.devices()[0]
        self.base = dict(
            device=dev.device_kind,
            jax=jax.__version__,
            stand_in=args.stand_in,
            digest=verified.digest(shape["backend"]),
        )

    def emit(self, figure, rec, options=None, dtype="bfloat16"):
        line = {"figure": figure, **self.shape, "dtype": dtype, "options": options or {}}
        print(json.dumps({**line, **rec, **self.base}), flush=True)

    def time(self, fn, *args):
        """``(out, figure fields)`` of one timed function; out None where it failed."""
        try:
            out, first, best = timed(fn, *args, reps=self.args.reps)
        except Exception as e:  # one failed figure; the others go on
            return None, error_message(e)
        T = self.shape["T"]
        rec = {"ms": round(best * 1e3, 3), "us_per_step": round(best * 1e6 / T, 2)}
        return out, {**rec, "compile_s": round(first, 2)}


# ------------------------------------------------------------------------ the LSTM


def lstm_problem(n, B, T, m=1, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    cell = cells.LSTM(n)
    return cell, cell.init(k[0], m), cell.initial_carry(B), jax.random.normal(k[1], (T, B, m))


def lstm_loss(unroll, cell, carry):
    def f(p, x):
        (h, c), _ = unroll(cell, p, carry, x)
        return jnp.sum(h * h)

    return f


def lstm(args):
    f32_none = Options(dtype=f32, outputs="none")
    bf16_none = Options(dtype=bf16, outputs="none")

    def kernels(batch_tile=None):
        """The LSTM's kernels (``batch_tile`` Bt: with the swap-AB forward), or the
        stand-in."""
        if args.stand_in:
            return lambda c, p, h, x: gated_fused.unroll(c, p, h, x, None, f32_none)
        opts = Options(outputs="none", interpret=args.interpret or None, batch_tile=batch_tile)
        return lambda c, p, h, x: gated.unroll(c, p, h, x, None, opts)

    fused = lambda c, p, h, x: gated_fused.unroll(c, p, h, x, None, bf16_none)
    reference = lambda c, p, h, x: gated_fused.unroll(c, p, h, x, None, f32_none)
    candidates = {  # name: (unroll, kernel options)
        "pallas": (kernels(), {}),
        "pallas_bt16": (kernels(16), {"batch_tile": 16}),
        "pallas_bt32": (kernels(32), {"batch_tile": 32}),
        "fused_bf16": (fused, {}),
    }
    first = True
    for n in args.n:
        for B in args.batch:
            shape = dict(backend="gated", cell="LSTM", n=n, depth=None, m=1, B=B, T=args.length)
            probe = Probe(args, **shape)
            cell, params, carry, xs = lstm_problem(n, B, args.length)
            outs = {}
            for name, (unroll, options) in candidates.items():
                f = lstm_loss(unroll, cell, carry)
                for what, fn in (
                    ("forward", jax.jit(f)),
                    ("value_and_grad", jax.jit(jax.value_and_grad(f))),
                ):
                    out, rec = probe.time(fn, params, xs)
                    if what == "value_and_grad":
                        outs[name] = (out, rec)
                    probe.emit(f"{name}_{what}", rec, options)
            if args.variants and first:
                lstm_variants(args, probe, cell, params, carry, xs, candidates, outs, reference)
            first = False


def lstm_variants(args, probe, cell, params, carry, xs, candidates, outs, reference):
    """The error lines of one shape: the timed candidates from their outputs, the two
    compiler settings compiled and timed anew."""
    with jax.default_matmul_precision("highest"):
        try:
            ref = jax.jit(jax.value_and_grad(lstm_loss(reference, cell, carry)))(params, xs)
            ref = jax.block_until_ready(ref)
        except Exception as e:
            probe.emit("reference_f32_value_and_grad", error_message(e), dtype="float32")
            return
    settings = [
        ("pallas", None),
        ("pallas_approx_math", {"approx_math": True}),
        ("pallas_no_auto_barriers", {"no_barriers": True}),
        ("pallas_bt16", None),
        ("pallas_bt32", None),
        ("fused_bf16", None),
    ]
    unroll = candidates["pallas"][0]
    for name, setting in settings:
        if setting is None:
            out, rec = outs[name]
            options = candidates[name][1]
        else:
            with compiler(**setting):
                fn = jax.jit(jax.value_and_grad(lstm_loss(unroll, cell, carry)))
                out, rec = probe.time(fn, params, xs)
            options = {"no_auto_barriers": True} if "no_barriers" in setting else setting
        if out is not None:
            rec = {**rec, **errors(out, ref)}
        probe.emit(f"error_{name}", rec, options)


# ------------------------------------------------------------------------ the RHN


def rhn_figures(args):
    for name in args.rhn:
        cfg, vocab = bench_lm.config(name)  # the preset (rhnzoo.bench.lm.CONFIGS)
        c = bench_lm.shape(cfg, vocab)
        n = args.rhn_n or c["hidden"]
        B = args.rhn_batch or c["batch"]
        T = args.rhn_length or c["num_steps"]
        m, L = n, c["depth"]  # tied: the embedding is n wide
        inner = cells.RHN(n, depth=L)
        cell = cells.HSG(inner) if c["hsg"] else inner
        shape = dict(
            backend="rhn", cell=verified.cell_name(cell), n=n, depth=L, m=m, B=B, T=T,
            config=name,
        )  # fmt: skip
        probe = Probe(args, **shape)
        k = jax.random.split(jax.random.PRNGKey(0), 4)
        params = cell.init(k[0], m)
        carry = 0.5 * jax.random.normal(k[1], (B, n))
        xs = jax.random.normal(k[2], (T, B, m))
        keep = 1.0 - cfg.drop_h  # the LM's recurrent dropout
        mask = jax.random.bernoulli(k[3], keep, (B, n)).astype(f32) / keep

        def loss(unroll):
            def f(p, x):
                _, ys = unroll(p, carry, x)
                return jnp.sum(ys * ys) / B

            return jax.jit(jax.value_and_grad(f))

        if args.stand_in:
            kernel = lambda p, h, x: rhn_fused.unroll(cell, p, h, x, mask, Options(dtype=f32))
        else:
            opts = Options(interpret=args.interpret or None)
            kernel = lambda p, h, x: rhn.unroll(cell, p, h, x, mask, opts)
        fused = lambda p, h, x: rhn_fused.unroll(cell, p, h, x, mask, Options(dtype=bf16))
        reference = lambda p, h, x: rhn_fused.unroll(cell, p, h, x, mask, Options(dtype=f32))
        outs = {}
        for label, unroll in (("pallas", kernel), ("fused_bf16", fused)):
            out, rec = probe.time(loss(unroll), params, xs)
            outs[label] = (out, rec)
            probe.emit(f"{label}_value_and_grad", rec)
        with jax.default_matmul_precision("highest"):
            try:
                ref = jax.block_until_ready(loss(reference)(params, xs))
            except Exception as e:
                probe.emit("reference_f32_value_and_grad", error_message(e), dtype="float32")
                continue
        for label, (out, rec) in outs.items():
            probe.emit(f"error_{label}", rec if out is None else {**rec, **errors(out, ref)})


def main():
    ap = argparse.ArgumentParser()
    ints = lambda s: [int(v) for v in s.split(",") if v]
    ap.add_argument("--n", type=ints, default=[100])
    ap.add_argument("--batch", type=ints, default=[100])
    ap.add_argument("--length", type=int, default=784)
    ap.add_argument("--variants", action="store_true", help="also the error of each setting")
    ap.add_argument("--no_lstm", action="store_true", help="no LSTM figures (--rhn only)")
    ap.add_argument(
        "--rhn",
        type=lambda s: [v for v in s.split(",") if v],
        default=[],
        help=f"RHN configurations, of {', '.join(bench_lm.CONFIGS)}",
    )
    ap.add_argument("--rhn_n", type=int, default=None)
    ap.add_argument("--rhn_batch", type=int, default=None)
    ap.add_argument("--rhn_length", type=int, default=None)
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per figure (min)")
    ap.add_argument(
        "--stand_in",
        action="store_true",
        help="the float32 fused scan in the kernel's place (a CPU dry run of the "
        "script's figures, no kernel)",
    )
    args = ap.parse_args()
    unknown = set(args.rhn) - set(bench_lm.CONFIGS)
    if unknown:
        ap.error(f"unknown --rhn configurations {sorted(unknown)}")
    if not args.no_lstm:
        lstm(args)
    rhn_figures(args)


if __name__ == "__main__":
    main()
