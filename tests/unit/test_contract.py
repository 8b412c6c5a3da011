"""The gateway–shard contract holds by construction: every command constructor of every dialect
names the fields its handler takes, every shard kind is built from components whose operations
do not collide, and the core (``router/``) imports no dialect."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from actors.baqend import contract as baqend
from actors.cashu import contract as cashu
from actors.mx import contract as mx
from actors.nolag import contract as nolag
from actors.shard import Component, Shard
from actors.signal import contract as signal
from gateways.dialects import DIALECTS, shard_components, shard_kinds
from router import contract as core
from router.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = [core, signal, cashu, mx, nolag, baqend]


def _constructors(module) -> dict[str, inspect.Signature]:
    """op -> the signature of the function in ``module`` that builds that command."""
    ops = {value for name, value in vars(module.Op).items() if not name.startswith("_")}
    found = {}
    for name, function in vars(module).items():
        if not inspect.isfunction(function) or function.__module__ != module.__name__:
            continue
        try:
            command = function(*[object()] * len(inspect.signature(function).parameters))
        except Exception:
            continue
        if isinstance(command, tuple) and command and command[0] in ops:
            found[command[0]] = inspect.signature(function)
    return found


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    settings = load_settings(data_dir=tmp_path_factory.mktemp("contract"), metrics={"enabled": False})
    return {kind: Shard(kind, 0, settings, components) for kind, components in shard_components(settings).items()}


def test_every_operation_has_one_constructor_and_one_handler_with_the_same_fields(shards):
    handlers = {}
    for shard in shards.values():
        for op, handler in shard._ops.items():
            handlers.setdefault(op, inspect.signature(handler))
    for module in CONTRACTS:
        ops = {value for name, value in vars(module.Op).items() if not name.startswith("_")}
        constructors = _constructors(module)
        assert set(constructors) == ops, f"{module.__name__}: operations without a constructor"
        for op, signature in constructors.items():
            assert op in handlers, f"{op} has no handler in any shard"
            fields = list(signature.parameters)
            # after gateway_id; Ray adds a tracing parameter to the methods of an actor class
            handler_fields = [name for name in list(handlers[op].parameters)[1:] if not name.startswith("_ray")]
            assert len(fields) == len(handler_fields), (op, fields, handler_fields)


def test_operations_are_namespaced_per_dialect():
    for module in CONTRACTS:
        prefix = "core." if module is core else module.__name__.split(".")[1] + "."
        for name, value in vars(module.Op).items():
            if not name.startswith("_"):
                assert value.startswith(prefix), (module.__name__, name, value)


def test_shard_kinds_come_from_the_dialect_table_in_order():
    settings = load_settings()
    assert shard_kinds(settings) == ("session", "topic", "registry", "document", "query")
    topic = [component.__name__ for component in shard_components(settings)["topic"]]
    assert topic == ["PubSub", "CashuRetained", "MxFilters", "NolagTopics"]
    # A dialect's own kind starts only with the dialect; the core's always do.
    assert shard_kinds(load_settings(signal={"enabled": False}, baqend={"enabled": False})) == ("session", "topic")
    assert [spec.name for spec in DIALECTS] == ["signal", "cashu", "mx", "nolag", "baqend"]


def test_each_rows_declared_parts_match_what_its_packages_hold():
    """A row's shard kinds (which the settings count without importing shards) are the kinds its
    components use beyond the core's; `cli` is set exactly when it has a CLI module."""
    for spec in DIALECTS:
        assert set(spec.components()) - {"session", "topic"} == set(spec.kinds), spec.name
        assert spec.cli == (ROOT / "gateways" / spec.name / "cli.py").exists(), spec.name
        assert callable(importlib.import_module(f"gateways.{spec.name}.session").endpoints), spec.name


def test_the_base_calls_every_components_purge_hooks(tmp_path):
    calls = []

    class Recorder(Component):
        name = "recorder"

        def purge_connection(self, location):
            calls.append(("connection", self.label, location))

        def purge_gateway(self, gateway_id):
            calls.append(("gateway", self.label, gateway_id))
            return 1

    class First(Recorder):
        label = "first"

    class Second(Recorder):
        label = "second"

    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    shard = Shard("topic", 0, settings, (First, Second))
    results, _ = shard.handle("g", [core.purge(7)])
    assert results == [True]
    assert shard.purge_gateway("g") == 1
    assert calls == [("connection", "first", ("g", 7)), ("connection", "second", ("g", 7)),
                     ("gateway", "first", "g"), ("gateway", "second", "g")]


def test_an_operation_declared_twice_is_refused(tmp_path):
    class Twice(Component):
        def operations(self):
            return {core.Op.PUBLISH: lambda gateway_id: None}

    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    from actors.pubsub import PubSub

    with pytest.raises(ValueError, match="declared twice"):
        Shard("topic", 0, settings, (PubSub, Twice))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_core_imports_no_dialect():
    """``router/`` is the core; only its composition root (runtime, CLI, settings, bench) starts
    dialects, and it reaches them through the dialect table, the gateway and the shard base. A
    benchmark's client of one dialect (``router/bench/dialects/<name>.py``) may use that dialect's
    own codecs and stores, and no other dialect's."""
    composition_root = {"router/runtime.py", "router/cli.py", "router/settings.py", "router/bench/systems.py"}
    allowed_in_root = {"gateways.dialects", "gateways.gateway", "actors.shard"}
    for path in sorted((ROOT / "router").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        outside = {name for name in _imports(path) if name.split(".")[0] in ("actors", "gateways")}
        if relative in composition_root:
            assert outside <= allowed_in_root, (relative, outside - allowed_in_root)
        elif relative.startswith("router/bench/dialects/"):
            own = path.stem
            assert all(name.split(".")[1:2] == [own] for name in outside), (relative, outside)
        else:
            assert not outside, (relative, outside)
