"""absl flags and the main wrapper shared by every experiment in ``experiments/``: flags
generated from a config's fields (:func:`define_config_flags`, :func:`config_from_flags`),
the main wrapper (:func:`main`: signals, one ``error: ...`` line), flag parsing with one
line per error (:func:`run_app`), ``--distributed`` (:func:`initialize_distributed`), the
memory check before a run (:func:`check_fits`) and a run's ``learning_curves.png``
(:func:`write_learning_curves`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import socket
import sys
import time
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import flags, logging

from rhnzoo import config as config_lib
from rhnzoo import precision
from rhnzoo.config import RunSettings
from rhnzoo.data.common import DataError
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.engine import signals

FLAGS = flags.FLAGS


def _flag_type(hint: Any) -> Any:
    """The type of a field's annotation without ``None`` (``int | None`` -> ``int``)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return args[0]
    return typing.get_origin(hint) or hint


class _TupleParser(flags.ListParser):
    """A comma-separated list flag parsed to a tuple of ``item`` (``int``, ``float``, ``str``)."""

    def __init__(self, item: type):
        super().__init__()
        self.item = item

    def parse(self, argument):
        values = argument if isinstance(argument, tuple | list) else super().parse(argument)
        try:
            return tuple(self.item(v) for v in values)
        except ValueError:
            raise ValueError(
                f"expected comma-separated {self.item.__name__} values, got {argument!r}"
            ) from None


def _item_type(hint: Any) -> type:
    """The item type of a ``tuple[X, ...]`` annotation (``str`` if it names none)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args and typing.get_origin(args[0]) is tuple:
        args = typing.get_args(args[0])
    return args[0] if args and isinstance(args[0], type) else str


def define_config_flags(
    defaults: config_lib.Config,
    presets: Sequence[str] = (),
    *,
    module_name: str | None = None,
    flag_values: flags.FlagValues = FLAGS,
) -> tuple[str, ...]:
    """Defines one flag per field of ``defaults`` (a task's config) that its class offers
    (:meth:`~rhnzoo.config.Config.flags`: all but its ``NOT_FLAGS``) and the script has not
    defined itself: its name, its default from ``defaults``, its help and choices from the field's
    :func:`~rhnzoo.config.setting`; a tuple field is a comma-separated list of its items' type. With
    ``presets``, also ``--preset``. Call once, at import of the script.

    Args:
      defaults: the config whose values are the flags' defaults.
      presets: the names ``--preset`` takes (none: no ``--preset``).
      module_name: the module ``--help`` lists them under (default: this one).
      flag_values: where to define them (default: absl's global ``FLAGS``).

    Returns:
      The names of the flags defined from fields.
    """
    where = {"module_name": module_name, "flag_values": flag_values}
    if presets:
        flags.DEFINE_enum(
            "preset",
            None,
            list(presets),
            "Named setting overriding the defaults (flags given explicitly still win).",
            **where,
        )
    hints = typing.get_type_hints(type(defaults))
    names = []
    offered = set(type(defaults).flags())
    for f in dataclasses.fields(defaults):
        m = config_lib.meta(f)
        if f.name not in offered or f.name in flag_values:
            continue
        kind, default, help_ = _flag_type(hints[f.name]), getattr(defaults, f.name), m["help"]
        if m["choices"] is not None and kind is str:
            flags.DEFINE_enum(f.name, default, list(m["choices"]), help_, **where)
        elif kind is tuple:
            flags.DEFINE(
                _TupleParser(_item_type(hints[f.name])),
                f.name,
                default,
                help_,
                serializer=flags.CsvListSerializer(","),
                **where,
            )
        else:
            define = {
                bool: flags.DEFINE_boolean,
                int: flags.DEFINE_integer,
                float: flags.DEFINE_float,
                str: flags.DEFINE_string,
            }[kind]
            define(f.name, default, help_, **where)
        names.append(f.name)
    return tuple(names)


def given(names: Sequence[str]) -> dict[str, Any]:
    """``{name: value}`` of the flags of ``names`` given on the command line."""
    return {name: FLAGS[name].value for name in names if FLAGS[name].present}


def config_from_flags(
    get_config: Callable[..., config_lib.Config], names: Sequence[str], **fixed: Any
) -> config_lib.Config:
    """``get_config(preset, **fixed, **flags given)``: the config of ``--preset`` (when
    the script has one) with the flags of ``names`` given on the command line over it.
    Raises ValueError (one line) for a bad setting."""
    preset = FLAGS.preset if "preset" in FLAGS else None
    return get_config(preset, **fixed, **given(names))


def check_out(out: pathlib.Path, flag: str = "--out") -> None:
    """Refuses (ValueError, one line) an output directory that is a file or lies under
    one, before anything is written."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                what = "is" if path == out else f"lies under {path}, which is"
                raise ValueError(f"{flag}={out} {what} a file, not a directory")
            return


def initialize_distributed(cfg: config_lib.DistributedSettings, log=print) -> None:
    """``jax.distributed.initialize`` with the ``coordinator_address`` /
    ``num_processes`` / ``process_id`` of ``cfg`` that are set (the rest from the
    cluster runtime); nothing unless ``cfg.distributed``. It says first, in one line to
    ``log``, what it waits for; a process other than 0 first waits up to
    ``cfg.distributed_timeout`` seconds for the coordinator's port to answer, then JAX
    waits as long for every process to join (past that JAX ends the process itself). On
    CPU the cross-process collectives use gloo. Call before JAX touches a device.

    Raises:
      ValueError: the coordinator did not answer, or the initialisation failed (one line).
    """
    if not cfg.distributed:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    settings = {
        k: getattr(cfg, k)
        for k in ("coordinator_address", "num_processes", "process_id")
        if getattr(cfg, k) is not None
    }
    where = cfg.coordinator_address or "the cluster runtime's coordinator"
    log(
        f"--distributed: process {cfg.process_id if cfg.process_id is not None else '?'} "
        f"joining {cfg.num_processes or 'all'} processes at {where} (waiting up to "
        f"{cfg.distributed_timeout} s)"
    )
    sys.stdout.flush()
    if cfg.coordinator_address and cfg.process_id != 0:
        _wait_for_port(cfg.coordinator_address, cfg.distributed_timeout)
    try:
        jax.distributed.initialize(**settings, initialization_timeout=cfg.distributed_timeout)
    except (RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"--distributed: jax.distributed.initialize failed: {first}") from None


def note_interpreted_kernels(scan_impl: str) -> None:
    """``--scan_impl=pallas`` where JAX's backend is the CPU: one ``warning:`` line on
    stderr (process 0's) that the GPU kernels run in Pallas's interpret mode, the
    kernels' test path, orders of magnitude slower than ``fused``. Call after
    :func:`initialize_distributed` (it asks JAX for its backend)."""
    if scan_impl != "pallas" or jax.default_backend() != "cpu" or jax.process_index() != 0:
        return
    print(
        "warning: --scan_impl=pallas on a CPU runs the GPU kernels in Pallas's interpret "
        "mode, the kernels' test path: orders of magnitude slower than --scan_impl=fused "
        "or reference (meant for a GPU)",
        file=sys.stderr,
        flush=True,
    )


def _wait_for_port(address: str, timeout: float) -> None:
    """Returns once ``host:port`` accepts a TCP connection; raises ValueError (one line)
    after ``timeout`` seconds without one."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except (OSError, ValueError) as e:
            if time.monotonic() >= deadline or isinstance(e, ValueError):
                raise ValueError(
                    f"--distributed: no coordinator answered at {address} within "
                    f"{timeout:g} s; start process 0 first or check "
                    "--coordinator_address"
                ) from None
        time.sleep(0.5)


def device_memory(device: jax.Device | None = None) -> tuple[int, str]:
    """``(bytes, where)``: the memory of ``device`` (default: the first local one) as its
    allocator reports it (``memory_stats()['bytes_limit']``: GPU, TPU), else the host's
    physical memory (``os.sysconf``: a CPU device, which shares it)."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} {device.id}"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host (physical memory)"


def check_fits(state: Callable[[], Any], sizes: str) -> int:
    """Refuses a model whose training state cannot fit one device; returns the state's
    bytes. ``state()`` (e.g. the parameters and optimizer state at initialisation,
    replicated on every device) is traced abstractly (:func:`jax.eval_shape`: nothing
    allocated) and its bytes compared with :func:`device_memory`. The state is a lower
    bound of what training holds (no gradients, activations or compiled programs), so a
    refused run could not have run; one that passes may still run out.

    Raises:
      ValueError: (one line, naming ``sizes``, the settings that size it, e.g.
        ``'--hidden_size=100000, --depth=10'``, and both sizes in GiB) the state alone
        exceeds the memory.
    """
    shapes = jax.eval_shape(state)
    need = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(shapes))
    have, where = device_memory()
    if need > have:
        raise ValueError(
            f"{sizes}: the parameters and optimizer state alone take "
            f"{need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB of "
            f"memory of the {where}"
        )
    return need


class _PrecisionParser(flags.ArgumentParser):
    """Parses a matmul precision to its level (``float32`` -> ``highest``)."""

    def parse(self, argument):
        return precision.normalize(argument)

    def flag_type(self):
        return "string"


def write_learning_curves(
    workdir: str | os.PathLike,
    valid: str,
    train: str | None = None,
    *,
    log: Callable[[str], None] = print,
) -> pathlib.Path | None:
    """A finished single run's figure: ``<workdir>/learning_curves.png``: its epoch
    records' (``metrics.jsonl``) ``valid`` field (e.g. ``'valid_ppl'``) and its ``train``
    field (e.g. ``'train_ppl'``) from the training-log records (every ``log_every``
    steps: a short run's curve has more than its one epoch's point), else from the epoch
    records, against the step count, log-scale y
    (:func:`rhnzoo.analysis.plots.plot_learning_curves`); then ``wrote <path>`` to ``log``.

    Returns:
      The PNG's path (not drawn again when it is newer than ``metrics.jsonl``); None,
      with nothing written, on a process other than 0 or for a workdir without epoch
      records.
    """
    workdir = pathlib.Path(workdir)
    png, metrics = workdir / "learning_curves.png", workdir / "metrics.jsonl"
    if png.is_file() and metrics.is_file() and png.stat().st_mtime >= metrics.stat().st_mtime:
        return png  # drawn after the last record (an already finished run: nothing written)
    records = workdir_lib.read_metrics(workdir) if jax.process_index() == 0 else []
    if not records:
        return None
    from rhnzoo.analysis import plots  # matplotlib only when plotting

    metric = valid.split("_", 1)[-1]  # the y axis: 'ppl', 'bpc', 'acc'
    logged = [r for r in workdir_lib.read_metrics(workdir, "train") if train and train in r]
    sources = (("validation", valid, records), ("training", train, logged or records))
    curves = {
        label: [{"step": r["step"], metric: r.get(key)} for r in rows]
        for label, key, rows in sources
        if key
    }
    path = plots.plot_learning_curves(
        curves,
        png,
        key=metric,
        x="step",
        title=f"Learning curves: {workdir.resolve().name}",
        style={label: {"marker": "o"} for label in curves},
    )
    log(f"wrote {path}")
    return path


def define_precision_flag() -> None:
    """``--matmul_precision`` (:mod:`rhnzoo.precision`), once per process, for a script
    without a config (the benchmarks, the analyses). Its default is JAX's setting
    when the flag is defined: ``$JAX_DEFAULT_MATMUL_PRECISION``, else ``default``."""
    if "matmul_precision" in FLAGS:
        return
    field = {f.name: f for f in dataclasses.fields(RunSettings)}["matmul_precision"]
    flags.DEFINE(
        _PrecisionParser(), "matmul_precision", precision.current(), config_lib.meta(field)["help"]
    )


def parse_flags(argv: Sequence[str], positional: bool = False) -> list[str]:
    """Parses a script's command line ``argv`` (``argv[0]`` the program) into the flags
    defined on absl's ``FLAGS``, as :func:`run_app` does before the script's ``main``.

    Returns:
      ``argv[0]`` and, with ``positional``, the positional arguments after it.

    Raises:
      SystemExit: with one ``error: ...`` line (exit status 1) for an unknown flag or
        enum value, a malformed number, a non-finite float (no float flag means
        anything at NaN or inf), or positional arguments unless ``positional``.
    """
    try:
        argv = FLAGS(list(argv))
    except flags.Error as e:
        sys.exit(f"error: {' '.join(str(e).split())}")
    if len(argv) > 1 and not positional:
        sys.exit(f"error: unexpected arguments {' '.join(argv[1:])}")
    for name in FLAGS:
        flag = FLAGS[name]
        if (
            isinstance(flag.parser, flags.FloatParser)
            and flag.value is not None
            and not math.isfinite(flag.value)
        ):
            sys.exit(f"error: --{flag.name} must be a finite number, got {flag.value}")
    return argv


def run_app(main_fn: Callable[[list[str]], Any], positional: bool = False) -> None:
    """``absl.app.run(main_fn)`` whose flag errors are one ``error: ...`` line and exit
    status 1, like every other error (:func:`parse_flags`); so are positional arguments
    unless ``positional`` (then ``main_fn`` gets them in ``argv[1:]``)."""
    from absl import app

    app.run(main_fn, flags_parser=lambda argv: parse_flags(argv, positional))


def main(fn: Callable[[], Any]) -> Any:
    """Runs an experiment's body with the shared error, signal and logging handling:
    signals caught first, orbax logging quiet, one ``error: ...`` line (exit 1) for any
    error a user can cause (``RHNZOO_TRACEBACK=1``: the traceback instead), exit 128 + N
    after signal N (the state saved)."""
    signals.catch_signals()
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    try:
        return fn()
    except (ValueError, DataError, workdir_lib.RunError) as e:
        if os.environ.get("RHNZOO_TRACEBACK"):
            raise
        sys.exit(f"error: {' '.join(str(e).split())}")
    except signals.Interrupted as e:
        sys.exit(128 + e.signum)
