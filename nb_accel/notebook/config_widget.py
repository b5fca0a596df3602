"""An interactive form for the saved default configuration (:mod:`nb_accel.config`).

:class:`ConfigWidget` shows one control per :class:`~nb_accel.config.Config` field, offers only
the choices this machine can use (GPUs are counted through NVML, so CUDA stays uninitialised),
shows each problem next to its field while the values are edited, and saves the file only when
every value is valid. It is an ``ipywidgets.VBox``: display it as a cell's last expression,
with ``display(form)``, or put it into another layout; its controls are among its children.
Each control is labelled in words ("Processes", "Timeout (s)"); its tooltip names the field
and says what it does.
"""

from __future__ import annotations

import html
import importlib.util
import inspect
import multiprocessing
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import ipywidgets

from .._keywords import refuse_unknown
from ..config import (
    CHOICES,
    MESH_SIZES,
    Config,
    ConfigError,
    config_path,
    config_problems,
    load_config,
    save_config,
)
from ..runtime.device_types import cuda_facts, nvml
from ..runtime.device_types.gpu_advice import bf16_note
from . import compat_widgets as compat

__all__ = ["ConfigWidget", "LABELS", "MULTI_NODE_FIELDS", "field_help", "hosts_from_text"]

#: Fields that matter only when ``num_nodes > 1``; their rows are hidden otherwise
#: (``max_restarts`` is shown always: one machine's workers are restarted too).
MULTI_NODE_FIELDS = ("node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_timeout")
#: What dropdowns show, and hold as their value, for a field's ``None`` ("decide at launch").
AUTO = "auto"
#: Upper bound of the whole-number fields (the browser's integer inputs need one).
MAX_INT = 2**31 - 1
#: The label of each field's control.
LABELS = {
    "num_processes": "Processes",
    "mixed_precision": "Mixed precision",
    "sharding": "Sharding",
    "start_method": "Start method",
    "gradient_accumulation_steps": "Gradient accumulation steps",
    "timeout": "Timeout (s)",
    "cpu": "CPU only",
    "num_nodes": "Nodes",
    "node_rank": "Node rank",
    "rdzv_endpoint": "Rendezvous endpoint",
    "rdzv_backend": "Rendezvous backend",
    "rdzv_timeout": "Rendezvous timeout (s)",
    "max_restarts": "Restarts at most",
    "hosts": "Hosts",
    "ssh_config": "SSH config file",
    "reuse_workers": "Keep workers warm",
    "post_mortem_wait": "Keep a failed rank for %debug (s)",
    "dp_replicate_size": "Mesh: replicas",
    "dp_shard_size": "Mesh: FSDP shards",
    "tp_size": "Mesh: tensor parallel",
    "cp_size": "Mesh: context parallel",
}
DESCRIPTION_WIDTH = "16em"
ERROR_COLOR = compat.PALETTE["danger"]
OK_COLOR = compat.PALETTE["success"]
PENDING_COLOR = compat.PALETTE["warning"]

Options = list[tuple[str, Any]]


def hosts_from_text(text: str) -> str | list[str] | None:
    """The hosts a form's text names: ``"slurm"``, ``"ray"``, host names split at commas and
    spaces, or ``None`` for none."""
    names = [name for name in text.replace(",", " ").split() if name]
    if names in (["slurm"], ["ray"]):
        return names[0]
    return names or None


def field_help(cls: type = Config) -> dict[str, str]:
    """Each field's one-line help, read from the ``Attributes:`` section of ``cls``'s docstring."""
    found: dict[str, str] = {}
    current: str | None = None
    in_section = False
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        if line.strip() == "Attributes:":
            in_section = True
            continue
        if not in_section:
            continue
        if not line.strip():
            current = None
            continue
        match = re.match(r"\s+(\w+):\s*(.*)$", line)
        if match and match.group(1) in {f.name for f in fields(Config)}:
            current = match.group(1)
            found[current] = match.group(2).strip()
        elif current is not None:
            found[current] += " " + line.strip()
    return {name: text.replace("``", "") for name, text in found.items()}


def _tpu_available() -> bool:
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _with_value(options: Options, value: Any, note: str) -> Options:
    """``options``, plus ``value`` (labelled with ``note``) when it is not among them."""
    if any(v == value and type(v) is type(value) for _, v in options):
        return options
    return [*options, (f"{value} ({note})", value)]


def _fits_its_label() -> ipywidgets.Layout:
    """A checkbox as wide as its label (ipywidgets 7 cuts "Keep workers warm" at its fixed
    width)."""
    return ipywidgets.Layout(width="auto")


class ConfigWidget(ipywidgets.VBox):  # type: ignore[misc]
    """A form (an ``ipywidgets.VBox``) that edits, validates, saves and reloads the default
    configuration.

    Args:
        path: the configuration file; ``None``: where :func:`~nb_accel.config.config_path`
            points (``$NB_ACCEL_CONFIG_FILE``, else the per-user default).

    The form starts from the saved file (the built-in defaults when it is missing, or when it
    is malformed, in which case :attr:`message` says what is wrong with it). Dropdowns hold
    ``"auto"`` for a field's ``None``. On a machine without GPUs ``cpu`` is fixed to true (every
    precision, fp16 included, runs on the CPU). Its children are :attr:`header`, one row per
    field (:attr:`rows`: the control and its problem), the Save/Load/Reset buttons and
    :attr:`message`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        """Build the form from the file at ``path`` (``kwargs`` go to ``ipywidgets.VBox``: its
        traits, such as ``layout``; any other name raises ``TypeError``)."""
        traits = [name for name in ipywidgets.VBox.class_trait_names() if not name.startswith("_")]
        refuse_unknown(
            "ConfigWidget",
            kwargs,
            ["path", *traits],
            ending="it takes path and the traits of ipywidgets.VBox (see help({title}))",
        )
        compat.ready_front_end()
        super().__init__(**kwargs)
        self.path: Path = config_path(path)
        self.gpu_count: int = cuda_facts.cuda_device_count()
        self.cpu_count: int = os.cpu_count() or 1
        self.tpu_available: bool = _tpu_available()
        report = nvml.gpu_report() if self.gpu_count else None
        #: Shown next to mixed precision while bf16 is picked on GPUs that only emulate it.
        self.bf16_note: str | None = bf16_note(report.gpus) if report else None
        self._filling = False
        help_texts = field_help()
        self.controls: dict[str, ipywidgets.Widget] = self._make_controls()
        #: Where each field's problem is shown, next to its control.
        self.field_messages: dict[str, ipywidgets.HTML] = {}
        #: One row per field: the control and its problem.
        self.rows: dict[str, ipywidgets.HBox] = {}
        for name, control in self.controls.items():
            control.description = LABELS[name]
            compat.set_tooltip(
                control, f"{name}: {help_texts[name]}" if name in help_texts else name
            )
            control.style = {"description_width": DESCRIPTION_WIDTH}
            self.field_messages[name] = ipywidgets.HTML(value="")
            self.rows[name] = ipywidgets.HBox([control, self.field_messages[name]])
        self.header = ipywidgets.HTML(value=self._header_html())
        self.save_button = ipywidgets.Button(
            description="Save", button_style="primary", icon="save", tooltip=f"Write {self.path}"
        )
        self.load_button = ipywidgets.Button(
            description="Load", icon="folder-open", tooltip=f"Re-read {self.path}"
        )
        self.reset_button = ipywidgets.Button(
            description="Reset", icon="undo", tooltip="Built-in defaults (not saved until Save)"
        )
        self.message = ipywidgets.HTML(value="")
        self.save_button.on_click(self._on_save)
        self.load_button.on_click(lambda _button: self.load())
        self.reset_button.on_click(lambda _button: self.reset())
        buttons = ipywidgets.HBox([self.save_button, self.load_button, self.reset_button])
        self.children = (
            *compat.stylesheet(),
            self.header,
            *self.rows.values(),
            buttons,
            self.message,
        )
        self._unsaved_note = True  # whether an edit replaces the message with "not saved yet"
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self._fill(Config())
        self._load(announce=False)

    # -- building ------------------------------------------------------------------------------

    def _process_options(self) -> Options:
        top = self.gpu_count if self.gpu_count > 0 else max(self.cpu_count, 2)
        return [(AUTO, AUTO), *((str(n), n) for n in range(1, top + 1))]

    def _precision_options(self) -> Options:
        return [(str(p), p) for p in CHOICES["mixed_precision"]]

    def _sharding_options(self) -> Options:
        return [(str(s).upper(), s) for s in CHOICES["sharding"]]  # DDP, FSDP2, registered

    def _start_method_options(self) -> Options:
        here = set(multiprocessing.get_all_start_methods())
        methods = [m for m in CHOICES["start_method"] if m is not None and m in here]
        return [(AUTO, AUTO), *((m, m) for m in methods)]

    def _make_controls(self) -> dict[str, ipywidgets.Widget]:
        whole = ipywidgets.BoundedIntText
        made: dict[str, ipywidgets.Widget] = {
            "num_processes": ipywidgets.Dropdown(options=self._process_options()),
            "mixed_precision": ipywidgets.Dropdown(options=self._precision_options()),
            "sharding": ipywidgets.Dropdown(options=self._sharding_options()),
            "start_method": ipywidgets.Dropdown(options=self._start_method_options()),
            "gradient_accumulation_steps": whole(min=1, max=MAX_INT),
            "timeout": ipywidgets.FloatText(),
            "cpu": ipywidgets.Checkbox(
                indent=True, disabled=self.gpu_count == 0, layout=_fits_its_label()
            ),
            "num_nodes": whole(min=1, max=MAX_INT),
            "node_rank": whole(min=0, max=MAX_INT),
            "rdzv_endpoint": ipywidgets.Text(placeholder="host:port"),
            "rdzv_backend": ipywidgets.Dropdown(
                options=[(str(b), b) for b in CHOICES["rdzv_backend"]]
            ),
            "rdzv_timeout": ipywidgets.FloatText(),
            "max_restarts": whole(min=0, max=MAX_INT),
            "hosts": ipywidgets.Text(placeholder="gpu0, gpu1  (or: slurm, ray)"),
            "ssh_config": ipywidgets.Text(placeholder="~/.ssh/config"),
            "reuse_workers": ipywidgets.Checkbox(indent=True, layout=_fits_its_label()),
            "post_mortem_wait": ipywidgets.FloatText(),
            **{size: whole(min=1, max=MAX_INT) for size in MESH_SIZES},
        }
        missing = {f.name for f in fields(Config)} - set(made)
        assert not missing, f"no control for {sorted(missing)}"
        return made

    def _header_html(self) -> str:
        parts = [_plural(self.cpu_count, "CPU core")]
        parts.append(_plural(self.gpu_count, "GPU") if self.gpu_count else "no GPU")
        if self.tpu_available:
            parts.append("TPU runtime available (torch_xla)")
        lines = [f"<b>This machine:</b> {html.escape(', '.join(parts))}"]
        if self.gpu_count == 0:
            lines.append("<i>No GPU: CPU only is fixed on.</i>")
        lines.append(f"<b>Settings file:</b> <code>{html.escape(str(self.path))}</code>")
        return "<br>".join(lines)

    # -- reading and writing the form ----------------------------------------------------------

    def _values(self) -> dict[str, Any]:
        """The controls' values as ``Config`` keyword arguments (not validated)."""
        values: dict[str, Any] = {name: c.value for name, c in self.controls.items()}
        for name in ("num_processes", "start_method"):
            if values[name] == AUTO:
                values[name] = None
        endpoint = values["rdzv_endpoint"].strip()
        values["rdzv_endpoint"] = endpoint or None
        values["hosts"] = hosts_from_text(values["hosts"])
        values["ssh_config"] = values["ssh_config"].strip() or None
        return values

    def _fill(self, config: Config) -> None:
        """Put ``config``'s values into the controls (``cpu`` stays true without GPUs)."""
        self._filling = True
        try:
            dropdowns = {
                "num_processes": (self._process_options(), "more than this machine has"),
                "mixed_precision": (self._precision_options(), "unknown"),
                "sharding": (self._sharding_options(), "unknown"),
                "start_method": (self._start_method_options(), "not on this platform"),
                "rdzv_backend": ([(str(b), b) for b in CHOICES["rdzv_backend"]], "unknown"),
            }
            for name, (options, note) in dropdowns.items():
                value = getattr(config, name)
                value = AUTO if value is None else value
                wanted = _with_value(options, value, note)
                control = self.controls[name]
                if tuple(control.options) != tuple(wanted):
                    control.options = wanted
                control.value = value
            for name in (
                "gradient_accumulation_steps",
                "timeout",
                "num_nodes",
                "node_rank",
                "rdzv_timeout",
                "max_restarts",
                "post_mortem_wait",
                *MESH_SIZES,
            ):
                self.controls[name].value = getattr(config, name)
            self.controls["rdzv_endpoint"].value = config.rdzv_endpoint or ""
            hosts = config.hosts
            self.controls["hosts"].value = (
                hosts if isinstance(hosts, str) else ", ".join(hosts or [])
            )
            self.controls["ssh_config"].value = config.ssh_config or ""
            self.controls["cpu"].value = True if self.gpu_count == 0 else config.cpu
            self.controls["reuse_workers"].value = config.reuse_workers
        finally:
            self._filling = False
        self._refresh()

    def _on_change(self, _change: dict[str, Any]) -> None:
        if not self._filling:
            self._refresh()
            if self._unsaved_note:
                self._say("Changed; not saved yet", color=PENDING_COLOR)

    def _refresh(self) -> None:
        """Show each field's problem next to it, enable Save only when there is none, and show
        the multi-node fields when ``num_nodes > 1`` (or when one of them has a problem)."""
        problems = self.problems()
        for name, label in self.field_messages.items():
            text = problems.get(name)
            value = f'<span style="color:{ERROR_COLOR}">{html.escape(text)}</span>' if text else ""
            note = self._precision_note() if name == "mixed_precision" and not text else None
            if note:
                value = f'<span style="color:{PENDING_COLOR}">{html.escape(note)}</span>'
            if label.value != value:
                label.value = value
        self.save_button.disabled = bool(problems)
        multi_node = self.controls["num_nodes"].value > 1
        for name in MULTI_NODE_FIELDS:
            display = None if multi_node or name in problems else "none"
            for part in (self.rows[name], self.controls[name]):
                if part.layout.display != display:
                    part.layout.display = display

    def _precision_note(self) -> str | None:
        """The bf16 note while bf16 is picked for GPUs that only emulate it."""
        picked = self.controls["mixed_precision"].value == "bf16"
        return self.bf16_note if picked and not self.controls["cpu"].value else None

    def _say(self, text: str, error: bool = False, color: str | None = None) -> None:
        # The colour is the widget's style, not markup in the value, so that the message reads
        # as plain text when a cell prints it (``print(form.message.value)``).
        compat.set_text_color(self.message, color or (ERROR_COLOR if error else OK_COLOR))
        self.message.value = html.escape(text, quote=False)
        self._unsaved_note = True

    # -- public ---------------------------------------------------------------------------------

    @property
    def widget(self) -> ipywidgets.VBox:
        """The form itself (it is the widget to display)."""
        return self

    @property
    def config(self) -> Config:
        """The form's current values as a :class:`Config`; :class:`ConfigError` when invalid."""
        return Config(**self._values())

    def problems(self) -> dict[str, str]:
        """Every field whose current value is not allowed, with why (empty when all are valid)."""
        return config_problems(**self._values())

    def save(self) -> Path:
        """Write the form's values to the file (what Save does) and return where they went.

        Raises :class:`ConfigError` when a value is invalid, ``OSError`` when the file cannot be
        written; either is also shown in :attr:`message`.
        """
        try:
            written = save_config(self.config, self.path)
        except (ConfigError, OSError) as error:
            self._say(f"Not saved: {error}", error=True)
            raise
        self._say(f"Saved to {written}")
        return written

    def load(self) -> None:
        """Re-read the file into the form (what Load does). A missing file gives the built-in
        defaults; a malformed one leaves the form as it is and shows the error in
        :attr:`message`."""
        self._load(announce=True)

    def reset(self) -> None:
        """Put the built-in defaults into the form (the file is unchanged until Save)."""
        self._fill(Config())
        self._say("Built-in defaults (not saved yet)")

    def _load(self, announce: bool) -> None:
        try:
            config = load_config(self.path)
        except ConfigError as error:
            self._say(f"Cannot use the saved settings: {error}", error=True)
            self._unsaved_note = False  # an edit does not make the file readable
            return
        self._fill(config)
        if not self.path.exists():
            self._say(f"No file at {self.path}; showing the built-in defaults")
        elif announce:
            self._say(f"Loaded from {self.path}")
        else:
            self.message.value = ""
            self._unsaved_note = True

    def _on_save(self, _button: ipywidgets.Button) -> None:
        try:
            self.save()
        except (ConfigError, OSError):
            pass  # already shown in the message
