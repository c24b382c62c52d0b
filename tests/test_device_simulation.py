"""The GPU window simulated on this CPU (issue 57): ``prepare`` here, then the exact device
command in a subprocess whose environment is the GPU image's: a copy of what the device
tool sends (tracked and untracked-not-ignored files, the carried ``.harvest/``), rhnzoo
importable only through the command's ``PYTHONPATH``, gensim / tensorflow_datasets /
tensorboardX import-blocked, ``RHNZOO_DATA`` and the user caches unset, ``$OUT`` an empty
folder; then the device tool's limits on what comes back, and ``record`` from a read-only
copy of ``$OUT``. At ``--smoke`` scale: tiny shapes, a few steps."""

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tarfile

import pytest

from rhnzoo.cells.kernels import verified
from tools import harvest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent"))
BLOCKED = ("gensim", "tensorflow_datasets", "tensorboardX")
# What device_call passes of this environment: the suite's compilation cache (conftest.py).
COMPILE_CACHE = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)

# Put into the copy's root (on the command's PYTHONPATH): the image's missing packages
# fail to import, and the editable install of this checkout is not seen.
SITECUSTOMIZE = f"""
import sys
class _NotOnTheImage:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU image)")
sys.meta_path[:] = [_NotOnTheImage()] + [
    f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""


def image_tree(dest: pathlib.Path) -> pathlib.Path:
    """A copy of what the device tool sends of this checkout (no ``.git``: the window's
    commit is in ``.harvest/window.json``), with the image's import blocker."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return dest


def device_call(
    tree: pathlib.Path,
    call: dict,
    out: pathlib.Path,
    home: pathlib.Path,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Runs ``call["command"]`` as the device would: from ``tree``, ``$OUT`` = ``out``
    (empty), a bare environment (no RHNZOO_DATA, no XDG caches, an empty HOME), but for
    the suite's compilation cache (tests/conftest.py's ``JAX_COMPILATION_CACHE_*``
    settings: where compiled programs are kept, not what runs; XLA's optimisation level
    stays the image's default, so its programs are cached apart from the suite's)."""
    assert len(call["command"]) < harvest.COMMAND_LIMIT
    out.mkdir()
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        "HOME": str(home),
        "OUT": str(out),
        "JAX_PLATFORMS": "cpu",
        "LANG": "C.UTF-8",
        "TMPDIR": str(home),
        **{k: v for k, v in os.environ.items() if k in COMPILE_CACHE},
    }
    return subprocess.run(
        ["bash", "-c", call["command"]],
        cwd=tree,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout or call["timeout_s"],
    )


def read_only_copy(out: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """``out`` as the device tool returns it: copied, every file and folder read-only."""
    shutil.copytree(out, dest)
    for p in sorted(dest.rglob("*"), reverse=True):
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    dest.chmod(0o555)
    return dest


def _window_data(name: str) -> None:
    for d in harvest.CHUNKS[name].data:
        if not (DATA / d).is_dir():
            pytest.skip(f"{d} not in $RHNZOO_DATA")


def _window(
    tmp_path: pathlib.Path, name: str, records: pathlib.Path, extra: str = "", tag: str = "1"
) -> tuple[dict, pathlib.Path, subprocess.CompletedProcess]:
    """prepare (here, into a fresh copy of the tree) then the device call; returns the
    call, ``$OUT`` and the process."""
    tree = image_tree(tmp_path / f"tree{tag}")
    call = harvest.prepare(name, smoke=True, root=tree, records=records, log=lambda s: None)
    assert (
        harvest.travelling_bytes()
        + sum(p.stat().st_size for p in (tree / ".harvest").rglob("*") if p.is_file())
        <= harvest.TRAVEL_LIMIT
    )
    call = dict(call, command=call["command"] + extra)
    out = tmp_path / f"out{tag}"
    proc = device_call(tree, call, out, tmp_path / "home")
    return call, out, proc


def _assert_comes_back(out: pathlib.Path, name: str, partial: bool = False) -> dict:
    assert harvest.check_out(out) == []
    names = {f"{name}.tar.gz", "summary.json"} | ({f"{name}.partial.tar.gz"} if partial else set())
    assert {p.name for p in out.iterdir()} == names
    with tarfile.open(out / f"{name}.tar.gz") as tar:
        members = tar.getnames()
    assert not [m for m in members if {"checkpoints", "best", "stacked"} & set(m.split("/"))]
    return json.loads((out / "summary.json").read_text())


def _assert_table(text: str, dest: pathlib.Path, metric: str) -> None:
    """``text`` (record's) holds each run group's mean of ``metric`` over its results."""
    values: dict[str, list[float]] = {}
    for results in dest.rglob("results.json"):
        run = results.parent.relative_to(dest).as_posix()
        head, _, k = run.rpartition("_")  # seeds <run>_s<k>, trials <run>_t<k> together
        base = head if k[:1] in ("s", "t") and k[1:].isdigit() else run
        values.setdefault(base, []).append(json.loads(results.read_text())[metric])
    rows = text.splitlines()[2:]
    assert values and sorted(r.split(" | ")[0].strip("| ") for r in rows) == sorted(values)
    scale = 100.0 if metric.endswith("_acc") else 1.0
    for row in rows:
        base, cell = row.split(" | ")[0].strip("| "), row.split(" | ")[1]
        mean = sum(values[base]) / len(values[base]) * scale
        # The table rounds to 2 decimals; a mean on a rounding boundary (x.xx5) may round
        # either way by the order of its float operations, so: within half a unit.
        assert abs(float(cell.split()[0]) - mean) <= 0.005 + 1e-9, (row, mean)


def _windows() -> list[str]:
    """The next pending window and one window of each table."""
    names = [harvest.next_pending()]
    for chunk in harvest.CHUNKS.values():
        if chunk.table not in {harvest.CHUNKS[n].table for n in names} and chunk.table != (
            "rrl_pmnist_paper"
        ):  # P-MNIST: the cut window below
            names.append(chunk.name)
    return names


@pytest.mark.slow
@pytest.mark.parametrize("name", _windows())
def test_a_window_runs_as_the_device_runs_it_and_its_table_comes_from_what_comes_back(
    tmp_path, name
):
    _window_data(name)
    records = tmp_path / "records"
    call, out, proc = _window(tmp_path, name, records)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _assert_comes_back(out, name)
    assert summary["complete"] and summary["finished"] and summary["smoke"]
    assert summary["chunk"] == name and summary["partial"] is None
    # What ran is what prepare printed: the chunk's stacked command, in the image.
    assert (
        summary["command"][:-1]
        == harvest.experiment_command(harvest.CHUNKS[name], pathlib.Path("x"), True)[1:-1]
    )
    queue = tmp_path / "queue.tsv"
    texts = harvest.record(
        read_only_copy(out, tmp_path / "back"), smoke=True, records=records, queue=queue
    )
    chunk = harvest.CHUNKS[name]
    _assert_table(texts[chunk.table], records / chunk.table, chunk.metric)
    assert (records / chunk.table / f"{name}.log").is_file() and not queue.exists()


@pytest.mark.slow
def test_a_window_cut_at_its_deadline_leaves_a_partial_archive_the_next_window_resumes(
    tmp_path,
):
    # Finding 5: a window cut at its deadline kept nothing and nothing resumed it.
    name = "rrl-pmnist-lstm"
    _window_data(name)
    records = tmp_path / "records"
    # 40 s: past start-up (a cut there saves step 0, which resumes as a fresh start; the
    # first step came 15 s after the start on the loaded 2 cores) and far from the end of
    # 100,000 steps (the smoke schedule's --epochs=1000 does not end the run sooner). The
    # run trains until the cut: the deadline is this test's CPU time.
    _, out, proc = _window(tmp_path, name, records, " --smoke_steps=100000 --deadline_s=40")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _assert_comes_back(out, name, partial=True)
    assert not summary["complete"] and summary["partial"] == f"{name}.partial.tar.gz"
    with tarfile.open(out / summary["partial"]) as tar:
        saved = [m for m in tar.getnames() if "/checkpoints/" in m]
    assert saved, "the cut window saved no checkpoint"
    harvest.record(read_only_copy(out, tmp_path / "back1"), smoke=True, records=records)
    assert (records / "rrl_pmnist_paper" / "partial" / f"{name}.tar.gz").is_file()
    # The next window: prepare carries the partial archive back; run resumes it.
    _, out2, proc2 = _window(tmp_path, name, records, tag="2")
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    summary2 = _assert_comes_back(out2, name)
    assert summary2["complete"] and summary2["resumed"]
    assert summary2["minutes_total"] > summary2["minutes"]
    with tarfile.open(out2 / f"{name}.tar.gz") as tar:
        log = tar.extractfile(f"{name}/log.txt").read().decode()
    resumed = [line for line in log.splitlines() if line.startswith("resumed ")]
    assert resumed and int(resumed[0].rsplit(" at step ", 1)[1]) > 0, log[-2000:]
    texts = harvest.record(read_only_copy(out2, tmp_path / "back2"), smoke=True, records=records)
    _assert_table(texts["rrl_pmnist_paper"], records / "rrl_pmnist_paper", "test_acc")
    assert not (records / "rrl_pmnist_paper" / "partial" / f"{name}.tar.gz").exists()


# ------------------------------------------------------------------ measure.sh, dry

PARTS = {  # part: the files it leaves in $OUT besides env.txt
    "suite": {"pytest.log"},
    "rnn": {"rnn.jsonl", "rnn.log"},
    "flags": {"rnn_flags.jsonl", "rnn_flags.log"},
    "lm": {"lm.jsonl", "lm.log", "lm-ops.txt"},
    "pallas": {
        "pallas.jsonl",
        "pallas.log",
        "pallas-probe.jsonl",
        "pallas-probe.log",
        "pallas-pytest.log",
    },
    "pallas-quick": {
        "pallas.jsonl",
        "pallas.log",
        "pallas-probe.jsonl",
        "pallas-probe.log",
        "pallas-pytest.log",
    },
    "seeds": {"seeds.jsonl", "seeds.log"},
    "seeds-quick": {"seeds.jsonl", "seeds.log"},
    "kernels": {  # issue 68 item 3: the kernel window (at most 7 files back, env.txt too)
        "kernels.jsonl",
        "kernels.log",
        "kernels-ptxas.txt",
        "kernels-pytest.log",
        "kernels-rhn.jsonl",
    },
}
EMPTY_OK = {
    "rnn.log",
    "rnn_flags.log",
    "lm.log",
    "pallas.log",
    "pallas-probe.log",
    "seeds.log",
    "kernels.log",
}  # stderr: empty where nothing went wrong


# A quick part shares its full part's branch of measure.sh, and --dry sets the same tiny
# shapes in both: dry, they differ only in time limits (and --torch_profile, which
# profiles nothing without a GPU). The full part's dry run checks the branch.
QUICK = {"pallas-quick": "pallas", "seeds-quick": "seeds"}


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return image_tree(tmp_path_factory.mktemp("image"))


def test_measure_sh_names_every_part():
    text = (ROOT / "tools/gpu/measure.sh").read_text()
    usage = text.split("usage: bash tools/gpu/measure.sh [--dry] ")[1].split('"')[0]
    assert set(usage.split("|")) == set(PARTS)
    for quick, full in QUICK.items():
        assert f"\n  {full}|{quick})\n" in text and PARTS[quick] == PARTS[full], quick


@pytest.mark.slow
@pytest.mark.parametrize("part", [p for p in PARTS if p not in QUICK])
def test_a_measure_sh_part_runs_dry_in_the_image_and_leaves_what_comes_back(image, tmp_path, part):
    call = {"command": f"bash tools/gpu/measure.sh --dry {part}", "timeout_s": 600}
    out = tmp_path / "out"
    proc = device_call(image, call, out, tmp_path / "home")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert harvest.check_out(out) == []
    assert {p.name for p in out.iterdir()} == {"env.txt"} | PARTS[part]
    for p in out.iterdir():
        assert p.stat().st_size or p.name in EMPTY_OK, p.name
    steps = [line for line in proc.stdout.splitlines() if ": rc=" in line]
    assert steps and "timed out" not in proc.stdout, proc.stdout[-2000:]
    env = (out / "env.txt").read_text()
    if part == "suite":  # finding 7: 8 workers on one GPU, each would take 75 % of it
        assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in env
        assert " passed" in (out / "pytest.log").read_text()
    else:
        assert "XLA_PYTHON_CLIENT_PREALLOCATE=\n" in env
    if part == "flags":  # finding 7: python's stderr into the log, not onto the terminal
        log = (out / "rnn_flags.log").read_text()
        assert "xla_no_such_flag_in_a_dry_run" in log
        assert "xla_no_such_flag_in_a_dry_run" not in proc.stderr
        lines = (out / "rnn_flags.jsonl").read_text().splitlines()
        assert lines and all(json.loads(x)["xla_flags"] for x in lines)
    elif part not in ("suite",):  # every step's status 0 (the flags' second is refused)
        assert all(" rc=0 " in line for line in steps), steps
    if part.startswith("pallas"):  # finding 6: the bench first, then the tests, each timed
        names = [line.split(":")[0] for line in steps]
        assert names == ["bench", "probe", "tests"], steps
        collected = (out / "pallas-pytest.log").read_text()
        assert "test_gated_pallas.py" in collected and "test_swap_ab.py" in collected
    if part.startswith("seeds"):  # bench.seeds' CLI: one record a configuration (issue 69:
        # its smoke lives here only; the stacked step itself: tests/test_bench.py)
        records = [
            json.loads(x) for x in (out / "seeds.jsonl").read_text().splitlines() if x[:1] == "{"
        ]
        assert [r["config"] for r in records] == ["tiny_classifier"], records
        for r in records:
            assert r["single_step_ms_min"] > 0
            for k in (1, 2):
                assert r[f"k{k}_ms_per_seed"] == pytest.approx(r[f"k{k}_step_ms_min"] / k)
                assert r[f"k{k}_steps_ratio"] > 0
    if part == "kernels":  # issue 68 item 3: the sections in order, each under its timeout
        names = [line.split(":")[0] for line in steps]
        assert names == ["(a) P-MNIST kernels", "(b) ptxas", "(c) tests", "(d) RHN kernels"]
        lines = [json.loads(x) for x in (out / "kernels.jsonl").read_text().splitlines()]
        assert {
            "pallas_forward",
            "pallas_value_and_grad",
            "pallas_bt16_value_and_grad",  # the swap-AB forward (issue 59)
            "pallas_bt32_value_and_grad",
            "fused_bf16_value_and_grad",
            "error_pallas",
            "error_pallas_bt16",
            "error_pallas_bt32",
            "error_pallas_approx_math",
            "error_pallas_no_auto_barriers",
            "error_fused_bf16",
        } <= {r["figure"] for r in lines}
        rhn = [json.loads(x) for x in (out / "kernels-rhn.jsonl").read_text().splitlines()]
        assert {(r["cell"], r["depth"]) for r in rhn} == {("RHN", 10), ("HSG(RHN)", 40)}
        for r in lines + rhn:  # what the record needs, and no failed figure
            assert "error" not in r, r
            assert r["stand_in"] and r["device"] == "cpu" and r["ms"] > 0
            assert r["digest"] == verified.digest(r["backend"]), r
        ptxas = (out / "kernels-ptxas.txt").read_text()
        assert "| lstm_n64 | forward |" in ptxas and "| rhn_hsg_bt16 | backward_first |" in ptxas
        tests = (out / "kernels-pytest.log").read_text().splitlines()
        first = [t for t in tests if t.startswith("tests/")][:2]  # riskiest first
        assert first == [
            "tests/test_swap_ab.py::test_outputs_match_the_reference[n100_bt16_pmnist_like_lengths]",
            "tests/test_swap_ab.py::test_outputs_match_the_reference[n128_bt32_two_ctas_lengths_masked]",
        ]  # fmt: skip
        # The record from what comes back (a read-only copy), in the image: every figure
        # an entry, all a dry run's, so none verifies, and the record stays empty.
        back = read_only_copy(out, tmp_path / "back")
        record = f"PYTHONPATH=$PWD python -m tools.kernel_record {back}"
        proc = device_call(
            image,
            {"command": f"{record} --dry", "timeout_s": 300},
            tmp_path / "out-record-dry",
            tmp_path / "home",
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        entries = verified.parse(proc.stdout)
        assert {(e.backend, e.cell, tuple(e.options.items())) for e in entries} == {
            ("gated", "LSTM", ()),
            ("gated", "LSTM", (("batch_tile", 16),)),
            ("gated", "LSTM", (("batch_tile", 32),)),
            ("gated", "LSTM", (("approx_math", True),)),
            ("gated", "LSTM", (("no_auto_barriers", True),)),
            ("rhn", "RHN", ()),
            ("rhn", "HSG(RHN)", ()),
        }
        assert all(e.stand_in and not verified.checked(e) for e in entries)
        assert all(e.value_error is not None and e.device_kind == "cpu" for e in entries)
        proc = device_call(
            image,
            {"command": record, "timeout_s": 300},
            tmp_path / "out-record",
            tmp_path / "home",
        )
        assert proc.returncode == 0 and "not recorded" in proc.stdout, proc.stdout + proc.stderr
        assert verified.parse((image / "rhnzoo/cells/kernels/verified.json").read_text()) == []


@pytest.mark.slow
def test_the_tensorboard_test_skips_in_the_image_without_tensorboardx(image, tmp_path):
    # Finding 7: it failed where tensorboardX is absent.
    call = {
        "command": "PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider "
        "tests/test_engine.py -k tensorboard_event_files",
        "timeout_s": 300,
    }
    proc = device_call(image, call, tmp_path / "out", tmp_path / "home")
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-2000:]
