"""What a notebook's saved widget state shows: the models under a cell's outputs, and the texts
of its labels as the front end draws them, on ipywidgets 7 and 8 alike."""

from __future__ import annotations

import html
import re
from typing import Any

#: A label that has hover text on ipywidgets 7: its text in a ``<span>``, with a ``title``
#: when it has a tooltip (``nb_accel.notebook.compat_widgets.tip_label``).
_TIP_LABEL = re.compile(r'<span(?: title="([^"]*)")?>(.*)</span>', re.S)


def shown_models(notebook: Any, cell: Any) -> list[dict[str, Any]]:
    """The saved state of every widget model ``cell``'s outputs show, children included."""
    models = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    pending = [
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for o in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    found = []
    while pending:
        model = models[pending.pop()]
        found.append(model)
        pending += [c.removeprefix("IPY_MODEL_") for c in model["state"].get("children", [])]
    return found


def label_text(model: dict[str, Any]) -> str | None:
    """The text a label model shows (a ``Label``, or an ``HTML`` label with hover text), or
    ``None`` when the model is no such label."""
    return state_text(model["state"], model["model_name"])


def state_text(state: dict[str, Any], model_name: str | None = None) -> str | None:
    """The text a label shows, from its model's state (as a kernel's ``comm_open`` and updates
    carry it); ``None`` when the model is no label."""
    value = str(state.get("value", ""))
    name = model_name or state.get("_model_name")
    if name == "LabelModel":
        return value
    found = _TIP_LABEL.fullmatch(value) if name == "HTMLModel" else None
    return html.unescape(found.group(2)) if found else None


def label_texts(models: list[dict[str, Any]]) -> list[str]:
    """The texts of the labels among ``models``, in their order."""
    return [text for text in map(label_text, models) if text is not None]
