"""rhnzoo.data.music: the JSB Chorales loader (real file, generated fixture, errors) and
pad_batch; experiments/jsb.py's flags."""

import json
import os
import pathlib
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from rhnzoo.data import common as data_common
from rhnzoo.data import music

JSB_DIR = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "jsb_chorales"
needs_jsb = pytest.mark.skipif(
    not (JSB_DIR / "jsb_chorales.pickle").exists(),
    reason=f"real jsb_chorales.pickle not found in {JSB_DIR} (set RHNZOO_DATA)",
)


# --- A writer for the file's format: Python 2 cPickle, protocol 2, int64 NumPy scalars. ---
# Opcodes written out by hand (pickletools names), as Python 2 emitted them, so the
# fixture exercises the same paths as the real file (SHORT_BINSTRING, numpy globals).


def _py2_str(s: bytes) -> bytes:
    return b"U" + bytes([len(s)]) + s  # SHORT_BINSTRING


def _int64_scalar(v: int) -> bytes:
    dtype = (
        b"cnumpy\ndtype\n" + _py2_str(b"i8") + b"K\x00K\x01\x87R"  # dtype('i8', 0, 1)
        b"(K\x03" + _py2_str(b"<") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"  # BUILD
    )
    return b"cnumpy.core.multiarray\nscalar\n" + dtype + _py2_str(struct.pack("<q", v)) + b"\x86R"


def py2_pickle(splits: dict) -> bytes:
    """{'train'|...: [[(note, ...), ...], ...]} -> bytes of a protocol-2 Python 2 pickle."""
    out = [b"\x80\x02}("]  # PROTO 2, EMPTY_DICT, MARK
    for name, seqs in splits.items():
        out.append(_py2_str(name.encode()) + b"](")  # key, EMPTY_LIST, MARK
        for seq in seqs:
            out.append(b"](")
            for notes in seq:
                out.append(b"(" + b"".join(_int64_scalar(n) for n in notes) + b"t")  # TUPLE
            out.append(b"e")  # APPENDS
        out.append(b"e")
    out.append(b"u.")  # SETITEMS, STOP
    return b"".join(out)


FIXTURE = {
    "train": [[(21, 60), (60,), ()], [(108,), (43, 96), (64, 67, 72), (64,)]],
    "valid": [[(48, 52, 55), ()]],
    "test": [[(50,), (62, 65)], [(70,)]],
}


def expected_roll(seq):
    roll = np.zeros((len(seq), 88), np.float32)
    for t, notes in enumerate(seq):
        for n in notes:
            roll[t, n - 21] = 1.0
    return roll


def write(directory: pathlib.Path, payload: bytes) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "jsb_chorales.pickle").write_bytes(payload)
    return directory


def test_fixture_writer_is_a_python2_style_pickle():
    """The writer is checked against plain pickle (latin1) before the loader is tested with it."""
    raw = pickle.loads(py2_pickle(FIXTURE), encoding="latin1")
    assert list(raw) == ["train", "valid", "test"]
    assert raw["train"][1][2] == (64, 67, 72) and isinstance(raw["train"][1][2][0], np.int64)
    assert raw["train"][0][2] == ()


def test_generated_fixture_loads_as_piano_rolls(tmp_path):
    directory = write(tmp_path / "jsb", py2_pickle(FIXTURE))
    data = music.load_jsb(directory, download=False, verify=False)
    assert list(data) == ["train", "valid", "test"]
    for split, seqs in FIXTURE.items():
        assert len(data[split]) == len(seqs)
        for roll, seq in zip(data[split], seqs):
            assert roll.dtype == np.float32 and roll.shape == (len(seq), 88)
            np.testing.assert_array_equal(roll, expected_roll(seq))
    # Hand-checked corners: MIDI 21 is column 0, MIDI 108 column 87, silence is a zero row.
    assert data["train"][0][0, 0] == 1 and data["train"][1][0, 87] == 1
    assert data["train"][0][2].sum() == 0 and data["train"][0].sum() == 3


def test_checksum_is_checked_unless_verify_false(tmp_path):
    directory = write(tmp_path / "jsb", py2_pickle(FIXTURE))
    with pytest.raises(music.DataError, match="sha256 mismatch"):
        music.load_jsb(directory, download=False)


def test_missing_file_names_it_and_the_fixes(tmp_path, monkeypatch):
    monkeypatch.delenv("RHNZOO_DATA", raising=False)
    with pytest.raises(music.DataError) as e:
        music.load_jsb(tmp_path / "none", download=False)
    message = str(e.value)
    for part in ("jsb_chorales.pickle", str(tmp_path / "none"), "pyro-ppl/datasets", "RHNZOO_DATA"):
        assert part in message
    assert not (tmp_path / "none").exists()


def test_offline_download_failure_is_a_data_error(tmp_path, monkeypatch):
    calls = []

    def offline(url, dest, timeout=60.0):
        calls.append(url)
        raise OSError("network unreachable")

    monkeypatch.setattr(data_common, "fetch", offline)
    with pytest.raises(music.DataError, match=r"jsb_chorales\.pickle.*download failed"):
        music.load_jsb(tmp_path / "jsb")
    assert calls == list(music.JSB_URLS)  # every source was tried
    assert not (tmp_path / "jsb").exists()


def test_download_is_checksummed_and_cached(tmp_path, monkeypatch):
    payload = py2_pickle(FIXTURE)

    def fake_fetch(url, dest, timeout=60.0):
        dest.write_bytes(payload)

    monkeypatch.setattr(data_common, "fetch", fake_fetch)
    # The fixture is not the real file, so the checksum must reject it and cache nothing.
    with pytest.raises(music.DataError, match="sha256 mismatch"):
        music.load_jsb(tmp_path / "jsb")
    assert not (tmp_path / "jsb" / "jsb_chorales.pickle").exists()
    # With the fixture's own checksum pinned, the download lands in the cache.
    monkeypatch.setitem(
        music.JSB_SHA256, "jsb_chorales.pickle", __import__("hashlib").sha256(payload).hexdigest()
    )
    data = music.load_jsb(tmp_path / "jsb")
    assert (tmp_path / "jsb" / "jsb_chorales.pickle").read_bytes() == payload
    assert len(data["train"]) == 2


def test_disallowed_global_is_refused(tmp_path):
    evil = b"\x80\x02cos\nsystem\nU\x04echo\x85R."  # os.system('echo')
    directory = write(tmp_path / "jsb", evil)
    with pytest.raises(music.DataError, match="os.system is not allowed"):
        music.load_jsb(directory, download=False, verify=False)


def test_note_out_of_range_is_refused(tmp_path):
    directory = write(tmp_path / "jsb", py2_pickle({**FIXTURE, "test": [[(20,)]]}))
    with pytest.raises(music.DataError, match=r"test\[0\]\[0\]: note 20"):
        music.load_jsb(directory, download=False, verify=False)


@needs_jsb
def test_real_file_counts():
    data = music.load_jsb(JSB_DIR, download=False)
    counts = {s: len(data[s]) for s in music.SPLITS}
    steps = {s: sum(r.shape[0] for r in data[s]) for s in music.SPLITS}
    assert counts == {"train": 229, "valid": 76, "test": 77}
    assert steps == {"train": 13807, "valid": 4602, "test": 4725}
    every = np.concatenate([r for s in music.SPLITS for r in data[s]])
    used = np.flatnonzero(every.sum(0))
    assert used.min() == 43 - 21 == 22 and used.max() == 96 - 21 == 75
    assert set(np.unique(every)) == {0.0, 1.0} and every.dtype == np.float32
    lengths = [r.shape[0] for s in music.SPLITS for r in data[s]]
    assert min(lengths) == 25 and max(lengths) == 160
    # SOURCES.md: 18 / 29 / 17 silent time steps.
    assert [int((np.concatenate(data[s]).sum(1) == 0).sum()) for s in music.SPLITS] == [18, 29, 17]


def test_pad_batch():
    a = np.ones((3, 88), np.float32)
    b = np.full((1, 88), 2.0, np.float32)
    x, mask = music.pad_batch([a, b])
    assert x.shape == (3, 2, 88) and mask.shape == (3, 2) and x.dtype == mask.dtype == np.float32
    np.testing.assert_array_equal(mask, [[1, 1], [1, 0], [1, 0]])
    np.testing.assert_array_equal(x[:, 0], a)
    np.testing.assert_array_equal(x[0, 1], b[0])
    assert x[1:, 1].sum() == 0
    x, mask = music.pad_batch([a, b], length=5, batch_size=4)
    assert x.shape == (5, 4, 88) and mask.sum() == 4 and mask[:, 2:].sum() == 0
    with pytest.raises(ValueError):
        music.pad_batch([a, b], length=2)
    with pytest.raises(ValueError):
        music.pad_batch([a, b], batch_size=1)
    with pytest.raises(ValueError):
        music.pad_batch([])


# ------------------------------------------------------------ experiments/jsb.py's flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLAGS_TO_CONFIG = """
import json, sys
from absl import flags
from rhnzoo.apps import jsb
jsb.define_flags()
flags.FLAGS(sys.argv)
print(json.dumps(jsb.config_from_flags().to_dict()))
print(json.dumps(sorted(flags.FLAGS)))
"""


def test_study_config_is_the_preset_with_the_flags_given_over_it():
    """The flags -> JSBConfig: --preset's values, the flags given over them (--depths as
    integers, --noverify an alias); the engine's flags that apply to an in-memory trial
    are there, those that do not are no flags."""
    args = ["--preset=cpu", "--trials=3", "--depths=4,1", "--noverify", "--patience=2"]
    out = subprocess.run(
        [sys.executable, "-c", FLAGS_TO_CONFIG, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config, names = (json.loads(line) for line in out.stdout.splitlines()[-2:])
    assert (config["width"], config["epochs"], config["batch_size"]) == (32, 25, 16)  # preset
    assert (
        config["trials"],
        config["depths"],
        config["verify_data"],
        config["patience"],
        config["preset"],
        config["seed"],
    ) == (3, [4, 1], False, 2, "cpu", 0)
    engine_flags = {
        "seed",
        "max_steps",
        "max_epochs",
        "patience",
        "divergence_factor",
        "matmul_precision",
    }
    assert engine_flags | {"jobs", "sweep_run", "data_dir", "workdir"} <= set(names)
    assert not {"log_every", "progress", "tensorboard", "checkpoint_every_steps"} & set(names)
