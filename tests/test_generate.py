"""Step-wise inference and generation (issue 71, item 3): ``LanguageModel.step`` against the
training model's teacher-forced logits (float64), greedy and sampled decoding
(:mod:`rhnzoo.models.generate`), and ``experiments/generate.py`` on a tiny trained run of a
generated PTB (``tests/corpus.py``)."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rhnzoo.configs import lm as lm_configs
from rhnzoo.models import generate, lm
from test_bad_inputs import ROOT, run_app

V, B, T = 13, 3, 9


def perturbed(params, seed=0, scale=0.3):
    """float64 parameters: ``params`` plus NumPy normal offsets (gates away from init)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda a: jnp.asarray(np.asarray(a, np.float64) + scale * rng.normal(size=a.shape)),
        params,
    )


# The training models of the word and character configs (rhnzoo.configs.lm), and other cells.
MODELS = {
    "word": lambda: lm_configs.get_config("small", hidden_size=8, depth=2).model(V),
    "char": lambda: lm_configs.get_config(
        "small", dataset="ptb_char", hidden_size=8, depth=2
    ).model(V),
    "hsg_rhn": lambda: lm.language_model("hsg_rhn", V, 8, depth=2, tied=False),
    "lstm": lambda: lm.language_model("lstm", V, 8),
    "sc_lstm": lambda: lm.language_model("sc_lstm_i", V, 8, tied=False),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_stepping_gives_the_teacher_forced_logits_at_every_position(name):
    """float64: T calls of ``step`` equal ``forward`` over the window at every position to
    1e-10 relative, and their cross-entropies sum to the training loss ``model.nll``."""
    model = MODELS[name]()
    if name == "char":
        assert not model.tied and model.embed_size == min(V, 8)  # the char config's own model
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, V, (B, T + 1)).astype(np.int32)
    with jax.enable_x64(True):
        params = perturbed(model.init(jax.random.PRNGKey(0)))
        carry0 = generate.initial_carry(model, params, B)
        forced, carry_f = model.forward(params, carry0, jnp.asarray(tokens[:, :-1]))
        step = jax.jit(model.step)
        carry, stepped = carry0, []
        for t in range(T):
            logits, carry = step(params, carry, jnp.asarray(tokens[:, t]))
            stepped.append(logits)
        stepped = jnp.stack(stepped, axis=1)
        assert stepped.dtype == forced.dtype == jnp.float64 and forced.shape == (B, T, V)
        scale = float(jnp.max(jnp.abs(forced)))
        assert float(jnp.max(jnp.abs(stepped - forced))) <= 1e-10 * scale
        for a, b in zip(jax.tree.leaves(carry), jax.tree.leaves(carry_f)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
        nll, _ = model.nll(params, carry0, jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:]))
        stepped_nll = optax.softmax_cross_entropy_with_integer_labels(stepped, tokens[:, 1:]).sum()
        np.testing.assert_allclose(float(stepped_nll), float(nll), rtol=1e-10)


def test_stepping_through_the_fused_scan_matches_its_window():
    """The RHN's fused scan (the training default of the LM configs' ``auto``): the step
    runs it over one-step windows; float32, so to float32 rounding."""
    model = lm.rhn_language_model(V, 8, 2, scan_impl="fused")
    params = jax.tree.map(
        lambda a: a.astype(jnp.float32), perturbed(model.init(jax.random.PRNGKey(0)))
    )
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, V, (B, T)), jnp.int32)
    forced, _ = model.forward(params, model.initial_carry(B), tokens)
    carry, stepped = model.initial_carry(B), []
    for t in range(T):
        logits, carry = model.step(params, carry, tokens[:, t])
        stepped.append(logits)
    np.testing.assert_allclose(np.stack(stepped, 1), np.asarray(forced), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def small():
    model = lm.rhn_language_model(V, 8, 2)
    params = jax.tree.map(
        lambda a: a.astype(jnp.float32), perturbed(model.init(jax.random.PRNGKey(0)), scale=0.5)
    )
    prompt = jnp.asarray(np.random.default_rng(3).integers(0, V, (4, 5)), jnp.int32)
    return model, params, prompt


def test_a_fixed_seed_gives_the_same_tokens_twice(small):
    model, params, prompt = small
    draw = lambda seed: generate.generate(
        model, params, prompt, 40, key=jax.random.PRNGKey(seed), temperature=1.5, top_k=6
    )
    first, again, other = draw(7), draw(7), draw(8)
    assert first.shape == (4, 40) and first.dtype == jnp.int32
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert int(first.min()) >= 0 and int(first.max()) < V


def test_top_k_one_is_greedy_and_greedy_follows_the_steps_argmax(small):
    model, params, prompt = small
    greedy = generate.generate(model, params, prompt, 12, greedy=True)
    top1 = generate.generate(model, params, prompt, 12, key=jax.random.PRNGKey(0), top_k=1)
    np.testing.assert_array_equal(greedy, top1)
    # by hand: the prompt's window, then argmax and step
    logits, carry = model.forward(params, model.initial_carry(4), prompt)
    logits, by_hand = logits[:, -1], []
    for _ in range(12):
        token = jnp.argmax(logits, -1).astype(jnp.int32)
        by_hand.append(token)
        logits, carry = model.step(params, carry, token)
    np.testing.assert_array_equal(greedy, np.stack(by_hand, 1))


def test_decoding_in_chunks_gives_the_tokens_of_one_call(small):
    model, params, prompt = small
    key = jax.random.PRNGKey(4)
    whole = generate.generate(model, params, prompt, 30, key=key, temperature=0.7)
    state, parts = generate.prime(model, params, prompt), []
    for n in (10, 15, 5):
        tokens, state = generate.decode(model, params, state, n, key=key, temperature=0.7)
        parts.append(tokens)
    np.testing.assert_array_equal(whole, np.concatenate(parts, 1))
    assert int(state.position) == 30


def test_top_k_draws_only_among_the_k_likeliest():
    logits = jnp.asarray(np.random.default_rng(5).normal(size=(1, 20)).repeat(2000, 0))
    drawn = generate.pick(logits, jax.random.PRNGKey(0), top_k=3, temperature=2.0)
    allowed = set(np.argsort(-np.asarray(logits[0]))[:3].tolist())
    assert set(np.asarray(drawn).tolist()) == allowed


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_tokens=0, greedy=True), "num_tokens must be an integer >= 1"),
        (dict(num_tokens=3, key=jax.random.PRNGKey(0), temperature=0.0), "temperature must be"),
        (dict(num_tokens=3, key=jax.random.PRNGKey(0), top_k=0), "top_k must be an integer in"),
        (dict(num_tokens=3, key=jax.random.PRNGKey(0), top_k=V + 1), f"[1, {V}]"),
        (dict(num_tokens=3), "sampling needs a key"),
    ],
)
def test_bad_arguments_are_one_line(small, kwargs, message):
    model, params, prompt = small
    with pytest.raises(ValueError, match=None) as e:
        generate.generate(model, params, prompt, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_prompt_must_be_a_batch_of_ids(small):
    model, params, _ = small
    with pytest.raises(ValueError, match=r"prompt must be token ids \[B, P\]"):
        generate.prime(model, params, jnp.zeros((5,), jnp.int32))
    with pytest.raises(ValueError, match="integer token ids"):
        generate.prime(model, params, jnp.zeros((1, 5)))
    with pytest.raises(ValueError, match=r"step takes tokens \[B\]"):
        model.step(params, model.initial_carry(1), jnp.zeros((1, 1), jnp.int32))
    # Before: a list prompt raised AttributeError ('list' object has no attribute 'shape').
    with pytest.raises(ValueError, match=r"prompt must be token ids \[B, P\]"):
        generate.prime(model, params, [1, 2])
    got = generate.generate(model, params, [[1, 2]], 3, greedy=True)
    np.testing.assert_array_equal(
        got, generate.generate(model, params, jnp.array([[1, 2]]), 3, greedy=True)
    )


def test_text_round_trips_through_the_vocabularies():
    words = ("<eos>", "the", "cat", "sat")
    ids = generate.encode("the cat\nsat", words, char_level=False)
    np.testing.assert_array_equal(ids, [1, 2, 0, 3])
    assert generate.render(ids, words, char_level=False) == "the cat\nsat"
    assert generate.render([1, 0, 0, 2], words, char_level=False) == "the\n\ncat"
    np.testing.assert_array_equal(generate.encode("", words, char_level=False), [0])
    chars = ("\n", "_", "a", "b")  # PTB-char: '_' between words, '\n' ends a line
    ids = generate.encode("ab a", chars, char_level=True, space="_")
    np.testing.assert_array_equal(ids, [2, 3, 1, 2])
    assert generate.render(ids, chars, char_level=True, space="_") == "ab a"
    with pytest.raises(ValueError, match="words outside the run's 4-symbol vocabulary: 'dog'"):
        generate.encode("the dog", words, char_level=False)


# ------------------------------------------------------------- experiments/generate.py


def test_generate_py_prints_text_of_the_runs_vocabulary(tiny_lm_run, monkeypatch, capfd, tmp_path):
    workdir, _, corpus = tiny_lm_run
    vocab = corpus.vocab
    argv = [f"--workdir={workdir}", "--num_tokens=150", "--seed=3", "--top_k=20", "--noprogress"]
    end, out, err = run_app("generate.py", argv, monkeypatch, capfd, tmp_path)
    assert end is None, (end, err)
    words = out.split()
    assert len(words) + out.count("\n") - 1 >= 150 and set(words) <= set(vocab)
    again = run_app("generate.py", argv, monkeypatch, capfd, tmp_path)[1]
    assert again == out  # the same seed, the same text
    greedy = [f"--workdir={workdir}", "--greedy", "--prompt=w3 w4", "--num_tokens=5"]
    end, out, err = run_app("generate.py", [*greedy, "--samples=2"], monkeypatch, capfd, tmp_path)
    assert end is None and out.count("--- sample") == 2
    rows = [line for line in out.splitlines() if not line.startswith("---")]
    assert rows[0].startswith("w3 w4") and rows[0] == rows[1]


@pytest.mark.parametrize("what", ["missing", "empty", "images", "no checkpoint"])
def test_generate_py_refuses_a_workdir_that_is_no_trained_lm(
    what, tiny_lm_run, monkeypatch, capfd, tmp_path
):
    workdir = tmp_path / "w"
    if what != "missing":
        workdir.mkdir()
    if what == "images":
        (workdir / "config.json").write_text(json.dumps({"dataset": "mnist", "depth": 10}))
    if what == "no checkpoint":
        (workdir / "config.json").write_text((tiny_lm_run[0] / "config.json").read_text())
    end, out, err = run_app("generate.py", [f"--workdir={workdir}"], monkeypatch, capfd, tmp_path)
    expected = {
        "missing": "has no config.json",
        "empty": "has no config.json",
        "images": "is a run on mnist (task 'images'), not a language model",
        "no checkpoint": "has no checkpoint",
    }[what]
    assert end is not None and isinstance(end.code, str), (end, err)
    assert end.code.startswith("error: ") and "\n" not in end.code and expected in end.code
    assert out == "" and err == ""


@pytest.mark.slow  # a Python that imports JAX
def test_generate_py_exits_1_with_one_line_for_another_tasks_run(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "config.json").write_text(json.dumps({"dataset": "mnist"}))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "generate.py"), f"--workdir={tmp_path / 'w'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: {tmp_path / 'w'} is a run on mnist (task 'images'), not a language model: "
        "generate.py "
        "reads runs of ptb.py or char.py"
    ]


def test_a_prompt_id_outside_the_vocabulary_is_one_line(small):
    model, params, prompt = small
    bad = lambda i: prompt.at[2, 4].set(i)
    for i in (-2, V):  # old: id -2 primed as id V - 2 (it wraps), id V as V - 1 (clamped)
        with pytest.raises(ValueError) as e:
            generate.prime(model, params, bad(i))
        assert f"prompt must be ids in [0, {V})" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(ValueError, match=r"prompt must be ids in \[0, 13\)"):
            generate.generate(model, params, bad(i), 2, greedy=True)
    # Under a caller's jit the ids are traced, not checked: the documented indexing.
    logits = jax.jit(lambda p: generate.prime(model, params, p).logits)
    np.testing.assert_array_equal(logits(bad(-2)), logits(bad(V - 2)))
    np.testing.assert_array_equal(logits(bad(V)), logits(bad(V - 1)))
