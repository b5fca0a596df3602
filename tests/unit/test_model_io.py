"""Model weight files: writing (single, sharded, tied, crash-safe) and loading them into models."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from nb_accel.runtime.checkpoint import model_files
from nb_accel.runtime.checkpoint.model_io import (
    load_checkpoint_in_model,
    load_state_dict_file,
    parse_size,
    save_model_files,
)

#: Calls made by unpickling a payload: a refused load must leave this empty.
UNPICKLED: list[str] = []


def _record(text: str) -> str:
    UNPICKLED.append(text)
    return text


class Payload:
    """Unpickling this calls ``_record``: loading it with plain pickle would run code."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_record, ("payload ran",))


class Net(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, hidden), nn.BatchNorm1d(hidden))
        self.decoder = nn.Sequential(nn.Linear(hidden, 4), nn.ReLU(), nn.Linear(4, 4))
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x)) * self.scale


class TiedLM(nn.Module):
    """The head's weight is the embedding's Parameter (tied by construction)."""

    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.body = nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        if tie:
            self.head.weight = self.embed.weight


def _randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every parameter and buffer fresh values, so a fresh model differs from it."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=generator))
            else:
                tensor.copy_(torch.randint(1, 100, tensor.shape, generator=generator))
    return model


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    left, right = a.state_dict(), b.state_dict()
    assert list(left) == list(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert torch.equal(left[name], right[name]), name


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _stored_keys(path: Path) -> list[str]:
    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())


def _header_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as handle:
        return handle.metadata() or {}


# ---------------------------------------------------------------------------------------------
# parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10GB", 10 * 10**9),
        ("500MB", 500 * 10**6),
        ("5GiB", 5 * 2**30),
        ("200KB", 200_000),
        ("1024", 1024),
        (1024, 1024),
        (" 2 mib ", 2 * 2**20),
        ("3kib", 3 * 1024),
        ("1.5GB", 1_500_000_000),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("7b", 7),
    ],
)
def test_parse_size_reads_units(text: int | str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "10XB", "0", "0MB", "-5MB", "5 G B", 0, -3, True])
def test_parse_size_rejects_bad_values(bad: object) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(").replace(")", r"\)")):
        parse_size(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# round trips


def test_single_safetensors_round_trip_restores_parameters_and_buffers(tmp_path: Path) -> None:
    source = _randomized(Net(), seed=1)
    written = save_model_files(source.state_dict(), tmp_path / "out")
    assert written == [str(tmp_path / "out" / "model.safetensors")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.safetensors"]
    assert "scratch" not in _stored_keys(tmp_path / "out" / "model.safetensors")
    assert _header_metadata(tmp_path / "out" / "model.safetensors")["format"] == "pt"

    fresh = _randomized(Net(), seed=2)
    load_checkpoint_in_model(fresh, tmp_path / "out", strict=True)
    _assert_same_weights(source, fresh)
    assert fresh.encoder[1].num_batches_tracked.dtype == torch.int64


def test_sharded_round_trip_writes_index_and_greedy_shards(tmp_path: Path) -> None:
    source = _randomized(Net(hidden=40), seed=3)
    state = source.state_dict()
    written = save_model_files(state, tmp_path, max_shard_size=1000)
    index_path = tmp_path / "model.safetensors.index.json"
    assert written[-1] == str(index_path)
    shards = [Path(p) for p in written[:-1]]
    count = len(shards)
    assert count >= 3
    assert [p.name for p in shards] == [
        f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)
    ]
    assert not (tmp_path / "model.safetensors").exists()

    index = json.loads(index_path.read_text())
    assert index["metadata"]["total_size"] == sum(_nbytes(t) for t in state.values())
    assert set(index["weight_map"]) == set(state)
    for shard in shards:
        assert sorted(_stored_keys(shard)) == sorted(
            name for name, file in index["weight_map"].items() if file == shard.name
        )
    # As Accelerate splits: a tensor above the limit alone in a shard (here encoder.0.weight,
    # 1280 bytes, listed first); the others fill shards in state-dict order, each up to the
    # limit, the next shard's first tensor being the one that would not have fitted.
    big = [name for name, tensor in state.items() if _nbytes(tensor) > 1000]
    assert big == ["encoder.0.weight"]
    assert index["weight_map"]["encoder.0.weight"] == shards[0].name
    rest = [name for name in state if name not in big]
    filled = [index["weight_map"][name] for name in rest]
    assert filled == sorted(filled) and filled[0] == shards[1].name
    sizes: dict[str, list[int]] = {shard.name: [] for shard in shards[1:]}
    for name in rest:
        sizes[index["weight_map"][name]].append(_nbytes(state[name]))
    for number, shard in enumerate(shards[1:], start=1):
        assert sum(sizes[shard.name]) <= 1000
        if number + 1 < count:
            assert sum(sizes[shard.name]) + sizes[shards[number + 1].name][0] > 1000

    fresh = _randomized(Net(hidden=40), seed=4)
    load_checkpoint_in_model(fresh, index_path, strict=True)
    _assert_same_weights(source, fresh)
    fresh = _randomized(Net(hidden=40), seed=5)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)  # the folder finds the index
    _assert_same_weights(source, fresh)


def test_a_tensor_larger_than_the_limit_gets_its_own_shard(tmp_path: Path) -> None:
    """As Accelerate's save_model: the big tensor's shard comes first, the small ones share
    the shard that was being filled around it."""
    state = {"small1": torch.ones(10), "big": torch.ones(1000), "small2": torch.ones(10)}
    save_model_files(state, tmp_path, max_shard_size="1KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {
        "big": "model-00001-of-00002.safetensors",
        "small1": "model-00002-of-00002.safetensors",
        "small2": "model-00002-of-00002.safetensors",
    }


def test_bin_round_trip_single_and_sharded(tmp_path: Path) -> None:
    source = _randomized(Net(), seed=6)
    [single] = save_model_files(source.state_dict(), tmp_path / "one", safe_serialization=False)
    assert Path(single).name == "pytorch_model.bin"
    fresh = _randomized(Net(), seed=7)
    load_checkpoint_in_model(fresh, tmp_path / "one", strict=True)
    _assert_same_weights(source, fresh)

    written = save_model_files(
        source.state_dict(), tmp_path / "many", safe_serialization=False, max_shard_size=600
    )
    names = [Path(p).name for p in written]
    assert names[-1] == "pytorch_model.bin.index.json"
    assert names[0] == f"pytorch_model-00001-of-{len(names) - 1:05d}.bin"
    fresh = _randomized(Net(), seed=8)
    load_checkpoint_in_model(fresh, tmp_path / "many", strict=True)
    _assert_same_weights(source, fresh)


def test_bin_loading_is_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    torch.save({"scale": torch.ones(4), "extra": Payload()}, path)
    UNPICKLED.clear()
    with pytest.raises(ValueError, match=r"refusing to load .*pytorch_model\.bin"):
        load_checkpoint_in_model(Net(), tmp_path)
    with pytest.raises(ValueError, match=r"pytorch_model\.bin"):
        load_state_dict_file(path)
    assert UNPICKLED == []  # the payload's code never ran


def test_weights_name_override(tmp_path: Path) -> None:
    source = _randomized(Net(hidden=40), seed=9)
    written = save_model_files(
        source.state_dict(), tmp_path, weights_name="model_1.safetensors", max_shard_size=2000
    )
    names = [Path(p).name for p in written]
    count = len(names) - 1
    assert names[0] == f"model_1-00001-of-{count:05d}.safetensors"
    assert names[-1] == "model_1.safetensors.index.json"
    fresh = _randomized(Net(hidden=40), seed=10)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)  # the only index in the folder
    _assert_same_weights(source, fresh)
    with pytest.raises(ValueError, match="plain file name"):
        save_model_files(source.state_dict(), tmp_path, weights_name="sub/model.safetensors")


# ---------------------------------------------------------------------------------------------
# shared memory


def test_tied_weights_are_stored_once_and_reload_tied(tmp_path: Path) -> None:
    source = _randomized(TiedLM(), seed=11)
    state = source.state_dict()
    assert state["head.weight"].data_ptr() == state["embed.weight"].data_ptr()
    save_model_files(state, tmp_path)
    file = tmp_path / "model.safetensors"
    assert sorted(_stored_keys(file)) == ["body.bias", "body.weight", "embed.weight"]
    aliases = json.loads(_header_metadata(file)["nb_accel.aliases"])
    assert aliases == {"head.weight": "embed.weight"}

    loaded = load_state_dict_file(file)
    assert set(loaded) == set(state)
    assert loaded["head.weight"] is loaded["embed.weight"]

    fresh = _randomized(TiedLM(), seed=12)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    _assert_same_weights(source, fresh)
    assert fresh.head.weight is fresh.embed.weight

    untied = _randomized(TiedLM(tie=False), seed=13)
    load_checkpoint_in_model(untied, tmp_path, strict=True)  # head.weight filled from its alias
    assert torch.equal(untied.head.weight, source.embed.weight)
    assert untied.head.weight.data_ptr() != untied.embed.weight.data_ptr()


def test_tied_weights_in_a_sharded_save_are_recorded_in_the_index(tmp_path: Path) -> None:
    source = _randomized(TiedLM(), seed=14)
    save_model_files(source.state_dict(), tmp_path, max_shard_size=200)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["aliases"] == {"head.weight": "embed.weight"}
    assert "head.weight" not in index["weight_map"]
    stored = [source.embed.weight, source.body.weight, source.body.bias]
    assert index["metadata"]["total_size"] == sum(_nbytes(t) for t in stored)

    fresh = _randomized(TiedLM(tie=False), seed=15)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    _assert_same_weights(source, fresh)


def test_tied_weights_in_a_bin_file_keep_sharing(tmp_path: Path) -> None:
    source = _randomized(TiedLM(), seed=16)
    save_model_files(source.state_dict(), tmp_path, safe_serialization=False)
    loaded = load_state_dict_file(tmp_path / "pytorch_model.bin")
    assert set(loaded) == set(source.state_dict())
    assert loaded["head.weight"].data_ptr() == loaded["embed.weight"].data_ptr()
    fresh = _randomized(TiedLM(), seed=17)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    _assert_same_weights(source, fresh)
    assert fresh.head.weight is fresh.embed.weight


def test_overlapping_views_are_written_as_independent_copies(tmp_path: Path) -> None:
    base = torch.arange(12, dtype=torch.float32)
    state = {
        "first": base[:8],
        "second": base[4:],
        "whole": base.view(3, 4),
        "again": base[:8],  # the very same view as "first": an alias
        "transposed": base.view(3, 4).t(),
    }
    save_model_files(state, tmp_path)
    file = tmp_path / "model.safetensors"
    assert sorted(_stored_keys(file)) == ["first", "second", "transposed", "whole"]
    assert json.loads(_header_metadata(file)["nb_accel.aliases"]) == {"again": "first"}
    loaded = load_state_dict_file(file)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name
    loaded["second"].zero_()
    assert torch.equal(loaded["first"], base[:8])  # nothing shared between stored tensors
    assert torch.equal(base, torch.arange(12, dtype=torch.float32))  # the source is untouched


# ---------------------------------------------------------------------------------------------
# files on disk


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_resaving_removes_stale_files_of_the_same_base_name_only(tmp_path: Path) -> None:
    state = _randomized(Net(hidden=40), seed=18).state_dict()
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "model-extra.safetensors").write_text("not a shard")
    save_model_files({"x": torch.ones(3)}, tmp_path, weights_name="model_1.safetensors")
    others = ["model-extra.safetensors", "model_1.safetensors", "notes.txt"]

    many = save_model_files(state, tmp_path, max_shard_size=1000)
    fewer = save_model_files(state, tmp_path, max_shard_size=3000)
    assert len(fewer) < len(many)
    assert _files(tmp_path) == sorted([Path(p).name for p in fewer] + others)
    fresh = _randomized(Net(hidden=40), seed=19)
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    assert torch.equal(fresh.encoder[0].weight, state["encoder.0.weight"])

    save_model_files(state, tmp_path)  # everything fits: one file, no index, no shards
    assert _files(tmp_path) == sorted(["model.safetensors", *others])
    again = save_model_files(state, tmp_path, max_shard_size=1000)
    assert _files(tmp_path) == sorted([Path(p).name for p in again] + others)


def test_a_failed_write_leaves_the_previous_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_model_files({"w": torch.ones(4)}, tmp_path)

    def broken_save(tensors: object, filename: str, metadata: object = None) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(model_files, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_model_files({"w": torch.zeros(4)}, tmp_path)
    assert _files(tmp_path) == ["model.safetensors"]  # no temporary file left behind
    assert torch.equal(load_state_dict_file(tmp_path / "model.safetensors")["w"], torch.ones(4))


def test_folder_resolution(tmp_path: Path) -> None:
    state = {"scale": torch.full((4,), 3.0)}
    model = Net()
    (tmp_path / "one").mkdir()
    save_model_files(state, tmp_path / "one", weights_name="weights.safetensors")
    with pytest.warns(
        UserWarning, match=r"weights\.safetensors does not match the model: 11 missing"
    ):
        load_checkpoint_in_model(model, tmp_path / "one")
    assert torch.equal(model.scale, state["scale"])

    save_model_files(state, tmp_path / "one", weights_name="other.safetensors")
    with pytest.raises(ValueError, match=r"several \*\.safetensors.*other\.safetensors"):
        load_checkpoint_in_model(model, tmp_path / "one")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no weights found .*readme\.txt"):
        load_checkpoint_in_model(model, tmp_path / "empty")


# ---------------------------------------------------------------------------------------------
# devices, dtypes, in-place loading


def test_device_map_single_device_and_prefixes(tmp_path: Path) -> None:
    source = _randomized(Net(), seed=20)
    save_model_files(source.state_dict(), tmp_path)
    fresh = Net()
    load_checkpoint_in_model(fresh, tmp_path, device_map={"": "cpu"}, strict=True)
    _assert_same_weights(source, fresh)

    # The meta device shows where each tensor was routed without needing a GPU.
    routed = Net()
    device_map = {"": "cpu", "decoder": "meta", "decoder.2": torch.device("cpu")}
    load_checkpoint_in_model(routed, tmp_path, device_map=device_map)
    assert routed.encoder[0].weight.device.type == "cpu"
    assert torch.equal(routed.encoder[0].weight, source.encoder[0].weight)
    assert routed.decoder[0].weight.device.type == "meta"
    assert routed.decoder[2].weight.device.type == "cpu"  # the longest prefix wins
    assert torch.equal(routed.decoder[2].weight, source.decoder[2].weight)


def test_prefixes_match_whole_module_names() -> None:
    from nb_accel.runtime.checkpoint.model_io import _device_for

    devices = {"decoder.1": torch.device("meta"), "": torch.device("cpu")}
    assert _device_for("decoder.1.weight", devices) == torch.device("meta")
    assert _device_for("decoder.10.weight", devices) == torch.device("cpu")
    assert _device_for("decoder.1", devices) == torch.device("meta")
    assert _device_for("encoder.weight", {"decoder": torch.device("meta")}) is None


def test_disk_in_device_map_is_refused(tmp_path: Path) -> None:
    save_model_files(Net().state_dict(), tmp_path)
    with pytest.raises(ValueError, match="disk"):
        load_checkpoint_in_model(Net(), tmp_path, device_map={"encoder": "disk", "": "cpu"})
    with pytest.raises(ValueError, match="not a device"):
        load_checkpoint_in_model(Net(), tmp_path, device_map={"": "nowhere"})


@pytest.mark.parametrize("dtype", ["float16", torch.bfloat16, "torch.float16"])
def test_dtype_casts_floats_and_keeps_integers(tmp_path: Path, dtype: str | torch.dtype) -> None:
    source = _randomized(Net(), seed=21)
    save_model_files(source.state_dict(), tmp_path)
    fresh = Net()
    load_checkpoint_in_model(fresh, tmp_path, dtype=dtype, strict=True)
    expected = dtype if isinstance(dtype, torch.dtype) else torch.float16
    assert fresh.encoder[0].weight.dtype == expected
    assert fresh.encoder[1].running_var.dtype == expected
    assert isinstance(fresh.encoder[0].weight, nn.Parameter)
    assert fresh.encoder[0].weight.requires_grad
    assert fresh.encoder[1].num_batches_tracked.dtype == torch.int64
    assert torch.equal(fresh.encoder[1].num_batches_tracked, source.encoder[1].num_batches_tracked)
    assert torch.equal(fresh.decoder[0].weight, source.decoder[0].weight.to(expected))


def test_unknown_dtype_is_refused(tmp_path: Path) -> None:
    save_model_files(Net().state_dict(), tmp_path)
    with pytest.raises(ValueError, match="float17"):
        load_checkpoint_in_model(Net(), tmp_path, dtype="float17")
    with pytest.raises(ValueError, match="floating-point"):
        load_checkpoint_in_model(Net(), tmp_path, dtype=torch.int32)


def test_loading_is_in_place_so_optimizers_keep_their_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # set by torch.optim
    source = _randomized(Net(), seed=22)
    save_model_files(source.state_dict(), tmp_path)
    fresh = Net()
    optimizer = torch.optim.SGD(fresh.parameters(), lr=0.5)
    weight = fresh.encoder[0].weight
    pointer = weight.data_ptr()
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    assert fresh.encoder[0].weight is weight and weight.data_ptr() == pointer
    assert torch.equal(weight, source.encoder[0].weight)
    fresh.train()
    fresh(torch.randn(5, 8)).sum().backward()
    optimizer.step()  # the optimizer still updates the model's own parameters
    assert not torch.equal(fresh.encoder[0].weight, source.encoder[0].weight)


def test_loading_into_a_meta_model_materializes_it(tmp_path: Path) -> None:
    source = _randomized(TiedLM(), seed=23)
    save_model_files(source.state_dict(), tmp_path)
    with torch.device("meta"):
        empty = TiedLM()
    load_checkpoint_in_model(empty, tmp_path, strict=True)
    assert empty.embed.weight.device.type == "cpu"
    assert isinstance(empty.head.weight, nn.Parameter)
    assert empty.head.weight is empty.embed.weight
    _assert_same_weights(source, empty)


# ---------------------------------------------------------------------------------------------
# errors


def test_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        load_checkpoint_in_model(Net(), tmp_path / "no_such_dir")
    with pytest.raises(FileNotFoundError, match=r"absent\.safetensors"):
        load_state_dict_file(tmp_path / "absent.safetensors")


@pytest.mark.parametrize("safe", [True, False])
def test_truncated_file_is_reported_with_its_name(tmp_path: Path, safe: bool) -> None:
    [written] = save_model_files(Net().state_dict(), tmp_path, safe_serialization=safe)
    path = Path(written)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ValueError, match=f"cannot read .*{path.name}"):
        load_checkpoint_in_model(Net(), tmp_path)
    with pytest.raises(ValueError, match=f"cannot read .*{path.name}"):
        load_state_dict_file(path)


def test_missing_shard_is_reported_before_anything_loads(tmp_path: Path) -> None:
    source = _randomized(Net(hidden=40), seed=24)
    written = save_model_files(source.state_dict(), tmp_path, max_shard_size=1000)
    Path(written[1]).unlink()
    fresh = Net(hidden=40)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(FileNotFoundError, match="missing: '" + Path(written[1]).name):
        load_checkpoint_in_model(fresh, tmp_path)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize("safe", [True, False])
def test_shape_mismatch_names_key_shapes_and_file(tmp_path: Path, safe: bool) -> None:
    state = Net().state_dict()
    state["encoder.0.weight"] = torch.ones(16, 9)
    save_model_files(state, tmp_path, safe_serialization=safe)
    file = "model.safetensors" if safe else "pytorch_model.bin"
    with pytest.raises(ValueError, match=r"size mismatch for 'encoder\.0\.weight'") as caught:
        load_checkpoint_in_model(Net(), tmp_path)
    message = str(caught.value)
    assert "(16, 9)" in message and "(16, 8)" in message and file in message


def test_strict_lists_missing_and_unexpected_keys(tmp_path: Path) -> None:
    state = _randomized(Net(), seed=25).state_dict()
    state["stray.weight"] = torch.ones(2)
    del state["scale"]
    save_model_files(state, tmp_path)
    fresh = Net()
    before = fresh.encoder[0].weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"missing.*'scale'.*unexpected.*'stray\.weight'"):
        load_checkpoint_in_model(fresh, tmp_path, strict=True)
    assert torch.equal(fresh.encoder[0].weight, before)  # nothing loaded

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_checkpoint_in_model(fresh, tmp_path)
    [warning] = caught
    assert "'scale'" in str(warning.message) and "'stray.weight'" in str(warning.message)
    assert torch.equal(fresh.encoder[0].weight, state["encoder.0.weight"])


def test_long_key_lists_are_shortened(tmp_path: Path) -> None:
    state = {f"extra.{i}": torch.ones(1) for i in range(15)}
    save_model_files(state, tmp_path)
    with pytest.raises(RuntimeError, match="15 unexpected") as caught:
        load_checkpoint_in_model(nn.Linear(2, 2), tmp_path, strict=True)
    message = str(caught.value)
    assert "and 5 more" in message
    assert sum(f"'extra.{i}'" in message for i in range(15)) == 10
    assert "2 missing (in the model only): 'weight', 'bias'" in message


def test_index_listing_a_key_its_shard_lacks_is_reported(tmp_path: Path) -> None:
    save_model_files(_randomized(Net(hidden=40)).state_dict(), tmp_path, max_shard_size=1000)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first_shard = index["weight_map"]["encoder.0.weight"]
    assert index["weight_map"]["decoder.0.weight"] != first_shard
    index["weight_map"]["decoder.0.weight"] = first_shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"decoder\.0\.weight"):
        load_checkpoint_in_model(Net(hidden=40), tmp_path)


def test_a_home_relative_path_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(3, 2)
    save_model_files(model.state_dict(), "~/weights")
    assert (tmp_path / "weights" / "model.safetensors").is_file()
    assert not (tmp_path / "~").exists()
    fresh = torch.nn.Linear(3, 2)
    load_checkpoint_in_model(fresh, "~/weights", strict=True)
    assert torch.equal(fresh.weight, model.weight)
