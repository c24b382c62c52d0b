"""Data-parallel training on 8 (virtual CPU) devices, a TPU v2-8's count, matches 1 device."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

PTB_DIR = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "ptb"

SCRIPT = textwrap.dedent("""
    import json, sys, jax, numpy as np
    from rhnzoo import data, dropout
    from rhnzoo.models import lm
    from rhnzoo.training import engine, lm as train
    assert jax.device_count() == 8, jax.devices()
    corpus = data.load_ptb(sys.argv[1])
    corpus = data.Corpus(corpus.train[:4000], corpus.valid[:800], corpus.test[:800], corpus.vocab)
    out = {}
    for n_dev in (1, 8):
        print("devices", n_dev, flush=True)
        model = lm.rhn_language_model(corpus.vocab_size, 16, 2, hsg=True, scan_impl="fused")
        cfg = train.TrainConfig(lr=0.5, batch_size=8, num_steps=10, eval_batch_size=4,
                                rates=dropout.Rates(0.2, 0.3, 0.2, 0.3))
        run = engine.RunConfig(epochs=cfg.max_max_epoch, max_steps=60, progress=False)
        # One train step, compared parameter by parameter.
        task = train.make_task(model, corpus, cfg, run, devices=jax.devices()[:n_dev])
        state = task.init_state(jax.random.PRNGKey(0))
        step = jax.jit(task.train_step, donate_argnums=0)
        state, sums = step(state, task.get_batch(0, 0), jax.random.PRNGKey(1))
        assert len(state["carry"].sharding.device_set) == n_dev
        out[n_dev] = {"params": [np.asarray(p).tolist() for p in jax.tree.leaves(state["params"])],
                      "nll": float(sums["loss"])}
        # A short run end to end.
        res = train.train(model, corpus, cfg, sys.argv[2] + f"/d{n_dev}", run,
                          devices=jax.devices()[:n_dev], run_config={})
        out[n_dev]["run"] = res
        out[n_dev]["metrics"] = open(sys.argv[2] + f"/d{n_dev}/metrics.jsonl").read()
    print("RESULT" + json.dumps(out), flush=True)
""")


@pytest.mark.skipif(
    not (PTB_DIR / "ptb.train.txt").exists(),
    reason=f"real PTB files not found in {PTB_DIR} (set RHNZOO_DATA)",
)
@pytest.mark.slow
def test_eight_devices_match_one(tmp_path):
    import json

    import numpy as np

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(PTB_DIR), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    one, four = out["1"], out["8"]
    assert abs(one["nll"] - four["nll"]) < 1e-4 * abs(one["nll"])
    for a, b in zip(one["params"], four["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(one["metrics"].splitlines(), four["metrics"].splitlines()):
        a, b = json.loads(a), json.loads(b)
        assert a["train_ppl"] == pytest.approx(b["train_ppl"], rel=1e-4)
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-4)
    assert one["run"]["test_ppl"] == pytest.approx(four["run"]["test_ppl"], rel=1e-4)


@pytest.mark.skipif(
    not (PTB_DIR / "ptb.train.txt").exists(),
    reason=f"real PTB files not found in {PTB_DIR} (set RHNZOO_DATA)",
)
def test_a_batch_the_devices_do_not_divide_is_one_error_line(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")  # fmt: skip
    script = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "ptb.py"
    proc = subprocess.run([sys.executable, str(script), "--preset=small", "--batch_size=12",
                           "--max_steps=1", f"--workdir={tmp_path / 'w'}"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines == ["error: batch_size 12 is not divisible by the 8 devices"]
    assert not (tmp_path / "w").exists()
