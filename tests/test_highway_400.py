"""tools/highway_400.py: the highway report's comparison at 400 epochs from run records."""

import json

from tools import highway_400


def _run(root, name, xents, test_acc):
    folder = root / name
    folder.mkdir(parents=True)
    lines = [{"kind": "train", "epoch": 1, "train_xent": 9.0}]
    lines += [{"kind": "epoch", "epoch": e + 1, "train_xent": x} for e, x in enumerate(xents)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "results.json").write_text(json.dumps({"test_acc": test_acc}))


def test_the_table_takes_each_finished_run_s_last_epoch_and_its_seeds_mean(tmp_path):
    _run(tmp_path, "plain_d10", [0.5, 2e-4], 0.9695)
    _run(tmp_path, "highway_d10", [0.1, 3e-5], 0.97)
    _run(tmp_path, "highway_d10_s1", [0.1, 1e-5], 0.98)
    (tmp_path / "plain_d50").mkdir()  # unfinished: no results.json
    found = highway_400.runs(tmp_path)
    assert set(found) == {("plain", 10), ("highway", 10)}
    text = highway_400.table(found)
    assert "| 10 | 2.00e-04 | 96.95 | 2.00e-05 ± 1.41e-05 (2) | 97.50 ± 0.71 (2) |" in text
    assert highway_400.figure(found, tmp_path / "f.png").stat().st_size > 0
