"""The harvest (``tools.harvest``, issues 47, 57, 68 and 70): its queue (a table: each
chunk's composition and size as columns), what a window carries and prints, the device
command, ``record``'s rules, which GPU window comes next. The windows themselves, run as
the device runs them, are tests/test_device_simulation.py's."""

import json
import os
import pathlib
import subprocess
import sys
import tarfile
from types import SimpleNamespace

import pytest

from rhnzoo.cells.kernels import verified
from tools import harvest
from tools.harvest import chunks as queue_table
from tools.harvest import stage as staging

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent"))


RRL_MODELS = ("lstm", "gru", "rrn", "sc_lstm_i", "sc_lstm_p", "hrl", "lstm_gru")


def test_the_committed_queue_lists_every_chunk_once_with_its_state():
    lines = harvest.QUEUE.read_text().splitlines()
    assert tuple(lines[0].split("\t")) == harvest.QUEUE_HEADER
    assert all(len(line.split("\t")) == len(harvest.QUEUE_HEADER) for line in lines)
    names = [line.split("\t")[0] for line in lines[1:]]
    assert names == list(harvest.CHUNKS) and len(set(names)) == len(names) == 39
    assert harvest.QUEUE.is_relative_to(ROOT / "docs" / "runs")  # a record, not code
    for row in harvest.read_queue():
        assert row["state"] in ("pending", "done", "partial"), row
        if row["state"] != "pending":  # a run chunk names its date, device and commit
            assert row["date"] and row["device"] and row["commit"], row


def test_every_chunk_is_one_table_s_and_carries_at_most_64_mib_with_the_tree():
    tables = {c.table: c.metric for c in harvest.CHUNKS.values()}
    tree = harvest.travelling_bytes()
    for chunk in harvest.CHUNKS.values():
        assert tables[chunk.table] == chunk.metric
        # a GPU window fits its deadline; a longer CPU chunk is cut and resumes
        assert chunk.device == "cpu" or chunk.minutes * 60 <= harvest.limit_s(chunk), chunk.name
        paths = [DATA / d for d in chunk.data]
        if not all(p.is_dir() for p in paths):
            continue  # sized where the data are
        size = sum(f.stat().st_size for p in paths for f in p.rglob("*") if f.is_file())
        size += 12 * 2**20 * bool(chunk.vectors)  # the 256-d IMDB vectors: 10 MB
        assert tree + size <= harvest.TRAVEL_LIMIT, (chunk.name, tree, size)


def test_the_travelling_size_counts_the_working_tree_not_only_the_stage_nor_git():
    # Finding 8: prepare checked only .harvest/ against 64 MiB. The device call copies the
    # tracked and untracked-not-ignored files, not .git (whose size is the clone's packing).
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    files = sum((ROOT / f).stat().st_size for f in tracked if f and (ROOT / f).is_file())
    git = sum(p.stat().st_size for p in (ROOT / ".git").rglob("*") if p.is_file())
    assert files <= harvest.travelling_bytes() < files + git


def test_seeded_windows_run_their_seeds_as_one_stacked_program(tmp_path):
    # Finding 2: three seeds as three processes time-slice one GPU. Each row's seeds are
    # one vmapped program by default, and --jobs is divided by the seeds.
    cmd = lambda name, smoke=False: harvest.experiment_command(
        harvest.CHUNKS[name], tmp_path, smoke
    )
    for name in ("rrl-imdb-w1", "rrl-pmnist-hrl"):
        assert cmd(name)[-3:] == ["--stack_seeds", "--jobs=1", f"--workdir={tmp_path}"]
        assert "--seeds=3" in cmd(name)
    assert "--stack_seeds" not in cmd("jsb-d1")  # trials, no seeds
    # A CPU highway chunk is one run (kind, depth, seed) in its run's folder.
    assert cmd("highway-mnist-plain-d10-s1")[-2:] == [
        "--noprogress",
        f"--workdir={tmp_path}/plain_d10_s1",
    ]
    assert cmd("rrl-pmnist-lstm", smoke=True)[-3:-1] == ["--stack_seeds", "--jobs=1"]
    no = harvest.experiment_command(harvest.CHUNKS["rrl-imdb-w1"], tmp_path, False, False)
    assert "--stack_seeds" not in no


@pytest.mark.skipif(not (DATA / "mnist").is_dir(), reason="MNIST not in $RHNZOO_DATA")
def test_prepare_stages_the_data_and_prints_the_device_call_that_runs(tmp_path, capsys):
    call = harvest.prepare("rrl-pmnist-lstm", root=tmp_path, records=tmp_path / "records")
    stage = tmp_path / ".harvest"
    files = sorted(p.name for p in (stage / "data" / "mnist").iterdir())
    assert files == sorted(p.name for p in (DATA / "mnist").iterdir())
    window = json.loads((stage / "window.json").read_text())
    assert window["window"] == "rrl-pmnist-lstm" and window["commit"]
    assert not window["smoke"] and not window["resume"]
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[-1]) == call
    assert call == {
        "command": "PYTHONPATH=$PWD python -m tools.harvest run rrl-pmnist-lstm",
        "carry": [".harvest"],
        "timeout_s": 600,
    }
    # Finding 8: the line names the command run returns to, stacked where it stacks.
    assert "--stack_seeds --jobs=1" in lines[-2]
    # A CPU chunk stages beside it (a background job never shares a device window's stage).
    call = harvest.prepare("jsb-d1", root=tmp_path, records=tmp_path / "records", log=print)
    assert call["carry"] == [".harvest_cpu"] and call["timeout_s"] > harvest.CPU_LIMIT_S
    assert (tmp_path / ".harvest_cpu" / "data" / "jsb_chorales").is_dir()
    assert json.loads((stage / "window.json").read_text())["window"] == "rrl-pmnist-lstm"


@pytest.mark.skipif(not (DATA / "mnist").is_dir(), reason="MNIST not in $RHNZOO_DATA")
def test_prepare_fails_before_touching_the_stage(tmp_path, monkeypatch):
    stage = tmp_path / ".harvest"
    (stage / "data").mkdir(parents=True)
    (stage / "window.json").write_text("earlier\n")
    monkeypatch.setattr(staging, "TRAVEL_LIMIT", 2**20)  # the tree alone is more
    with pytest.raises(harvest.HarvestError, match="would travel"):
        harvest.prepare("rrl-pmnist-lstm", root=tmp_path, records=tmp_path / "records")
    monkeypatch.setenv("RHNZOO_DATA", str(tmp_path / "none"))
    with pytest.raises(harvest.HarvestError, match="not there"):
        harvest.prepare("rrl-pmnist-lstm", root=tmp_path, records=tmp_path / "records")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".harvest"]
    assert (stage / "window.json").read_text() == "earlier\n"
    assert list((stage / "data").iterdir()) == []


@pytest.mark.slow  # IMDB's vocabulary and documents: about 30 s
@pytest.mark.skipif(not (DATA / "imdb").is_dir(), reason="IMDB not in $RHNZOO_DATA")
def test_prepare_without_gensim_fails_on_the_vectors_before_touching_the_stage(
    tmp_path, monkeypatch
):
    # Finding 4: nothing made the 256-d vectors; prepare ended in a traceback after
    # leaving a half-filled .harvest/.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no vectors cached
    monkeypatch.setitem(sys.modules, "gensim", None)
    monkeypatch.setitem(sys.modules, "gensim.models", None)
    with pytest.raises(harvest.HarvestError, match="imdb vectors: .*gensim"):
        harvest.prepare("rrl-imdb-w1", root=tmp_path, records=tmp_path / "records")
    assert not (tmp_path / ".harvest").exists() and not (tmp_path / ".harvest.new").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "imdb").is_dir(), reason="IMDB not in $RHNZOO_DATA")
def test_prepare_makes_and_carries_the_vectors_the_imdb_window_reads(tmp_path):
    # Finding 4: the vectors are trained here (gensim, fixed seed; about 2 min the first
    # time, then from the user cache) and carried where the run's XDG_CACHE_HOME finds
    # them under the name the training computes.
    pytest.importorskip("gensim")
    from rhnzoo.configs import rrl as presets
    from rhnzoo.data import word2vec
    from rhnzoo.tasks import rrl

    harvest.prepare("rrl-imdb-w1", root=tmp_path, records=tmp_path / "records")
    config = presets.get_config("paper", "imdb", model="lstm")
    data = rrl.load_data(config)
    os.environ["XDG_CACHE_HOME"], before = (
        str(tmp_path / ".harvest" / "cache"),
        os.environ.get("XDG_CACHE_HOME"),
    )
    try:
        path = word2vec.cache_path(data.train.inputs, data.vocab, 256, dataset="imdb")
        vectors, found = word2vec.load_word2vec(path, data.vocab, 256)
    finally:
        if before is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = before
    assert path.is_relative_to(tmp_path / ".harvest" / "cache") and path.is_file()
    assert vectors.shape == (len(data.vocab), 256) and found.sum() > 0.9 * len(data.vocab)


def _archive(out: pathlib.Path, info: dict) -> pathlib.Path:
    work = out.parent / f"w_{out.name}" / info["chunk"]
    (work / "runs" / "lstm").mkdir(parents=True)
    (work / "runs" / "lstm" / "results.json").write_text(json.dumps({"test_acc": 0.5}))
    (work / "log.txt").write_text("log\n")
    (work / "harvest.json").write_text(json.dumps(info))
    out.mkdir(exist_ok=True)
    with tarfile.open(out / f"{info['chunk']}.tar.gz", "w:gz") as tar:
        tar.add(work, arcname=info["chunk"])
    return out


INFO = {
    "chunk": "rrl-pmnist-lstm",
    "table": "rrl_pmnist_paper",
    "complete": True,
    "finished": ["lstm"],
    "date": "2026-11-27",
    "device": "CPU",
    "commit": "abc",
    "minutes_total": 0.1,
    "partial": None,
}


def test_record_never_puts_a_smoke_window_into_a_paper_table_or_the_queue(tmp_path):
    # Finding 8: record of a --smoke archive wrote smoke runs into the paper table.
    out = _archive(tmp_path / "out", INFO | {"smoke": True})
    queue = tmp_path / "queue.tsv"
    with pytest.raises(harvest.HarvestError, match="--smoke"):
        harvest.record(out, records=tmp_path / "paper", queue=queue)
    assert not (tmp_path / "paper").exists() and not queue.exists()
    texts = harvest.record(out, smoke=True, records=tmp_path / "smoke", queue=queue)
    assert "| lstm | 50.00 |" in texts["rrl_pmnist_paper"] and not queue.exists()
    assert harvest.record.__defaults__[0] is False  # paper scale unless told
    paper = _archive(tmp_path / "out2", INFO | {"smoke": False})
    with pytest.raises(harvest.HarvestError, match="without --smoke"):
        harvest.record(paper, smoke=True, records=tmp_path / "smoke", queue=queue)


def test_record_reads_a_read_only_out_and_writes_nothing_there(tmp_path):
    # Finding 8: record unpacked beside the archive; a device's files come back read-only.
    out = _archive(tmp_path / "out", INFO | {"smoke": False})
    queue = tmp_path / "queue.tsv"
    for p in out.iterdir():
        p.chmod(0o444)
    out.chmod(0o555)
    try:
        texts = harvest.record(out, records=tmp_path / "records", queue=queue)
    finally:
        out.chmod(0o755)
    assert sorted(p.name for p in out.iterdir()) == ["rrl-pmnist-lstm.tar.gz"]
    assert "| lstm | 50.00 |" in texts["rrl_pmnist_paper"]
    # Each row says where its runs ran, with the commit (the CPU rows of a table).
    assert texts["rrl_pmnist_paper"].splitlines()[2].endswith("| CPU (abc) |")
    row = next(r for r in harvest.read_queue(queue) if r["chunk"] == "rrl-pmnist-lstm")
    assert row["state"] == "done" and row["commit"] == "abc"


def test_the_cli_gives_one_error_line_for_a_bad_window_and_a_missing_out(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OUT", None)
    for args, says in (
        (["prepare", "nope"], "no window 'nope'"),
        (["run", "rrl-pmnist-lstm"], "no $OUT"),
        (["record", str(tmp_path / "none")], "not a folder"),
        (["record", str(tmp_path)], "no window archive"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "tools.harvest", *args],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 1 and p.stderr.splitlines() == [f"error: {p.stderr[7:-1]}"]
        assert says in p.stderr, p.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_cli_refuses_a_deadline_that_never_comes_and_names_a_broken_archive(tmp_path):
    # Issue 73, item 3: --deadline_s=nan passed ``<= 0`` and inf waited for ever (no
    # deadline to keep the window's archives); a cut-short or corrupt .tar.gz was a
    # tarfile.ReadError traceback. Each is one line, and nothing is written.
    whole = _archive(tmp_path / "whole", INFO) / f"{INFO['chunk']}.tar.gz"
    data = whole.read_bytes()
    broken = {"cut": data[: len(data) // 2], "garbage": b"not a tarball\n" * 20, "empty": b""}
    for name, content in broken.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{INFO['chunk']}.tar.gz").write_bytes(content)
    before = sorted(tmp_path.rglob("*"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OUT", None)
    cases = [
        *(
            (["run", "rrl-pmnist-lstm", f"--deadline_s={v}"], "must be a finite number > 0")
            for v in ("nan", "inf", "-inf", "0")
        ),
        *(
            (
                ["record", str(tmp_path / name), "--records", str(tmp_path / "records")],
                f"{tmp_path / name / INFO['chunk']}.tar.gz: cut short or corrupt",
            )
            for name in broken
        ),
    ]
    for args, says in cases:
        p = subprocess.run(
            [sys.executable, "-m", "tools.harvest", *args],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        shown = f"{args}: exit {p.returncode}\n{p.stderr}"
        assert p.returncode == 1 and p.stderr.splitlines() == [f"error: {p.stderr[7:-1]}"], shown
        assert says in p.stderr, shown
    assert sorted(tmp_path.rglob("*")) == before
    for v in (float("nan"), float("inf")):  # the function refuses it too, before anything
        with pytest.raises(harvest.HarvestError, match="must be a finite number > 0"):
            harvest.run("rrl-pmnist-lstm", tmp_path / "out", deadline_s=v, root=tmp_path)
    assert sorted(tmp_path.rglob("*")) == before


def test_the_gpu_queue_holds_table_3_only_and_refuses_a_window_sized_past_its_deadline(
    tmp_path,
):
    # Finding 3 (and 2): P-MNIST's 15,940 steps with three seeds as three processes, and
    # highway at 400 epochs, could not finish a window, and the queue took them anyway.
    # Highway and JSB are CPU chunks; every GPU window stacks its seeds and is sized from
    # measured step times under the deadline; record re-sizes the rest of its table from
    # a window's wall time, and prepare refuses one that would now pass the deadline.
    gpu = [c for c in harvest.CHUNKS.values() if c.device == "gpu"]
    assert {c.table for c in gpu} == {"rrl_imdb_paper", "rrl_pmnist_paper"}
    assert all(c.stack and "--seeds=3" in c.flags for c in gpu)
    for table in ("highway_mnist_paper", "jsb_paper"):
        assert {c.device for c in harvest.CHUNKS.values() if c.table == table} == {"cpu"}
    imdb = [m for c in gpu if c.table == "rrl_imdb_paper" for m in c.flags[3][9:].split(",")]
    assert len(gpu) - 7 == 3 and sorted(imdb) == sorted(RRL_MODELS)
    # 15,940 steps (10 epochs of 1,594 at batch 32) x the B 100 LSTM step, 13.3 ms (H100)
    unstacked = 3 * 15_940 * 13.3 / 1000
    assert unstacked > harvest.DEADLINE_S  # why the seeds are stacked
    queue = tmp_path / "queue.tsv"
    harvest.write_queue(harvest.read_queue(queue), queue)
    for row in harvest.read_queue(queue):
        assert harvest.check_size(row["chunk"], queue) == float(row["estimate"])
    w1, w2 = harvest.CHUNKS["rrl-imdb-w1"], harvest.CHUNKS["rrl-imdb-w2"]
    info = INFO | {"chunk": w1.name, "table": w1.table, "smoke": False}
    harvest.record(
        _archive(tmp_path / "out", info | {"minutes_total": 2 * w1.minutes}),
        records=tmp_path / "records",
        queue=queue,
    )
    rows = {r["chunk"]: r for r in harvest.read_queue(queue)}
    assert float(rows["rrl-imdb-w2"]["estimate"]) == pytest.approx(2 * w2.minutes, abs=0.05)
    assert rows["rrl-pmnist-lstm"]["estimate"] == f"{harvest.CHUNKS['rrl-pmnist-lstm'].minutes:g}"
    with pytest.raises(harvest.HarvestError, match="rrl-imdb-w2: estimated .* split it"):
        harvest.prepare("rrl-imdb-w2", root=tmp_path, records=tmp_path / "records", queue=queue)
    assert not (tmp_path / ".harvest").exists() and not (tmp_path / ".harvest.new").exists()


def test_the_cpu_queue_runs_seed_0_at_every_depth_then_jsb_then_the_other_seeds(tmp_path):
    """Issue 72's order, and a highway chunk longer than one 45-minute sitting is sized
    from the measured step, not refused (it is cut and resumes from its partial archive)."""
    cpu = [c.name for c in harvest.CHUNKS.values() if c.device == "cpu"]
    seed0 = [n for n in cpu if n.endswith("-s0")]
    jsb = [n for n in cpu if n.startswith("jsb-")]
    assert cpu[: len(seed0)] == seed0 and cpu[len(seed0) : len(seed0) + len(jsb)] == jsb
    assert [n.split("-")[3] for n in seed0[::2]] == ["d10", "d20", "d50", "d100"]
    d100 = harvest.CHUNKS["highway-mnist-highway-d100-s0"]
    # 156,000 steps of the measured 9.568 ms step, x the loaded-core factor 6.5
    assert d100.minutes == pytest.approx(156_000 * 9.568e-3 / 60 * 6.5, abs=0.05)
    assert d100.minutes * 60 > harvest.CPU_LIMIT_S
    queue = tmp_path / "queue.tsv"
    harvest.write_queue(harvest.read_queue(queue), queue)
    assert harvest.check_size(d100.name, queue) == d100.minutes


def test_the_queue_s_composition_and_sizes_are_a_data_edit(tmp_path):
    # Issue 70: re-sizing, re-ordering or re-composing a chunk is an edit of the table,
    # not of code: the chunks, their order and sizes, and what runs are the rows'.
    lines = harvest.QUEUE.read_text().splitlines()
    head, rows = lines[0], lines[1:]
    cols = head.split("\t")
    edited = []
    for line in [rows[3], *rows[:3], *rows[4:]]:  # rrl-pmnist-lstm first
        fields = dict(zip(cols, line.split("\t")))
        if fields["chunk"] == "rrl-pmnist-lstm":
            fields |= {"estimate": "3.5", "flags": fields["flags"] + " --skip=20"}
        edited.append("\t".join(fields[c] for c in cols))
    queue = tmp_path / "queue.tsv"
    queue.write_text("\n".join([head, *edited]) + "\n")
    found = harvest.read_chunks(queue)
    assert next(iter(found)) == "rrl-pmnist-lstm" == harvest.next_pending(queue)
    assert harvest.check_size("rrl-pmnist-lstm", queue) == 3.5
    cmd = harvest.experiment_command(found["rrl-pmnist-lstm"], tmp_path, False)
    assert "--skip=20" in cmd and cmd[1] == "experiments/rrl.py"
    queue.write_text(head + "\n" + rows[0].replace("\tgpu\t", "\tgpu?\t", 1) + "\n")
    with pytest.raises(harvest.HarvestError, match="on='gpu\\?'"):
        harvest.read_chunks(queue)


def test_a_cpu_chunk_is_recorded_apart_from_the_gpu_windows(tmp_path, monkeypatch):
    # Issue 68 item 4: CPU chunks' records lived under docs/runs/gpu/ and read as GPU
    # windows. A CPU chunk's table is under docs/runs/cpu/harvest/, a GPU window's under
    # docs/runs/gpu/harvest/.
    assert harvest.records_dir(harvest.CHUNKS["jsb-d1"]) == ROOT / "docs/runs/cpu/harvest"
    assert harvest.records_dir(harvest.CHUNKS["rrl-imdb-w1"]) == ROOT / "docs/runs/gpu/harvest"
    monkeypatch.setitem(queue_table.RECORDS, "cpu", tmp_path / "cpu")
    monkeypatch.setitem(queue_table.RECORDS, "gpu", tmp_path / "gpu")
    info = INFO | {"chunk": "highway-mnist-plain-d50-s0", "table": "highway_mnist_paper"}
    harvest.record(_archive(tmp_path / "out", info | {"smoke": False}), queue=tmp_path / "q.tsv")
    assert (tmp_path / "cpu/highway_mnist_paper/highway-mnist-plain-d50-s0.json").is_file()
    assert not (tmp_path / "gpu").exists()


def _env(folder: pathlib.Path, stamp: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "call1-env.txt").write_text(f"{stamp}\ncommit\nGPU 0: NVIDIA H100\n")


# A verified record holding every backend's current digest (what a kernel window leaves).
MEASURED = [SimpleNamespace(backend=b, digest=verified.digest(b)) for b in verified.SOURCES]


def _window_record(gpu: pathlib.Path, table: str, chunk: str, **info) -> None:
    (gpu / "harvest" / table).mkdir(parents=True, exist_ok=True)
    record = {"chunk": chunk, "table": table, "smoke": False, "device": "NVIDIA H100"} | info
    (gpu / "harvest" / table / f"{chunk}.json").write_text(json.dumps(record))


def test_the_next_window_alternates_between_the_harvest_and_the_kernels(tmp_path):
    # Issue 68 item 4: which window is next is a command. A measurement window newest:
    # the harvest's next pending GPU window; a harvest window newest: the kernels; CPU
    # chunks' records never count. (Every kernel measured in its present form: below.)
    gpu, queue = tmp_path / "gpu", tmp_path / "queue.tsv"
    harvest.write_queue(harvest.read_queue(queue), queue)  # a fresh queue: all pending
    _env(gpu / "2026-11-27", "Fri Nov 27 03:25:36 AM UTC 2026")
    step = harvest.next_window(gpu, queue, MEASURED)
    assert (step["window"], step["name"]) == ("harvest", "rrl-imdb-w1"), step
    assert step["call"] == {
        "command": "PYTHONPATH=$PWD python -m tools.harvest run rrl-imdb-w1",
        "carry": [".harvest"],
        "timeout_s": 600,
    }
    assert step["before"] == "python -m tools.harvest prepare rrl-imdb-w1"
    assert "2026-11-27" in step["why"]
    # The harvest ran w1 (a window record, newer): the kernels next.
    _window_record(
        gpu, "rrl_imdb_paper", "rrl-imdb-w1", date="2026-12-07", ended="2026-12-07T10:00:00+00:00"
    )
    rows = harvest.read_queue(queue)
    rows[0]["state"] = "done"
    harvest.write_queue(rows, queue)
    step = harvest.next_window(gpu, queue, MEASURED)
    assert step["window"] == "kernels" and step["call"] == harvest.KERNEL_CALL
    # after it, here: the record tool (a module of tools/, run from the repository root)
    assert step["after"].startswith("python -m tools.kernel_record FILES_AT --dry")
    assert (ROOT / "tools" / "kernel_record.py").is_file()
    assert step["call"] == {
        "command": "bash tools/gpu/measure.sh kernels",
        "carry": [],
        "timeout_s": 600,
    }
    # CPU chunks' records, newer, never count: one left in the GPU folder (its chunk is a
    # CPU one), one that ran on a CPU, and smoke records.
    _window_record(gpu, "jsb_paper", "jsb-d4", date="2026-12-09", device="CPU: AMD EPYC")
    _window_record(gpu, "rrl_pmnist_paper", "rrl-pmnist-lstm", date="2026-12-09", device="CPU")
    _window_record(gpu, "rrl_imdb_paper", "rrl-imdb-w2", date="2026-12-09", smoke=True)
    assert harvest.next_window(gpu, queue, MEASURED)["window"] == "kernels"
    # A measurement window after it (a dated folder, its env.txt's time): the harvest's
    # next pending window, w2 (the queue says which).
    _env(gpu / "2026-12-07", "Mon Dec  7 11:02:03 AM UTC 2026")
    step = harvest.next_window(gpu, queue, MEASURED)
    assert (step["window"], step["name"]) == ("harvest", "rrl-imdb-w2"), step
    # The same day without times: the harvest record is taken as the newer (kernels).
    (gpu / "2026-12-07" / "call1-env.txt").unlink()
    assert harvest.next_window(gpu, queue, MEASURED)["window"] == "kernels"
    # Every GPU window done: the kernels.
    harvest.write_queue([r | {"state": "done"} for r in harvest.read_queue(queue)], queue)
    (gpu / "harvest").rename(tmp_path / "away")
    step = harvest.next_window(gpu, queue, MEASURED)
    assert step["window"] == "kernels" and "no harvest window is pending" in step["why"]


def test_kernels_no_window_measured_in_their_present_form_come_first(tmp_path):
    """While the verified record holds no entry for a backend's current source digest,
    the kernels are measured before the harvest (auto runs no unchecked kernel)."""
    gpu, queue = tmp_path / "gpu", tmp_path / "queue.tsv"
    harvest.write_queue(harvest.read_queue(queue), queue)
    _env(gpu / "2026-11-27", "Fri Nov 27 03:25:36 AM UTC 2026")  # a measurement newest
    step = harvest.next_window(gpu, queue, [])
    assert step["window"] == "kernels" and "gated, chained, rhn" in step["why"], step
    stale = [SimpleNamespace(backend=b, digest="0" * 64) for b in verified.SOURCES]
    assert harvest.next_window(gpu, queue, stale)["window"] == "kernels"
    step = harvest.next_window(gpu, queue, MEASURED[1:])  # one backend still unmeasured
    assert step["window"] == "kernels" and "gated" in step["why"]
    assert harvest.next_window(gpu, queue, MEASURED)["window"] == "harvest"


def test_the_next_command_prints_the_window_and_its_exact_call_last():
    p = subprocess.run(
        [sys.executable, "-m", "tools.harvest", "next"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    step = json.loads(p.stdout.splitlines()[-1])
    assert step == harvest.next_window()
    assert step["window"] in ("harvest", "kernels") and step["call"]["timeout_s"] == 600
    assert f"the device call: {json.dumps(step['call'])}" in p.stdout
    # The kernels' call names a part measure.sh has.
    measure = (ROOT / "tools/gpu/measure.sh").read_text()
    usage = measure.split("usage: bash tools/gpu/measure.sh [--dry] ")[1].split('"')[0]
    assert harvest.KERNEL_CALL["command"].rsplit(" ", 1)[1] in usage.split("|")


def test_a_corrupt_partial_archive_to_resume_is_one_line(tmp_path):
    # The resuming side of issue 73's item 3: a carried partial archive cut short or
    # corrupt was a tarfile traceback when the window unpacked it.
    from tools.harvest import device

    whole = _archive(tmp_path / "whole", INFO) / f"{INFO['chunk']}.tar.gz"
    for name, content in {"cut": whole.read_bytes()[:100], "garbage": b"no tar\n" * 9}.items():
        carried = tmp_path / f"{name}.tar.gz"
        carried.write_bytes(content)
        with pytest.raises(queue_table.HarvestError, match="cut short or corrupt") as e:
            device._work_folder(tmp_path / "work", carried, smoke=False)
        assert str(carried) in str(e.value) and "\n" not in str(e.value)
