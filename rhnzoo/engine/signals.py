"""SIGTERM / SIGINT for the run engine: a signal asks the run to stop, a second one exits.

:func:`catch_signals` is the first thing every experiment does (``rhnzoo.apps.cli.main``),
so a signal during start-up is remembered and honoured as soon as the engine can save;
:func:`track` checks for one between the items of a long evaluation; the engine raises
:class:`Interrupted` after saving.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator

from tqdm import tqdm


class Interrupted(Exception):
    """The run stopped on a signal after saving its state; ``signum`` says which."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"stopped by signal {signum}")
        self.signum = signum


_signals = {"received": None, "installed": False, "previous": {}}


def _on_signal(signum, frame):
    del frame
    if _signals["received"] is not None:  # a second signal: leave now, without saving
        print(f"second signal {signum}: exiting without saving", file=sys.stderr, flush=True)
        os._exit(128 + signum)
    _signals["received"] = signum


def catch_signals() -> None:
    """Installs the SIGTERM/SIGINT handlers that ask the run to stop (idempotent; only the
    main thread can install handlers, elsewhere this does nothing)."""
    if _signals["installed"] or not _is_main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        _signals["previous"][signum] = signal.signal(signum, _on_signal)
    _signals["installed"] = True


def release_signals() -> None:
    """Restores the handlers that were there before :func:`catch_signals`; clears a
    received signal."""
    if _signals["installed"]:
        for signum, handler in _signals["previous"].items():
            signal.signal(signum, handler)
    _signals.update(received=None, installed=False, previous={})


def stop_requested() -> int | None:
    """The signal number received since :func:`catch_signals`, or None."""
    return _signals["received"]


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def track(
    iterable: Iterable, *, total: int | None = None, desc: str = "", progress: bool = True
) -> Iterator:
    """Iterates with a tqdm bar (ETA) when ``progress``, checking for SIGTERM/SIGINT
    before every item.

    Raises:
      Interrupted: when a signal was received; the caller's work since the last item
        is abandoned.
    """
    bar = tqdm(
        iterable, total=total, desc=desc, disable=not progress, leave=False, dynamic_ncols=True
    )
    try:
        for item in bar:
            if stop_requested() is not None:
                raise Interrupted(stop_requested())
            yield item
    finally:
        bar.close()


Track = Callable[..., Iterator]


def installed() -> bool:
    """Whether :func:`catch_signals` has installed the handlers."""
    return _signals["installed"]
