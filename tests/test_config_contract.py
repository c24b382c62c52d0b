"""The config contract, once for every config class of the package (issue 58): whatever
fields a class has now or gets later, each is checked from its own :func:`~rhnzoo.config.setting`
(``low`` / ``high`` / ``choices``, help, resume rule), with no per-field case to write.

Per class: the defaults make a valid config; every value below ``low``, not above
``gt``, above ``high`` or outside ``choices`` (and an empty string) is refused, on
construction and through the flag the script defines from the field, with one line naming
the flag; so is a value of another type than the field's annotation (an ``int`` field
refuses 2.5 and True, a ``float`` field True, a ``bool`` field 1, a ``str`` field 3, a
``tuple[int, ...]`` field a string item), on construction; an unknown key is
refused; the config survives ``config.json`` (strict JSON) unchanged; a ``config.json``
written before any one field existed resumes, the field at its default; another value
of a structural field is a conflict naming it and of a resumable one is none (the field's
rule, or its class's ``STRUCTURAL``); the flags are the fields but the
class's ``NOT_FLAGS``; every flag has its help and the config's default, and a
``choices`` string is an enum of exactly those. Rules between fields (``check()``) are
each task's own tests'.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pkgutil
import types
import typing

import pytest
from absl import flags

import rhnzoo
from rhnzoo import config as config_lib
from rhnzoo.apps import cli

for _module in ("rhnzoo.configs", "rhnzoo.tasks", "rhnzoo.analysis"):  # all loaded
    for _info in pkgutil.iter_modules(importlib.import_module(_module).__path__):
        importlib.import_module(f"{_module}.{_info.name}")


def _all_configs() -> list[type[config_lib.Config]]:
    found, todo = [], [config_lib.Config]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("rhnzoo.") and sub not in found:
                found.append(sub)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


CONFIGS = _all_configs()
# The task configs the scripts run: a refactor that drops one from the search fails here.
TASKS = {"LMConfig", "RRLConfig", "HighwayConfig", "JSBConfig", "TrialConfig", "AnalysisOptions"}


def _required(cls) -> dict:
    """Values for the fields without a default (e.g. ``epochs``): their ``low`` or 1."""
    return {
        f.name: config_lib.meta(f)["low"] or 1
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def _hint(cls, f):
    """A field's annotation without ``None`` (``int | None`` -> ``int``)."""
    hint = typing.get_type_hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _kind(cls, f) -> type:
    """A field's value type without ``None`` (``int | None`` -> ``int``)."""
    hint = _hint(cls, f)
    return typing.get_origin(hint) or hint


# Values of another type than the annotation's, each refused by a field of that type.
WRONG_TYPE = {
    int: (2.5, True, "3"),
    float: (True, "0.5"),
    bool: (1, "yes"),
    str: (3,),
    tuple: ("a,b",),
}
TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _bad_values(cls, f) -> list[tuple[object, str, bool]]:
    """(value, the start of its one-line error, whether a flag can carry it) for each
    bound the field declares and each type its annotation refuses."""
    m, kind, out = config_lib.meta(f), _kind(cls, f), []
    if m["choices"] is not None:
        bad = "no-such-choice" if kind is str else -12345
        out.append((bad, f"--{f.name} must be one of ", True))
    if kind in (int, float) and m["low"] is not None:
        low = kind(math.floor(m["low"]) - 1)
        out.append((low, f"--{f.name} must be >= {m['low']}, got ", True))
    if kind in (int, float) and m["gt"] is not None:
        out.append((kind(m["gt"]), f"--{f.name} must be > {m['gt']}, got ", True))
        out.append((kind(m["gt"]) - 1, f"--{f.name} must be > {m['gt']}, got ", True))
    if kind in (int, float) and m["high"] is not None:
        high = kind(math.ceil(m["high"]) + 1)
        out.append((high, f"--{f.name} must be <= {m['high']}, got ", True))
    if kind is str and m["choices"] is None:
        out.append((" ", f"--{f.name}", True))  # "must not be empty", or the field's own word
    for value in WRONG_TYPE.get(kind, ()):
        word = TYPE_WORDS.get(kind, "a list")
        out.append((value, f"--{f.name} must be {word}, got {value!r}", False))
    items = typing.get_args(_hint(cls, f))
    if kind is tuple and items and items[0] is int:
        out.append((("a",), f"--{f.name} must be integers, got ['a']", False))
    return out


def _other_value(cls, f, value):
    """Values other than ``value`` the field may take, most plausible first."""
    m, kind = config_lib.meta(f), _kind(cls, f)
    if m["choices"] is not None:
        return [c for c in m["choices"] if c != value]
    if kind is bool:
        return [not value]
    if kind in (int, float):
        base = value if value is not None else (m["low"] if m["low"] is not None else 1)
        step = kind(1) if kind is int else abs(base) * 0.5 + 0.25
        return [
            kind(v)
            for v in (base + step, base - step, (m["low"] or 0) + 2 * step)
            if v != value
            and (m["low"] is None or v >= m["low"])
            and (m["high"] is None or v <= m["high"])
        ]
    if kind is str:
        return ["elsewhere"]
    if kind is tuple:
        return [tuple(value or ()) * 2] if value else []
    return []


def _plain(cls):
    return cls(**_required(cls))


def test_the_search_finds_every_task_config():
    assert TASKS <= {c.__name__ for c in CONFIGS}, [c.__name__ for c in CONFIGS]


@pytest.fixture(params=CONFIGS, ids=lambda c: c.__name__)
def cls(request):
    return request.param


def test_out_of_range_values_are_one_line_errors_naming_the_flag(cls):
    """On construction, and as the script takes them: the flag defined from the field
    parses the value and the config built from the flags given refuses it."""
    base = _plain(cls)
    fv = flags.FlagValues()
    names = cli.define_config_flags(base, flag_values=fv)
    checked = 0
    for f in dataclasses.fields(cls):
        for value, message, as_flag in _bad_values(cls, f):
            with pytest.raises(ValueError) as e:
                cls(**{**_required(cls), f.name: value})
            assert str(e.value).startswith(message) and "\n" not in str(e.value), (f.name, e.value)
            choices = _kind(cls, f) is str and config_lib.meta(f)["choices"]
            if as_flag and f.name in names and not choices:
                fv.unparse_flags()
                fv(["prog", f"--{f.name}={value}"])
                given = {n: fv[n].value for n in names if fv[n].present}
                assert given == {f.name: value}
                with pytest.raises(ValueError, match=f"^{message}"):
                    cls(**{**_required(cls), **given})
            checked += 1
    bounded = [f for f in dataclasses.fields(cls) if _bad_values(cls, f)]
    assert checked >= len(bounded) and (checked or not bounded)
    with pytest.raises(ValueError, match=f"^unknown {cls.__name__} setting\\(s\\): no_such_field$"):
        cls.from_dict({"no_such_field": 1})


def test_the_round_trip_through_config_json(cls):
    config = _plain(cls)
    on_disk = json.loads(json.dumps(config_lib.strict(config.to_dict())))
    assert set(on_disk) == {f.name for f in dataclasses.fields(cls)}
    assert cls.from_dict(on_disk) == config
    assert config.conflicts(on_disk) == []


def test_a_config_json_that_is_no_object_is_one_line(cls):
    """Issue 73, item 1: a ``config.json`` of valid JSON that is no object (``[1, 2, 3]``)
    is one ValueError line in every task's ``from_dict`` (the LM's read ``.get`` of a
    list: AttributeError) and in ``conflicts``, not a traceback."""
    for value in ([1, 2, 3], "x", 3, None):
        with pytest.raises(ValueError, match=f"^{cls.__name__} is read from a JSON object"):
            cls.from_dict(value)
        assert _plain(cls).conflicts(value)[0].startswith("settings this version refuses")


def test_a_config_json_from_before_any_one_field_resumes_at_its_default(cls):
    config = _plain(cls)
    on_disk = json.loads(json.dumps(config_lib.strict(config.to_dict())))
    for name in set(on_disk) - set(_required(cls)):
        older = {k: v for k, v in on_disk.items() if k != name}
        assert config.conflicts(older) == [], name
        assert cls.from_dict({**_required(cls), **older}) == config, name


def test_a_structural_change_is_refused_and_a_resumable_one_is_not(cls):
    """For every field with another valid value (alone: some values need others, e.g.
    ``--hsg_init_bias`` needs ``--hsg``; those fields are each task's own tests')."""
    config = _plain(cls)
    on_disk = config_lib.strict(config.to_dict())
    tried = {True: 0, False: 0}
    for f in dataclasses.fields(cls):
        for other in _other_value(cls, f, getattr(config, f.name)):
            try:
                changed = config.replace(**{f.name: other})
            except ValueError:
                continue
            resumable = cls.resumable(f.name)
            conflicts = changed.conflicts(on_disk)
            # a field whose default follows this one (the LM's init_bias follows hsg)
            follow = [
                g.name
                for g in dataclasses.fields(cls)
                if g.name != f.name
                and not cls.resumable(g.name)
                and getattr(changed, g.name) != getattr(config, g.name)
            ]
            if resumable:
                assert conflicts == [] and not follow, f.name
            else:
                named = sorted(c.split("=")[0] for c in conflicts)
                assert named == sorted([f.name, *follow]), (f.name, conflicts)
            tried[resumable] += 1
            break
    fields = [cls.resumable(f.name) for f in dataclasses.fields(cls)]
    for resumable in (True, False):  # not vacuous: each kind the class has, tried
        assert tried[resumable] or resumable not in fields, tried


def test_every_flag_has_its_help_default_and_choices(cls):
    config = _plain(cls)
    fv = flags.FlagValues()
    names = cli.define_config_flags(config, flag_values=fv)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hidden = set().union(*(vars(c).get("NOT_FLAGS", ()) for c in cls.__mro__))
    assert hidden <= set(fields), hidden - set(fields)  # a name that is no field: a typo
    assert set(names) == set(fields) - hidden
    for name in set(names) - set(_required(cls)):  # a required field is no script's flag
        m = config_lib.meta(fields[name])
        assert m["help"] and fv[name].help.endswith(m["help"]), name  # an enum: "<a|b>: "
        assert fv[name].default == getattr(config, name), name
        if m["choices"] is not None and _kind(cls, fields[name]) is str:
            assert fv[name].parser.enum_values == list(m["choices"]), name


SCAN_CONFIGS = [c for c in CONFIGS if "scan_impl" in {f.name for f in dataclasses.fields(c)}]


@pytest.mark.parametrize("scan_cls", SCAN_CONFIGS, ids=lambda c: c.__name__)
def test_pallas_without_bfloat16_is_refused_on_construction(scan_cls):
    """Old: accepted, so ptb.py / rrl.py / jsb.py wrote their workdir before the kernels
    refused float32. Now one line naming the flags; with a --dtype, bfloat16 is taken."""
    fields = {f.name for f in dataclasses.fields(scan_cls)}
    assert {"LMConfig", "RRLConfig", "JSBConfig", "TrialConfig"} <= {
        c.__name__ for c in SCAN_CONFIGS
    }
    base = {**_required(scan_cls), **({"model": "rhn"} if "model" in fields else {})}
    with pytest.raises(ValueError) as e:
        scan_cls(**base, scan_impl="pallas")
    message = str(e.value)
    assert "\n" not in message and message.startswith("--scan_impl=pallas needs")
    assert "bfloat16" in message
    if "dtype" in fields:  # both settings: pallas with bfloat16 is a valid config
        assert scan_cls(**base, scan_impl="pallas", dtype="bfloat16").scan_impl == "pallas"
        with pytest.raises(ValueError, match="got --dtype=float32"):
            scan_cls(**base, scan_impl="pallas", dtype="float32")
    else:
        assert "has no --dtype" in message


def test_the_contract_can_fail():
    """The checks above fail on a field that breaks it: no help, a bound not enforced."""

    @dataclasses.dataclass(frozen=True)
    class Broken(config_lib.Config):
        width: int = dataclasses.field(default=3, metadata={"low": 1, "help": ""})

        def __post_init__(self):  # skips the base's checks
            pass

    with pytest.raises(pytest.fail.Exception):
        test_out_of_range_values_are_one_line_errors_naming_the_flag(Broken)
    with pytest.raises(AssertionError):
        test_every_flag_has_its_help_default_and_choices(Broken)
    assert rhnzoo  # the package searched is this checkout's
