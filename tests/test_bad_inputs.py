"""Issue 48's bad-input table: every script in ``experiments/`` answers bad input with
exactly one ``error: ...`` line on stderr and exit status 1, and writes nothing.

Each case runs the script in a subprocess with ``cwd=tmp_path``; where the script has a
workdir it points into ``tmp_path`` and where it reads data the data directory does not
exist and nothing is downloaded, so a case the script fails to refuse stops at the data
(with another message) instead of training. After the run ``tmp_path`` must hold exactly
what the case made there beforehand (nothing, or an analysis workdir's corrupt
``config.json``). absl's ``--help`` (exit 1 by design) is no bad input and not here.

Placeholders in a case's arguments: ``{tmp}`` (the test's ``tmp_path``) and ``{port}``
(a free TCP port on localhost, for a coordinator nobody runs).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

# Each case starts a Python that imports JAX (about 3.7 s of CPU): 76 cases take about
# 2.5 minutes with -n 2 on 2 idle cores (282 CPU-s in all).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_DATA = ("--data_dir=/nonexistent", "--nodownload")
# Arguments every case of a script gets, unless the case gives the same flag itself.
BASE = {
    "ptb.py": ("--workdir={tmp}/run", *NO_DATA),
    "char.py": ("--workdir={tmp}/run", *NO_DATA),
    "rrl.py": ("--workdir={tmp}/run", *NO_DATA),
    "jsb.py": ("--workdir={tmp}/run", *NO_DATA),
    "highway.py": ("--workdir={tmp}/run", *NO_DATA),
    "sweep.py": ("--root={tmp}/sweep",),
    "analyze.py": (),
}
FLOW = ("--flow", "--out={tmp}/flow")  # analyze.py without a run: its options checked first
# analyze.py's workdir whose config.json is corrupt (made before the run).
CORRUPT = "corrupt/config.json"

# (script, args, a substring of the error line[, why it is not answered so yet])
CASES = [
    # ---------------------------------------------------------------- ptb.py
    ("ptb.py", "--preset=small --max_steps=2 foo", "unexpected arguments foo"),
    ("ptb.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("ptb.py", "--preset=large", "--preset=large: value should be one of <small>"),
    ("ptb.py", "--scan_impl=fast", "--scan_impl=fast: value should be one of"),
    ("ptb.py", "--depth=x", "--depth=x: invalid literal for int()"),
    ("ptb.py", "--lr=inf", "--lr must be a finite number, got inf"),
    ("ptb.py", "--max_grad_norm=nan", "--max_grad_norm must be a finite number, got nan"),
    ("ptb.py", "--unroll=0", "--unroll must be >= 1, got 0"),
    ("ptb.py", "--max_steps=0", "--max_steps must be >= 1, got 0"),
    ("ptb.py", "--log_every=0", "--log_every must be >= 1, got 0"),
    ("ptb.py", "--checkpoint_every_steps=-1", "--checkpoint_every_steps must be >= 0, got -1"),
    ("ptb.py", "--depth=0", "--depth must be >= 1, got 0"),
    ("ptb.py", "--hidden_size=0", "--hidden_size must be >= 1, got 0"),
    ("ptb.py", "--eval_batch_size=0", "--eval_batch_size must be >= 1, got 0"),
    ("ptb.py", "--init_scale=-1", "--init_scale must be > 0, got -1"),
    ("ptb.py", "--lr=0", "--lr must be > 0, got 0"),
    ("ptb.py", "--lr_decay=0.5", "--lr_decay must be >= 1, got 0.5"),
    ("ptb.py", "--weight_decay=-1", "--weight_decay must be >= 0, got -1"),
    ("ptb.py", "--drop_x=1", "drop_x must be a drop probability in [0, 1), got 1.0"),
    ("ptb.py", "--divergence_factor=0.5", "--divergence_factor must be 0 (off) or a finite"),
    ("ptb.py", "--matmul_precision=fast", "--matmul_precision: unknown matmul precision 'fast'"),
    ("ptb.py", "--workdir=", "--workdir must not be empty"),
    ("ptb.py", "--data_dir=", "--data_dir must not be empty"),
    ("ptb.py", ("--distributed --coordinator_address=localhost:{port} --num_processes=2 "
                "--process_id=1 --distributed_timeout=1"),
     "no coordinator answered at localhost:{port} within 1 s"),
    # ---------------------------------------------------------------- char.py
    ("char.py", "--preset=small --max_steps=2 foo", "unexpected arguments foo"),
    ("char.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("char.py", "--dataset=nope", "--dataset=nope: value should be one of <ptb_char|enwik8|text8>"),
    ("char.py", "--max_epochs=-1", "--max_epochs must be >= 1, got -1"),
    ("char.py", "--num_steps=0", "--num_steps must be >= 1, got 0"),
    ("char.py", "--batch_size=0", "--batch_size must be >= 1, got 0"),
    ("char.py", "--patience=0", "--patience must be >= 1, got 0"),
    ("char.py", "--drop_i=-0.1", "drop_i must be a drop probability in [0, 1), got -0.1"),
    # ---------------------------------------------------------------- rrl.py
    ("rrl.py", "--preset=cpu --max_steps=2 foo", "unexpected arguments foo"),
    ("rrl.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("rrl.py", "--hidden_size=-3", "--hidden_size must be >= 1, got -3"),
    ("rrl.py", "--keep=middle", "--keep=middle: value should be one of <last|first>"),
    ("rrl.py", "--input_drop=1.5", "--input_drop must be a drop probability in [0, 1), got 1.5"),
    ("rrl.py", "--jobs=2 --distributed", "--jobs > 1 and --distributed do not go together"),
    ("rrl.py", "--seeds=0", "--seeds must be >= 1, got 0"),
    # ---------------------------------------------------------------- jsb.py
    ("jsb.py", "--preset=cpu --max_steps=2 foo", "unexpected arguments foo"),
    ("jsb.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("jsb.py", "--depths=0", "--depths: every depth must be >= 1, got [0]"),
    ("jsb.py", "--depths=a", "--depths=a: expected comma-separated int values"),
    ("jsb.py", "--archs=transformer", "--archs must be a non-empty subset of"),
    ("jsb.py", "--trials=0", "--trials must be >= 1, got 0"),
    ("jsb.py", "--epochs=0", "--epochs must be >= 1, got 0"),
    ("jsb.py", "--data_dir=", "--data_dir must not be empty"),
    # ---------------------------------------------------------------- highway.py
    ("highway.py", "--preset=cpu --max_steps=2 foo", "unexpected arguments foo"),
    ("highway.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("highway.py", "--dataset=nope", "--dataset=nope: value should be one of"),
    ("highway.py", "--depth=1", "--depth must be >= 2, got 1"),
    ("highway.py", "--width=0", "--width must be >= 1, got 0"),
    ("highway.py", "--init=orthogonal", "--init=orthogonal: value should be one of"),
    ("highway.py", "--seeds=2", "--jobs and --seeds are for --sweep"),
    ("highway.py", "--sweep --jobs=0", "--jobs must be >= 1, got 0"),
    # ---------------------------------------------------------------- sweep.py
    ("sweep.py", "--dry_run foo", "unexpected arguments foo (ptb.py's flags go after --)"),
    ("sweep.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("sweep.py", "--dry_run -- --bogus=1", "Unknown command line flag 'bogus'"),
    ("sweep.py", "--depths=0", "depths must be >= 1, got [0]"),
    ("sweep.py", "--dry_run -- --depth=3", "the sweep sets --depth, --hsg and --workdir itself"),
    ("sweep.py", "-- --unroll=0 --data_dir=/nonexistent --nodownload",
     "--unroll must be >= 1, got 0"),
    # ---------------------------------------------------------------- analyze.py
    ("analyze.py", "--workdir={tmp}/none foo", "unexpected arguments foo"),
    ("analyze.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("analyze.py", "", "--workdir is required"),
    ("analyze.py", "--workdir={tmp}/none", "has no config.json"),
    ("analyze.py", f"--workdir={{tmp}}/{CORRUPT.split('/')[0]}", "config.json is unreadable"),
    ("analyze.py", "--workdir={tmp}/none --split=dev",
     "--split=dev: value should be one of <train|valid|test>"),
    ("analyze.py", "--lesion_tokens=-1", "--lesion_tokens must be >= 1, got -1"),
    ("analyze.py", "--heatmap_steps=-5", "--heatmap_steps must be >= 1, got -5"),
    ("analyze.py", "--flow_steps=0", "--flow_steps must be >= 1, got 0"),
    ("analyze.py", "--mc_samples=-1", "--mc_samples must be >= 0, got -1"),
    ("analyze.py", "--lesion_batch_size=0", "--lesion_batch_size must be >= 1, got 0"),
    ("analyze.py", "--max_eval_tokens=0", "--max_eval_tokens must be >= 1, got 0"),
    # found by this table, fixed with it
    ("ptb.py", "--max_epoch=-1", "--max_epoch must be >= 0, got -1"),
    ("rrl.py", "--model=rrn --rrn_depth=0", "--rrn_depth must be >= 1, got 0"),
    ("sweep.py", "--dry_run -- --unroll=0", "--unroll must be >= 1, got 0"),
]
# Options of analyze.py checked without a run: --flow --out (nothing to read first).
_ANALYZE_OPTIONS = ("--lesion_tokens", "--heatmap_steps", "--flow_steps", "--mc_samples",
                    "--lesion_batch_size", "--max_eval_tokens")


def _name(arg: str) -> str:
    """A flag's name as absl reads it (``--nodownload`` -> ``download``); '' for no flag."""
    if not arg.startswith("-") or arg == "--":
        return ""
    name = arg.lstrip("-").split("=")[0]
    return name[2:] if name.startswith("no") and "=" not in arg else name


def _argv(script: str, args: str) -> list[str]:
    """The case's command line: ``BASE[script]`` less the flags the case gives, then the
    case's arguments (``analyze.py``'s option cases run with ``--flow --out``)."""
    case = args.split()
    base = list(BASE[script])
    if script == "analyze.py" and case and case[0].split("=")[0] in _ANALYZE_OPTIONS:
        base += FLOW
    if "--" in case:  # sweep.py: the base (its own flags) before --
        return [*base, *case]
    given = {_name(a) for a in case} - {""}
    return [*(a for a in base if _name(a) not in given), *case]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _tree(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _param(script: str, args: str, expected: str):
    """A case as a pytest parameter, named ``<script>:<args>``."""
    return pytest.param(script, args, expected,
                        id=f"{script.removesuffix('.py')}:{args or '(none)'}")  # fmt: skip


@pytest.mark.parametrize("script,args,expected", [_param(*case) for case in CASES])
def test_bad_input_is_one_error_line(tmp_path, script, args, expected):
    if CORRUPT.split("/")[0] in args:
        (tmp_path / CORRUPT).parent.mkdir()
        (tmp_path / CORRUPT).write_text("{")
    before = _tree(tmp_path)
    fill = {"tmp": str(tmp_path), "port": str(_free_port())}
    argv = [a.format(**fill) for a in _argv(script, args)]
    env = {**os.environ, "RHNZOO_DATA": "/nonexistent"}
    env.pop("RHNZOO_TRACEBACK", None)
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / script), *argv],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    shown = f"{script} {' '.join(argv)}\nexit {proc.returncode}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 1, shown
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert expected.format(**fill) in lines[0], shown
    assert _tree(tmp_path) == before, shown
