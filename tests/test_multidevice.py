"""Data-parallel training on 8 (virtual CPU) devices, a TPU v2-8's count, matches 1 device.

The language model reads the generated PTB of ``tests/corpus.py`` (the contract is the
sharding, not the data): 4,000 training and 800 validation and test words, the slices
of the real PTB these runs read before."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from corpus import flags as on


def eight_devices_env() -> dict:
    """The environment of a subprocess that sees 8 virtual CPU devices."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")


SCRIPT = textwrap.dedent("""
    import json, sys, jax, numpy as np
    from rhnzoo import data
    from rhnzoo.models import lm
    from rhnzoo.tasks import lm as train
    from rhnzoo.configs import lm as lm_configs
    from rhnzoo.engine import sharding, workdir
    assert jax.device_count() == 8, jax.devices()
    corpus = data.load_ptb(sys.argv[1], verify=False)
    corpus = data.Corpus(corpus.train[:4000], corpus.valid[:800], corpus.test[:800], corpus.vocab)
    meshes, by_rows = [], sharding.by_rows
    sharding.by_rows = lambda mesh: meshes.append(mesh.size) or by_rows(mesh)  # rows split over
    out = {}
    for n_dev in (1, 8):
        print("devices", n_dev, flush=True)
        model = lm.rhn_language_model(corpus.vocab_size, 16, 2, hsg=True, scan_impl="fused")
        cfg = lm_configs.LMConfig(lr=0.5, batch_size=8, num_steps=10, eval_batch_size=4,
                             drop_x=0.2, drop_i=0.3, drop_h=0.2, drop_o=0.3, progress=False)
        devices = jax.devices()[:n_dev]
        # One train step (a run of one step), compared parameter by parameter.
        one = sys.argv[2] + f"/one{n_dev}"
        meshes.clear()
        train.train_and_evaluate(cfg.replace(max_steps=1), corpus, workdir=one, model=model,
                                 devices=devices, log=None)
        assert set(meshes) == {n_dev}, meshes  # the rows split over the devices
        out[n_dev] = {"params": [np.asarray(p).tolist()
                                 for p in jax.tree.leaves(workdir.restore_params(one))],
                      "nll": workdir.read_metrics(one)[0]["train_ppl"]}
        # A short run end to end.
        res = train.train_and_evaluate(cfg.replace(max_steps=60), corpus,
                                       workdir=sys.argv[2] + f"/d{n_dev}", model=model,
                                       devices=devices, log=None)
        out[n_dev]["run"] = res
        out[n_dev]["metrics"] = open(sys.argv[2] + f"/d{n_dev}/metrics.jsonl").read()
    print("RESULT" + json.dumps(out), flush=True)
""")


@pytest.mark.slow
def test_eight_devices_match_one(tmp_path):
    import json

    import numpy as np

    from corpus import write_ptb

    ptb = write_ptb(tmp_path / "ptb", train=4000, valid=800, test=800)
    env = eight_devices_env()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ptb), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    one, eight = out["1"], out["8"]
    assert abs(one["nll"] - eight["nll"]) < 1e-4 * abs(one["nll"])
    for a, b in zip(one["params"], eight["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(one["metrics"].splitlines(), eight["metrics"].splitlines()):
        a, b = json.loads(a), json.loads(b)
        assert a["train_ppl"] == pytest.approx(b["train_ppl"], rel=1e-4)
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-4)
    assert one["run"]["test_ppl"] == pytest.approx(eight["run"]["test_ppl"], rel=1e-4)


def test_a_batch_the_devices_do_not_divide_is_one_error_line(tmp_path, generated_ptb):
    env = eight_devices_env()
    script = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "ptb.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--preset=small",
            "--batch_size=12",
            "--max_steps=1",
            f"--workdir={tmp_path / 'w'}",
            *on(generated_ptb),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines == [
        "error: batch_size 12 is not divisible by the 8 devices"
    ]
    assert not (tmp_path / "w").exists()


CLASSIFIER_SCRIPT = textwrap.dedent("""
    import json, sys, jax, numpy as np
    from rhnzoo.data import sequences
    from rhnzoo.models.highway import FeedForwardNet
    from rhnzoo.tasks import highway as hw, rrl
    from rhnzoo.configs import rrl as rrl_configs
    from rhnzoo.configs import highway as highway_configs
    from rhnzoo.engine import sharding
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)

    def seqs(n):  # ragged token sequences, so the length masks are exercised
        s = [rng.integers(1, 20, int(rng.integers(3, 12))).astype(np.int32) for _ in range(n)]
        return sequences.Split(s, rng.integers(0, 3, n).astype(np.int32))

    def images(n):
        return rng.integers(0, 256, (n, 12)).astype(np.uint8), rng.integers(0, 3, n).astype(np.int32)

    text = {k: seqs(n) for k, n in (("train", 64), ("dev", 24), ("test", 20))}
    splits = {k: images(n) for k, n in (("train", 96), ("valid", 40), ("test", 30))}
    dataset = sequences.Dataset(text["train"], text["dev"], text["test"], num_classes=3,
                                vocab=tuple(map(str, range(20))), input_size=None)
    tasks = {  # embeddings="random": no word2vec training (nor its cache)
        "rrl": lambda devices, seeds=None, **run: rrl.train_and_evaluate(
            rrl_configs.RRLConfig(model="lstm", hidden_size=8, embed_size=6, drop=0.3, input_drop=0.2,
                          embeddings="random", batch_size=16, max_len=10, buckets=2, epochs=2,
                          progress=False, **run),
            dataset, devices=devices, log=None, seeds=seeds),
        "highway": lambda devices, seeds=None, **run: hw.train_and_evaluate(
            highway_configs.HighwayConfig(batch_size=16, eval_batch_size=12, lr=0.1, epochs=2, progress=False,
                             **run),
            splits, net=FeedForwardNet(input_size=12, width=8, depth=4, num_classes=3),
            devices=devices, log=None, seeds=seeds),
    }
    meshes, put_rows = [], sharding.put_rows
    sharding.put_rows = lambda x, mesh, **kw: meshes.append(mesh.size) or put_rows(x, mesh, **kw)
    out = {}
    for name, make in tasks.items():
        for n_dev in (1, 8):
            meshes.clear()
            step = make(jax.devices()[:n_dev], max_steps=1)  # one step, then its parameters
            assert set(meshes) == {n_dev}, (name, meshes)  # the batches' rows split over
            run = make(jax.devices()[:n_dev])
            stacked = make(jax.devices()[:n_dev], seeds=2)  # 2 seeds as one program
            out[f"{name}{n_dev}"] = {
                "params": [np.asarray(p).tolist() for p in jax.tree.leaves(step.best_params)],
                "loss": step.history[0]["train_xent"], "history": run.history,
                "results": run.results, "stacked": [r.results for r in stacked]}
    try:
        tasks["rrl"](jax.devices()[:3])
    except ValueError as e:
        out["error"] = str(e)
    mesh = sharding.data_mesh()
    padded = sharding.put_rows((np.ones((3, 2)), np.arange(3)), mesh, pad=True)
    out["padded"] = [np.asarray(a).tolist() for a in padded]
    out["padded_devices"] = len(padded[0].sharding.device_set)
    try:
        sharding.put_rows(np.ones((3, 2)), mesh)
    except ValueError as e:
        out["rows_error"] = str(e)
    print("RESULT" + json.dumps(out), flush=True)
""")


@pytest.mark.slow
def test_classifiers_on_eight_devices_match_one():
    """The sequence classifier (LSTM, ragged lengths, both dropouts) and the highway net
    (an evaluation batch of 12, padded to 16 rows on 8 devices): one data-parallel step
    on 8 devices gives the 1-device loss and parameters, and two epochs through the
    engine the same validation and test metrics; so do two seeds stacked."""
    import json

    import numpy as np

    env = eight_devices_env()
    proc = subprocess.run(
        [sys.executable, "-c", CLASSIFIER_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert out["error"] == "batch_size 16 is not divisible by the 3 devices"
    # Evaluation rows the devices do not divide: zero rows appended, split over all 8
    # (the highway net's evaluation batch of 12 above runs this way).
    assert out["padded"] == [[[1.0, 1.0]] * 3 + [[0.0, 0.0]] * 5, [0, 1, 2] + [0] * 5]
    assert out["padded_devices"] == 8
    assert out["rows_error"] == "batch_size 3 is not divisible by the 8 devices"
    for name in ("rrl", "highway"):
        one, eight = out[f"{name}1"], out[f"{name}8"]
        assert one["loss"] == pytest.approx(eight["loss"], rel=1e-5)
        for a, b in zip(one["params"], eight["params"], strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        assert len(one["history"]) == 2
        for a, b in zip(one["history"], eight["history"], strict=True):
            for key, value in a.items():
                if isinstance(value, float) and key not in ("elapsed_s", "tok_per_s", "img_per_s"):
                    assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, key)
        for key in ("test_acc",):
            assert one["results"][key] == pytest.approx(eight["results"][key], abs=1e-9), name
        # Two stacked seeds (issue 47) on 8 devices, the seed axis not split: seed 0 is
        # the single run, and both seeds are their 1-device selves.
        assert eight["stacked"][0]["test_acc"] == eight["results"]["test_acc"], name
        for a, b in zip(one["stacked"], eight["stacked"], strict=True):
            assert a["test_acc"] == b["test_acc"] and a["best_step"] == b["best_step"], name
            assert a["test_xent"] == pytest.approx(b["test_xent"], rel=1e-5), name
