"""Polyphonic music: JSB Chorales as 88-note piano rolls (Boulanger-Lewandowski et al., 2012).

Boulanger-Lewandowski, Bengio & Vincent, "Modeling Temporal Dependencies in
High-Dimensional Sequences: Application to Polyphonic Music Generation and
Transcription", ICML 2012: 382 chorales by J. S. Bach, quantised to quarter notes,
split 229 / 76 / 77 (train / valid / test). The file used here is the pickle that
Pyro's polyphonic loader downloads (``polyphonic/jsb_chorales.pickle`` of the
pyro-ppl/datasets repository): a Python-2 protocol-2 pickle of a dict
{'train', 'valid', 'test'} -> list of sequences, a sequence a list of time steps, a
time step a tuple of MIDI note numbers (NumPy int64 scalars).
"""

from __future__ import annotations

import pathlib
import pickle
from collections.abc import Sequence

import numpy as np

from rhnzoo.data import common
from rhnzoo.data.common import DataDir, DataError

JSB_FILE = "jsb_chorales.pickle"
JSB_SHA256 = {JSB_FILE: "69dc4c3e52800959ac0ab3b82aa3e5f55285ce64f1705acb3e3a8ef77a5c051c"}
# The pyro-ppl/datasets file, then the mirror Pyro's own loader uses; tried in order.
JSB_URLS = (
    "https://github.com/pyro-ppl/datasets/raw/master/polyphonic/jsb_chorales.pickle",
    "https://d2hg8soec8ck9v.cloudfront.net/datasets/polyphonic/jsb_chorales.pickle",
)
SPLITS = ("train", "valid", "test")
LOWEST_NOTE = 21  # MIDI A0, column 0 of the piano roll
NUM_NOTES = 88  # A0 (21) .. C8 (108)

# The only globals the pickle needs: NumPy scalars and dtypes, under their NumPy 1 and 2 names.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "dtype"),
}


class _ScalarsOnlyUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global except NumPy's scalar constructor and dtype,
    so a tampered file cannot run code."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        if name == "dtype":
            return np.dtype
        try:
            from numpy._core.multiarray import scalar  # NumPy >= 2
        except ImportError:  # pragma: no cover - NumPy 1.x
            from numpy.core.multiarray import scalar
        return scalar


def _download_jsb(tmp: pathlib.Path) -> None:
    """Fetch the pickle into `tmp`, trying each of JSB_URLS; re-raises the last OSError."""
    common.fetch_first(JSB_URLS, tmp / JSB_FILE)


JSB_ORIGIN = common.Origin(
    "jsb_chorales", _download_jsb, f"it is polyphonic/{JSB_FILE} of github.com/pyro-ppl/datasets"
)


def _piano_roll(path: pathlib.Path, split: str, index: int, sequence) -> np.ndarray:
    """One sequence (list of tuples of MIDI notes) -> float32 [T, 88], roll[t, note - 21] = 1."""
    where = f"{path}: {split}[{index}]"
    if not isinstance(sequence, (list, tuple)) or not sequence:
        raise DataError(f"{where} is not a non-empty list of time steps")
    roll = np.zeros((len(sequence), NUM_NOTES), np.float32)
    for t, notes in enumerate(sequence):
        if not isinstance(notes, (list, tuple)):
            raise DataError(f"{where}[{t}] is not a tuple of MIDI notes")
        for note in notes:
            column = int(note) - LOWEST_NOTE
            if not 0 <= column < NUM_NOTES or int(note) != note:
                raise DataError(f"{where}[{t}]: note {note} is outside MIDI 21..108")
            roll[t, column] = 1.0
    return roll


def load_jsb(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True
) -> dict[str, list[np.ndarray]]:
    """Load JSB Chorales from ``jsb_chorales.pickle`` in `resolve_data_dir('jsb_chorales',
    data_dir)`.

    If the file is missing and `download` is true it is fetched from pyro-ppl/datasets
    (JSB_URLS) and checked against JSB_SHA256; `verify=False` skips the check of a file
    already on disk (for your own copies or test fixtures). The pickle is read with an
    unpickler that allows only NumPy scalars and dtypes (``encoding='latin1'`` for the
    Python-2 strings).

    Returns:
      ``{'train', 'valid', 'test'}`` -> list of float32 piano rolls ``[T_i, 88]`` with
      entries 0/1; column j is MIDI note 21 + j (A0 .. C8). Real data: 229 / 76 / 77
      sequences, 13,807 / 4,602 / 4,725 time steps, notes within MIDI 43..96 (columns
      22..75), T_i from 25 to 160; a few time steps are silent (all zeros).
    Raises:
      DataError: file missing (and no download, or the download failed: the message
        names the file and where to put it), checksum mismatch, a file that is not
        such a pickle, or a note outside MIDI 21..108.
    """
    directory = JSB_ORIGIN.ensure(data_dir, JSB_SHA256, download=download, verify=verify)
    path = directory / JSB_FILE
    try:
        with open(path, "rb") as f:
            raw = _ScalarsOnlyUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise DataError(f"{path}: not a readable JSB Chorales pickle ({e})") from None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(s), list) for s in SPLITS):
        raise DataError(f"{path}: expected a dict with lists under {', '.join(SPLITS)}")
    return {
        split: [_piano_roll(path, split, i, seq) for i, seq in enumerate(raw[split])]
        for split in SPLITS
    }


def pad_batch(
    seqs: Sequence[np.ndarray], length: int | None = None, batch_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Stack piano rolls time-major, zero-padded at the end.

    Args:
      seqs: rolls ``[T_i, D]`` (D = 88 for JSB), at least one.
      length: padded length T (default: the longest T_i); must be >= every T_i.
      batch_size: padded batch size B (default: len(seqs)); the extra columns are
        empty sequences (all-zero mask), so a fixed B serves a last, smaller batch.

    Returns:
      ``(x [T, B, D] float32, mask [T, B] float32)``; ``mask[t, b] = 1`` iff t < T_b.
    Raises:
      ValueError: no sequences, a roll that is not 2-D or has another width, or a
        `length` / `batch_size` too small.
    """
    if not seqs:
        raise ValueError("pad_batch needs at least one sequence")
    width = np.shape(seqs[0])[-1]
    lengths = [np.shape(s)[0] for s in seqs]
    if any(np.ndim(s) != 2 or np.shape(s)[1] != width for s in seqs):
        raise ValueError(f"pad_batch expects 2-D rolls [T_i, {width}]")
    T = max(lengths) if length is None else length
    B = len(seqs) if batch_size is None else batch_size
    if T < max(lengths) or B < len(seqs):
        raise ValueError(
            f"length={T} / batch_size={B} too small for {len(seqs)} sequences of up to "
            f"{max(lengths)} steps"
        )
    x = np.zeros((T, B, width), np.float32)
    mask = np.zeros((T, B), np.float32)
    for b, (s, n) in enumerate(zip(seqs, lengths)):
        x[:n, b] = s
        mask[:n, b] = 1.0
    return x, mask
