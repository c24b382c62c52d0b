"""The language model and its variational dropout masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells, dropout, evaluation
from rhnzoo.models import lm
from rhnzoo.tasks import lm as train


def small_model(tied=True, hsg=False, vocab=11):
    return lm.rhn_language_model(vocab, 8, 2, hsg=hsg, tied=tied)


def test_word_mask_is_per_type_per_row():
    tokens = jnp.array([[1, 2, 1, 3, 1, 2], [4, 4, 4, 4, 4, 4]])
    m = dropout.word_mask(jax.random.PRNGKey(0), tokens, 5, 0.5)
    m = np.asarray(m)
    assert set(np.unique(m)) <= {0.0, 2.0}
    for row, toks in zip(m, np.asarray(tokens)):
        for w in set(toks):
            assert len(set(row[toks == w])) == 1, "a repeated word must share its mask in a row"
    # Over many keys, both outcomes occur for the same (row, word): the mask is random.
    draws = np.stack(
        [dropout.word_mask(jax.random.PRNGKey(k), tokens, 5, 0.5)[0, 0] for k in range(20)]
    )
    assert set(draws) == {0.0, 2.0}


def test_mask_rate_and_scaling():
    m = dropout.mask(jax.random.PRNGKey(0), (400, 500), 0.25)
    np.testing.assert_allclose(np.unique(m), [0.0, 1 / 0.75], rtol=1e-6)
    assert abs(float((m == 0).mean()) - 0.25) < 0.01
    np.testing.assert_array_equal(dropout.mask(jax.random.PRNGKey(0), (3, 4), 0.0), 1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        dropout.mask(jax.random.PRNGKey(0), (2,), 1.0)
    with pytest.raises(ValueError, match="drop_h"):
        dropout.Rates(h=-0.1)


def test_masks_are_shared_by_all_time_steps():
    """A unit dropped by the output mask is zero at every time step; the state mask
    is the same one at every step (equal to a manual unroll with that mask)."""
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 9), 0, 11)
    masks = dropout.lm_masks(
        jax.random.PRNGKey(2), tokens, 11, 8, 8, dropout.Rates(0.3, 0.3, 0.3, 0.5)
    )
    masks["o"] = masks["o"].at[1, 4].set(0.0).at[1, 5].set(2.0)
    _, ys = model.hidden(params, model.initial_carry(3), tokens, masks)
    np.testing.assert_array_equal(ys[:, 1, 4], 0.0)
    assert np.all(np.asarray(ys[:, 1, 5]) != 0.0)
    # Same computation by hand: embedding * x-mask * i-mask, then the cell with one h-mask.
    xs = params["embed"][tokens.T] * masks["x"].T[..., None] * masks["i"][None]
    s = model.initial_carry(3)
    outs = []
    for t in range(9):
        s, y = model.cell.step(
            params["cell"], s, model.cell.project_inputs(params["cell"], xs[t]), masks["h"]
        )
        outs.append(y * masks["o"])
    np.testing.assert_allclose(ys, jnp.stack(outs), rtol=1e-6, atol=1e-6)


def test_masks_differ_across_minibatches_and_repeat_for_same_key():
    tokens = jnp.zeros((4, 5), jnp.int32)
    rates = dropout.Rates(0.5, 0.5, 0.5, 0.5)
    a = dropout.lm_masks(jax.random.fold_in(jax.random.PRNGKey(0), 0), tokens, 7, 16, 16, rates)
    b = dropout.lm_masks(jax.random.fold_in(jax.random.PRNGKey(0), 1), tokens, 7, 16, 16, rates)
    c = dropout.lm_masks(jax.random.fold_in(jax.random.PRNGKey(0), 0), tokens, 7, 16, 16, rates)
    for k in "xiho":
        assert not np.array_equal(a[k], b[k])
        np.testing.assert_array_equal(a[k], c[k])


def test_nll_is_cross_entropy_of_tied_softmax():
    model = small_model(tied=True)
    params = model.init(jax.random.PRNGKey(0))
    assert "softmax_w" not in params
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 0, 11)
    targets = jnp.roll(tokens, -1, axis=1)
    nll, _ = model.nll(params, model.initial_carry(2), tokens, targets)
    _, ys = cells.unroll(
        model.cell, params["cell"], model.initial_carry(2), params["embed"][tokens.T]
    )
    logits = np.asarray(ys) @ np.asarray(params["embed"]).T + np.asarray(params["softmax_b"])
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -sum(logp[t, b, targets[b, t]] for t in range(6) for b in range(2))
    np.testing.assert_allclose(float(nll), expected, rtol=1e-5)


def test_nll_in_time_chunks_is_the_same_sum_and_gradient():
    """Summing the softmax over chunks of steps is the same sum (and gradient), weights
    included; a chunk that does not divide the window is one clear error."""
    model = small_model(tied=True)
    params = model.init(jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 6), 0, 11)
    targets = jnp.roll(tokens, -1, axis=1)
    weights = jnp.ones((3, 6)).at[2, 4:].set(0.0)  # a padded row end
    nll = lambda p, chunk: model.nll(
        p, model.initial_carry(3), tokens, targets, None, weights, time_chunk=chunk
    )[0]
    full, g_full = jax.value_and_grad(nll)(params, None)
    for chunk in (1, 2, 3, 6):
        part, g_part = jax.value_and_grad(nll)(params, chunk)
        np.testing.assert_allclose(float(part), float(full), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(g_part), jax.tree.leaves(g_full)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="time_chunk 4 does not divide the window's 6 steps"):
        nll(params, 4)


def test_eval_time_chunk_is_the_largest_divisor_under_the_budget():
    assert (
        evaluation.eval_time_chunk(100, 20, 10_000) == 10
    )  # 8 MB of float32 logits: 10 x 20 x 10^4
    assert evaluation.eval_time_chunk(100, 1, 10_000) == 100  # the batch-1 protocol: one chunk
    assert evaluation.eval_time_chunk(7, 64, 10**6) == 1  # nothing fits: one step at a time
    assert evaluation.eval_time_chunk(35, 20, 10_000, max_logits=20 * 10_000 * 6) == 5


def test_untied_model_and_tying_error():
    model = lm.rhn_language_model(5, 8, 1, tied=False)
    params = model.init(jax.random.PRNGKey(0))
    assert params["embed"].shape == (5, 5) and params["softmax_w"].shape == (8, 5)
    with pytest.raises(ValueError, match="tying"):
        lm.LanguageModel(cells.RHN(8, 1), 5, 6, tied=True)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        # old: ZeroDivisionError (T % 0)
        (dict(time_chunk=0), "time_chunk must be None or an integer >= 1, got 0"),
        # old: a JAX TypeError from reshape (negative sizes)
        (dict(time_chunk=-2), "time_chunk must be None or an integer >= 1, got -2"),
        # old: a JAX TypeError (non-integer shape)
        (dict(time_chunk=2.0), "time_chunk must be None or an integer >= 1, got 2.0"),
        # old: [B] weights broadcast silently, as per-row weights
        (dict(weights=jnp.ones(6)), "weights must be [B, T] = [6, 6] like tokens, got shape [6]"),
        # old: [B, 1] weights broadcast over time silently
        (dict(weights=jnp.ones((6, 1))), "weights must be [B, T] = [6, 6]"),
    ],
)
def test_nll_refuses_a_bad_time_chunk_or_weights_shape_in_one_line(kwargs, message):
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    tokens = jnp.zeros((6, 6), jnp.int32)
    with pytest.raises(ValueError) as e:
        model.nll(params, model.initial_carry(6), tokens, tokens, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda: lm.language_model("rhn", 0, 8),  # old: accepted, failed later
        lambda: lm.rhn_language_model(-3, 8, 1),  # old: accepted; init gave an MLIRError
        lambda: lm.LanguageModel(cells.RHN(8), 0, 8),  # old: accepted
    ],
)
def test_a_bad_vocab_size_is_refused_at_construction(build):
    with pytest.raises(ValueError) as e:
        build()
    assert "vocab_size must be an integer >= 1" in str(e.value) and "\n" not in str(e.value)


def test_out_of_range_ids_are_refused_where_concrete_and_index_as_documented_under_jit():
    V = 11
    model = small_model(vocab=V)
    params = model.init(jax.random.PRNGKey(0))
    carry = model.initial_carry(2)
    tokens = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32)
    bad = lambda a, i: a.at[1, 2].set(i)
    for call, message in (
        # old: read as id V - 1
        (lambda: model.forward(params, carry, bad(tokens, V)), "tokens must be ids in [0, 11)"),
        # old: read as id V - 2 (negative ids wrap)
        (lambda: model.step(params, carry, tokens[:, 0].at[1].set(-2)), "got min -2 max 1"),
        # old: NaN
        (lambda: model.nll(params, carry, tokens, bad(tokens, V)), "targets must be ids in"),
        # old: a finite NLL, that of target V - 1
        (lambda: model.nll(params, carry, tokens, bad(tokens, -1)), "got min -1 max 5"),
        # old: a JAX TypeError from indexing with floats
        (lambda: model.hidden(params, carry, tokens * 1.0), "tokens must be integer token ids"),
    ):
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value) and "\n" not in str(e.value)
    # Traced ids are not checked (no host transfer under jit): JAX's indexing, as documented.
    forward = jax.jit(lambda t: model.forward(params, carry, t)[0])
    np.testing.assert_array_equal(forward(bad(tokens, V)), forward(bad(tokens, V - 1)))
    np.testing.assert_array_equal(forward(bad(tokens, -2)), forward(bad(tokens, V - 2)))
    np.testing.assert_array_equal(forward(bad(tokens, -V - 3)), forward(bad(tokens, 0)))
    nll = jax.jit(lambda y: model.nll(params, carry, tokens, y)[0])
    np.testing.assert_array_equal(nll(bad(tokens, -1)), nll(bad(tokens, V - 1)))
    assert np.isnan(nll(bad(tokens, V))) and np.isnan(nll(bad(tokens, -V - 1)))
