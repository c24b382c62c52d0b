"""Registers per thread and spill bytes of the persistent Mosaic GPU kernels for an H100
(sm_90a), on a host without a GPU.

Lowering a kernel for ``cuda`` (any host) stops at a StableHLO ``mosaic_gpu_v2`` custom
call holding the kernel's Mosaic GPU module; what turns that module into PTX and SASS
(the MLIR passes to NVVM, LLVM's NVPTX back end, then ptxas) is not in jaxlib but in the
CUDA PJRT plugin (``jax-cuda13-pjrt``, ``xla_cuda_plugin.so``), behind the C entry point
``MosaicGpuCompile`` that ``jax.experimental.mosaic.gpu`` uses for its PyTorch path.
That entry point asks the CUDA driver for the current device's compute capability
(``cuCtxGetDevice``, ``cuDeviceGetAttribute``) before it compiles, and loads the binary
into the device (``cuModuleLoadData``) after: the only steps that need a GPU. Here a
stand-in ``libcuda.so.1`` of four functions (compiled from C at run time and loaded
first: the plugin's ``dlopen("libcuda.so.1")`` then returns it) answers 9.0, and the
pipeline runs as on an H100 up to and including ptxas (the CUDA toolkit's, as a
subprocess: ``-arch sm_90a --warn-on-spills -v --generate-line-info``), whose log
``MOSAIC_GPU_DUMP_PTXAS`` prints. What follows ptxas then fails, as it must here (the
host launcher finds no Mosaic GPU runtime library; there is no device to load into).

Each compilation runs in a child process: the stand-in driver and the 400 MB plugin
stay out of the caller's process, and the plugin writes its ptxas log to the C++
standard output.

The plugin must be the jaxlib's version (the module is serialised in jaxlib's Mosaic GPU
IR version). It is looked for at ``$RHNZOO_XLA_CUDA_PLUGIN`` (the ``.so``), then an
installed ``jax_plugins.xla_cuda13``, then ``<user cache>/rhnzoo/jax-cuda13-pjrt-<jaxlib
version>``, where ``python tests/kernel_registers.py fetch`` unpacks it (pip download
of the wheel, about 130 MB; not installed: an installed CUDA plugin would make JAX try a
CUDA backend in every process). ``python tests/kernel_registers.py table`` prints the
counts of every configuration in :data:`CONFIGS`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple


class Config(NamedTuple):
    """A configuration the kernels ship in: the cell ``family`` (:func:`_cell`), hidden
    size ``n``, input width ``m``, ``outputs`` (False: a classifier's, whose backward gets
    no output cotangents), a recurrent dropout mask (``masked``), the RHN's batch tile Bt
    (``batch_tile``; None for the gated and chained kernels, which tile the batch by 64
    rows), and ``kernels``: the labels of the distinct Mosaic GPU kernels its training
    step launches, in the order the lowered step calls them (``backward*`` for those
    under the VJP's transpose, the others forward)."""

    family: str
    n: int
    m: int
    outputs: bool
    masked: bool
    batch_tile: int | None = None
    kernels: tuple[str, ...] = ("forward", "backward")


# The RHN micro-layer kernels (rhnzoo.cells.kernels.rhn) of HSG(RHN) at depth 2: the first
# micro-layer's (its epilogue adds the input projection), a later one's, HSG's gate; the
# backward kernels of micro-layer 2 (ds_1 and dz_1) and of micro-layer 1 (ds_0).
_RHN_KERNELS = ("first", "later", "hsg", "backward_later", "backward_first")

# n = 100 pads to the N = 128 kernels (P-MNIST's shape); the classifiers (P-MNIST) run
# with outputs False. The RHN at ptb_sota's hidden 830 (padded to 832: 13 CTAs of 64
# units, K over 13 blocks) at each batch tile: registers depend on Bt (the wgmma N), not
# on n, the depth or the number of CTAs.
CONFIGS = {
    "lstm_n64": Config("lstm", 64, 1, False, False),
    "lstm_n64_outputs": Config("lstm", 64, 1, True, False),
    "lstm_n100": Config("lstm", 100, 1, False, False),
    "lstm_n100_outputs": Config("lstm", 100, 1, True, False),
    "lstm_n100_outputs_masked": Config("lstm", 100, 1, True, True),
    "gru_ra_n64": Config("gru_ra", 64, 1, True, False),
    "gru_ra_n100": Config("gru_ra", 100, 1, True, False),
    "sc_lstm_p_n64": Config("sc_lstm_p", 64, 1, True, False),
    "sc_lstm_p_n100": Config("sc_lstm_p", 100, 1, True, False),
    "rrn2_n64": Config("rrn2", 64, 1, True, False),
    "rrn2_n100": Config("rrn2", 100, 1, True, False),
    "rrn3_n100": Config("rrn3", 100, 1, False, False),
    "cho_gru_n64": Config("cho_gru", 64, 1, True, False),
    "cho_gru_n100": Config("cho_gru", 100, 1, False, False),
    **{
        f"rhn_hsg_bt{bt}": Config("rhn_hsg", 830, 830, True, True, bt, _RHN_KERNELS)
        for bt in (16, 32, 64)
    },
}

ARCH = "sm_90a"  # an H100: what the stand-in driver reports (compute capability 9.0)
_MARK = "@@rhnzoo-kernel "

_FAKE_DRIVER = r"""
/* Stand-in for libcuda.so.1: what Mosaic GPU's compiler asks before it compiles. */
typedef int CUresult;
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  if (attr == 75) { *v = 9; return 0; }  /* COMPUTE_CAPABILITY_MAJOR */
  if (attr == 76) { *v = 0; return 0; }  /* COMPUTE_CAPABILITY_MINOR */
  return 1;  /* CUDA_ERROR_INVALID_VALUE */
}
"""


@dataclasses.dataclass(frozen=True)
class Counts:
    """ptxas's figures for one kernel: registers per thread, bytes of spill stores and
    loads, bytes of stack frame (local memory) per thread."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int


def parse_ptxas_log(log: str) -> Counts:
    """The counts in a ``ptxas -v`` log of one entry function.

    Raises:
      ValueError: the log does not hold exactly one entry function with its counts.
    """
    entries = re.findall(r"Compiling entry function '([^']+)'", log)
    regs = re.findall(r"Used (\d+) registers", log)
    frame = re.findall(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
        r"loads",
        log,
    )
    if len(entries) != 1 or len(regs) != 1 or len(frame) != 1:
        raise ValueError(f"expected one entry function's counts in the ptxas log:\n{log}")
    stack, stores, loads = map(int, frame[0])
    return Counts(int(regs[0]), stores, loads, stack)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    import jaxlib

    return Path(base) / "rhnzoo" / f"jax-cuda13-pjrt-{jaxlib.__version__}"


def plugin_path() -> Path | None:
    """The CUDA PJRT plugin's ``xla_cuda_plugin.so`` (module docstring), or None."""
    if os.environ.get("RHNZOO_XLA_CUDA_PLUGIN"):
        return Path(os.environ["RHNZOO_XLA_CUDA_PLUGIN"])
    import importlib.util

    try:
        spec = importlib.util.find_spec("jax_plugins.xla_cuda13")
    except ImportError:
        spec = None
    if spec is not None and spec.origin:
        so = Path(spec.origin).parent / "xla_cuda_plugin.so"
        if so.exists():
            return so
    so = _cache_dir() / "jax_plugins" / "xla_cuda13" / "xla_cuda_plugin.so"
    return so if so.exists() else None


def fetch() -> Path:
    """Downloads the jaxlib's ``jax-cuda13-pjrt`` wheel (pip) and unpacks it into the
    cache (module docstring); returns the plugin's path. A plugin already there (any
    place :func:`plugin_path` looks) is returned at once: nothing is downloaded (the
    cache directory is named by the jaxlib version, so a new jaxlib fetches its own)."""
    if (found := plugin_path()) is not None and found.exists():
        return found
    import jaxlib

    dest = _cache_dir()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-d",
                tmp,
                f"jax-cuda13-pjrt=={jaxlib.__version__}",
            ],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial)
        so = partial / "jax_plugins" / "xla_cuda13" / "xla_cuda_plugin.so"
        so.chmod(0o755)
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    return dest / "jax_plugins" / "xla_cuda13" / "xla_cuda_plugin.so"


def ptxas() -> str | None:
    """The ptxas the plugin's pipeline will find (PATH, then /usr/local/cuda/bin), or None."""
    found = shutil.which("ptxas")
    if found is None and Path("/usr/local/cuda/bin/ptxas").exists():
        found = "/usr/local/cuda/bin/ptxas"
    return found


def ptxas_version() -> str:
    """ptxas's version line, e.g. ``Cuda compilation tools, release 13.0, V13.0.88``."""
    out = subprocess.run([ptxas(), "--version"], capture_output=True, text=True, check=True)
    return next(line for line in out.stdout.splitlines() if "release" in line)


def missing_tools() -> str | None:
    """Why the counts cannot be computed on this host (a sentence), or None."""
    plugin = plugin_path()
    if plugin is None or not plugin.exists():
        return (
            f"no CUDA PJRT plugin (jax-cuda13-pjrt) at $RHNZOO_XLA_CUDA_PLUGIN, in "
            f"jax_plugins or in {_cache_dir()}: `python tests/kernel_registers.py fetch` "
            "unpacks it there"
        )
    if ptxas() is None:
        return "no ptxas (CUDA toolkit) on PATH or in /usr/local/cuda/bin"
    if shutil.which("cc") is None:
        return "no C compiler (cc) for the stand-in CUDA driver"
    return None


def _cell(family: str, n: int):
    from rhnzoo import cells

    return {
        "lstm": lambda: cells.LSTM(n),
        "gru_ra": lambda: cells.GRU(n, reset_after=True),
        "sc_lstm_p": lambda: cells.SCLSTM(n, skip=3, learn_alpha=True),
        "rrn2": lambda: cells.RRN(n, depth=2),
        "rrn3": lambda: cells.RRN(n, depth=3),
        "cho_gru": lambda: cells.GRU(n),
        "rhn_hsg": lambda: cells.HSG(cells.RHN(n, 2)),
    }[family]()


def mosaic_modules(lowered) -> list[tuple[bool, bytes]]:
    """The Mosaic GPU kernels of a computation lowered for ``cuda`` (``jax.jit(f).trace(
    ...).lower(lowering_platforms=("cuda",))``), in the order it calls them: for each
    ``mosaic_gpu_v2`` custom call, whether it is under a VJP's transpose (a backward
    kernel) and its serialised Mosaic GPU module, the input of :func:`ptxas_counts`."""
    from jax._src.lib.mlir import ir

    found = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attrs = inner.operation.attributes
                    if (
                        inner.operation.name == "stablehlo.custom_call"
                        and ir.StringAttr(attrs["call_target_name"]).value == "mosaic_gpu_v2"
                    ):
                        config = ir.DictAttr(attrs["mhlo.backend_config"])
                        module = ir.StringAttr(config["module"]).value_bytes
                        # The VJP's backward is traced under transpose(jvp(...)).
                        found.append(("transpose(" in str(inner.location), module))
                    walk(inner.operation)

    walk(lowered.compiler_ir("stablehlo").operation)
    return found


def kernel_modules(name: str, T: int = 12, B: int | None = None) -> dict[str, bytes]:
    """``{label: module}`` for each label of ``CONFIGS[name].kernels``: the serialised
    Mosaic GPU modules of the distinct kernels a training step of configuration ``name``
    launches, from the gradient of a loss through the public ``unroll`` (the kernels
    compiled, not interpreted) lowered for ``cuda``. Shapes: T steps, B rows (None: one
    64-row tile, or the RHN's two batch tiles; registers depend neither on T nor on the
    number of tiles).

    Raises:
      AssertionError: the step launches other kernels than ``kernels`` names (a count,
        or a forward one where a ``backward*`` is named, or the reverse)."""
    import jax
    import jax.numpy as jnp

    from rhnzoo import cells
    from rhnzoo.cells.kernels import Options

    config = CONFIGS[name]
    family, n, m, outputs, masked, bt = config[:6]
    cell = _cell(family, n)
    B = B or (2 * bt if bt else 64)
    z = jax.ShapeDtypeStruct
    params = jax.eval_shape(lambda: cell.init(jax.random.PRNGKey(0), m))
    h = z((B, n), jnp.float32)
    carry = h
    if family == "lstm":
        carry = cells.LSTMState(h, h)
    elif family == "sc_lstm_p":  # mid-sequence step counts: int32
        carry = cells.SCLSTMState(h, h, h, z((B,), jnp.int32))
    mask = z((B, n), jnp.float32) if masked else None
    if family == "rhn_hsg":
        from rhnzoo.cells.kernels import rhn

        unroll = rhn.unroll
    elif family in ("rrn2", "rrn3", "cho_gru"):
        from rhnzoo.cells.kernels import chained

        unroll = chained.unroll
    else:
        from rhnzoo.cells.kernels import gated

        unroll = gated.unroll

    def loss(params, carry, xs, mask):
        tile = bt if family == "rhn_hsg" else None  # the RHN's kernels: swap-AB, tile Bt
        opts = Options(outputs=outputs, interpret=False, batch_tile=tile)
        final, ys = unroll(cell, params, carry, xs, mask, opts)
        total = sum(jnp.sum(leaf) for leaf in jax.tree.leaves(final) if leaf.dtype == jnp.float32)
        return total + (jnp.sum(ys) if outputs else 0.0)

    grad = jax.grad(loss, argnums=(0, 1, 2), allow_int=True)  # SC-LSTM: int32 step counts
    lowered = (
        jax.jit(grad)
        .trace(params, carry, z((T, B, m), jnp.float32), mask)
        .lower(lowering_platforms=("cuda",))
    )
    found = list(dict((module, backward) for backward, module in mosaic_modules(lowered)).items())
    kinds = ["backward" if backward else "forward" for _, backward in found]
    if kinds != ["backward" if k.startswith("backward") else "forward" for k in config.kernels]:
        raise AssertionError(
            f"{name}: expected the kernels {config.kernels}, the step launches {kinds}"
        )
    return {label: module for label, (module, _) in zip(config.kernels, found, strict=True)}


def ptxas_counts(modules: dict[str, bytes], timeout: float = 600) -> dict[str, tuple[Counts, str]]:
    """``{label: (Counts, ptxas log)}`` for serialised Mosaic GPU modules, compiled for
    sm_90a by the CUDA plugin's pipeline in a child process (module docstring).

    Raises:
      RuntimeError: the tools are missing (:func:`missing_tools`) or a module produced
        no ptxas log (the child's output in the message).
    """
    why = missing_tools()
    if why:
        raise RuntimeError(why)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fakecuda.c"
        src.write_text(_FAKE_DRIVER)
        driver = Path(tmp) / "libcuda.so.1"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(driver), str(src)],
            check=True,
        )
        files = []
        for label, module in modules.items():
            path = Path(tmp) / f"{len(files)}.mlirbc"
            path.write_bytes(module)
            files += [label, str(path)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOSAIC_GPU_DUMP")}
        env["MOSAIC_GPU_DUMP_PTXAS"] = "1"
        if shutil.which("ptxas") is None:
            env["PATH"] = "/usr/local/cuda/bin" + os.pathsep + env.get("PATH", "")
        run = subprocess.run(
            [sys.executable, __file__, "_compile", str(plugin_path()), str(driver), *files],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    logs = run.stdout.split(_MARK)[1:]
    out = {}
    for chunk in logs:
        label, _, log = chunk.partition("\n")
        if "Compiling entry function" not in log:
            continue
        out[label] = (parse_ptxas_log(log), log.strip())
    if sorted(out) != sorted(modules):
        raise RuntimeError(
            f"no ptxas log for {sorted(set(modules) - set(out))}; the child "
            f"(exit {run.returncode}) wrote:\n{run.stdout[-3000:]}\n"
            f"{run.stderr[-3000:]}"
        )
    return out


def _compile_in_child(plugin: str, driver: str, pairs: list[str]) -> None:
    """The child: load the stand-in driver, then the plugin; compile each module. The
    compilation itself fails after ptxas (no device to load the binary into, no Mosaic
    runtime for the host launcher): the log is what is wanted."""
    import ctypes

    ctypes.CDLL(driver, mode=os.RTLD_GLOBAL)
    lib = ctypes.CDLL(plugin)
    compile_ = lib.MosaicGpuCompile
    compile_.argtypes = [ctypes.c_char_p, ctypes.c_int]
    compile_.restype = ctypes.POINTER(ctypes.c_void_p)
    for label, path in zip(pairs[::2], pairs[1::2], strict=True):
        print(f"\n{_MARK}{label}", flush=True)
        module = Path(path).read_bytes()
        result = compile_(module, len(module))
        if result:  # a real device after all: release what it loaded
            lib.MosaicGpuUnload.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            lib.MosaicGpuUnload(result)
    print(flush=True)


def table(names=None) -> list[dict]:
    """The counts of every configuration (or ``names``): one row per kernel."""
    rows = []
    for name in names or CONFIGS:
        counts = ptxas_counts(kernel_modules(name))
        for which in CONFIGS[name].kernels:
            c = counts[which][0]
            rows.append({"config": name, "kernel": which, **dataclasses.asdict(c)})
            print(
                f"| {name} | {which} | {c.registers} | {c.spill_stores} | {c.spill_loads} | "
                f"{c.stack_frame} |",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["_compile"]:
        _compile_in_child(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1:2] == ["fetch"]:
        print(fetch())
    elif sys.argv[1:2] == ["table"]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(f"ptxas: {ptxas_version()}, {ARCH}")
        print("| config | kernel | registers | spill stores (B) | spill loads (B) | stack (B) |")
        print("|---|---|---|---|---|---|")
        table(sys.argv[2:] or None)
    else:
        sys.exit("usage: python tests/kernel_registers.py fetch | table [CONFIG ...]")
