"""The harvest (issues 47, 57, 68, 70): the papers' tables at their own sizes, filled window
by window in a GPU's short device calls, and chunk by chunk on this CPU in the background.

A window is one row of the queue (``docs/runs/harvest_queue.tsv``: each chunk's
composition and size as columns, :mod:`tools.harvest.chunks`): one device command that
runs in at most 9 minutes from a fresh checkout where rhnzoo is importable only through
``PYTHONPATH`` and the image lacks gensim, tensorflow-datasets, tensorboardX and a
network. What it reads travels in ``.harvest/`` (an ignored folder, carried beside the
working tree); it trains outside ``$OUT`` (in ``.harvest/work/``) and leaves in ``$OUT``
at most three files: ``<window>.tar.gz`` (the run records: ``config.json``,
``metrics.jsonl``, ``results.json``, the logs; ``harvest.json``, ``log.txt``),
``<window>.partial.tar.gz`` (a window cut at its deadline: its whole work folder with the
checkpoints, where that fits) and ``summary.json``. From the repository root::

  python -m tools.harvest list                     # the queue
  python -m tools.harvest next                     # the next GPU window and its exact call
  python -m tools.harvest prepare [WINDOW] [--smoke] [--cpu]  # here: .harvest/, the call
  PYTHONPATH=$PWD python -m tools.harvest run [WINDOW] [--smoke]  # the device
  python -m tools.harvest record [--smoke] OUT_DIR  # here: the records, the queue, the table
  python -m tools.harvest table TABLE              # the table of what is recorded

The modules follow the verbs: :mod:`~tools.harvest.chunks` (the queue),
:mod:`~tools.harvest.stage`, :mod:`~tools.harvest.device`, :mod:`~tools.harvest.records`,
:mod:`~tools.harvest.windows` (``next``), ``__main__`` (the command line). A GPU window's
records go to ``docs/runs/gpu/harvest/<table>/``, a CPU chunk's to
``docs/runs/cpu/harvest/<table>/`` (so none reads as a GPU window); a ``--smoke`` archive
only to ``--records`` (default ``runs/harvest_smoke/``), never into a paper table or the
queue. Sizes and evidence: docs/runs/gpu/README.md.
"""

from tools.harvest.chunks import (
    CHUNKS,
    CPU_LIMIT_S,
    DEADLINE_S,
    QUEUE,
    QUEUE_HEADER,
    RECORDS,
    Chunk,
    HarvestError,
    check_size,
    chunk_of,
    limit_s,
    next_pending,
    read_chunks,
    read_queue,
    records_dir,
    write_queue,
)
from tools.harvest.device import check_out, experiment_command, run
from tools.harvest.records import record, table
from tools.harvest.stage import (
    COMMAND_LIMIT,
    TRAVEL_LIMIT,
    device_command,
    prepare,
    travelling_bytes,
)
from tools.harvest.windows import KERNEL_CALL, next_window

__all__ = [
    "CHUNKS",
    "COMMAND_LIMIT",
    "CPU_LIMIT_S",
    "DEADLINE_S",
    "KERNEL_CALL",
    "QUEUE",
    "QUEUE_HEADER",
    "RECORDS",
    "TRAVEL_LIMIT",
    "Chunk",
    "HarvestError",
    "check_out",
    "check_size",
    "chunk_of",
    "device_command",
    "experiment_command",
    "limit_s",
    "next_pending",
    "next_window",
    "prepare",
    "read_chunks",
    "read_queue",
    "record",
    "records_dir",
    "run",
    "table",
    "travelling_bytes",
    "write_queue",
]
