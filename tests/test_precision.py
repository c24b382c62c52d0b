"""The matmul precision policy (rhnzoo.precision): names, the context, the engine and the
scripts applying and recording it, and the fast path at the backend's default precision.

The rest of the suite runs at ``highest`` (tests/conftest.py); the tests named
``..._at_the_default_precision`` here run the fused scans at ``default`` on whatever
backend the suite runs on, against float64, with a tolerance sized by what that
backend's default does to a matmul's inputs (float32 on CPU, TensorFloat-32 on GPU,
one bfloat16 pass on TPU).
"""

import dataclasses
import functools
import json
import subprocess
import sys

import engine_toy
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import normal, random_params
from jax.experimental import rnn as jax_rnn
from corpus import flags as on
from test_ptb_experiment import TINY, ptb

from rhnzoo import cells, precision
from rhnzoo.cells import gated_fused, rhn_fused
from rhnzoo.cells.scan_options import Options
from engine_toy import ToyConfig
from rhnzoo import engine
from rhnzoo.engine import workdir as workdir_lib


def test_the_suite_runs_at_highest_from_the_environment():
    """conftest.py's JAX_DEFAULT_MATMUL_PRECISION reached JAX (read when JAX starts)."""
    assert jax.config.jax_default_matmul_precision == "highest"
    assert precision.current() == "highest"


@pytest.mark.parametrize(
    "name,level",
    [
        ("default", "default"),
        ("high", "high"),
        ("highest", "highest"),
        ("bfloat16", "default"),
        ("fastest", "default"),
        ("tensorfloat32", "high"),
        ("bfloat16_3x", "high"),
        ("float32", "highest"),
        ("TF32_TF32_F32", "TF32_TF32_F32"),
    ],
)
def test_names_normalise_to_jax_levels(name, level):
    assert precision.normalize(name) == level
    with precision.context(name):
        assert precision.current() == level


@pytest.mark.parametrize("bad", ["fast", "HIGHEST", "DEFAULT", "", None])
def test_unknown_names_are_one_line_errors(bad):
    with pytest.raises(ValueError, match="unknown matmul precision") as e:
        precision.normalize(bad)
    assert "\n" not in str(e.value)
    if bad is not None:  # every config holding the setting says it the same way
        from rhnzoo.configs import jsb as jsb_configs

        for make in (
            lambda: ToyConfig(epochs=1, matmul_precision=bad),
            lambda: jsb_configs.PolyphonicConfig(lr=0.1, matmul_precision=bad),
            lambda: jsb_configs.JSBConfig(matmul_precision=bad),
        ):
            with pytest.raises(ValueError, match=r"^--matmul_precision: unknown matmul precision"):
                make()


def test_cudnn_rnn_precision_follows_the_level():
    """bench.rnn's cuDNN peer passes ``precision.cudnn_rnn()``: what cuDNN's RNN op makes
    of it (JAX's own rule, which runs before any GPU is needed) is TensorFloat-32 at
    default and high, float32 at highest."""
    rule = jax_rnn._lstm_cudnn_allow_tf32
    for level, tf32 in [
        ("default", True),
        ("high", True),
        ("highest", False),
        ("F32_F32_F32", False),
        ("TF32_TF32_F32", True),
    ]:
        with precision.context(level):
            assert rule(precision.cudnn_rnn()) is tf32, level
        assert rule(precision.cudnn_rnn(level)) is tf32, level
    with precision.context("default"), pytest.raises(NotImplementedError):
        rule(None)  # why the peer passes one: unset, the op refuses the context's default


def test_context_none_keeps_jax_setting_and_contexts_nest():
    with precision.context(None):
        assert precision.current() == "highest"
    with precision.context("default"):
        assert precision.current() == "default"
        with precision.context(None):
            assert precision.current() == "default"
        assert precision.resolve(None) == "default" and precision.resolve("float32") == "highest"
    assert precision.current() == "highest"


def test_the_precision_reaches_the_compiled_matmul():
    """What XLA receives: the dot's precision config is the context's (the jit cache holds
    one program per precision)."""
    a = jnp.ones((8, 8))
    f = jax.jit(lambda a: jnp.tanh(a @ a))
    for name, shown in [("default", "DEFAULT"), ("tensorfloat32", "HIGH"), ("highest", "HIGHEST")]:
        with precision.context(name):
            text = f.lower(a).as_text()
        assert f"precision = [{shown}, {shown}]" in text, text


def test_the_engine_runs_steps_and_evaluations_at_the_run_precision():
    """RunSettings.matmul_precision holds while the train step is traced and while the
    validation and the final evaluation run; JAX's setting is back afterwards; None
    keeps JAX's setting."""
    for setting, expected in [("bfloat16", "default"), (None, "highest")]:
        seen = {"step": set(), "validate": set(), "final": set()}
        task = engine_toy.make_task()

        def step(state, batch, key, _step=task.train_step):
            seen["step"].add(precision.current())  # at trace time
            return _step(state, batch, key)

        def eval_batches(split, final, _batches=task.eval_batches):
            seen["final" if final else "validate"].add(precision.current())
            return _batches(split, final)

        task = dataclasses.replace(task, train_step=step, eval_batches=eval_batches)
        cfg = ToyConfig(epochs=1, max_steps=3, progress=False, matmul_precision=setting)
        engine.run(task, cfg, None, log=None)
        assert seen == {"step": {expected}, "validate": {expected}, "final": {expected}}
        assert precision.current() == "highest"


def test_a_workdir_from_before_the_setting_resumes_at_the_default(tmp_path):
    """A config.json without ``matmul_precision`` (written before it was recorded) holds a
    run at ``default``: it resumes at default and refuses another precision; the config
    records the precision as a level."""
    (tmp_path / "config.json").write_text(json.dumps({"lr": 1.0}))
    (tmp_path / "checkpoints" / "10").mkdir(parents=True)  # it holds a run
    with precision.context("default"):  # JAX's setting where the configs are made
        config = engine_toy.ToyConfig(lr=1.0)
        assert config.matmul_precision == "default"
        workdir_lib.prepare_workdir(tmp_path, config, check_only=True)
        with pytest.raises(ValueError, match="matmul_precision='default' there vs 'highest'"):
            workdir_lib.prepare_workdir(tmp_path, config.replace(matmul_precision="float32"))


# ------------------------------------------------------- the fast path at the default


def default_precision_tolerance() -> dict:
    """At ``default`` a float32 matmul rounds its inputs to ``bits`` significant bits
    (24 on CPU, 11 on a GPU with TensorFloat-32, 8 on TPU): a relative error of 2^-bits
    per product. 32 x that covers the few matmuls these short scans chain: with the
    fused scans' bfloat16 inputs (8 bits) on the CPU, four seeds of each case below stayed
    within 3.5 x 2^-8 (as atol and rtol). Never tighter than the float32 tolerances of
    tests/test_gated_fused.py."""
    bits = {"cpu": 24, "gpu": 11, "cuda": 11, "rocm": 11, "tpu": 8}[jax.default_backend()]
    eps = 2.0**-bits
    return dict(rtol=max(2e-4, 32 * eps), atol=max(2e-5, 32 * eps))


def rhn_problem(seed=0, B=3, m=5, n=6, T=7):
    cell = cells.HSG(cells.RHN(n, 3))
    k = jax.random.split(jax.random.PRNGKey(seed), 6)
    params = random_params(cell.init(k[0], m), k[1])
    xs, s0 = normal(k[2], (T, B, m)), normal(k[3], (B, n))
    mask = jax.random.bernoulli(k[4], 0.8, (B, n)) / 0.8
    target = normal(k[5], (T, B, n))
    return cell, (params, s0, xs), mask, target


def gated_problem(name, seed=0, B=4, m=3, n=5, T=9):
    cell = {"lstm": cells.LSTM, "gru": cells.GRU}[name](n)
    k = jax.random.split(jax.random.PRNGKey(seed), 6)
    params = random_params(cell.init(k[0], m), k[1])
    leaves, tree = jax.tree.flatten(cell.initial_carry(B))
    keys = jax.random.split(k[2], len(leaves))
    carry = jax.tree.unflatten(tree, [0.5 * normal(kk, a.shape) for a, kk in zip(leaves, keys)])
    xs = normal(k[3], (T, B, m))
    mask = jax.random.bernoulli(k[4], 0.8, (B, n)) / 0.8
    target = normal(k[5], (T, B, n))
    return cell, (params, carry, xs), mask, target


def value_and_grads(unroll, args, target):
    """The outputs, and the gradients of a loss of every output and the final carry, with
    respect to the parameters, the initial carry and the inputs."""

    def loss(*args):
        carry, ys = unroll(*args)
        return jnp.sum(jnp.sin(ys) * target) + sum(jnp.sum(c**2) for c in jax.tree.leaves(carry))

    return unroll(*args)[1], jax.grad(loss, argnums=(0, 1, 2))(*args)


# The fused scans training runs take (float32, fast tanh / sigmoid, hand-written backward).
FUSED = {
    "rhn_hsg": (
        rhn_problem,
        functools.partial(rhn_fused.unroll, opts=Options(layer_loop="python")),
    ),
    "lstm": (functools.partial(gated_problem, "lstm"), gated_fused.unroll),
    "gru": (functools.partial(gated_problem, "gru"), gated_fused.unroll),
}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c != "gru" else c for c in FUSED]
)
def test_fused_scans_at_the_default_precision_match_float64(case):
    """The fused scan under ``default``, values and gradients, against the reference scan
    under autodiff in float64."""
    problem, unroll = FUSED[case]
    cell, args, mask, target = problem()
    fast = lambda p, c, x: unroll(cell, p, c, x, mask)
    with precision.context("default"):
        ys, grads = jax.jit(functools.partial(value_and_grads, fast))(args, target)
    with jax.enable_x64(True):
        args64, mask64, target64 = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float64), (args, mask, target)
        )
        reference = lambda p, c, x: cells.unroll(cell, p, c, x, mask64)
        ys64, grads64 = value_and_grads(reference, args64, target64)
        ys64, grads64 = np.asarray(ys64), jax.tree.map(np.asarray, grads64)
    tol = default_precision_tolerance()
    np.testing.assert_allclose(ys, ys64, **tol)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads64), strict=True):
        np.testing.assert_allclose(a, b, **tol)


# ------------------------------------------------------------------ the scripts


@pytest.mark.slow  # the fast tier: tests/test_bad_inputs.py's --matmul_precision row
def test_a_bad_precision_flag_is_one_line_and_writes_nothing(tmp_path):
    result = ptb("--matmul_precision=fast", f"--workdir={tmp_path / 'w'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: --matmul_precision: unknown matmul precision 'fast'")
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_a_run_records_its_precision_and_an_earlier_workdir_resumes(tmp_path, generated_ptb):
    """config.json holds the precision (here the suite's $JAX_DEFAULT_MATMUL_PRECISION,
    the flag's default); a workdir written before the setting resumes at the setting's
    default, JAX's precision where the config is made (here ``highest``, any name of it),
    records it, and refuses another with one line."""
    workdir = tmp_path / "w"
    tiny = [*TINY, *on(generated_ptb)]  # the generated PTB: tests/corpus.py
    first = ptb(*tiny, "--max_steps=1", f"--workdir={workdir}")
    assert first.returncode == 0, first.stderr
    config = json.loads((workdir / "config.json").read_text())
    assert config["matmul_precision"] == "highest"
    del config["matmul_precision"]
    (workdir / "config.json").write_text(json.dumps(config))
    second = ptb(*tiny, "--max_steps=2", "--matmul_precision=float32", f"--workdir={workdir}")
    assert second.returncode == 0 and f"resumed {workdir} at step 1" in second.stdout, second.stderr
    assert json.loads((workdir / "config.json").read_text())["matmul_precision"] == "highest"
    third = ptb(*tiny, "--max_steps=3", "--matmul_precision=bfloat16", f"--workdir={workdir}")
    lines = third.stderr.strip().splitlines()
    assert third.returncode == 1 and len(lines) == 1, third.stderr
    assert "matmul_precision='highest' there vs 'default'" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "module,args",
    [
        ("lm", ["--configs=tiny", "--steps=0"]),
        ("rnn", ["--configs=tiny", "--cells=gru", "--rounds=1"]),
    ],
)
def test_benchmark_records_say_the_precision_they_ran_at(module, args):
    out = subprocess.run(
        [sys.executable, "-m", f"rhnzoo.bench.{module}", *args, "--matmul_precision=tensorfloat32"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert records and all(r["matmul_precision"] == "high" for r in records)
