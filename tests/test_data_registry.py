"""rhnzoo.data's registry: one entry per data set, ensure_files(name) finds its directory."""

import pathlib

import pytest

from rhnzoo import data
from rhnzoo.data import registry


def test_every_set_is_registered_with_its_task_and_files():
    assert set(data.names()) == {
        "ptb",
        "ptb_char",
        "enwik8",
        "text8",
        "jsb_chorales",
        "mnist",
        "cifar100",
        "pmnist",
        "imdb",
        "agnews",
        "20ng",
    }
    assert data.names("images") == ("mnist", "cifar100")
    assert set(data.names("sequences")) == {"pmnist", "imdb", "agnews", "20ng"}
    for d in data.DATASETS.values():
        assert d.files and callable(d.load) and d.origin.offline_hint, d.name
    assert (data.DATASETS["cifar100"].input_size, data.DATASETS["cifar100"].num_classes) == (
        3072,
        100,
    )
    assert data.DATASETS["enwik8"].metric == "bpc" and data.DATASETS["ptb"].metric == "ppl"


def test_ensure_files_resolves_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("RHNZOO_DATA", str(tmp_path))
    (tmp_path / "jsb_chorales").mkdir()
    (tmp_path / "jsb_chorales" / "jsb_chorales.pickle").write_bytes(b"mine")
    assert data.ensure_files("jsb_chorales", verify=False) == tmp_path / "jsb_chorales"
    with pytest.raises(data.DataError, match="jsb_chorales.pickle"):
        data.ensure_files("jsb_chorales")  # checksum of a file that is not the real one
    with pytest.raises(data.DataError, match=str(tmp_path / "ptb")):
        data.ensure_files("ptb", download=False)  # missing: names the files and the folder
    mine = tmp_path / "elsewhere"
    with pytest.raises(data.DataError, match=str(mine)):
        data.ensure_files("mnist", mine, download=False)


def test_unknown_names_are_one_line():
    for call in (
        lambda: data.ensure_files("mnist2"),
        lambda: data.load("ptb3"),
        lambda: registry.get("ptb", task="images"),
    ):
        with pytest.raises(ValueError) as e:
            call()
        assert "choose from" in str(e.value) and "\n" not in str(e.value)


def test_load_goes_through_the_sets_loader():
    d = pathlib.Path(__import__("os").environ.get("RHNZOO_DATA", "/nonexistent")) / "ptb"
    if not (d / "ptb.train.txt").exists():
        pytest.skip(f"real PTB files not found in {d} (set RHNZOO_DATA)")
    assert data.load("ptb").vocab_size == data.load_ptb().vocab_size == 10000
