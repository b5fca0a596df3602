"""One catalogue of the messages between processes (``nb_accel._messages``): every message a
module sends on a channel is a class of the catalogue, every class of a channel's module is a
message of that channel, and each comes back whole through its channel's encoding."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import multiprocessing
import types
from pathlib import Path
from typing import Any, get_args

import pytest

import nb_accel
from nb_accel._messages import commands, events, hosts, nodes
from nb_accel.launch.hosts.protocol import receive, send
from nb_accel.launch.placement.nodes import NodePlan
from nb_accel.launch.plan import LaunchPlan

PACKAGE = Path(nb_accel.__file__).parent
CATALOGUE = PACKAGE / "_messages"
CATALOGUE_NAME = "nb_accel._messages"
#: What puts a message on a channel: a worker's event channel (``channel.send``), the
#: encodings of the catalogue, a host's channel (``protocol.send``, ``NodeChannel.tell``).
CHANNEL_CALLS = {"encode", "encode_command", "send", "tell"}

FAILURE = events.Failure(0, "ValueError", "bad", "Traceback ...", None, collective="all_reduce #3")
BAR = events.BarState(0, 0, "train", 3, 10, "it", 1.5, 2.0, "loss=0.1")
PLAN = LaunchPlan(2, "cpu", "gloo", "fork", "no", 60.0)
VERSIONS = hosts.Versions("3.12", "2.8.0", "0.1.0")

#: One message of each class of the catalogue, as a channel would carry it.
SAMPLES: dict[type, Any] = {
    events.Started: events.Started(1, 4242, attempt=2),
    events.Output: events.Output(1, "stderr", "warning\n", debugger=True),
    events.Result: events.Result(0, b"\x80\x05K\x07."),
    events.Failure: FAILURE,
    events.BarState: BAR,
    events.Report: events.Report(0, (BAR,), ((3, {"loss": 0.1}),), 12.5, ("mlflow: ./mlruns",)),
    events.CellDone: events.CellDone(1, 7, value_repr="<lock>", failure=FAILURE),
    events.TrackerRun: events.TrackerRun(0, "mlflow", "run-1", "file:///tmp/mlruns", open=False),
    events.Prompt: events.Prompt(1, "(Pdb) ", debugger=True, where=("/src/train.py", 9, "train")),
    commands.Execute: commands.Execute(3, "x + 1", want_value=True, name="In[3]", value_ranks=(0,)),
    commands.Push: commands.Push(4, b"pushed"),
    commands.Pull: commands.Pull(5, "x"),
    commands.Interrupt: commands.Interrupt(6),
    commands.Call: commands.Call(7, b"call", {"A": "1"}, ("B",), ("/src",), "/work", b"rng"),
    commands.Debug: commands.Debug(8, failed_cell=6),
    commands.Answer: commands.Answer(None),
    commands.Stop: commands.Stop(),
    commands.Settle: commands.Settle(9, timeout_s=30.0),
    commands.Release: commands.Release(6),
    hosts.Versions: VERSIONS,
    hosts.Hello: hosts.Hello("gpu1", VERSIONS, 29500, "/usr/bin/python3"),
    hosts.NodeJob: hosts.NodeJob(PLAN, NodePlan(num_nodes=2, node_rank=1), b"call", {"A": "1"}),
    hosts.StopNode: hosts.StopNode(),
    hosts.Alive: hosts.Alive(),
    hosts.Forwarded: hosts.Forwarded(3, events.encode(events.Started(1, 4242))),
    hosts.AgentRestarting: hosts.AgentRestarting(1, [(0, 4242, -9)]),
    hosts.AgentEnded: hosts.AgentEnded([(1, 4243, 1)], "RendezvousError: lost", True, ("ended",)),
    hosts.ToWorker: hosts.ToWorker(3, commands.encode_command(commands.Stop())),
    hosts.SignalWorker: hosts.SignalWorker(3, 2),
    hosts.PromptState: hosts.PromptState(is_open=True),
    hosts.AskWorkers: hosts.AskWorkers(11, "where+collectives", {0: 3, 1: 4}),
    hosts.WorkersAnswer: hosts.WorkersAnswer(11, {0: 512.0, 1: None}),
    nodes.NodeCard: nodes.NodeCard(1, "10.0.0.2", "gpu1", "ipv4", "gpu0:29500"),
}


def _classes(module: types.ModuleType) -> list[type]:
    return [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if obj.__module__ == module.__name__
    ]


CATALOGUED = [cls for m in (events, commands, hosts, nodes) for cls in _classes(m)]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_from(path: Path, tree: ast.Module) -> dict[str, str]:
    """The names ``path`` imports, each with the module it imports it from."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*base, node.module or ""]) if node.level else node.module or ""
            found.update({alias.asname or alias.name: source.rstrip(".") for alias in node.names})
    return found


def _sent_messages() -> list[tuple[str, str, str]]:
    """``(module, class, where it comes from)`` for each message made right in a call that
    puts it on a channel (``channel.send(Started(...))``, ``encode_command(Stop())``)."""
    sent = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if CATALOGUE in path.parents:
            continue
        tree = ast.parse(path.read_text())
        imported = _imported_from(path, tree)
        own = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name not in CHANNEL_CALLS:
                continue
            for arg in node.args:
                if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):
                    made = arg.func.id
                    if made[:1].isupper():
                        where = "this module" if made in own else imported.get(made, "?")
                        sent.append((_module_name(path), made, where))
    return sent


def test_every_message_a_module_sends_is_a_class_of_the_catalogue() -> None:
    sent = _sent_messages()
    outside = [f"{m} sends {c} from {w}" for m, c, w in sent if not w.startswith(CATALOGUE_NAME)]
    assert not outside, "messages defined outside the catalogue: " + "; ".join(outside)
    # the scan sees the senders of every channel (it would pass on finding nothing)
    seen = {made for _, made, _ in sent}
    assert seen >= {"Started", "Prompt", "Stop", "Answer", "Forwarded", "NodeJob"}


def test_the_hosts_transport_defines_no_message() -> None:
    """``launch/hosts/protocol.py`` frames the host's channel; what travels on it is the
    catalogue's."""
    tree = ast.parse((PACKAGE / "launch" / "hosts" / "protocol.py").read_text())
    assert [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)] == []


def test_each_channel_module_holds_its_channels_messages_only() -> None:
    """A class of a channel's module is one of the messages its decoding takes (or travels
    inside one: a Report's bars, a Hello's versions)."""
    assert set(_classes(events)) == {*get_args(events.Event), events.BarState}
    assert set(_classes(commands)) == set(get_args(commands.KernelMessage))
    to_node, from_node = set(get_args(hosts.ToNode)), set(get_args(hosts.FromNode))
    assert not to_node & from_node
    assert set(_classes(hosts)) == to_node | from_node | {hosts.Hello, hosts.Versions}
    assert all(dataclasses.is_dataclass(cls) for cls in CATALOGUED)


@pytest.mark.parametrize("cls", CATALOGUED, ids=lambda cls: cls.__name__)
def test_each_message_round_trips_through_its_channel(cls: type) -> None:
    assert cls in SAMPLES, f"add a sample of {cls.__name__} to SAMPLES"
    message = SAMPLES[cls]
    if cls.__module__ == events.__name__:
        wrapped = message if cls is not events.BarState else SAMPLES[events.Report]
        assert events.decode(events.encode(wrapped)) == wrapped
    elif cls.__module__ == commands.__name__:
        assert commands.decode_command(commands.encode_command(message)) == message
    elif cls.__module__ == nodes.__name__:
        assert nodes.NodeCard.decode(message.encode()) == message
    else:
        assert _over_a_host_channel(message) == message


def _over_a_host_channel(message: Any) -> Any:
    """``message`` sent and read back over a pipe, as a node's channel carries it (a hello,
    and the versions in it, as plain data)."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        if isinstance(message, (hosts.Hello, hosts.Versions)):
            hello = message if isinstance(message, hosts.Hello) else SAMPLES[hosts.Hello]
            send(writer, hello.as_dict())
            back = hosts.Hello.from_dict(receive(reader))
            return back if isinstance(message, hosts.Hello) else back.versions
        send(writer, message)
        return receive(reader)
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("cls", _classes(events), ids=lambda cls: cls.__name__)
def test_a_worker_refuses_an_event_as_a_command(cls: type) -> None:
    with pytest.raises(TypeError, match="unexpected message from the kernel"):
        commands.decode_command(events.encode(SAMPLES[cls]))


@pytest.mark.parametrize("cls", _classes(commands), ids=lambda cls: cls.__name__)
def test_the_kernel_refuses_a_command_as_an_event(cls: type) -> None:
    with pytest.raises(TypeError, match="unexpected message on the event channel"):
        events.decode(commands.encode_command(SAMPLES[cls]))
