"""Reading back what the trackers wrote, with each library's own reader where it has one."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files directly in ``folder``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def tensorboard_texts(folder: Path) -> dict[str, list[tuple[int, str]]]:
    """Every text summary in ``folder``: tag -> [(step, text)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    accumulator = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    accumulator.Reload()
    found: dict[str, list[tuple[int, str]]] = {}
    for tag in accumulator.Tags()["tensors"]:
        for event in accumulator.Tensors(tag):
            text = tensor_util.make_ndarray(event.tensor_proto).item()
            found.setdefault(tag, []).append((event.step, text.decode()))
    return found


def mlflow_runs(uri: str) -> list[dict[str, Any]]:
    """Every run in the store at ``uri``: its experiment, status, params and metric histories."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = []
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            histories = {
                key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
                for key in run.data.metrics
            }
            runs.append(
                {
                    "experiment": experiment.name,
                    "status": run.info.status,
                    "params": dict(run.data.params),
                    "metrics": histories,
                }
            )
    return runs


_BLOCK = 32768
_HEADER = 7  # checksum (4 bytes), length (2), type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file (W&B's LevelDB-style log of protobuf records)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records: list[bytes] = []
    partial = b""
    position = 7  # the file header: ":W&B", magic, version
    while position + _HEADER <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _HEADER:
            position += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + _HEADER])
        body = data[position + _HEADER : position + _HEADER + length]
        position += _HEADER + length
        if kind == _FULL:
            records.append(body)
        elif kind == _FIRST:
            partial = body
        elif kind == _MIDDLE:
            partial += body
        elif kind == _LAST:
            records.append(partial + body)
        else:
            break  # zero padding at the end of a block or file
    return records


def wandb_run(run_folder: Path) -> dict[str, Any]:
    """An offline W&B run folder read back: its config, history rows and exit code."""
    from wandb.proto import wandb_internal_pb2

    (log,) = run_folder.glob("*.wandb")
    result: dict[str, Any] = {"config": {}, "history": [], "exit_code": None, "project": None}
    for raw in _wandb_records(log):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            result["project"] = record.run.project
        elif kind == "config":
            for item in record.config.update:
                result["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {
                item.key or ".".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            result["history"].append(row)
        elif kind == "exit":
            result["exit_code"] = record.exit.exit_code
    return result


#: The libraries the tracker tests load in the test process.
_LIBRARIES = ("wandb", "mlflow", "tensorboard", "tensorboardX", "torch.utils.tensorboard")


def forget_tracker_libraries() -> None:
    """Unload the tracker libraries a test module loaded, so that the tests that check that
    nb_accel never imports them (``is_wandb_available``...) see them unloaded, whatever the
    order the suite runs in."""
    for name in list(sys.modules):
        if any(name == library or name.startswith(library + ".") for library in _LIBRARIES):
            del sys.modules[name]
