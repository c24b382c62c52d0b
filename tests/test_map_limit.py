"""tests/map_limit.py: past half the process's mapping limit, JAX's cached executables
(and the memory mappings XLA:CPU holds for each) are freed; below it, nothing is."""

import functools

import jax
import jax.numpy as jnp
import map_limit


@functools.partial(jax.jit, static_argnums=1)
def scaled(x, k):
    return jnp.tanh(x * k) + k


def test_cached_executables_are_freed_past_half_the_limit_and_only_then():
    if map_limit.map_count() is None:  # no /proc: the plugin does nothing
        return
    x = jnp.ones(3)
    before = map_limit.map_count()
    for k in range(40):  # 40 executables held by nothing but jax.jit's cache
        scaled(x, float(k)).block_until_ready()
    held = map_limit.map_count()
    added = held - before  # XLA:CPU: 3-6 mappings each (fewer where code pages are shared)
    assert added >= 40 * 2, (before, held)

    assert not map_limit.release_if_near_limit(limit=2 * held + 2)  # at half: kept
    assert map_limit.map_count() >= held - 10
    assert map_limit.release_if_near_limit(limit=held) >= held  # past half: freed
    assert map_limit.map_count() <= held - added // 2  # at least most of the 40 freed
    assert not map_limit.release_if_near_limit(limit=None)  # limit unknown: nothing
