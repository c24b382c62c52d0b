"""The bad-input table (issues 48, 58, 62): every script in ``experiments/`` answers bad
input with exactly one ``error: ...`` line on stderr and exit status 1, and writes nothing.

One row per bad input. One row per script (:data:`IN_A_PROCESS`) runs the script in a
subprocess, for what only a process shows: the exit status, the whole of stderr (no
traceback, no library log line), absl's ``app.run`` wiring. Every other row runs in this
process through the same path: the script's flags defined on a fresh copy of absl's
``FLAGS`` (:func:`script_flags`), its command line parsed by
:func:`rhnzoo.apps.cli.parse_flags` and its ``main`` run; the ``SystemExit`` must carry
the one ``error:`` line and nothing may reach stderr.

Each row runs with ``tmp_path`` as the working directory; where the script has a workdir
it points into ``tmp_path`` and where it reads data the data directory does not exist
and nothing is downloaded, so a row the script fails to refuse stops at the data (with
another message) instead of training; a row about a value only data can refute reads a
tiny made-up PTB in ``{tmp}/data`` (:data:`TINY_PTB`). After the run ``tmp_path`` must
hold exactly what the row made there beforehand (nothing, the tiny PTB, a workdir whose
``config.json`` is corrupt or no JSON object, a file, a study's root). absl's ``--help``
(exit 1 by design) is no bad input and not here.

Placeholders in a row's arguments: ``{tmp}`` (the test's ``tmp_path``) and ``{port}``
(a free TCP port on localhost, for a coordinator nobody runs).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import pathlib
import runpy
import socket
import subprocess
import sys

import pytest
from absl import flags, logging

from corpus import write_ptb
from rhnzoo.apps import analyze, cli, highway, jsb, lm, rrl
from rhnzoo.engine import signals

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
    "generate.py": (),
    "export.py": (),
}
FLOW = ("--flow", "--out={tmp}/flow")  # analyze.py without a run: its options checked first
# analyze.py's workdir whose config.json is corrupt (made before the run).
CORRUPT = "corrupt/config.json"
# A workdir whose config.json is valid JSON but no object of settings (made before the run).
LISTED = "listed/config.json"
# A regular file (made before the run) where a directory belongs.
A_FILE = "afile"
# A jsb.py study's root (made before the run): its config.json, results.jsonl, trials/.
STUDY = "jsb_study"

# A tiny made-up PTB (made in {tmp}/data before the row runs): for values only data refute.
TINY_PTB = "--data_dir={tmp}/data --noverify_data --preset=small"
# The row of each script that runs in a subprocess (the rest run in this process).
IN_A_PROCESS = {
    "ptb.py": "--distributed --coordinator_address=localhost:{port} --num_processes=2 "
    "--process_id=1 --distributed_timeout=1",  # JAX's global settings change
    "char.py": "--preset=small --max_steps=2 foo",
    "rrl.py": "--jobs=2 --distributed",
    "jsb.py": "--preset=cpu --max_steps=2 foo",
    "highway.py": "--seeds=2",
    "sweep.py": "--dry_run -- --bogus=1",
    "analyze.py": f"--workdir={{tmp}}/{CORRUPT.split('/')[0]}",
    "generate.py": f"--workdir={{tmp}}/{CORRUPT.split('/')[0]}",
    "export.py": "--workdir={tmp}/none",
}
# The script's main, as its ``if __name__ == "__main__"`` passes it to cli.run_app.
MAIN = {"highway.py": lambda g: g["highway"].main, "sweep.py": lambda g: g["depth_sweep"].main}

# (script, args, a substring of the error line)
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
    (
        "ptb.py",
        (
            "--distributed --coordinator_address=localhost:{port} --num_processes=2 "
            "--process_id=1 --distributed_timeout=1"
        ),
        "no coordinator answered at localhost:{port} within 1 s",
    ),
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
    (
        "sweep.py",
        "-- --unroll=0 --data_dir=/nonexistent --nodownload",
        "--unroll must be >= 1, got 0",
    ),
    # ------------------------------------------- generate.py, export.py (issue 71)
    ("generate.py", "--workdir={tmp}/none foo", "unexpected arguments foo"),
    ("generate.py", "", "--workdir is required"),
    ("generate.py", "--workdir={tmp}/none", "has no config.json"),
    ("generate.py", f"--workdir={{tmp}}/{CORRUPT.split('/')[0]}", "config.json is unreadable"),
    ("generate.py", "--workdir={tmp}/none --num_tokens=0", "--num_tokens=0: 0 is not a positive"),
    # Old: no upper bound; 100,000,000 rows were allocated until memory ran out.
    (
        "generate.py",
        "--workdir={tmp}/none --samples=100000000",
        "not an integer in the range [1, 10000]",
    ),
    ("export.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("export.py", "", "--workdir is required"),
    ("export.py", "--workdir={tmp}/none", "has no config.json"),
    # ---------------------------------------------------------------- analyze.py
    ("analyze.py", "--workdir={tmp}/none foo", "unexpected arguments foo"),
    ("analyze.py", "--bogus=1", "Unknown command line flag 'bogus'"),
    ("analyze.py", "", "--workdir is required"),
    ("analyze.py", "--workdir={tmp}/none", "has no config.json"),
    ("analyze.py", f"--workdir={{tmp}}/{CORRUPT.split('/')[0]}", "config.json is unreadable"),
    (
        "analyze.py",
        "--workdir={tmp}/none --split=dev",
        "--split=dev: value should be one of <train|valid|test>",
    ),
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
    # issue 62, item 2: values the flags accept and the program cannot take
    *(
        (s, "--seed=99999999999999999999", "--seed must be <= 4294967295, got 9999")
        for s in ("ptb.py", "char.py", "rrl.py", "jsb.py", "highway.py")
    ),
    ("ptb.py", "--seed=-1", "--seed must be >= 0, got -1"),
    ("analyze.py", "--seed=99999999999999999999", "--seed must be <= 4294967295, got 9999"),
    ("sweep.py", "--dry_run -- --seed=99999999999999999999", "--seed must be <= 4294967295"),
    (
        "rrl.py",
        "--seed=4294967295 --seeds=2",
        "--seed=4294967295 with --seeds=2: the last seed, 4294967296, must be <= 4294967295",
    ),
    (
        "ptb.py",
        "--hidden_size=100000",
        "--hidden_size=100000, --depth=10: the parameters and optimizer state alone take",
    ),
    ("char.py", "--hidden_size=100000", "GiB, more than the"),
    ("rrl.py", "--hidden_size=10000000", "--model=lstm, --hidden_size=10000000, --embed_size"),
    ("sweep.py", "--depths=10 -- --hidden_size=100000", "--hidden_size=100000, --depth=10:"),
    ("jsb.py", "--width=100000", "--width=100000 (RHN at depth 6: width 100000): the "),
    ("highway.py", "--width=1000000", "--kind=highway, --width=1000000, --depth=10: the "),
    (
        "highway.py",
        "--sweep --width=1000000 --depths=10,20",
        "--kind=plain, --width=1000000, --depth=20: the parameters",
    ),
    # issue 62, item 3: flags that contradict or do nothing
    ("rrl.py", "--table --study=rrn", "--table (the --models' Table 3) and --study=rrn"),
    (
        "ptb.py",
        "--nohsg --hsg_init_bias=1.0",
        "--hsg_init_bias=1.0 sets the Highway State Gate's bias: it needs --hsg",
    ),
    (
        "rrl.py",
        "--stack_seeds --seeds=1",
        "--stack_seeds stacks a row's --seeds: it needs --seeds > 1",
    ),
    ("sweep.py", "--stack_seeds --dry_run", "--stack_seeds stacks a row's --seeds"),
    (
        "ptb.py",
        "--max_epoch=10 --max_max_epoch=2",
        "--max_epoch=10 (epochs at the initial learning rate) exceeds --max_max_epoch=2",
    ),
    (
        "rrl.py",
        "--buckets=100 --max_len=16",
        "--buckets=100 at --max_len=16 gives only 2 distinct padded lengths (8, 16)",
    ),
    ("sweep.py", "--depths=", "--depths must name at least one depth"),
    ("sweep.py", "--table", "--root={tmp}/sweep does not exist: no runs to tabulate"),
    ("sweep.py", "--table --root={tmp}", "--root={tmp} holds no run"),
    (
        "char.py",
        "--preset=small --dataset=enwik8",
        "--preset=small is sized for --dataset=ptb_char, not --dataset=enwik8",
    ),
    # rows of test_rrl.py / test_highway_experiment.py's subprocess cases, here in-process
    ("rrl.py", "--table --models=lstm,transformer", "unknown cell 'transformer'"),
    (
        "rrl.py",
        "--model=rrn --rrn_f_bias=-3 --study=rrn --dataset=agnews",
        "no rrn study on agnews",
    ),
    ("rrl.py", "--jobs=0", "--jobs must be >= 1, got 0"),
    ("highway.py", "--data_dir={tmp}/nothing", "train-images-idx3-ubyte.gz"),
    # issue 62, item 4: checked early, by the right flag's name
    ("rrl.py", "--coverage=1.5", "--coverage must be a fraction in (0, 1], got 1.5"),
    (
        "ptb.py",
        f"--eval_batch_size=1000000 {TINY_PTB}",
        "--eval_batch_size=1000000 is too large for the valid split's",
    ),
    # --data_source=tfds honours --nodownload: a set TFDS has not prepared is refused at
    # once, nothing fetched or written (TFDS's default download=True retried for minutes)
    (
        "highway.py",
        "--data_source=tfds --data_dir={tmp}/tfds",
        "TFDS 'mnist' is not prepared in {tmp}/tfds (--nodownload: nothing is fetched",
    ),
    (
        "rrl.py",
        "--dataset=agnews --data_source=tfds --data_dir={tmp}/tfds",
        "TFDS 'ag_news_subset' is not prepared in {tmp}/tfds (--nodownload",
    ),
    # issue 73, item 1: a config.json that is valid JSON but no object of settings
    (
        "ptb.py",
        f"--workdir={{tmp}}/{LISTED.split('/')[0]} {TINY_PTB}",
        f"{{tmp}}/{LISTED} is unreadable (a JSON object of settings expected, got a list)",
    ),
    (
        "analyze.py",
        f"--workdir={{tmp}}/{LISTED.split('/')[0]}",
        f"{{tmp}}/{LISTED} is unreadable (a JSON object of settings expected, got a list)",
    ),
    # issue 73, item 2: a sweep's --root that is a file, refused before any run starts
    ("sweep.py", f"--root={{tmp}}/{A_FILE} --dry_run", f"--root={{tmp}}/{A_FILE} is a file;"),
    (
        "sweep.py",
        f"--root={{tmp}}/{A_FILE} -- --max_steps=1 {TINY_PTB}",
        f"--root={{tmp}}/{A_FILE} is a file; the sweep's root is a directory of workdirs",
    ),
    ("sweep.py", f"--root={{tmp}}/{A_FILE}/sub --table", f"is under {{tmp}}/{A_FILE}, a file"),
    # issue 73, item 4: another task's study root is no folder of this script's runs
    *(
        (
            "rrl.py",
            f"--workdir={{tmp}}/{STUDY}{more}",
            f"{{tmp}}/{STUDY} is a run's workdir or a study's root (it holds config.json, "
            "results.jsonl, trials/), not a folder of this experiment's workdirs",
        )
        for more in ("", " --table", " --study=rrn --model=rrn")
    ),
    # issue 73, item 7: an --embeddings file checked with the flags, before IMDB is read
    ("rrl.py", "--embeddings=/no/such/file", "--embeddings=/no/such/file: no such file; give"),
    ("rrl.py", "--embeddings={tmp}", "--embeddings={tmp}: is a directory"),
]
# Options of analyze.py checked without a run: --flow --out (nothing to read first).
_ANALYZE_OPTIONS = (
    "--lesion_tokens",
    "--heatmap_steps",
    "--flow_steps",
    "--mc_samples",
    "--lesion_batch_size",
    "--max_eval_tokens",
    "--seed",
)


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
    return pytest.param(
        script, args, expected, id=f"{script.removesuffix('.py')}:{args or '(none)'}"
    )


def _prepare(tmp_path: pathlib.Path, args: str) -> tuple[list[str], dict[str, str]]:
    """What the row needs in ``tmp_path`` before the run (a corrupt config.json, the tiny
    PTB); returns ``tmp_path``'s listing then and the placeholders' values."""
    if CORRUPT.split("/")[0] in args:
        (tmp_path / CORRUPT).parent.mkdir()
        (tmp_path / CORRUPT).write_text("{")
    if f"{{tmp}}/{STUDY}" in args:
        (tmp_path / STUDY / "trials" / "rhn_d1_t0").mkdir(parents=True)
        (tmp_path / STUDY / "config.json").write_text('{"archs": ["rhn"], "depths": [1]}')
        (tmp_path / STUDY / "results.jsonl").write_text('{"valid_nll": 8.5}\n')
    if f"{{tmp}}/{A_FILE}" in args:
        (tmp_path / A_FILE).write_text("not a directory\n")
    if LISTED.split("/")[0] in args:
        (tmp_path / LISTED).parent.mkdir()
        (tmp_path / LISTED).write_text("[1, 2, 3]")
    if TINY_PTB in args:
        write_ptb(tmp_path / "data")  # tests/corpus.py
    return _tree(tmp_path), {"tmp": str(tmp_path), "port": str(_free_port())}


def _absl_flags() -> set[str]:
    """The names (and short names) of absl's own flags on ``FLAGS`` (logging's, app's)."""
    return {
        n
        for module, defined in flags.FLAGS.flags_by_module_dict().items()
        if module.startswith("absl.")
        for f in defined
        for n in (f.name, f.short_name)
        if n
    }


@contextlib.contextmanager
def script_flags():
    """absl's global ``FLAGS`` as a fresh process has it (absl's own flags, copied) for
    the block, where a script may define and parse its flags; its earlier state after it,
    the flags' values and absl's logging verbosity included. The scripts define their
    flags on the global ``FLAGS`` (absl's ``DEFINE_*`` default to it), so their flags
    live on a copy of its state, not on another ``FlagValues``."""
    F, verbosity = flags.FLAGS, logging.get_verbosity()
    saved = dict(F.__dict__)
    absl_names = _absl_flags()
    F.__dict__.update(copy.deepcopy(saved))
    try:
        for name in [n for n in F if n not in absl_names]:
            delattr(F, name)
        yield F
    finally:
        F.__dict__.clear()
        F.__dict__.update(saved)
        logging.set_verbosity(verbosity)


def run_in_process(script: str, argv: list[str], monkeypatch) -> SystemExit | None:
    """Runs ``experiments/<script>`` with ``argv`` in this process as its ``__main__``
    would: its flags (:func:`script_flags`), :func:`rhnzoo.apps.cli.parse_flags`, its
    ``main``. Returns the ``SystemExit`` it ended with (None: it returned)."""
    for module, name in (
        (lm, "_NAMES"),
        (rrl, "_NAMES"),
        (highway, "_NAMES"),
        (jsb, "_NAMES"),
        (analyze, "_OPTIONS"),
    ):
        monkeypatch.setattr(module, name, [])  # filled again by the script's define_flags
    command = [script, *argv]
    monkeypatch.setattr(sys, "argv", command)
    environ = dict(os.environ)
    try:
        with script_flags():
            g = runpy.run_path(str(ROOT / "experiments" / script), run_name="bad_input_table")
            main = MAIN.get(script, lambda g: g["main"])(g)
            main(cli.parse_flags(command, positional=script == "sweep.py"))
    except SystemExit as e:
        return e
    finally:
        signals.release_signals()  # cli.main catches SIGTERM / SIGINT
        os.environ.clear()
        os.environ.update(environ)
    return None


def run_app(script: str, argv, monkeypatch, capfd, tmp_path):
    """:func:`run_in_process` from ``tmp_path`` without ``RHNZOO_TRACEBACK``:
    ``(SystemExit or None, stdout, stderr)``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RHNZOO_TRACEBACK", raising=False)
    end = run_in_process(script, [str(a) for a in argv], monkeypatch)
    out, err = capfd.readouterr()
    return end, out, err


def _subprocess_cases():
    return [
        _param(script, args, expected)
        for script, args, expected in CASES
        if IN_A_PROCESS[script] == args
    ]


def _in_process_cases():
    return [
        _param(script, args, expected)
        for script, args, expected in CASES
        if IN_A_PROCESS[script] != args
    ]


def test_every_script_has_its_subprocess_row():
    assert sorted(p.values[0] for p in _subprocess_cases()) == sorted(BASE)


@pytest.mark.parametrize("script,args,expected", _in_process_cases())
def test_bad_input_is_one_error_line(tmp_path, monkeypatch, capfd, script, args, expected):
    before, fill = _prepare(tmp_path, args)
    argv = [a.format(**fill) for a in _argv(script, args)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RHNZOO_DATA", "/nonexistent")
    monkeypatch.delenv("RHNZOO_TRACEBACK", raising=False)
    end = run_in_process(script, argv, monkeypatch)
    err = capfd.readouterr().err
    shown = f"{script} {' '.join(argv)}\nexit {end and end.code!r}\nstderr:\n{err}"
    assert end is not None and isinstance(end.code, str), shown  # sys.exit(str): status 1
    lines = end.code.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert expected.format(**fill) in lines[0], shown
    assert err == "", shown
    assert _tree(tmp_path) == before, shown


@pytest.mark.slow  # each starts a Python that imports JAX (about 3.7 s of CPU)
@pytest.mark.parametrize("script,args,expected", _subprocess_cases())
def test_bad_input_in_a_process_is_one_error_line(tmp_path, script, args, expected):
    before, fill = _prepare(tmp_path, args)
    argv = [a.format(**fill) for a in _argv(script, args)]
    env = {**os.environ, "RHNZOO_DATA": "/nonexistent"}
    env.pop("RHNZOO_TRACEBACK", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    shown = f"{script} {' '.join(argv)}\nexit {proc.returncode}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 1, shown
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert expected.format(**fill) in lines[0], shown
    assert _tree(tmp_path) == before, shown


def test_script_flags_leave_the_global_flags_as_they_were(monkeypatch, tmp_path):
    """The in-process rows define each script's flags on a copy of absl's state: after a
    row the global ``FLAGS`` has the same flags, values and verbosity as before."""
    before = {n: flags.FLAGS[n].value for n in flags.FLAGS}
    verbosity = logging.get_verbosity()
    monkeypatch.chdir(tmp_path)
    end = run_in_process("ptb.py", ["--bogus=1"], monkeypatch)
    assert end is not None and "Unknown command line flag 'bogus'" in end.code
    assert {n: flags.FLAGS[n].value for n in flags.FLAGS} == before
    assert logging.get_verbosity() == verbosity


@pytest.mark.parametrize("script", ["ptb.py", "rrl.py", "jsb.py", "sweep.py"])
def test_pallas_on_a_cpu_says_it_interprets_the_kernels(tmp_path, monkeypatch, capfd, script):
    """Issue 73, item 5: ``--scan_impl=pallas`` on a CPU runs the GPU kernels in Pallas's
    interpret mode (a 16-unit depth-1 model had not finished 3 steps in 300 s): one
    ``warning:`` line on stderr says so before the data are read (here: none, so the run
    then stops at the data with its one error line)."""
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("the notice is the CPU's")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RHNZOO_DATA", "/nonexistent")
    monkeypatch.delenv("RHNZOO_TRACEBACK", raising=False)
    args = "-- --scan_impl=pallas --data_dir=/nonexistent --nodownload"
    # a model the kernels take: rrl.py's LSTM at n <= 128, jsb.py's LSTM (not a DT-RNN),
    # in the kernels' one precision (jsb.py has no --dtype: it refuses pallas up front)
    args += {"rrl.py": " --hidden_size=16", "jsb.py": " --archs=lstm"}.get(script, "")
    args += "" if script == "jsb.py" else " --dtype=bfloat16"
    argv = _argv(script, args if script == "sweep.py" else args.removeprefix("-- "))
    argv = [a.format(tmp=tmp_path) for a in argv]
    end = run_in_process(script, argv, monkeypatch)
    err = capfd.readouterr().err
    assert end is not None and str(end.code).startswith("error: "), (end, err)
    if script == "jsb.py":
        assert "--scan_impl=pallas needs --dtype=bfloat16" in str(end.code) and not err, err
        assert _tree(tmp_path) == []
        return
    assert err.splitlines() == [
        "warning: --scan_impl=pallas on a CPU runs the GPU kernels in Pallas's interpret "
        "mode, the kernels' test path: orders of magnitude slower than --scan_impl=fused "
        "or reference (meant for a GPU)"
    ], err
    assert _tree(tmp_path) == []


# ------------------------------------------- issue 62, item 5: library log lines on stderr


def test_a_checkpoint_with_unreadable_metadata_logs_nothing(tmp_path, caplog):
    """A resumed run whose latest checkpoint has a zeroed ``_CHECKPOINT_METADATA`` (what a
    crash can leave): orbax reads on without it, and its ``Failed to json parse Metadata
    file`` ERROR record does not reach the user (the engine's own lines say what
    happened)."""
    import logging as pylogging

    from rhnzoo import engine

    sys.path.insert(0, str(ROOT / "tests"))
    import engine_toy

    config = lambda steps: engine_toy.ToyConfig(
        epochs=3, progress=False, max_steps=steps, checkpoint_every_steps=5
    )
    engine.run(engine_toy.make_task(), config(12), tmp_path, log=None)
    metadata = tmp_path / "checkpoints" / "12" / "_CHECKPOINT_METADATA"
    metadata.write_bytes(b"\0" * len(metadata.read_bytes()))
    lines = []
    with caplog.at_level(pylogging.WARNING):
        engine.run(engine_toy.make_task(), config(20), tmp_path, log=lines.append)
    assert [r.getMessage()[:80] for r in caplog.records] == []
    assert any(line.startswith(f"resumed {tmp_path} at step 12") for line in lines), lines


def test_tfds_failures_are_our_line_alone(monkeypatch, caplog):
    """TFDS logs through absl (``W... Variant folder ... has no dataset_info.json``) before
    it fails; the failure is one DataError line and the log record does not reach the user."""
    import logging as pylogging

    tfds = pytest.importorskip("tensorflow_datasets")
    from rhnzoo.data import common

    def data_source(name, split, data_dir, download):
        logging.warning("Variant folder %s/%s has no dataset_info.json", data_dir, name)
        raise FileNotFoundError(f"{name} is not prepared in {data_dir}")

    monkeypatch.setattr(tfds, "data_source", data_source)
    monkeypatch.setattr(common, "_offline", lambda: None)  # as online: TFDS is asked
    with caplog.at_level(pylogging.DEBUG), pytest.raises(common.DataError, match="not prepared"):
        common.tfds_examples("mnist", "train", "/nowhere")
    assert caplog.records == []


def _fake_tfds(monkeypatch, data_source):
    """``common.import_tfds`` returning a stand-in whose ``data_source`` is the given one
    (tensorflow-datasets need not be installed)."""
    from rhnzoo.data import common

    fake = type("tfds", (), {"data_source": staticmethod(data_source)})
    monkeypatch.setattr(common, "import_tfds", lambda: fake)


def test_tfds_download_offline_fails_at_once_naming_nodownload(monkeypatch, tmp_path):
    """Issue 73, item 6: ``--data_source=tfds`` without ``--nodownload`` and no network:
    TFDS retried for 210 s, printing urllib3's retries. Where TFDS's host does not
    resolve, TFDS is asked for the set without downloading (it may have it elsewhere;
    here it has not: at once), nothing is made in its data directory, and the line
    names ``--nodownload``."""
    from rhnzoo.data import common

    calls = []

    def data_source(name, *, split, data_dir, download):
        calls.append((name, download))
        raise FileNotFoundError(f"{name} is not prepared")

    _fake_tfds(monkeypatch, data_source)
    reason = "storage.googleapis.com does not resolve: Name or service not known"
    monkeypatch.setattr(common, "_offline", lambda: reason)
    with pytest.raises(common.DataError) as e:
        common.tfds_examples("mnist", "train", tmp_path / "tfds", download=True)
    line = str(e.value)
    assert line.startswith(f"TFDS 'mnist' is not prepared in {tmp_path / 'tfds'} and cannot be")
    assert f"no network ({reason})" in line and "--nodownload" in line and "\n" not in line
    assert calls == [("mnist", False)] and _tree(tmp_path) == []


def test_a_failed_tfds_download_is_quiet_and_leaves_no_folders(monkeypatch, tmp_path, caplog):
    """Issue 73, item 6: a TFDS download that fails (the network gone after the name
    resolved): urllib3's ``Retrying (...)`` warnings do not reach the user, the folders
    the attempt made in TFDS's data directory are removed (what was there stays), and
    the one line names ``--nodownload``."""
    import logging as pylogging

    from rhnzoo.data import common

    def data_source(name, *, split, data_dir, download):
        root = pathlib.Path(data_dir)
        (root / name / "incomplete.X_3.0.1").mkdir(parents=True)
        (root / "downloads" / name).mkdir(parents=True)
        (root / "downloads" / name / "train.gz.tmp.1").write_bytes(b"")
        pylogging.getLogger("urllib3.connectionpool").warning("Retrying (Retry(total=4))")
        raise ConnectionError("Failed to resolve 'storage.googleapis.com'")

    _fake_tfds(monkeypatch, data_source)
    monkeypatch.setattr(common, "_offline", lambda: None)
    (tmp_path / "kept" / "cifar100").mkdir(parents=True)  # a data directory already in use
    before = _tree(tmp_path)
    for root in (tmp_path / "new", tmp_path / "kept"):
        with caplog.at_level(pylogging.DEBUG), pytest.raises(common.DataError) as e:
            common.tfds_examples("mnist", "train", root, download=True)
        line = str(e.value)
        assert line.startswith("tfds.data_source('mnist', split='train') failed (ConnectionError")
        assert line.endswith(
            "--nodownload reads only a prepared set, and fails at once without one"
        )
        assert caplog.records == []
        assert _tree(tmp_path) == before


def test_tfds_offline_is_a_name_that_does_not_resolve(monkeypatch):
    """The quick offline test (issue 73, item 6): TFDS's host not resolving is offline;
    a name that resolves, or a proxy (which resolves names itself), is not."""
    import socket

    from rhnzoo.data import common

    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)

    def fails(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fails)
    assert common._offline() == "storage.googleapis.com does not resolve: Name or service not known"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert common._offline() is None
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [])
    assert common._offline() is None


@pytest.mark.parametrize("download", [False, True])
def test_tfds_is_asked_to_download_only_as_the_flag_says(monkeypatch, tmp_path, download):
    """``--data_source=tfds`` passes ``--[no]download`` to ``tfds.data_source`` on every
    path that reads TFDS (highway.py's images, rrl.py's P-MNIST, IMDB and AG News): its
    default, ``download=True``, starts a download (offline: minutes of retries) where
    ``--nodownload`` asks for the prepared set or one line."""
    from rhnzoo import data
    from rhnzoo.data import common
    from rhnzoo.configs import highway as highway_configs

    calls = []

    def data_source(name, *, split, data_dir, download):
        calls.append((name, download))
        raise FileNotFoundError(f"{name} is not prepared")

    monkeypatch.setattr(
        common, "import_tfds", lambda: type("tfds", (), {"data_source": staticmethod(data_source)})
    )
    for name in ("mnist", "cifar100", "imdb_reviews", "ag_news_subset"):  # "prepared":
        (tmp_path / name / "1.0.0").mkdir(parents=True)  # the error is the fake TFDS's
        (tmp_path / name / "1.0.0" / "dataset_info.json").write_text("{}")
    readers = {
        "mnist": lambda: highway._load(
            highway_configs.HighwayConfig(
                dataset="mnist", data_source="tfds", data_dir=str(tmp_path), download=download
            )
        ),
        "cifar100": lambda: highway._load(
            highway_configs.HighwayConfig(
                dataset="cifar100", data_source="tfds", data_dir=str(tmp_path), download=download
            )
        ),
        **{
            name: functools.partial(
                data.load_dataset, name, data_dir=str(tmp_path), download=download, source="tfds"
            )
            for name in ("pmnist", "imdb", "agnews")
        },
    }
    for reader in readers.values():
        with pytest.raises(common.DataError, match="is not prepared") as e:
            reader()
        assert ("download=False" in str(e.value)) == (not download)
    assert calls == [
        (name, download)
        for name in ("mnist", "cifar100", "mnist", "imdb_reviews", "ag_news_subset")
    ]


def test_tfds_without_download_refuses_an_unprepared_set_at_once(tmp_path):
    """``tfds.data_source(..., download=False)`` on a data directory without the set: one
    line that says so, nothing written there (download=True makes ``downloads/`` and
    ``mnist/`` before it fetches)."""
    pytest.importorskip("tensorflow_datasets")
    from rhnzoo.data import common

    with pytest.raises(common.DataError) as e:
        common.tfds_examples("mnist", "train", tmp_path, download=False)
    assert str(e.value).startswith(f"TFDS 'mnist' is not prepared in {tmp_path} ("), e.value
    assert "\n" not in str(e.value) and _tree(tmp_path) == []


def test_tfds_data_source_has_what_it_imports(tmp_path):
    """``--data_source=tfds`` from the ``[tfds]`` / ``[test]`` extras: ``tfds.data_source``
    imports what it needs (importlib_resources, which tensorflow-datasets 4.9 does not
    declare); on a data directory without the set it fails for the missing set, not for
    a missing module."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with pytest.raises(Exception) as e:  # noqa: PT011 - TFDS's own error, whichever it is
        tfds.data_source("mnist", split="train", data_dir=str(tmp_path), download=False)
    assert not isinstance(e.value, ImportError), e.value


@pytest.mark.slow  # a process: absl's log handler is app.run's
def test_sweep_table_prints_no_library_log_line(tmp_path):
    """``sweep.py --table`` reads JAX's devices for its plots: absl's ``Unable to
    initialize backend 'tpu'`` INFO line must not reach stderr (the scripts log at WARNING
    unless --verbosity is given)."""
    run = tmp_path / "d10_rhn"
    run.mkdir()
    (run / "config.json").write_text('{"depth": 10, "hsg": false}')
    (run / "results.json").write_text('{"valid_ppl": 70.0, "test_ppl": 68.0}')
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "sweep.py"), f"--root={tmp_path}", "--table"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "| 10 | 70.0 | 68.0 |" in proc.stdout


def _checkpointless_run(tmp_path: pathlib.Path) -> pathlib.Path:
    """A ptb.py workdir with a config.json that rebuilds a model and no checkpoint."""
    run = tmp_path / "nockpt"
    run.mkdir()
    (run / "config.json").write_text('{"dataset": "ptb", "depth": 1, "hidden_size": 8}')
    return run


@pytest.mark.parametrize("script", ["rrl.py", "highway.py"])
def test_a_sweep_root_that_is_a_file_is_one_error_line(tmp_path, monkeypatch, capfd, script):
    # Old code: a NotADirectoryError traceback writing <file>/<run>/failed.json.
    from helpers import write_random_mnist

    (tmp_path / A_FILE).write_text("not a directory\n")
    args = [*NO_DATA]
    if script == "highway.py":  # reads its data before the sweep starts
        mnist = write_random_mnist(tmp_path / "mnist", train=200, test=40)
        data = [f"--data_dir={mnist}", "--noverify_data", "--nodownload", "--valid_size=40"]
        args = ["--sweep", "--depths=2", "--lr=0.1", *data]
    before = _tree(tmp_path)
    argv = [f"--workdir={tmp_path / A_FILE}", *args, "--max_steps=1"]
    end, _, err = run_app(script, argv, monkeypatch, capfd, tmp_path)
    assert end is not None and isinstance(end.code, str), err
    assert end.code.startswith("error: ") and "exists and is not a directory" in end.code
    assert len(end.code.splitlines()) == 1 and err == ""
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("script", ["export.py", "analyze.py"])
@pytest.mark.parametrize("out", [A_FILE, f"{A_FILE}/sub"])
def test_an_out_that_is_a_file_is_one_error_line(tmp_path, monkeypatch, capfd, script, out):
    # Old code: analyze.py a FileExistsError / NotADirectoryError traceback from mkdir;
    # export.py (no checkpoint here) another error line than the --out one.
    (tmp_path / A_FILE).write_text("not a directory\n")
    run = _checkpointless_run(tmp_path)
    before = _tree(tmp_path)
    argv = [f"--workdir={run}", f"--out={tmp_path / out}"]
    end, _, err = run_app(script, argv, monkeypatch, capfd, tmp_path)
    assert end is not None and isinstance(end.code, str), err
    assert end.code.startswith(f"error: --out={tmp_path / out} "), end.code
    assert "a file, not a directory" in end.code and len(end.code.splitlines()) == 1
    assert err == "" and _tree(tmp_path) == before


@pytest.mark.parametrize("out", ["new", "new/sub"])
def test_analyze_refused_leaves_no_empty_out(tmp_path, monkeypatch, capfd, out):
    # Old code: the right error line, but an empty new/ (new/sub/) left behind.
    run = _checkpointless_run(tmp_path)
    before = _tree(tmp_path)
    argv = [f"--workdir={run}", f"--out={tmp_path / out}", "--data_dir=/nonexistent"]
    end, _, err = run_app("analyze.py", argv, monkeypatch, capfd, tmp_path)
    assert end is not None and isinstance(end.code, str), err
    assert end.code.startswith("error: ") and "has no checkpoint" in end.code, end.code
    assert err == "" and _tree(tmp_path) == before


def test_sweep_table_of_another_studys_root_is_one_error_line(tmp_path, monkeypatch, capfd):
    # Old code: KeyError: 'depth' (an rrl.py study's runs have no depth in config.json).
    study = tmp_path / "rrl_study"
    (study / "lstm").mkdir(parents=True)
    (study / "lstm" / "config.json").write_text('{"dataset": "imdb", "cell": "lstm"}')
    (study / "lstm" / "results.json").write_text('{"test_accuracy": 0.5}')
    before = _tree(tmp_path)
    end, _, err = run_app("sweep.py", [f"--root={study}", "--table"], monkeypatch, capfd, tmp_path)
    assert end is not None and isinstance(end.code, str), err
    assert end.code.startswith(f"error: --root={study} is not a depth sweep's root"), end.code
    assert "lstm" in end.code and len(end.code.splitlines()) == 1
    assert err == "" and _tree(tmp_path) == before


@pytest.mark.parametrize("platforms", ["bogus", "cpu,bogus"])
def test_export_refuses_a_platform_jax_export_does_not_know(
    tmp_path, monkeypatch, capfd, platforms
):
    # Old code: lowered for the CPU alone and wrote an artifact naming the platform.
    run = _checkpointless_run(tmp_path)
    before = _tree(tmp_path)
    argv = [f"--workdir={run}", f"--out={tmp_path / 'new'}", f"--platforms={platforms}"]
    end, _, err = run_app("export.py", argv, monkeypatch, capfd, tmp_path)
    assert end is not None and isinstance(end.code, str), err
    assert end.code.startswith(f"error: --platforms={platforms}: unknown platform"), end.code
    assert "cpu, cuda, rocm, tpu" in end.code and len(end.code.splitlines()) == 1
    assert err == "" and _tree(tmp_path) == before
