"""rhnzoo.bench: the plain-JAX peer computes rhnzoo's function; ``alternate``'s structure; the CLI.

No timing assertions (performance is shown by running the benchmark, not by tests).
"""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from rhnzoo import data, dropout
from rhnzoo.bench import alternate, lm as bench_lm, ratios
from rhnzoo.models import lm
from rhnzoo.tasks import lm as train
from rhnzoo.configs import lm as lm_configs

V, N, B, T = 23, 8, 3, 5
RATES = dropout.Rates(0.2, 0.3, 0.4, 0.5)


def setup(hsg, tied, dtype="float32", depth=2):
    model = lm.rhn_language_model(V, N, depth, hsg=hsg, tied=tied, scan_impl="fused", dtype=dtype)
    cfg = lm_configs.LMConfig(
        batch_size=B, num_steps=T, drop_x=RATES.x, drop_i=RATES.i, drop_h=RATES.h, drop_o=RATES.o
    )
    params = helpers.random_params(model.init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1), 0.3)
    return model, cfg, params


def inputs(model, seed=2):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = jax.random.randint(k[0], (B, T), 0, V)
    y = jax.random.randint(k[1], (B, T), 0, V)
    carry = 0.5 * jax.random.normal(k[2], (B, N))
    masks = dropout.lm_masks(k[3], x, V, model.embed_size, N, RATES)
    return carry, x, y, masks


def rhnzoo_loss(model, cfg):
    """rhnzoo's training loss, as ``make_train_step`` defines it."""

    def loss(params, carry, x, y, masks):
        nll, carry = model.nll(params, carry, x, y, masks)
        return nll / B + cfg.weight_decay * train.l2_penalty(params), (nll, carry)

    return loss


def peer_loss(model, cfg, dtype="float32", layers="python"):
    def loss(params, carry, x, y, masks):
        return bench_lm.peer_loss(
            params,
            carry,
            x,
            y,
            masks,
            hsg="W_R" in params["cell"],
            tied=model.tied,
            batch_size=B,
            weight_decay=cfg.weight_decay,
            dtype=dtype,
            layers=layers,
        )

    return loss


def assert_trees_close(a, b, rtol, atol):
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=rtol, atol=atol), a, b)


def value_and_grad(loss):
    return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize(
    "hsg,tied,layers",
    [
        pytest.param(False, True, "python", marks=pytest.mark.slow),
        pytest.param(True, False, "scan", marks=pytest.mark.slow),
    ],
)  # fast: the train-step test
def test_peer_loss_and_gradients_match_rhnzoo(hsg, tied, layers):
    model, cfg, params = setup(hsg, tied)
    carry, x, y, masks = inputs(model)
    assert float(masks["h"].min()) == 0.0  # dropout is active, so the masks matter
    (l1, (n1, c1)), g1 = value_and_grad(rhnzoo_loss(model, cfg))(params, carry, x, y, masks)
    peer = value_and_grad(peer_loss(model, cfg, layers=layers))
    (l2, (n2, c2)), g2 = peer(params, carry, x, y, masks)
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    np.testing.assert_allclose(n2, n1, rtol=1e-5)
    np.testing.assert_allclose(c2, c1, rtol=1e-5, atol=1e-6)
    assert jax.tree.structure(g2) == jax.tree.structure(g1)
    assert_trees_close(g2, g1, rtol=1e-4, atol=1e-5)
    # The comparison can fail: other dropout masks change the gradient.
    other = dict(masks, h=masks["h"][::-1])
    _, g3 = peer(params, carry, x, y, other)
    assert not np.allclose(g3["embed"], g1["embed"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_peer_bfloat16_matches_rhnzoo_bfloat16():
    """Both cast at the same matmuls, so the bfloat16 losses agree closely; the
    gradients differ only by bfloat16 rounding (autodiff vs the fused backward)."""
    model, cfg, params = setup(True, True, dtype="bfloat16")
    carry, x, y, masks = inputs(model)
    (l1, _), g1 = value_and_grad(rhnzoo_loss(model, cfg))(params, carry, x, y, masks)
    (l2, _), g2 = value_and_grad(peer_loss(model, cfg, "bfloat16"))(params, carry, x, y, masks)
    l32, _ = jax.jit(peer_loss(model, cfg))(params, carry, x, y, masks)
    np.testing.assert_allclose(l2, l1, rtol=2e-3)
    assert abs(float(l2) - float(l32)) > 0  # bfloat16 really was used
    flat1, flat2 = (jnp.concatenate([a.ravel() for a in jax.tree.leaves(g)]) for g in (g1, g2))
    assert float(jnp.linalg.norm(flat2 - flat1) / jnp.linalg.norm(flat1)) < 3e-2


@pytest.mark.slow
def test_peer_train_step_matches_rhnzoo_train_step():
    """The whole step (window slicing, carry reset, masks from the key, update) agrees."""
    model, cfg, params = setup(True, True)
    rows = jnp.asarray(data.batchify(np.arange(B * (2 * T + 1)) % V, B))
    tx = train.make_optimizer(cfg, data.num_windows(rows.shape[1], T))
    state = train.init_state(model, cfg, tx, jax.random.PRNGKey(0))
    state["params"] = params
    state["carry"] = 0.5 * jnp.ones((B, N))
    ours = jax.jit(train.make_train_step(model, cfg, tx))
    peer = jax.jit(bench_lm.make_peer_step(cfg, tx, vocab_size=V, hsg=True, tied=True))
    key = jax.random.PRNGKey(7)
    for window in (0, 1):
        batch = (rows, jnp.int32(window))
        s1, sums1 = ours(state, batch, key)
        s2, sums2 = peer(state, batch, key)
        np.testing.assert_allclose(sums2["loss"], sums1["loss"], rtol=1e-5)
        assert float(sums2["count"]) == float(sums1["count"]) == B * T
        np.testing.assert_allclose(s2["carry"], s1["carry"], rtol=1e-5, atol=1e-6)
        assert_trees_close(s2["params"], s1["params"], rtol=1e-5, atol=1e-6)
        moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), s2["params"], params)
        assert min(jax.tree.leaves(moved)) > 0  # every parameter was updated


def test_peer_rejects_unknown_layer_loop():
    model, cfg, params = setup(False, True, depth=1)
    with pytest.raises(ValueError, match="layers must be"):
        peer_loss(model, cfg, layers="while")(params, *inputs(model))


def test_flops_per_token_ptb_sota():
    # ptb_sota by hand: input 2*830*1660, 10 micro-layers 10*2*830*1660, softmax 2*830*10000.
    c = bench_lm.shape(*bench_lm.config("ptb_sota"))
    assert bench_lm.flops_per_token(c) == 3 * (11 * 2 * 830 * 1660 + 2 * 830 * 10000)
    hsg = dict(c, hsg=True)
    assert bench_lm.flops_per_token(hsg) - bench_lm.flops_per_token(c) == 3 * 4 * 830 * 830


def test_lm_configs_are_the_presets_at_the_shapes_of_record():
    """bench.lm's configurations are rhnzoo.configs.lm's presets (issue 70: no second
    copy of their sizes), at the shapes, rates and vocabularies the records ran."""
    rates = {
        name: (cfg.drop_x, cfg.drop_i, cfg.drop_h, cfg.drop_o)
        for name in bench_lm.CONFIGS
        for cfg in [bench_lm.config(name)[0]]
    }
    shapes = {name: bench_lm.shape(*bench_lm.config(name)) for name in bench_lm.CONFIGS}
    row = lambda hidden, depth, hsg, batch, T, vocab, tied: dict(
        hidden=hidden, depth=depth, hsg=hsg, batch=batch, num_steps=T, vocab=vocab, tied=tied
    )
    assert shapes == {
        "ptb_sota": row(830, 10, False, 20, 35, 10000, True),
        "ptb_d40_hsg": row(830, 40, True, 20, 35, 10000, True),
        "enwik8_sota": row(1500, 10, False, 128, 50, 205, False),
        "cpu_small": row(256, 3, False, 20, 35, 10000, True),
        "tiny": row(16, 2, True, 4, 6, 50, True),
    }
    sota, small = (0.25, 0.75, 0.25, 0.75), (0.1, 0.3, 0.1, 0.3)
    assert rates == dict(
        ptb_sota=sota,
        ptb_d40_hsg=sota,
        enwik8_sota=(0.1, 0.4, 0.1, 0.4),
        cpu_small=small,
        tiny=small,
    )
    assert bench_lm.config("cpu_small")[0] == lm_configs.get_config("small")
    assert bench_lm.config("ptb_d40_hsg")[0].init_bias == lm_configs.HSG_RHN_INIT_BIAS
    cfg, _ = bench_lm.config("tiny", num_steps=9, scan_impl="fused")  # the entry's 6, replaced
    assert (cfg.num_steps, cfg.scan_impl, cfg.depth) == (9, "fused", 2)
    cfg, _ = bench_lm.config("ptb_sota", num_steps=7)
    rows, window = bench_lm.random_batch(cfg, 11, windows=2, seed=0)
    assert rows.shape == (20, 2 * 7 + 1) and int(rows.max()) < 11 and int(window) == 1


def test_alternate_structure():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
            return jnp.ones(3) * calls[name]

        return fn

    out = alternate({"a": make("a"), "b": make("b")}, rounds=3, repeats=2, peak_size=64)
    assert calls == {"a": 7, "b": 7}  # warm-up + rounds * repeats
    assert set(out) == {"seconds", "peak_flops_per_s"}
    for name in ("a", "b"):
        s = out["seconds"][name]
        assert len(s["all"]) == 6 and s["min"] == min(s["all"]) and s["min"] <= s["median"]
    p = out["peak_flops_per_s"]
    assert len(p["all"]) == 3 and p["max"] == max(p["all"]) >= p["min"] == min(p["all"]) > 0
    assert set(alternate({"a": make("a")}, rounds=1, peak_dtype=None)) == {"seconds"}
    calls["a"] = 0
    alternate({"a": make("a")}, rounds=2, peak_dtype=None, warmup=False)
    assert calls["a"] == 2  # no warm-up: only the timed calls
    with pytest.raises(ValueError, match="rounds"):
        alternate({"a": make("a")}, rounds=0)


def test_ratios_of_minima_medians_and_paired_rounds():
    """Worked by hand: a's calls 2, 4, 3 s and b's 1, 2, 3 s give 2 / 1 (minima), 3 / 2
    (medians) and the median of 2, 2, 1 (pairs in time order)."""
    secs = {
        "a": {"min": 2.0, "median": 3.0, "all": [2.0, 4.0, 3.0]},
        "b": {"min": 1.0, "median": 2.0, "all": [1.0, 2.0, 3.0]},
    }
    assert ratios(secs, "a", "b") == {"min": 2.0, "median": 1.5, "paired_median": 2.0}


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "rhnzoo.bench.lm", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_cli_tiny_prints_one_json_record():
    proc = run_cli("--configs=tiny", "--steps=1", "--eval_tokens=30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert r["config"] == "tiny" and r["dtype"] == "float32" and r["rounds"] == 1
    for who in ("rhnzoo", "peer"):
        assert len(r[f"{who}_step_ms_all"]) == 1
        assert 0 < r[f"{who}_step_ms_min"] <= r[f"{who}_step_ms_median"]
    assert r["speedup"] == pytest.approx(r["peer_step_ms_min"] / r["rhnzoo_step_ms_min"])
    assert r["speedup_paired_median"] == pytest.approx(r["speedup"])  # one round: one pair
    tok_s = r["batch"] * r["num_steps"] / (r["rhnzoo_step_ms_min"] / 1e3)
    assert r["tokens_per_s"] == pytest.approx(tok_s)
    assert r["mfu"] == pytest.approx(tok_s * r["model_flops_per_token"] / r["peak_flops_per_s_max"])
    assert r["peak_flops_per_s_max"] >= r["peak_flops_per_s_min"] > 0
    assert r["eval_batch1_tokens_per_s"] > 0 and r["compile_s"] > 0 and r["peer_compile_s"] > 0


@pytest.mark.parametrize(
    "layer_loop,per_layer", [("auto", True), ("scan", False), ("python", True)]
)
def test_layer_loop_reaches_the_traced_step_and_is_recorded(monkeypatch, layer_loop, per_layer):
    """``--layer_loop`` picks the fused RHN's micro-layer layout of the compiled train step
    (seen by what the layer loop is given: per-layer weight lists or the stacked weights),
    is recorded as resolved, and leaves the module's default as it was."""
    from rhnzoo.cells import rhn_fused

    seen, layer_scan = [], rhn_fused._layer_scan
    monkeypatch.setattr(
        rhn_fused,
        "_layer_scan",
        lambda layer, carry, xs, reverse=False: (
            seen.append(isinstance(xs[0], list)) or layer_scan(layer, carry, xs, reverse)
        ),
    )
    default = rhn_fused.LOOP_LAYERS_UP_TO
    r = bench_lm.bench("tiny", peer=False, steps=0, layer_loop=layer_loop)
    assert seen and set(seen) == {per_layer}
    assert r["layer_loop"] == ("python" if per_layer else "scan")
    assert rhn_fused.LOOP_LAYERS_UP_TO == default


def test_cli_unknown_config_is_a_one_line_error():
    proc = run_cli("--configs=nope")
    assert proc.returncode != 0
    assert "unknown configs ['nope']" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
def test_nnx_scan_highway_peer_computes_rhnzoo_function():
    """The nnx.vmap / nnx.scan highway peer, its stacked weights copied into rhnzoo's
    FeedForwardNet layout (H|T fused), gives the same logits."""
    from flax import nnx

    from rhnzoo.bench.highway import NNXScanHighwayNet
    from rhnzoo.models.highway import FeedForwardNet

    depth, width = 4, 6
    peer = NNXScanHighwayNet(depth, width, 7, 3, -1.0, rngs=nnx.Rngs(0))
    assert peer.blocks.h.kernel[...].shape == (depth - 1, width, width)
    net = FeedForwardNet("highway", depth, width, input_size=7, num_classes=3, transform_bias=-1.0)
    b = peer.blocks
    params = {
        "input": {"W": peer.first.kernel[...], "b": peer.first.bias[...]},
        "layers": {
            "W": jnp.concatenate([b.h.kernel[...], b.t.kernel[...]], -1),
            "b": jnp.concatenate([b.h.bias[...], b.t.bias[...]], -1),
        },
        "output": {"W": peer.out.kernel[...], "b": peer.out.bias[...]},
    }
    assert jax.tree.structure(params) == jax.tree.structure(net.init(jax.random.key(0)))
    x = jax.random.normal(jax.random.key(1), (5, 7))
    np.testing.assert_allclose(peer(x), net.apply(params, x), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_rnn_bench_candidates_compute_the_same_loss_and_skipped_ones_say_why():
    """bench.rnn times nothing until rhnzoo's fused step, its reference scan, its bfloat16
    and ``--unroll=2,3`` candidates (k time steps per scan iteration, forward and backward)
    and (LSTM, GRU) Flax's cells with rhnzoo's weights agree on the loss (it raises
    otherwise). ``--pallas --torch`` off a GPU: the record names each of those candidates
    as skipped with its reason (not a GPU; torch absent, or no CUDA for it; no PyTorch
    SC-LSTM or RRN), times the others, and names commit, versions and every timed
    candidate's precision. One run as its CLI (its flags would clash with bench.lm's in
    this process); a bad ``--unroll`` is one ``error:`` line."""
    import importlib.util

    base = [sys.executable, "-m", "rhnzoo.bench.rnn", "--configs=tiny", "--rounds=1"]
    out = subprocess.run(
        base
        + ["--cells=lstm,gru,sc_lstm,rrn", "--bfloat16", "--unroll=2,3", "--pallas", "--torch"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["cell"] for r in records] == ["lstm", "gru", "sc_lstm", "rrn"]
    torch_names = ["torch_fp32", "torch_tf32", "torch_bf16", "torch_fp16"]
    no_torch = importlib.util.find_spec("torch") is None
    for r in records:
        losses = r["losses"]
        assert ("flax" in losses) == (r["cell"] in ("lstm", "gru"))
        np.testing.assert_allclose(losses["reference"], losses["rhnzoo"], rtol=1e-5)
        np.testing.assert_allclose(losses["rhnzoo_bf16"], losses["rhnzoo"], rtol=2e-2)
        if r["cell"] == "lstm":
            np.testing.assert_allclose(losses["flax"], losses["rhnzoo"], rtol=1e-5)
        ratio = r[f"ratio_{r['peer']}_over_rhnzoo"]
        secs = r["seconds"]
        assert ratio["min"] == pytest.approx(secs[r["peer"]]["min"] / secs["rhnzoo"]["min"])
        assert ratio["paired_median"] == pytest.approx(ratio["min"])  # one round: one pair
        for k in (2, 3):
            np.testing.assert_allclose(losses[f"rhnzoo_u{k}"], losses["rhnzoo"], rtol=1e-6)
            assert r[f"ratio_rhnzoo_u{k}_over_rhnzoo"]["min"] > 0
        skipped = r["skipped"]
        assert set(skipped) == {"pallas", *torch_names}
        assert skipped["pallas"].startswith("not a GPU (backend cpu)")
        for k in torch_names:
            if r["cell"] in ("sc_lstm", "rrn"):
                assert skipped[k] == (
                    f"no PyTorch peer for {r['cell']} (PyTorch has LSTM and GRU only)"
                )
            elif no_torch:
                assert skipped[k].startswith("torch is not importable here (ModuleNotFoundError")
            else:
                assert skipped[k].startswith("CUDA is not available to torch")
        assert not set(skipped) & (set(r["seconds"]) | set(losses))
        assert not [k for k in r if k.endswith("_over_pallas") or k.startswith("ratio_torch")]
        assert r["loss_checks"] == {}
        assert r["precisions"] == {  # the CPU computes float32
            k: "bf16" if k == "rhnzoo_bf16" else "fp32" for k in r["seconds"]
        }
        assert r["commit"] is None or len(r["commit"]) == 40
        assert r["versions"]["jax"] == jax.__version__ and "torch" not in r["versions"]
    assert "pallas skipped: not a GPU" in out.stderr  # and said in the log
    bad = subprocess.run(base + ["--unroll=0"], capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: --unroll")


@pytest.mark.slow
def test_trace_cli_lists_the_steps_xla_ops():
    """``rhnzoo.bench.trace`` prints per-op times of a train step, largest first; the
    time scan's ops run once per step (T = 6 for the tiny shape)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rhnzoo.bench.trace",
            "--cell=lstm",
            "--config=tiny",
            "--steps=1",
            "--top=200",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines()[1:]]
    ms = [float(r[0]) for r in rows]
    assert len(rows) > 5 and ms == sorted(ms, reverse=True) and ms[0] > 0
    assert any(r[2].startswith(("while", "fusion", "ynn_fusion", "dot")) for r in rows)
    assert any(int(r[1]) == 6 for r in rows)  # a per-time-step op


@pytest.mark.slow
def test_rnn_bench_peer_weights_compute_the_peers_functions():
    """bench.rnn's cuDNN peer (``jax.experimental.rnn.lstm``, GPU only) gets rhnzoo's LSTM
    weights packed by ``cudnn_weights``; checked here on any backend through JAX's own
    unpacking and reference LSTM (``lstm_ref``): the same logits as rhnzoo's fused scan.
    The torch peers' weights (``torch_weights``: rhnzoo's LSTM converted; the GRU's W,
    U, b as the reset-after GRU with b_hn = 0) through PyTorch's documented equations
    (``test_torch_interop``'s transcription, float64) give the loss the peers are checked
    against (``torch_function_loss``, rhnzoo's reference scan at float32); no torch needed.
    Also the precision labels of the JAX candidates. One subprocess: bench.rnn's flags
    would clash with bench.lm's in this one."""
    code = """
import sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np, optax, pytest
from jax.experimental import rnn as jax_rnn
from test_torch_interop import torch_gru, torch_lstm
from rhnzoo.bench import rnn
c = rnn.CONFIGS["tiny"]
cell, params, xs, _ = rnn.problem("lstm", c)
m, n, B = c["input"], c["hidden"], c["batch"]
params["cell"]["b"] = jax.random.normal(jax.random.PRNGKey(3), params["cell"]["b"].shape)
flat = rnn.cudnn_weights(params, m, n)
assert flat.shape == (jax_rnn.get_num_params_in_lstm(m, n, 1, False),), flat.shape
W_ih, W_hh, b_ih, b_hh = jax_rnn.unpack_lstm_weights(flat, m, n, 1, False)
zeros = jnp.zeros((1, B, n))
_, h, _ = jax_rnn.lstm_ref(jnp.swapaxes(xs, 0, 1), zeros, zeros, W_ih, W_hh, b_ih, b_hh,
                           jnp.full((B,), xs.shape[0], jnp.int32), m, n, 1, 0.0, False)
peer = h[0] @ params["out"]["kernel"] + params["out"]["bias"]
np.testing.assert_allclose(peer, rnn.rhnzoo_logits(cell, params, xs), rtol=1e-5, atol=1e-6)
print("same logits")
for name in ("lstm", "gru"):
    cell, params, xs, labels = rnn.problem(name, c)
    params["cell"]["b"] = 0.5 * jax.random.normal(jax.random.PRNGKey(3), params["cell"]["b"].shape)
    _, p, sd = rnn.torch_weights(name, params)
    assert sorted(sd) == ["bias_hh_l0", "bias_ih_l0", "weight_hh_l0", "weight_ih_l0"]
    sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x64, h0 = np.asarray(xs, np.float64), np.zeros((c["batch"], c["hidden"]))
    ys, _ = torch_lstm(np, sd, x64, h0, h0) if name == "lstm" else torch_gru(np, sd, x64, h0)
    out = {k: np.asarray(v, np.float64) for k, v in params["out"].items()}
    logits = ys[-1] @ out["kernel"] + out["bias"]
    peer = float(optax.softmax_cross_entropy_with_integer_labels(logits, np.asarray(labels)).mean())
    ours = rnn.torch_function_loss(name, params, xs, labels)
    np.testing.assert_allclose(ours, peer, rtol=1e-6)
    if name == "gru":  # PyTorch's GRU is not rhnzoo's default (Cho et al.'s) GRU
        cho = rnn.rhnzoo_logits(cell, params, xs, scan_impl="reference")
        assert not np.allclose(cho, logits, rtol=1e-3)
with pytest.raises(ValueError, match="no PyTorch peer for rrn"):
    rnn.torch_weights("rrn", rnn.problem("rrn", c)[1])
labels = {(b, l): rnn.jax_precision(b, l) for b in ("cpu", "gpu", "tpu")
          for l in ("default", "high", "highest")}
assert labels == {("cpu", "default"): "fp32", ("cpu", "high"): "fp32",
                  ("cpu", "highest"): "fp32", ("gpu", "default"): "tf32",
                  ("gpu", "high"): "tf32", ("gpu", "highest"): "fp32", ("tpu", "default"): "bf16",
                  ("tpu", "high"): "bf16_3x", ("tpu", "highest"): "fp32"}
assert rnn.jax_precision("gpu", "float32") == "fp32"
assert rnn.jax_precision("gpu", "BF16_BF16_F32") == "BF16_BF16_F32"
print("same losses")
"""
    here = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run(
        [sys.executable, "-c", code, here], check=False, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["same", "logits", "same", "losses"], out.stdout


def test_rnn_bench_imports_neither_torch_nor_pallas_mosaic_gpu():
    """bench.rnn imports torch only where a torch peer is built (:func:`torch_step`,
    :func:`torch_skip_reason`), and Pallas's Mosaic GPU module (MLIR bindings) only where
    a kernel is built: importing the module loads neither."""
    code = (
        "import sys, rhnzoo.bench.rnn; print(sorted(m for m in ('torch', "
        "'jax.experimental.pallas.mosaic_gpu') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "name", ["tiny_classifier", "tiny_highway", pytest.param("tiny_lm", marks=pytest.mark.slow)]
)
def test_k_seeds_in_one_vmapped_step_give_each_seed_its_own_step(name):
    """rhnzoo.bench.seeds: the stacked step of 3 seeds (vmap over states, batches, keys)
    equals each seed's own step, every parameter, optimizer state and sum."""
    from rhnzoo.bench import seeds

    task, c = seeds.CONFIGS[name]
    step, make = seeds.PROBLEMS[task](c)
    state, batch, keys = seeds.stacked(make, 3)
    new, sums = jax.jit(jax.vmap(step))(state, batch, keys)
    for k in range(3):
        own, own_sums = jax.jit(step)(*make(k), keys[k])
        for a, b in zip(
            jax.tree.leaves((new, sums)), jax.tree.leaves((own, own_sums)), strict=True
        ):
            np.testing.assert_allclose(np.asarray(a)[k], np.asarray(b), rtol=2e-5, atol=1e-6)
    assert not np.allclose(np.asarray(sums["loss"])[0], np.asarray(sums["loss"])[1])


# bench.seeds' CLI (one record a configuration): tests/test_device_simulation.py's dry
# seeds part, which runs it (issue 69: its smoke lives there only).
