"""The TPU path checked on any host (issue 62): every task's train step and evaluation
step (the LM, the RRL classifier, the highway net, the JSB piano-roll model), with
``scan_impl='auto'`` resolved as on a TPU (:func:`rhnzoo.cells.scan.for_platform`),
lowers for ``tpu`` in float32 and, where the task has it, bfloat16; ``auto`` never
picks a GPU kernel there, and asking for one (``scan_impl='pallas'``) is one ValueError
line naming the platform and what to use.

Lowering only (``jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))``, abstract
arguments): no TPU, no compile, no FLOPs."""

import functools

import jax
import jax.numpy as jnp
import pytest

from rhnzoo import cells, evaluation
from rhnzoo.cells import scan
from rhnzoo.cells.kernels import verified
from rhnzoo.cells.scan import ScanImpl
from rhnzoo.tasks import highway, lm, polyphonic, rrl
from rhnzoo.configs import rrl as rrl_configs
from rhnzoo.configs import jsb as jsb_configs
from rhnzoo.configs import lm as lm_configs
from rhnzoo.configs import highway as highway_configs

KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)  # jax.random.PRNGKey's


def lower_for_tpu(fn, *args):
    """``fn`` traced with ``auto`` resolved as on a TPU and lowered for ``tpu``; its text,
    which must hold no GPU kernel (Mosaic GPU's custom call, ``mosaic_gpu_v2``: in the
    text of the LSTM kernel lowered for ``cuda``). A fresh function object: JAX would
    reuse a trace made for another platform (:func:`rhnzoo.cells.scan.for_platform`)."""
    with scan.for_platform("tpu"):
        fresh = jax.jit(lambda *a: fn(*a))
        text = fresh.trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    assert "mosaic_gpu" not in text.lower()
    return text


@pytest.fixture
def kernel_fits_any_gpu(monkeypatch):
    """A stand-in H100 (device kind and compute capability 9.0) and a verified record that
    lists every kernel at every shape (``verified.fits`` true): ``kernels.gated.fits``
    then holds wherever its own conditions do and the platform asked for is a GPU, so
    ``auto`` would pick the LSTM kernel if the platform said GPU."""
    monkeypatch.setattr(verified, "fits", lambda *a, **k: True)
    with verified.stand_in(verified.H100, "9.0"):
        yield


def test_auto_resolves_for_the_named_platform_and_never_a_gpu_kernel_on_a_tpu(kernel_fits_any_gpu):
    lstm = cells.LSTM(64)
    with scan.for_platform("gpu"):  # the platform reaches the kernel's fits(): a GPU picks it
        assert scan.platform() == "gpu"
        assert scan.resolve("auto", lstm, batch=100, dtype=jnp.bfloat16) is ScanImpl.PALLAS
    with scan.for_platform("tpu"):
        assert scan.platform() == "tpu"
        for cell in (
            lstm,
            cells.GRU(64, reset_after=True),
            cells.GRU(64),
            cells.RRN(64),
            cells.SCLSTM(64, skip=3),
            cells.make("hrl", 64),
        ):
            assert scan.resolve("auto", cell, batch=100, dtype=jnp.bfloat16) is ScanImpl.FUSED
        assert scan.resolve("auto", cells.make("rhn", 8, depth=2), batch=4) is ScanImpl.FUSED
    assert scan.platform() == jax.default_backend()  # restored on leaving


@pytest.mark.parametrize("cell", [cells.LSTM(8), cells.make("hrl", 8), cells.GRU(8)])
def test_pallas_asked_for_on_a_tpu_is_one_line(cell):
    with scan.for_platform("tpu"):
        with pytest.raises(ValueError) as e:
            scan.resolve("pallas", cell, batch=4, dtype=jnp.bfloat16)
    text = str(e.value)
    assert "'tpu'" in text and "scan_impl='fused'" in text and "\n" not in text
    assert scan.resolve("pallas", cell, backend="gpu") is ScanImpl.PALLAS  # a GPU: as before
    assert scan.resolve("pallas", cell, backend="cpu") is ScanImpl.PALLAS  # interpret mode
    with scan.for_platform("tpu"), pytest.raises(ValueError, match="'tpu'"):  # a task's model
        rrl_configs.RRLConfig(
            model="lstm", hidden_size=8, embed_size=4, scan_impl="pallas", dtype="bfloat16"
        ).classifier(3, vocab_size=11)
    with pytest.raises(ValueError, match="platform name"):
        with scan.for_platform(""):
            pass


# ------------------------------------------------------------------ every task's steps

DTYPES = ["float32", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cell", ["rhn", "lstm"])
def test_the_lm_steps_lower_for_a_tpu(cell, dtype, kernel_fits_any_gpu):
    B, T, V = 2, 3, 11
    depth = {"depth": 2} if cell == "rhn" else {}  # an LSTM has no recurrence depth
    cfg = lm_configs.LMConfig(
        cell=cell, hidden_size=8, batch_size=B, num_steps=T, dtype=dtype, **depth
    )
    model = cfg.model(V)
    tx = lm.make_optimizer(cfg, steps_per_epoch=4)
    state = jax.eval_shape(lambda k: lm.init_state(model, cfg, tx, k), KEY)
    rows = jax.ShapeDtypeStruct((B, 4 * T + 1), jnp.int32)
    lower_for_tpu(
        lm.make_train_step(model, cfg, tx), state, (rows, jax.ShapeDtypeStruct((), jnp.int32)), KEY
    )
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    window = (tokens, tokens, jax.ShapeDtypeStruct((B, T), jnp.float32))
    lower_for_tpu(
        functools.partial(evaluation.window_sums, model), state["params"], window, state["carry"]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_name", ["lstm", "gru", "hrl"])
def test_the_rrl_classifier_steps_lower_for_a_tpu(model_name, dtype, kernel_fits_any_gpu):
    B, T = 4, 5
    cfg = rrl_configs.RRLConfig(
        model=model_name, hidden_size=8, hybrid_hidden_size=8, embed_size=4, dtype=dtype
    )
    model = cfg.classifier(3, vocab_size=11)
    tx = cfg.optimizer()
    params = jax.eval_shape(model.init, KEY)
    state = {"params": params, "opt_state": jax.eval_shape(tx.init, params)}
    batch = tuple(
        jax.ShapeDtypeStruct(shape, dtype)
        for shape, dtype in [
            ((B, T), jnp.int32),
            ((B,), jnp.int32),
            ((B,), jnp.int32),
            ((B,), jnp.float32),
        ]
    )
    lower_for_tpu(rrl.make_train_step(model, tx), state, batch, KEY)
    lower_for_tpu(functools.partial(rrl._eval_sums, model), params, batch)


@pytest.mark.parametrize("kind", ["highway", "plain"])
def test_the_highway_steps_lower_for_a_tpu(kind):
    """The feed-forward task (float32 only: it has no dtype setting; no time scan)."""
    cfg = highway_configs.HighwayConfig(kind=kind, depth=3, width=8, lr=0.1)
    net = cfg.net()
    tx, _ = highway.make_optimizer(cfg, 0.1)
    state = jax.eval_shape(lambda k: highway.init_state(net, tx, k), KEY)
    images = jax.ShapeDtypeStruct((10, net.input_size), jnp.uint8)
    labels = jax.ShapeDtypeStruct((10,), jnp.int32)
    lower_for_tpu(
        highway.make_train_step(net, tx),
        state,
        (images, labels, jax.ShapeDtypeStruct((4,), jnp.int32)),
        KEY,
    )
    lower_for_tpu(
        evaluation.highway_sums_fn(net),
        state["params"],
        images,
        labels,
        jax.ShapeDtypeStruct((10,), jnp.float32),
    )


@pytest.mark.parametrize("arch", ["rhn", "lstm"])
def test_the_jsb_steps_lower_for_a_tpu(arch, kernel_fits_any_gpu):
    """The piano-roll task (float32 only: it has no dtype setting), its study's scan
    setting ``auto``."""
    T, B = 5, 3
    model = jsb_configs.study_model(arch, 8, 2, scan_impl="auto")
    params = jax.eval_shape(model.init, KEY)
    state = {
        "params": params,
        "opt_state": jax.eval_shape(polyphonic.sgd(0.1, 0.9, 1.0).init, params),
    }
    batch = (
        jax.ShapeDtypeStruct((T, B, 88), jnp.float32),
        jax.ShapeDtypeStruct((T, B), jnp.float32),
    )
    lower_for_tpu(polyphonic._engine_step(model), state, batch, KEY)
    lower_for_tpu(functools.partial(polyphonic.nll_sums, model), params, *batch)
