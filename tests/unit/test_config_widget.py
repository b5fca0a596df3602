"""The configuration form, built in-process and driven through its controls (no browser)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import ipywidgets
import pytest
import yaml

from nb_accel.config import Config, ConfigError, load_config, save_config
from nb_accel.notebook.compat_widgets import text_color, tooltip_of
from nb_accel.notebook.config_widget import LABELS, MULTI_NODE_FIELDS, ConfigWidget, hosts_from_text
from nb_accel.runtime.device_types import cuda_facts

FIELD_NAMES = [f.name for f in fields(Config)]


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 0)


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_facts, "cuda_device_count", lambda: 4)


def _offered(form: ConfigWidget, name: str) -> list[object]:
    return [value for _, value in form.controls[name].options]


def _hidden(form: ConfigWidget, name: str) -> bool:
    return form.rows[name].layout.display == "none" and form.rows[name] in form.children


def test_missing_file_gives_the_defaults(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "missing" / "config.yaml"
    form = ConfigWidget(file)
    assert form.config == Config()
    assert form.problems() == {}
    assert not form.save_button.disabled
    assert str(file) in form.header.value
    assert not file.exists()


def test_the_path_defaults_to_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, four_gpus: None
) -> None:
    file = tmp_path / "from_env.yaml"
    save_config(Config(gradient_accumulation_steps=3), file)
    monkeypatch.setenv("NB_ACCEL_CONFIG_FILE", str(file))
    form = ConfigWidget()
    assert form.path == file
    assert form.config.gradient_accumulation_steps == 3


def test_every_field_has_a_control_labelled_in_words_with_its_name_in_the_tooltip(
    tmp_path: Path,
) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    assert list(form.controls) == FIELD_NAMES
    labels = {name: control.description for name, control in form.controls.items()}
    assert labels["num_processes"] == "Processes"
    assert labels["mixed_precision"] == "Mixed precision"
    assert labels["timeout"] == "Timeout (s)"
    assert labels["num_nodes"] == "Nodes" and labels["cpu"] == "CPU only"
    assert labels["sharding"] == "Sharding"
    assert len(set(labels.values())) == len(labels) and labels == LABELS
    for name, control in form.controls.items():
        assert "_" not in control.description, name
        tip = tooltip_of(control)
        assert tip.startswith(f"{name}: ") and len(tip) > len(name) + 9
    assert "one per GPU" in tooltip_of(form.controls["num_processes"])


def test_the_form_is_a_widget_holding_its_controls(tmp_path: Path, no_gpu: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml", layout=ipywidgets.Layout(width="40em"))
    assert isinstance(form, ipywidgets.VBox) and form.layout.width == "40em"
    outer = ipywidgets.VBox([ipywidgets.HTML("Settings"), form])  # embeddable
    assert outer.children[1] is form and form.widget is form

    def descendants(widget: ipywidgets.Widget) -> list[ipywidgets.Widget]:
        found = [widget]
        for child in getattr(widget, "children", ()):
            found += descendants(child)
        return found

    inside = descendants(form)
    for widget in (*form.controls.values(), form.save_button, form.message, form.header):
        assert any(widget is found for found in inside)
    assert form.model_id  # a widget model of its own (a kernel test displays it)


def test_an_edit_after_save_replaces_the_saved_message(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    form = ConfigWidget(file)
    form.save_button.click()
    assert form.message.value == f"Saved to {file}"
    form.controls["timeout"].value = 12.0
    assert "Saved" not in form.message.value
    assert form.message.value == "Changed; not saved yet"
    assert text_color(form.message) == "#ef6c00"
    form.save()
    assert form.message.value == f"Saved to {file}" and text_color(form.message) == "#2e7d32"
    form.load()
    form.controls["mixed_precision"].value = "bf16"
    assert form.message.value == "Changed; not saved yet"
    form.reset()
    assert form.message.value == "Built-in defaults (not saved yet)"
    form.controls["num_nodes"].value = 2  # a problem: Save disabled, still not saved
    assert form.message.value == "Changed; not saved yet" and form.save_button.disabled


def test_an_edit_keeps_the_error_about_a_malformed_file(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("timeout: [oops\n")
    form = ConfigWidget(file)
    error = form.message.value
    assert str(file) in error
    form.controls["timeout"].value = 3.0
    assert form.message.value == error  # still true until Save overwrites the file
    form.save()
    form.controls["timeout"].value = 4.0
    assert form.message.value == "Changed; not saved yet"


def test_values_set_on_the_controls_are_saved_and_read_back(
    tmp_path: Path, four_gpus: None
) -> None:
    file = tmp_path / "sub" / "c.yaml"
    form = ConfigWidget(file)
    changes = {
        "num_processes": 2,
        "mixed_precision": "fp16",
        "sharding": "fsdp2",
        "start_method": "spawn",
        "gradient_accumulation_steps": 4,
        "timeout": 60.5,
        "num_nodes": 2,
        "node_rank": 1,
        "rdzv_endpoint": "head:29500",
        "rdzv_timeout": 30.0,
        "max_restarts": 3,
    }
    for name, value in changes.items():
        form.controls[name].value = value
    assert not form.save_button.disabled
    form.save_button.click()
    assert file.exists()
    assert load_config(file) == Config(**changes)
    assert f"Saved to {file}" in form.message.value
    assert form.save() == file


def test_sharding_is_a_ddp_or_fsdp_choice_saved_as_the_launch_default(
    tmp_path: Path, four_gpus: None
) -> None:
    file = tmp_path / "c.yaml"
    form = ConfigWidget(file)
    sharding = form.controls["sharding"]
    assert list(sharding.options) == [("DDP", "ddp"), ("FSDP2", "fsdp2")]
    assert sharding.value == "ddp" and sharding.label == "DDP"
    assert "fully_shard" in tooltip_of(sharding) and tooltip_of(sharding).startswith("sharding: ")
    sharding.value = "fsdp2"
    assert form.message.value == "Changed; not saved yet"
    form.save()
    assert load_config(file) == Config(sharding="fsdp2")
    assert "sharding: fsdp2" in file.read_text()
    again = ConfigWidget(file)
    assert again.controls["sharding"].label == "FSDP2"
    again.reset()
    assert again.controls["sharding"].value == "ddp" and again.config == Config()


def test_an_older_file_without_sharding_shows_ddp(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("num_processes: 2\nmixed_precision: bf16\n")
    form = ConfigWidget(file)
    assert form.controls["sharding"].value == "ddp" and form.message.value == ""
    assert form.config == Config(num_processes=2, mixed_precision="bf16")


def test_auto_is_saved_as_none(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    save_config(Config(num_processes=3, start_method="fork"), file)
    form = ConfigWidget(file)
    assert form.controls["num_processes"].value == 3
    form.controls["num_processes"].value = "auto"
    form.controls["start_method"].value = "auto"
    form.save()
    assert load_config(file) == Config()


def test_node_rank_not_below_num_nodes_is_shown_and_blocks_save(
    tmp_path: Path, four_gpus: None
) -> None:
    file = tmp_path / "c.yaml"
    form = ConfigWidget(file)
    form.controls["num_nodes"].value = 2
    form.controls["rdzv_endpoint"].value = "head:29500"
    assert not form.save_button.disabled
    form.controls["node_rank"].value = 2
    assert "below num_nodes" in form.field_messages["node_rank"].value
    assert form.field_messages["node_rank"] in form.rows["node_rank"].children
    assert form.save_button.disabled
    with pytest.raises(ConfigError):
        _ = form.config
    form.save_button.click()  # disabled in the browser; called anyway, it must not write
    assert not file.exists()
    assert "Not saved" in form.message.value
    form.controls["node_rank"].value = 1
    assert form.field_messages["node_rank"].value == ""
    assert not form.save_button.disabled


def test_multi_node_without_endpoint_is_shown_and_blocks_save(
    tmp_path: Path, four_gpus: None
) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    form.controls["num_nodes"].value = 2
    assert "host:port" in form.field_messages["rdzv_endpoint"].value
    assert form.save_button.disabled
    form.controls["rdzv_endpoint"].value = "no-port"
    assert form.save_button.disabled
    form.controls["rdzv_endpoint"].value = "10.0.0.1:29500"
    assert form.field_messages["rdzv_endpoint"].value == ""
    assert not form.save_button.disabled


def test_fp16_with_cpu_can_be_saved(tmp_path: Path, four_gpus: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    form.controls["mixed_precision"].value = "fp16"
    form.controls["cpu"].value = True
    assert form.field_messages["mixed_precision"].value == ""
    assert not form.save_button.disabled
    form.save_button.click()
    saved = load_config(tmp_path / "c.yaml")
    assert (saved.mixed_precision, saved.cpu) == ("fp16", True)


def test_multi_node_fields_appear_only_with_several_nodes(tmp_path: Path, four_gpus: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    for name in MULTI_NODE_FIELDS:
        assert _hidden(form, name), name
    assert not _hidden(form, "num_nodes")
    form.controls["num_nodes"].value = 2
    for name in MULTI_NODE_FIELDS:
        assert not _hidden(form, name), name
    form.controls["num_nodes"].value = 1
    for name in MULTI_NODE_FIELDS:
        assert _hidden(form, name), name


def test_restarts_are_a_field_for_one_machine_too(tmp_path: Path, four_gpus: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    assert form.controls["num_nodes"].value == 1
    assert not _hidden(form, "max_restarts")
    form.controls["max_restarts"].value = 2
    form.save_button.click()
    assert load_config(tmp_path / "c.yaml").max_restarts == 2


def test_a_hidden_field_with_a_problem_is_shown(tmp_path: Path, four_gpus: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    form.controls["num_nodes"].value = 3
    form.controls["rdzv_endpoint"].value = "head:1"
    form.controls["node_rank"].value = 2
    form.controls["num_nodes"].value = 1
    assert form.save_button.disabled
    assert not _hidden(form, "node_rank")
    assert _hidden(form, "rdzv_endpoint")


def test_load_rereads_the_file(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    form = ConfigWidget(file)
    save_config(Config(timeout=10.0, mixed_precision="bf16"), file)
    assert form.config == Config()
    form.load_button.click()
    assert form.config == Config(timeout=10.0, mixed_precision="bf16")
    assert "Loaded from" in form.message.value
    form.controls["timeout"].value = 99.0
    form.load()
    assert form.config.timeout == 10.0


def test_load_of_a_malformed_file_keeps_the_form(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    form = ConfigWidget(file)
    form.controls["gradient_accumulation_steps"].value = 5
    file.write_text("timeout: [oops\n")
    form.load()
    assert str(file) in form.message.value
    assert form.config.gradient_accumulation_steps == 5


def test_reset_restores_the_defaults_without_saving(tmp_path: Path, four_gpus: None) -> None:
    file = tmp_path / "c.yaml"
    saved = Config(num_processes=2, timeout=5.0, cpu=True, mixed_precision="bf16")
    save_config(saved, file)
    form = ConfigWidget(file)
    assert form.config == saved
    form.reset_button.click()
    assert form.config == Config()
    assert load_config(file) == saved


def test_a_malformed_file_gives_defaults_and_an_error_naming_it(
    tmp_path: Path, four_gpus: None
) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump({"timeout": 1.0, "colour": "blue"}))
    form = ConfigWidget(file)
    assert form.config == Config()
    assert str(file) in form.message.value
    assert "colour" in form.message.value


def test_without_gpus_cpu_is_fixed_and_fp16_offered(tmp_path: Path, no_gpu: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    assert form.controls["cpu"].value is True
    assert form.controls["cpu"].disabled
    assert _offered(form, "mixed_precision") == ["no", "bf16", "fp16"]
    assert form.config == Config(cpu=True)
    assert "no GPU" in form.header.value
    processes = _offered(form, "num_processes")
    assert processes[0] == "auto" and processes[1] == 1 and len(processes) >= 3


def test_with_gpus_the_choices_follow_the_gpu_count(tmp_path: Path, four_gpus: None) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    assert not form.controls["cpu"].disabled
    assert "fp16" in _offered(form, "mixed_precision")
    assert _offered(form, "num_processes") == ["auto", 1, 2, 3, 4]
    assert "4 GPUs" in form.header.value


def test_a_saved_value_this_machine_cannot_use_is_shown(tmp_path: Path, no_gpu: None) -> None:
    file = tmp_path / "c.yaml"
    save_config(Config(num_processes=64), file)
    form = ConfigWidget(file)
    assert form.controls["cpu"].value is True
    assert form.controls["num_processes"].value == 64
    form.reset()
    assert 64 not in _offered(form, "num_processes")


@pytest.mark.skipif(cuda_facts.cuda_device_count() > 0, reason="this machine has a GPU")
def test_this_machine_without_gpu(tmp_path: Path) -> None:
    form = ConfigWidget(tmp_path / "c.yaml")
    assert form.controls["cpu"].value is True and form.controls["cpu"].disabled
    assert "fp16" in _offered(form, "mixed_precision")


def test_tpu_runtime_is_mentioned_when_torch_xla_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_gpu: None
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: object() if name == "torch_xla" else real(name, *args),
    )
    assert "TPU" in ConfigWidget(tmp_path / "c.yaml").header.value


def test_hosts_are_typed_as_names_or_slurm(tmp_path: Path, four_gpus: None) -> None:
    assert hosts_from_text(" gpu0, gpu1 gpu2 ") == ["gpu0", "gpu1", "gpu2"]
    assert hosts_from_text("slurm") == "slurm"
    assert hosts_from_text("  ") is None
    path = tmp_path / "config.yaml"
    form = ConfigWidget(path)
    form.controls["hosts"].value = "gpu0, gpu0"
    assert "names gpu0 more than once" in form.field_messages["hosts"].value
    assert form.save_button.disabled
    form.controls["hosts"].value = "gpu0, gpu1"
    form.controls["ssh_config"].value = "~/cluster/ssh_config"
    form.save()
    assert load_config(path).hosts == ["gpu0", "gpu1"]
    assert ConfigWidget(path).controls["hosts"].value == "gpu0, gpu1"
