"""Our weight files against huggingface_hub's ``save_torch_state_dict`` (whose split Accelerate's
``save_model`` uses): the same state dict and shard size give the same files, the same index
and the same tensors; and where the two differ on purpose, a save that fails part way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from huggingface_hub import save_torch_state_dict
from torch import nn

from nb_accel.runtime.checkpoint import model_files
from nb_accel.runtime.checkpoint.model_io import load_checkpoint_in_model, save_model_files

pytestmark = pytest.mark.timeout(60)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 40), nn.BatchNorm1d(40))
        self.decoder = nn.Sequential(nn.Linear(40, 4), nn.ReLU(), nn.Linear(4, 4))
        self.register_buffer("scale", torch.ones(4))


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.body = nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight


def _state(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    if kind == "net":
        return dict(Net().state_dict())
    if kind == "tied":
        return dict(TiedLM().state_dict())
    # a tensor above the limit between two small ones
    return {"small1": torch.randn(10), "big": torch.randn(1000), "small2": torch.randn(10)}


def _read(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return safetensors.torch.load_file(path)
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _index(folder: Path) -> dict[str, object] | None:
    found = list(folder.glob("*.index.json"))
    return json.loads(found[0].read_text()) if found else None


@pytest.mark.parametrize(
    ("kind", "max_shard_size", "safe", "sharded"),
    [
        ("net", 1000, True, True),
        ("net", "10GB", True, False),
        ("net", 600, False, True),
        ("big", "1KB", True, True),
        ("big", "1KB", False, True),
        ("tied", 200, True, True),
        ("tied", 200, False, True),
        ("tied", "10GB", True, False),
    ],
)
def test_the_same_files_index_and_tensors_as_huggingface_hub(
    tmp_path: Path, kind: str, max_shard_size: int | str, safe: bool, sharded: bool
) -> None:
    ours, hub = tmp_path / "ours", tmp_path / "hub"
    hub.mkdir()
    save_model_files(_state(kind), ours, max_shard_size=max_shard_size, safe_serialization=safe)
    save_torch_state_dict(_state(kind), hub, max_shard_size=max_shard_size, safe_serialization=safe)

    names = sorted(p.name for p in hub.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    index = _index(hub)
    if sharded:
        assert index is not None and len(names) > 2
    else:
        assert index is None and len(names) == 1
    if index is not None:
        our_index = _index(ours)
        assert our_index is not None
        assert our_index["weight_map"] == index["weight_map"]
        assert our_index["metadata"]["total_size"] == index["metadata"]["total_size"]  # type: ignore[index]
    for name in names:
        if name.endswith(".index.json"):
            continue
        mine, theirs = _read(ours / name), _read(hub / name)
        assert sorted(mine) == sorted(theirs), name
        for key, tensor in theirs.items():
            assert torch.equal(mine[key], tensor), (name, key)


def test_tied_weights_load_back_tied_from_our_files_where_the_hub_drops_them(
    tmp_path: Path,
) -> None:
    """Both store the shared memory once; our files record the dropped name, so loading
    restores it under its own name."""
    state = _state("tied")
    save_model_files(state, tmp_path / "ours", max_shard_size=200)
    fresh = TiedLM()
    load_checkpoint_in_model(fresh, tmp_path / "ours", strict=True)
    assert torch.equal(fresh.head.weight, state["embed.weight"])
    index = _index(tmp_path / "ours")
    assert index is not None
    assert index["metadata"]["aliases"] == {"head.weight": "embed.weight"}  # type: ignore[index]


class _FullDisk:
    """A ``save_file`` that writes the first ``allowed`` files, then half a file and fails."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.real = safetensors.torch.save_file

    def __call__(self, tensors: dict[str, torch.Tensor], filename: str, **kwargs: object) -> None:
        if self.allowed == 0:
            Path(filename).write_bytes(b"half a shard")
            raise OSError("disk full")
        self.allowed -= 1
        self.real(tensors, filename, **kwargs)  # type: ignore[arg-type]


def test_a_save_failing_part_way_leaves_our_previous_save_whole_not_the_hubs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the writing stays ours: huggingface_hub removes the previous save's files, then
    writes in place; a failure on the second shard leaves a checkpoint that cannot be loaded.
    Ours writes every file aside first, so the previous save is still there, whole."""
    before, after = _state("net", seed=1), _state("net", seed=2)
    ours, hub = tmp_path / "ours", tmp_path / "hub"
    hub.mkdir()
    save_model_files(before, ours, max_shard_size=1000)
    save_torch_state_dict(before, hub, max_shard_size=1000)
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in hub.iterdir())
    saved = {p.name: p.read_bytes() for p in ours.iterdir()}

    monkeypatch.setattr(safetensors.torch, "save_file", _FullDisk(allowed=1))
    monkeypatch.setattr(model_files, "save_file", _FullDisk(allowed=1))
    with pytest.raises(OSError, match="disk full"):
        save_torch_state_dict(after, hub, max_shard_size=1000)
    with pytest.raises(OSError, match="disk full"):
        save_model_files(after, ours, max_shard_size=1000)
    monkeypatch.undo()

    assert {p.name: p.read_bytes() for p in ours.iterdir()} == saved  # nothing else, unchanged
    fresh = Net()
    load_checkpoint_in_model(fresh, ours, strict=True)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, before[name]), name

    assert not (hub / "model.safetensors.index.json").exists()  # the previous index is gone
    with pytest.raises((FileNotFoundError, ValueError)):
        load_checkpoint_in_model(Net(), hub, strict=True)
