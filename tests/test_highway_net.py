"""The fully connected highway / plain nets (Srivastava et al. 2015) against NumPy, their
initialisation and parameter counts, the training task, and the analyses (gate statistics,
lesioning, activation and gradient statistics)."""

import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import np_tree, random_params

from rhnzoo.analysis import highway as analysis
from rhnzoo.models.highway import INITS, FeedForwardNet, Highway, Plain
from rhnzoo.studies import highway as highway_study
from rhnzoo import evaluation
from rhnzoo.engine import evaluate
from rhnzoo.tasks import classify
from rhnzoo.tasks import highway as hw
from rhnzoo.configs import highway as highway_configs

MNIST_DIR = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "mnist"
np_sigmoid = lambda z: 0.5 * (1.0 + np.tanh(0.5 * z))  # 1 / (1 + e^-z), no overflow
NP_ACT = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0.0), "sigmoid": np_sigmoid}


def np_net(net, p, x):
    """The net in float64 NumPy, one layer at a time: (logits, hidden [depth, B, n], gates)."""
    act, n = NP_ACT[net.activation], net.width
    h = act(x @ p["input"]["W"] + p["input"]["b"])
    hidden, gates = [h], []
    for W, b in zip(p["layers"]["W"], p["layers"]["b"]):
        if net.kind == "highway":  # eq. 3: y = H T + x (1 - T)
            H = act(h @ W[:, :n] + b[:n])
            T = np_sigmoid(h @ W[:, n:] + b[n:])
            h = H * T + h * (1.0 - T)
            gates.append(T)
        else:
            h = act(h @ W + b)
        hidden.append(h)
    return h @ p["output"]["W"] + p["output"]["b"], np.stack(hidden), gates


def tiny(kind="highway", activation="tanh", depth=4, **kw):
    return FeedForwardNet(kind, depth, 5, 7, 3, activation, **kw)


@pytest.mark.parametrize(
    "kind,activation",
    [("highway", "tanh"), ("highway", "relu"), ("highway", "sigmoid"), ("plain", "relu")],
)
def test_net_matches_numpy(kind, activation):
    net = tiny(kind, activation)
    params = random_params(net.init(jax.random.key(0)), jax.random.key(1))
    x = np.random.default_rng(2).uniform(size=(6, 7)).astype(np.float32)
    logits, stats = net.apply_with_stats(params, jnp.asarray(x))
    ref, hidden, gates = np_net(net, np_tree(params), x.astype(np.float64))
    np.testing.assert_allclose(logits, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(net.apply(params, jnp.asarray(x)), ref, rtol=1e-5, atol=1e-5)
    assert stats["hidden"].shape == (4, 6, 5)
    np.testing.assert_allclose(stats["hidden"], hidden, rtol=1e-5, atol=1e-5)
    if kind == "highway":
        assert stats["gates"].shape == (3, 6, 5)
        np.testing.assert_allclose(stats["gates"], np.stack(gates), rtol=1e-5, atol=1e-6)
    else:
        assert "gates" not in stats


@pytest.mark.parametrize("kind", ["highway", pytest.param("plain", marks=pytest.mark.slow)])
def test_gradient_matches_finite_differences(kind):
    net, eps = tiny(kind, "tanh", depth=3), 1e-6
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        p = random_params(net.init(jax.random.key(3)), jax.random.key(4))
        p = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), p)
        x, y = jnp.asarray(rng.uniform(size=(4, 7))), jnp.asarray([0, 2, 1, 2])
        loss = jax.jit(lambda p: jnp.mean(-jax.nn.log_softmax(net.apply(p, x))[jnp.arange(4), y]))
        grads = jax.jit(jax.grad(loss))(p)
        for _ in range(3):  # random directions
            v = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape)), p)
            shift = lambda s: jax.tree.map(lambda a, d: a + s * eps * d, p, v)
            fd = (loss(shift(1)) - loss(shift(-1))) / (2 * eps)
            analytic = sum(
                jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(v))
            )
            np.testing.assert_allclose(analytic, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("depth", [10, 20, 50, 100])
def test_parameter_counts_of_the_papers_nets(depth):
    # Highway: 784x50 + 50 in, (depth - 1) x (50 x 2*50 + 2*50), 50x10 + 10 out;
    # plain: 784x71 + 71, (depth - 1) x (71x71 + 71), 71x10 + 10. About 5,000 per layer.
    highway = FeedForwardNet("highway", depth, 50)
    plain = FeedForwardNet("plain", depth, 71)
    assert highway.num_params() == 39_250 + (depth - 1) * 5_100 + 510
    assert plain.num_params() == 55_735 + (depth - 1) * 5_112 + 720
    if depth == 10:  # num_params counts what init allocates
        params = jax.jit(highway.init)(jax.random.key(0))
        assert sum(a.size for a in jax.tree.leaves(params)) == highway.num_params()


def test_initialisation():
    n, depth = 64, 9
    net = FeedForwardNet("highway", depth, n, 300, 10, transform_bias=-4.0)  # Glorot default
    p = jax.jit(net.init)(jax.random.key(0))
    W, b = p["layers"]["W"], p["layers"]["b"]
    assert W.shape == (depth - 1, n, 2 * n) and b.shape == (depth - 1, 2 * n)
    np.testing.assert_array_equal(b[:, :n], 0.0)
    np.testing.assert_array_equal(b[:, n:], -4.0)
    for w, fan_in, fan_out in ((W, n, n), (p["input"]["W"], 300, n), (p["output"]["W"], n, 10)):
        limit = math.sqrt(6 / (fan_in + fan_out))  # Glorot & Bengio 2010, eq. 16
        assert float(jnp.abs(w).max()) <= limit
        np.testing.assert_allclose(np.std(w), limit / math.sqrt(3), rtol=0.05)
    # Each n x n block (H, T) of each layer has its own draw.
    assert not np.allclose(W[0, :, :n], W[0, :, n:]) and not np.allclose(W[0], W[1])
    he = jax.jit(FeedForwardNet("plain", depth, n, 300, 10, kernel_init="he_normal").init)(
        jax.random.key(1)
    )
    np.testing.assert_allclose(np.std(he["layers"]["W"]), math.sqrt(2 / n), rtol=0.05)
    np.testing.assert_allclose(np.std(he["input"]["W"]), math.sqrt(2 / 300), rtol=0.05)
    # The layer stacks take the option too; He normal stays their default.
    q = jax.jit(Highway(n, depth=2, kernel_init="glorot_uniform").init)(jax.random.key(2))
    assert float(jnp.abs(q["W"]).max()) <= math.sqrt(6 / (2 * n))
    np.testing.assert_allclose(
        np.std(jax.jit(Plain(n, 3).init)(jax.random.key(3))["W"]), math.sqrt(2 / n), rtol=0.05
    )


def test_initialisers_are_jax_nn_initializers_with_batch_axes():
    """The nets' flat draws are jax.nn.initializers' numbers to the bit: fan-in and
    fan-out the last two axes, the leading axes batch axes (per layer and block)."""
    for shape in [(300, 64), (64, 10), (3, 2, 8, 8)]:
        batch = tuple(range(len(shape) - 2))
        for name, init in INITS.items():
            jax_init = getattr(jax.nn.initializers, name)(-2, -1, batch_axis=batch)
            key = jax.random.key(len(shape))
            np.testing.assert_array_equal(init(key, shape), jax_init(key, shape, jnp.float32))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(depth=1), "depth must be an integer >= 2"),
        (dict(width=0), "width must be"),
        (dict(kind="resnet"), "kind must be one of"),
        (dict(activation="gelu"), "activation"),
        (dict(kernel_init="lecun"), "kernel_init"),
        (dict(num_classes=1), "num_classes"),
    ],
)
def test_invalid_nets(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FeedForwardNet(**kwargs)


def test_lesion_removes_exactly_one_layer():
    net = tiny("highway", depth=5)
    params = random_params(net.init(jax.random.key(5)), jax.random.key(6))
    x = np.random.default_rng(0).uniform(size=(8, 7)).astype(np.float32)
    p64 = np_tree(params)
    lesion_apply = jax.jit(lambda p, l, x: net.apply(analysis.highway_lesion_params(net, p, l), x))
    for layer in (0, 2, 3):
        # The same net with highway layer `layer` deleted, in NumPy.
        keep = [l for l in range(net.depth - 1) if l != layer]
        short = FeedForwardNet("highway", net.depth - 1, 5, 7, 3)
        p_short = {**p64, "layers": {k: v[keep] for k, v in p64["layers"].items()}}
        np.testing.assert_allclose(
            lesion_apply(params, layer, x),
            np_net(short, p_short, x.astype(np.float64))[0],
            rtol=1e-5,
            atol=1e-5,
        )
    lesioned = analysis.highway_lesion_params(net, params, 1)
    np.testing.assert_array_equal(lesioned["layers"]["b"][1, 5:], analysis.LESION_BIAS)
    assert params["layers"]["b"][1, 5] != analysis.LESION_BIAS  # not modified in place
    with pytest.raises(ValueError, match="layer must be in"):
        analysis.highway_lesion_params(net, params, 4)


@pytest.mark.parametrize("kind", ["highway", "plain"])
def test_lesioned_logits_are_the_net_without_the_layer(kind):
    """Issue 62 item 7: a plain net's lesions (they raised "lesioning needs a highway
    net"): the removed layer passes its input through, i.e. the net with that layer deleted
    (NumPy); the whole study takes a plain net too."""
    net = tiny(kind, "relu" if kind == "plain" else "tanh", depth=5)
    params = random_params(net.init(jax.random.key(5)), jax.random.key(6))
    x = np.random.default_rng(0).uniform(size=(8, 7)).astype(np.float32)
    p64 = np_tree(params)
    lesioned = jax.jit(lambda p, l, x: analysis.lesioned_logits(net, p, l, x))
    for layer in range(net.depth - 1):
        keep = [l for l in range(net.depth - 1) if l != layer]
        short = FeedForwardNet(kind, net.depth - 1, 5, 7, 3, net.activation)
        p_short = {**p64, "layers": {k: v[keep] for k, v in p64["layers"].items()}}
        np.testing.assert_allclose(
            lesioned(params, layer, x),
            np_net(short, p_short, x.astype(np.float64))[0],
            rtol=1e-5,
            atol=1e-5,
        )
    labels = np.arange(8) % 3
    images = (x * 255).astype(np.uint8)
    result = analysis.highway_lesions(net, params, (images, labels), batch_size=3)
    assert result.nll.shape == (net.depth - 1,) and result.num_tokens == 8
    with pytest.raises(ValueError, match="layer must be in"):
        analysis.lesioned_logits(net, params, 4, x)


def test_lesioning_a_closed_layer_changes_nothing():
    net = tiny("highway", depth=4)
    params = net.init(jax.random.key(7))
    n = net.width
    params["layers"]["b"] = params["layers"]["b"].at[1, n:].set(-30.0)  # T ~ 1e-13
    x = jax.random.uniform(jax.random.key(8), (16, 7))
    apply = jax.jit(net.apply)
    intact = apply(params, x)
    np.testing.assert_allclose(
        apply(analysis.highway_lesion_params(net, params, 1), x), intact, atol=1e-6
    )
    other = apply(analysis.highway_lesion_params(net, params, 0), x)
    assert float(jnp.abs(other - intact).max()) > 1e-3  # an open layer does matter


@pytest.fixture(scope="module")
def trained_tiny():
    """A tiny highway net after 40 SGD steps on random images (gates off their init)."""
    net = FeedForwardNet("highway", 4, 6, 12, 3, transform_bias=-1.0)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (300, 12), dtype=np.uint8)
    labels = (images[:, 0] > images[:, 1]).astype(np.int32) + (images[:, 2] > 200)
    splits = evaluation.split_data(images[:, :, None], labels, images[:50], labels[:50], 50)
    cfg = highway_configs.HighwayConfig(
        lr=0.05, batch_size=10, epochs=2, log_every=10**6, progress=False
    )
    out = hw.train_and_evaluate(cfg, splits, net=net, log=None)
    return net, jax.tree.map(jnp.asarray, out.best_params), splits


def test_gate_statistics_match_numpy(trained_tiny):
    net, params, splits = trained_tiny
    images = splits["train"][0][:37]  # not a multiple of the batch: padded batches
    stats = analysis.gate_statistics(net, params, images, sample=5, batch_size=8)
    _, hidden, gates = np_net(net, np_tree(params), images / 255.0)
    gates = np.stack(gates)  # [L, N, n]
    np.testing.assert_allclose(stats.mean_t, gates.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.sample_t, gates[:, 5], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.sample_output, hidden[1:, 5], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(stats.t_bias, params["layers"]["b"][:, 6:])
    assert stats.num_examples == 37 and stats.mean_t.shape == (3, 6)
    assert not np.allclose(stats.t_bias, -1.0)  # trained


def test_highway_lesions_evaluate_each_lesion(trained_tiny):
    net, params, splits = trained_tiny
    split = (splits["train"][0][:45], splits["train"][1][:45])
    result = analysis.highway_lesions(net, params, split, batch_size=20)

    def np_xent(p):
        logits = np_net(net, np_tree(p), split[0] / 255.0)[0]
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        return -logp[np.arange(45), split[1]].mean()

    assert result.num_tokens == 45 and result.nll.shape == (3,)
    np.testing.assert_allclose(result.base_nll, np_xent(params), rtol=1e-5)
    for layer in range(3):
        np.testing.assert_allclose(
            result.nll[layer],
            np_xent(analysis.highway_lesion_params(net, params, layer)),
            rtol=1e-5,
        )


def test_activation_statistics_and_gradient_norms(trained_tiny):
    net, params, splits = trained_tiny
    images, labels = splits["train"][0][:20], splits["train"][1][:20]
    mean, var = analysis.activation_statistics(net, params, images)
    hidden = np_net(net, np_tree(params), images / 255.0)[1]
    np.testing.assert_allclose(mean, hidden.mean(axis=(1, 2)), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(var, hidden.var(axis=(1, 2)), rtol=1e-4, atol=1e-7)
    norms = analysis.gradient_norms(net, params, images, labels)
    x = evaluation.inputs(jnp.asarray(images))
    grads = jax.grad(
        lambda p: jnp.mean(-jax.nn.log_softmax(net.apply(p, x))[jnp.arange(20), labels])
    )(params)
    expect = [np.sqrt(np.sum(grads["input"]["W"] ** 2) + np.sum(grads["input"]["b"] ** 2))]
    expect += [
        np.sqrt(np.sum(grads["layers"]["W"][l] ** 2) + np.sum(grads["layers"]["b"][l] ** 2))
        for l in range(3)
    ]
    np.testing.assert_allclose(norms, expect, rtol=1e-4)


@pytest.mark.slow
def test_plain_diagnostics_show_glorot_relu_vanishing():
    """He et al. 2015: with ReLU, Glorot's Var(W) = 1/n halves the second moment of the
    activations at every layer, He's 2/n keeps it; both facts, at depth 20."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (256, 64), dtype=np.uint8)
    labels = rng.integers(0, 10, 256)
    diag = analysis.plain_diagnostics(images, labels, depth=20, width=128, activations=("relu",))
    assert set(diag) == {"relu, Glorot", "relu, He"}
    second = {k: d["mean"] ** 2 + d["variance"] for k, d in diag.items()}
    assert second["relu, Glorot"][-1] < 1e-3 * second["relu, Glorot"][1]
    assert 0.1 < second["relu, He"][-1] / second["relu, He"][1] < 10
    assert all(d["grad_norm"].shape == (20,) for d in diag.values())


def test_split_and_config_errors():
    x, y = np.zeros((100, 4, 4), np.uint8), np.zeros(100, np.int32)
    splits = evaluation.split_data(x, y, x[:10], y[:10], 30)
    assert [len(s[0]) for s in splits.values()] == [70, 30, 10]
    assert splits["train"][0].shape == (70, 16)
    for bad in (0, 100):
        with pytest.raises(ValueError, match="--valid_size must be in"):
            evaluation.split_data(x, y, x, y, bad)
    for kwargs, flag in (  # rules beyond a field's bounds (those: test_config_contract)
        (dict(lr=0.0), "--lr"),  # lr is None (derived) by default: checked per net
        (dict(momentum=1.0), "--momentum"),
    ):
        with pytest.raises(ValueError, match=flag):
            highway_configs.HighwayConfig(**kwargs)
    with pytest.raises(ValueError, match="batch_size must be in"):
        hw.train_and_evaluate(
            highway_configs.HighwayConfig(batch_size=71), splits, net=FeedForwardNet(input_size=16)
        )


@pytest.mark.skipif(
    not (MNIST_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason=f"real MNIST not found in {MNIST_DIR} (set RHNZOO_DATA)",
)
@pytest.mark.slow
def test_depth10_highway_learns_real_mnist():
    """300 SGD steps (batch 64, lr 0.1, T bias -2) on 6,400 real MNIST images: the
    cross-entropy falls from chance level at initialisation (> 2, log 10 = 2.30) to a
    mean below 0.4 over the third epoch of 100 steps, and test accuracy exceeds 85%."""
    from rhnzoo.data import load_mnist

    data = load_mnist(MNIST_DIR, download=False)
    splits = evaluation.split_data(
        data.train_images[:7400],
        data.train_labels[:7400],
        data.test_images[:2000],
        data.test_labels[:2000],
        1000,
    )
    cfg = highway_configs.HighwayConfig(
        lr=0.1, batch_size=64, epochs=3, transform_bias=-2.0, log_every=10**6, progress=False
    )
    net = cfg.net()
    assert net == FeedForwardNet("highway", 10, 50, transform_bias=-2.0)
    batches = classify.eval_batches({"valid": splits["valid"]}, 1000)("valid", False)
    totals = evaluate.evaluate(hw.eval_step(net), net.init(jax.random.key(0)), batches)
    sums = evaluate.seed_rows(totals)[0]
    at_init = sums["loss"] / sums["count"]
    out = hw.train_and_evaluate(cfg, splits, log=None)
    curve = [r["train_xent"] for r in out.history]
    assert at_init > 2.0 and len(curve) == 3 and curve[-1] < 0.4 and curve[-1] < curve[0], curve
    assert out.results["test_acc"] > 0.85, out.results


def test_sweep_table_shows_the_mean_and_sd_over_seeds():
    import statistics

    def run(kind, acc, xent, diverged=False, epochs=3):
        results = {"test_acc": acc, **({"diverged": True} if diverged else {})}
        return {
            "kind": kind,
            "depth": 10,
            "width": 50,
            "params": 1234,
            "lr": 0.1,
            "history": [{"epoch": epochs, "train_xent": xent}],
            "results": results,
        }

    one = highway_study.sweep_table([run("plain", 0.9, 0.31), run("highway", 0.95, 0.2, True)])
    assert one.splitlines()[2] == (
        "| 10 | 1,234 | 0.1 | 3 | 0.3100 | 90.00% | 1,234 | 0.1 | 3 | 0.2000 | 95.00% (diverged) |"
    )
    seeds = [
        run("plain", 0.9, 0.31),
        run("plain", 0.8, 0.35, epochs=5),
        run("highway", 0.95, 0.2),
        run("highway", 0.97, 0.1, True),
        {**run("highway", 0, 0), "results": None, "history": [], "failed": {"exit_status": 1}},
    ]
    cells = [
        c.strip() for c in highway_study.sweep_table(seeds).splitlines()[2].strip("|").split("|")
    ]
    sd = lambda *v: statistics.stdev(v)
    assert cells[3:6] == [
        "4",
        f"0.3300 ± {sd(0.31, 0.35):.4f} (n=2)",
        f"85.00 ± {sd(90, 80):.2f}% (n=2)",
    ]
    assert cells[9:] == [
        f"0.1500 ± {sd(0.2, 0.1):.4f} (n=2)",
        f"96.00 ± {sd(95, 97):.2f}% (n=2) (1 diverged)",
    ]


def test_a_stack_takes_an_activation_name_and_refuses_what_is_not_callable():
    # old: Highway(4, activation="tanh") constructed, then apply raised "'str' object is
    # not callable"; names and non-callables alike were accepted at construction.
    x = np.random.default_rng(0).uniform(-1, 1, size=(3, 4)).astype(np.float32)
    for cls in (Highway, Plain):
        named = cls(4, 2, activation="tanh")
        assert named == cls(4, 2, activation=jnp.tanh)
        p = named.init(jax.random.key(0))
        h = x.astype(np.float64)
        for W, b in zip(np.asarray(p["W"], np.float64), np.asarray(p["b"], np.float64)):
            z = h @ W + b
            if cls is Highway:  # eq. 3 with tanh H
                T = np_sigmoid(z[:, 4:])
                h = np.tanh(z[:, :4]) * T + h * (1.0 - T)
            else:
                h = np.tanh(z)
        np.testing.assert_allclose(named.apply(p, jnp.asarray(x)), h, rtol=1e-5, atol=1e-6)
    for bad, message in (
        ("gelu", "activation must be one of tanh, relu, sigmoid; got 'gelu'"),
        (3, "activation must be a callable or one of tanh, relu, sigmoid"),
    ):
        with pytest.raises(ValueError) as e:
            Highway(4, activation=bad)
        assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("stack", [Plain(5, 3), Highway(5, 3)])
def test_a_stack_takes_integer_inputs_as_their_float_values(stack):
    # Before: each layer cast W to the input's dtype, so uint8 pixels met W truncated to
    # integers (zeros at this scale), and a Highway stack's scan carry changed dtype.
    params = random_params(stack.init(jax.random.key(0)), jax.random.key(1))
    pixels = np.random.default_rng(3).integers(0, 4, size=(6, 5)).astype(np.uint8)
    want = stack.apply(params, jnp.asarray(pixels, jnp.float32))
    np.testing.assert_allclose(stack.apply(params, jnp.asarray(pixels)), want, rtol=1e-6)
    assert np.abs(np.asarray(want)).max() > 0
