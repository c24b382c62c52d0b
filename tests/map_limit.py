"""A pytest plugin (loaded by conftest): keeps a test process's memory mappings under
Linux's limit by emptying JAX's in-memory compilation caches past half of it.

Why: XLA:CPU maps each loaded executable's code and data into the process, about six
memory mappings per executable, and JAX's in-memory caches (``jax.jit``'s, the eager
operations', the lowering caches) keep thousands of executables alive, bounded by entry
counts, not by mappings. A process that has kept some 10,000 programs (a Pallas
interpret-mode kernel test leaves about 150, ~1,000 mappings; a float64 dispatcher case
200-500 mappings) reaches ``vm.max_map_count`` (65,530 by default). XLA's next compile,
or its next load of an executable from the persistent compilation cache, then fails to
map memory (``LLVM compilation error: Cannot allocate memory``) and the process dies in
the error's unwinding (a segmentation fault in ``_Unwind_Find_FDE`` under
``backend_compile_and_load``, ``compilation_cache.put_executable_and_time`` or
``get_executable_and_time``): the XLA:CPU worker crash (BUILD_NOTES, "Memory mappings"),
late in a long xdist worker, in whichever test compiled next.

``jax.clear_caches()`` frees every cached executable and its mappings (a program needed
again is compiled again, or read from the persistent cache); results are unchanged (the
same program and flags give the same executable). Checked at most every
:data:`CHECK_EVERY_S` seconds (reading ``/proc/self/maps`` takes ~70 ms at 40,000
mappings); a test adds at most a few thousand. Off Linux (no ``/proc``) it does nothing.
"""

import gc
import time
import warnings

import pytest

CHECK_EVERY_S = 5.0  # wall seconds between two counts of the mappings


def map_count() -> int | None:
    """This process's memory mappings (lines of ``/proc/self/maps``); None without /proc."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def map_limit() -> int | None:
    """The kernel's limit on one process's mappings (``vm.max_map_count``); None if unknown."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


_LIMIT = map_limit()
_last_check = [float("-inf")]


def release_if_near_limit(limit: int | None) -> int | None:
    """Empties JAX's in-memory caches (and collects garbage) if this process holds more
    than half of ``limit`` mappings; returns the count it found then, else None."""
    count = map_count()
    if limit is None or count is None or count <= limit // 2:
        return None
    import jax

    jax.clear_caches()
    gc.collect()
    return count


@pytest.fixture(autouse=True)
def _executables_within_the_map_limit():
    yield
    now = time.monotonic()
    if now - _last_check[0] >= CHECK_EVERY_S:
        _last_check[0] = now
        if count := release_if_near_limit(_LIMIT):  # in the warnings summary: how often
            warnings.warn(
                f"{count} memory mappings, past half of vm.max_map_count "
                f"({_LIMIT}): JAX's in-memory caches emptied (tests/map_limit.py)"
            )
