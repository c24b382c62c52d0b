"""ptxas's registers and spills of every kernel configuration of tests/kernel_registers.py,
from the device's own compilation (``measure.sh kernels``, issue 68 item 3 (b)), beside
the counts docs/runs/kernels/*.md recorded on the CPU (the CUDA plugin's pipeline behind
a stand-in driver, docs/runs/kernels/registers.md): the same pipeline, so they should
match; a difference means another ptxas (or plugin) on the device.

On a GPU (JAX's backend ``gpu``): a child process, ``MOSAIC_GPU_DUMP_PTXAS=1``, lowers
each configuration's training step as kernel_registers.kernel_modules does (which also
checks the kernels it launches), compiles it for the device and runs it once on zeros:
the installed CUDA plugin compiles each Mosaic GPU kernel with its own ptxas (the one
beside it, ``nvidia/cu13/bin``) and prints ptxas's log, which the parent reads. The
kernels of one configuration are labelled in the order they were compiled (taken as
kernel_registers' order); a kernel whose module an earlier configuration already
compiled is not compiled again (the plugin's cache) and is listed as that one.
Configurations start in :data:`ORDER` (the P-MNIST LSTM, the RHN's batch tiles, then
the rest) until ``--deadline_s`` has passed.

Elsewhere (``--dry``, the CPU): the configurations are lowered for ``cuda`` only (the
kernels each step launches are checked) and, where kernel_registers finds its tools,
counted by its stand-in pipeline; else the reason is printed.

  python tools/gpu/kernel_ptxas.py [--configs=lstm_n100,...] [--deadline_s=90] [--dry]

Prints a Markdown table on stdout. Run from the repository root.
"""

import argparse
import ctypes
import glob
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

# The parent and the child share the device with nothing else: neither takes 75 % of it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import kernel_registers as kr  # noqa: E402

# The order of interest: what `auto` would run at P-MNIST and the LM first.
ORDER = [
    "lstm_n100",
    "lstm_n64",
    "rhn_hsg_bt32",
    "rhn_hsg_bt16",
    "rhn_hsg_bt64",
    "gru_ra_n100",
    "sc_lstm_p_n100",
    "lstm_n100_outputs_masked",
    "rrn2_n100",
    "cho_gru_n100",
    "lstm_n100_outputs",
    "lstm_n64_outputs",
    "gru_ra_n64",
    "sc_lstm_p_n64",
    "rrn2_n64",
    "rrn3_n100",
    "cho_gru_n64",
]
ORDER += [c for c in kr.CONFIGS if c not in ORDER]
MARK = "@@kernel-ptxas "
ROW = re.compile(
    r"^\|\s*(\w+)\s*\|\s*(\w+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|"
)


def recorded() -> dict:
    """``{(config, kernel): (registers, spill stores, spill loads, stack)}``: the rows of
    docs/runs/kernels/*.md's register tables, a later row (file order, then line order)
    replacing an earlier one."""
    rows = {}
    for path in sorted((ROOT / "docs/runs/kernels").glob("*.md")):
        for line in path.read_text().splitlines():
            m = ROW.match(line)
            if m and m.group(1) in kr.CONFIGS:
                rows[m.group(1), m.group(2)] = tuple(int(v) for v in m.groups()[2:])
    return rows


def split_logs(text: str) -> list[str]:
    """One ptxas log per entry function in a run of ptxas output."""
    parts = re.split(r"(?=ptxas info\s*: Compiling entry function)", text)
    return [p for p in parts if "Compiling entry function" in p]


# ------------------------------------------------------------------------ the child


def child(names: list[str], deadline_s: float) -> None:
    """On the device: each configuration's step compiled and run once (module
    docstring); markers and a JSON line of its labels around the plugin's output."""
    import hashlib

    import jax
    import jax.numpy as jnp

    libc = ctypes.CDLL(None)
    seen: dict[str, str] = {}  # module sha -> "config/label"
    t0 = time.monotonic()
    for name in names:
        if time.monotonic() - t0 > deadline_s:
            print(f"{MARK}deadline {json.dumps({'skipped': name})}", flush=True)
            continue
        captured = []
        original = kr.mosaic_modules

        def spy(lowered, _original=original):
            captured.append(lowered)
            return _original(lowered)

        kr.mosaic_modules = spy
        info = {"config": name}
        print(f"{MARK}start {name}", flush=True)
        try:
            modules = kr.kernel_modules(name)
            lowered = captured[-1]
            new, same = [], {}
            for label, module in modules.items():
                sha = hashlib.sha256(module).hexdigest()
                if sha in seen:
                    same[label] = seen[sha]
                else:
                    seen[sha] = f"{name}/{label}"
                    new.append(label)
            info.update(new=new, same=same)
            compiled = lowered.compile()
            args = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), lowered.args_info[0])
            jax.block_until_ready(compiled(*args))
        except Exception as e:
            info["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            kr.mosaic_modules = original
        libc.fflush(None)
        sys.stdout.flush()
        print(f"\n{MARK}end {json.dumps(info)}", flush=True)


# ------------------------------------------------------------------------ the parent


def device_counts(names, deadline_s, scratch) -> tuple[list[dict], str]:
    """Rows of the device's counts and the child's log (module docstring)."""
    env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1")
    out = pathlib.Path(scratch) / "child.txt"
    with open(out, "w") as f:
        subprocess.run(
            [sys.executable, __file__, "_child", str(deadline_s), *names],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            check=False,
        )
    text = out.read_text(errors="replace")
    rows = []
    for chunk in text.split(f"{MARK}start ")[1:]:
        name = chunk.split("\n", 1)[0].strip()
        body, _, tail = chunk.partition(f"{MARK}end ")
        try:
            info = json.loads(tail.split("\n", 1)[0])
        except ValueError:
            info = {"config": name, "error": "the child ended within it (no end marker)"}
        logs = split_logs(body)
        new = info.get("new", [])
        labels = new if len(logs) == len(new) else [f"?{i}" for i in range(len(logs))]
        for label, log in zip(labels, logs):
            try:
                c = kr.parse_ptxas_log(log)
                rows.append(dict(config=name, kernel=label, counts=c))
            except ValueError:
                rows.append(dict(config=name, kernel=label, note="unparsed ptxas log"))
        for label, where in info.get("same", {}).items():
            rows.append(dict(config=name, kernel=label, note=f"the module of {where}"))
        if len(logs) != len(new):
            rows.append(dict(config=name, kernel="-", note=f"{len(logs)} ptxas logs for {new}"))
        if "error" in info:
            rows.append(dict(config=name, kernel="-", note=info["error"]))
    for m in re.finditer(rf"{MARK}deadline (.*)", text):
        rows.append(dict(config=json.loads(m.group(1))["skipped"], kernel="-", note="deadline"))
    return rows, text


def dry_counts(names) -> tuple[list[dict], str]:
    """The CPU: lowered only; counted by the stand-in pipeline where its tools are."""
    why = kr.missing_tools()
    rows, notes = [], []
    for name in names:
        try:
            modules = kr.kernel_modules(name)
        except Exception as e:
            rows.append(dict(config=name, kernel="-", note=f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        if why:
            rows += [dict(config=name, kernel=k, note="lowered; no ptxas here") for k in modules]
            continue
        try:
            for label, (c, _) in kr.ptxas_counts(modules).items():
                rows.append(dict(config=name, kernel=label, counts=c))
        except Exception as e:
            rows.append(dict(config=name, kernel="-", note=f"{type(e).__name__}: {e}"[:200]))
    if why:
        notes.append(f"ptxas counts: none on this host ({why})")
    return rows, "\n".join(notes)


def plugin_ptxas() -> list[str]:
    """The ptxas beside the installed CUDA plugin (``nvidia/cu*/bin``), if any."""
    plugin = kr.plugin_path()
    if plugin is None:
        return []
    site = plugin.resolve().parents[2]
    return sorted(glob.glob(str(site / "nvidia" / "*" / "bin" / "ptxas")))


def ptxas_version() -> str:
    """The version of the ptxas beside the installed CUDA plugin, else on PATH."""
    found = plugin_ptxas() + [p for p in [kr.ptxas()] if p]
    for p in found:
        try:
            out = subprocess.run([p, "--version"], capture_output=True, text=True, timeout=30)
            line = next(x for x in out.stdout.splitlines() if "release" in x)
            return f"{p}: {line}"
        except Exception:
            continue
    return "(no ptxas found beside the plugin or on PATH)"


def main() -> int:
    if sys.argv[1:2] == ["_child"]:
        child(sys.argv[3:], float(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(ORDER))
    ap.add_argument("--deadline_s", type=float, default=90.0)
    ap.add_argument("--dry", action="store_true", help="the CPU: lower only (module docstring)")
    args = ap.parse_args()
    names = [c for c in args.configs.split(",") if c]
    unknown = set(names) - set(kr.CONFIGS)
    if unknown:
        ap.error(f"unknown configurations {sorted(unknown)}; of {', '.join(kr.CONFIGS)}")
    import jax

    dev = jax.devices()[0]
    print(f"# ptxas counts, {dev.device_kind} ({jax.default_backend()}), jax {jax.__version__}")
    print(f"# plugin: {kr.plugin_path()}")
    print(f"# ptxas: {ptxas_version()}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        if args.dry or jax.default_backend() != "gpu":
            rows, log = dry_counts(names)
        else:
            rows, log = device_counts(names, args.deadline_s, scratch)
            if not any("counts" in r for r in rows):  # no log from the device's compile:
                # the stand-in pipeline of the CPU's counts, with the plugin's ptxas
                dirs = [os.path.dirname(p) for p in plugin_ptxas()]
                os.environ["PATH"] = os.pathsep.join([*dirs, os.environ.get("PATH", "")])
                note = "the device's compilation printed no ptxas log; the stand-in pipeline:"
                more, why = dry_counts(names[:4])
                rows += [dict(config="-", kernel="-", note=note), *more]
                log += "\n" + why
    docs = recorded()
    print(f"# {len(rows)} rows in {time.monotonic() - t0:.0f} s; docs: docs/runs/kernels/*.md")
    print("| config | kernel | registers | spill stores (B) | spill loads (B) | stack (B) | docs |")
    print("|---|---|---|---|---|---|---|")
    differ = 0
    for r in rows:
        doc = docs.get((r["config"], r["kernel"]))
        doc_text = "—" if doc is None else " / ".join(map(str, doc))
        if "counts" in r:
            c = r["counts"]
            got = (c.registers, c.spill_stores, c.spill_loads, c.stack_frame)
            mark = "" if doc is None or doc == got else " **differs**"
            differ += bool(mark)
            cells = " | ".join(map(str, got))
            print(f"| {r['config']} | {r['kernel']} | {cells} | {doc_text}{mark} |")
        else:
            print(f"| {r['config']} | {r['kernel']} | {r['note']} | | | | {doc_text} |")
    print(f"# {differ} kernels differ from the docs' counts")
    print("\n# the compilation's own output (ptxas logs and errors), tail:")
    print(log[-60000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
