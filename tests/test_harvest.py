"""The GPU harvest (``docs/runs/gpu/harvest.py``, issue 47): its queue, what a chunk
carries, and one chunk of each table end to end at ``--smoke`` scale, its table made from
the records it archives."""

import importlib.util
import json
import os
import pathlib
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent"))
_spec = importlib.util.spec_from_file_location("harvest", ROOT / "docs/runs/gpu/harvest.py")
harvest = sys.modules["harvest"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harvest)


def test_the_committed_queue_lists_every_chunk_once_with_its_state():
    lines = harvest.QUEUE.read_text().splitlines()
    assert tuple(lines[0].split("\t")) == harvest.QUEUE_HEADER
    names = [line.split("\t")[0] for line in lines[1:]]
    assert names == list(harvest.CHUNKS)
    for row in harvest.read_queue():
        assert row["state"] in ("pending", "done", "partial"), row
        if row["state"] != "pending":  # a run chunk names its date, device and commit
            assert row["date"] and row["device"] and row["commit"], row


def test_every_chunk_is_one_table_s_and_carries_at_most_64_mib():
    tables = {c.table: c.metric for c in harvest.CHUNKS.values()}
    for chunk in harvest.CHUNKS.values():
        assert tables[chunk.table] == chunk.metric and chunk.minutes <= 9
        paths = [DATA / d for d in chunk.data]
        if not all(p.is_dir() for p in paths):
            continue  # sized where the data are
        size = sum(f.stat().st_size for p in paths for f in p.rglob("*") if f.is_file())
        size += 12 * 2**20 * len(chunk.cache)  # the 256-d IMDB vectors: 10 MB
        assert size <= harvest.CARRY_LIMIT, (chunk.name, size)


@pytest.mark.skipif(not (DATA / "mnist").is_dir(), reason="MNIST not in $RHNZOO_DATA")
def test_prepare_stages_the_data_and_the_commit(tmp_path, capsys):
    size = harvest.prepare("highway-mnist-d10", stage=tmp_path / "stage")
    files = sorted(p.name for p in (tmp_path / "stage" / "data" / "mnist").iterdir())
    assert files == sorted(p.name for p in (DATA / "mnist").iterdir())
    assert (tmp_path / "stage" / "commit.txt").read_text().strip()
    call = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert call["carry"] == [".harvest"] and "run highway-mnist-d10" in call["command"]
    assert size <= harvest.CARRY_LIMIT


def _members(archive):
    with tarfile.open(archive) as tar:
        return tar.getnames()


def test_stack_seeds_makes_a_row_s_seeds_one_program_and_divides_the_jobs(tmp_path):
    cmd = lambda name, smoke=False: harvest.command(harvest.CHUNKS[name], tmp_path, smoke,
                                                    stack=True)  # fmt: skip
    for name, jobs in (("rrl-imdb-lstm", "--jobs=1"), ("highway-mnist-d10", "--jobs=2")):
        tail = cmd(name)[-3:]
        assert tail == ["--stack_seeds", jobs, f"--workdir={tmp_path}"], tail
        assert "--seeds=3" in cmd(name)
    assert "--stack_seeds" not in cmd("jsb-d1")  # trials, no seeds
    assert "--stack_seeds" not in cmd("highway-mnist-d10", smoke=True)  # --seeds=1 there
    assert cmd("rrl-pmnist-lstm", smoke=True)[-3:-1] == ["--stack_seeds", "--jobs=1"]


@pytest.mark.slow
@pytest.mark.parametrize("name,data,stack", [("rrl-pmnist-lstm", "mnist", True),
                                             ("rrl-imdb-lstm", "imdb", False),
                                             ("highway-mnist-d10", "mnist", False),
                                             ("jsb-d1", "jsb_chorales", False)])  # fmt: skip
def test_a_chunk_at_smoke_scale_archives_its_records_and_its_table_comes_from_them(
    tmp_path, name, data, stack
):
    if not (DATA / data).is_dir():
        pytest.skip(f"{data} not in $RHNZOO_DATA")
    archive = harvest.run(name, tmp_path / "out", smoke=True, stage=tmp_path / "none",
                          stack=stack)  # fmt: skip
    members = _members(archive)
    assert not [m for m in members if "/checkpoints/" in m or "/best/" in m]
    assert not [m for m in members if "/stacked/" in m]  # the stacked state stays behind
    info = json.loads((tmp_path / "out" / name / "harvest.json").read_text())
    assert info["complete"] and info["finished"] and info["smoke"]
    for run in (tmp_path / "out" / name / "runs").rglob("results.json"):
        for kept in ("config.json", "metrics.jsonl", "results.json"):  # (a JSB trial: no log)
            if (run.parent / kept).is_file():
                assert str(run.parent.relative_to(tmp_path / "out") / kept) in members
    text = harvest.record(archive, records=tmp_path / "records", update_queue=False)
    dest = tmp_path / "records" / harvest.CHUNKS[name].table
    metric = harvest.CHUNKS[name].metric
    values = {}
    for results in dest.rglob("results.json"):
        run = results.parent.relative_to(dest).as_posix()
        head, _, k = run.rpartition("_")  # seeds <run>_s<k>, trials <run>_t<k> together
        base = head if k[:1] in ("s", "t") and k[1:].isdigit() else run
        values.setdefault(base, []).append(json.loads(results.read_text())[metric])
    rows = text.splitlines()[2:]
    assert sorted(r.split(" | ")[0].strip("| ") for r in rows) == sorted(values)
    scale = 100.0 if metric.endswith("_acc") else 1.0
    for row in rows:
        base, cell = row.split(" | ")[0].strip("| "), row.split(" | ")[1]
        mean = sum(values[base]) / len(values[base]) * scale
        assert cell.startswith(f"{mean:.2f}"), (row, values[base])
        if len(values[base]) > 1:
            assert cell.endswith(f"(n={len(values[base])})")
    assert (dest / "harvest_table.md").read_text().strip() == text
    assert (dest / f"{name}.json").is_file() and (dest / f"{name}.log").is_file()


@pytest.mark.skipif(not (DATA / "mnist").is_dir(), reason="MNIST not in $RHNZOO_DATA")
def test_a_chunk_past_its_deadline_is_stopped_and_recorded_as_partial(tmp_path, monkeypatch):
    monkeypatch.setattr(harvest, "QUEUE", tmp_path / "queue.tsv")
    archive = harvest.run("rrl-pmnist-lstm", tmp_path / "out", smoke=True, deadline_s=2.0,
                          stage=tmp_path / "none")  # fmt: skip
    info = json.loads((tmp_path / "out" / "rrl-pmnist-lstm" / "harvest.json").read_text())
    assert not info["complete"] and info["finished"] == [] and info["minutes"] < 1.5
    info["smoke"] = False  # as a device's run: the queue row is set
    (tmp_path / "out" / "rrl-pmnist-lstm" / "harvest.json").write_text(json.dumps(info))
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "out" / "rrl-pmnist-lstm", arcname="rrl-pmnist-lstm")
    harvest.record(archive, records=tmp_path / "records")
    row = next(r for r in harvest.read_queue() if r["chunk"] == "rrl-pmnist-lstm")
    assert row["state"] == "partial" and row["note"] == "0 runs finished"
    assert all(r["state"] == "pending" for r in harvest.read_queue() if r["chunk"] != row["chunk"])
