"""A generated PTB: ``ptb.{train,valid,test}.txt`` of made-up words, for the tests whose
contract is a script's or a trainer's behaviour, not the data (issue 69): a run on it
costs its compile and a few steps, not an evaluation of the real 74k / 82k-token
validation and test sets. Real-PTB contracts keep the real files (the depth-40 headline
run, ``test_train.py``, CI's smoke run, the data tests).

Its words are ``w0 .. w49`` in turn, 20 to a line (the bad-input table's tiny PTB,
``tests/test_bad_inputs.py``). The files carry no published checksum: a script reads
them with ``--noverify_data`` (:func:`flags`), code that checks sums by default with
:func:`sha256s` put in ``rhnzoo.data.PTB_SHA256`` (``monkeypatch.setitem``).
"""

from __future__ import annotations

import pathlib

SPLITS = ("train", "valid", "test")


def write_ptb(directory, *, train: int = 2000, valid: int = 500, test: int = 500) -> pathlib.Path:
    """Writes the three files (``train`` / ``valid`` / ``test`` words each) into
    ``directory`` (made, with its parents); returns it."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True)
    sizes = dict(zip(SPLITS, (train, valid, test)))
    words = [f"w{i % 50}" for i in range(max(sizes.values()))]
    for split, n in sizes.items():
        lines = [" ".join(words[i : min(i + 20, n)]) for i in range(0, n, 20)]
        (directory / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return directory


def flags(directory) -> tuple[str, ...]:
    """``experiments/ptb.py``'s flags that read the generated files in ``directory``."""
    return (f"--data_dir={directory}", "--noverify_data")


def sha256s(directory) -> dict[str, str]:
    """``{file name: sha256}`` of the generated files, as ``rhnzoo.data.PTB_SHA256`` has it."""
    from rhnzoo.data import common

    return {
        f"ptb.{s}.txt": common.sha256_file(pathlib.Path(directory) / f"ptb.{s}.txt") for s in SPLITS
    }
