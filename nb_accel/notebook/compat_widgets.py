"""Where ipywidgets 7 and 8 differ for nb_accel's widgets: the one seam.

Colab runs ipywidgets 7.7; Kaggle 8.1; a current JupyterLab 8. The live view and the config form
call these functions instead of the version-specific traits:

- **Text style.** ipywidgets 8 styles a label's text (``style.text_color``,
  ``style.font_weight``); ipywidgets 7 has no such traits, so there the widget gets a CSS class
  and the view shows :func:`stylesheet` once (a hidden ``HTML`` widget with the rules). The
  text itself stays plain in ``value`` on both.
- **Tooltips.** ipywidgets 8 gives every widget ``tooltip``; ipywidgets 7 only buttons, and
  ``description_tooltip`` on a control's description. A label whose hover text matters is made
  by :func:`tip_label`: on 7 an ``HTML`` widget whose text is wrapped in an element with a
  ``title``; read it back with :func:`text_of` and :func:`tooltip_of`.

:mod:`~nb_accel.notebook.compat_shell` is the same seam for IPython 7 and 8/9.
"""

from __future__ import annotations

import html
import sys
import weakref
from typing import Any

import ipywidgets

__all__ = [
    "PALETTE",
    "WIDGETS_MAJOR",
    "ready_front_end",
    "set_text_color",
    "set_tooltip",
    "show_text",
    "stylesheet",
    "text_color",
    "text_of",
    "tip_label",
    "tooltip_of",
]

#: The major version of the ipywidgets this kernel runs.
WIDGETS_MAJOR = int(ipywidgets.__version__.split(".")[0])
#: The text colours the views use, by meaning: the only colours :func:`set_text_color` takes.
PALETTE = {"warning": "#ef6c00", "danger": "#d32f2f", "success": "#2e7d32", "muted": "#808080"}
_CLASS_PREFIX = "nb-accel-"
_BOLD = f"{_CLASS_PREFIX}bold"
_COLOR_CLASSES = {color: f"{_CLASS_PREFIX}{name}" for name, color in PALETTE.items()}
#: The colour each widget was given on ipywidgets 7 (its class says it to the front end).
_colors: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _modern() -> bool:
    return WIDGETS_MAJOR >= 8


# -- widgets ------------------------------------------------------------------------------------

_front_end_ready = False


def ready_front_end() -> None:
    """Make sure the front end can draw this ipywidgets' widgets, before the first is shown:
    Colab draws ipywidgets 7 itself, but ipywidgets 8 only through its custom widget manager,
    which nb_accel turns on once (as ``google.colab.output.enable_custom_widget_manager()``
    does by hand). Nothing elsewhere."""
    global _front_end_ready  # noqa: PLW0603 - once per kernel
    colab = sys.modules.get("google.colab")
    if _front_end_ready or colab is None or not _modern():
        return
    _front_end_ready = True
    output = getattr(colab, "output", None) or sys.modules.get("google.colab.output")
    enable = getattr(output, "enable_custom_widget_manager", None)
    if enable is not None:
        enable()


def stylesheet() -> tuple[Any, ...]:
    """The widgets a view shows once, before the others: on ipywidgets 7 a hidden ``HTML``
    holding the rules of the colour and weight classes; nothing on 8."""
    if _modern():
        return ()
    rules = [f".{_BOLD} {{ font-weight: bold !important; }}"]
    rules += [f".{name} {{ color: {color} !important; }}" for color, name in _COLOR_CLASSES.items()]
    return (
        ipywidgets.HTML(
            "<style>" + "\n".join(rules) + "</style>", layout=ipywidgets.Layout(display="none")
        ),
    )


class _TitledText(ipywidgets.HTML):  # type: ignore[misc]
    """A label with hover text on ipywidgets 7: the text (escaped) in a ``<span title>``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plain = ""
        self.tip: str | None = None
        self._drawn = False

    def show(self, text: str, tip: str | None) -> None:
        if (text, tip) == (self.plain, self.tip) and self._drawn:
            return
        self.plain, self.tip, self._drawn = text, tip, True
        title = f' title="{html.escape(tip)}"' if tip else ""
        self.value = f"<span{title}>{html.escape(text, quote=False)}</span>"


def tip_label(*, bold: bool = False, **kwargs: Any) -> Any:
    """A label whose text can have hover text (:func:`show_text`); ``bold`` text; ``kwargs``
    go to the widget (``layout``)."""
    widget = ipywidgets.Label(**kwargs) if _modern() else _TitledText(**kwargs)
    if bold:
        if _modern():
            widget.style.font_weight = "bold"
        else:
            widget.add_class(_BOLD)
    return widget


def show_text(widget: Any, text: str, tooltip: str | None = None) -> None:
    """Show ``text`` in a :func:`tip_label`, with ``tooltip`` on hover (``None``: none),
    sending only what changed."""
    if isinstance(widget, _TitledText):
        widget.show(text, tooltip)
        return
    if widget.value != text:
        widget.value = text
    set_tooltip(widget, tooltip)


def text_of(widget: Any) -> str:
    """The plain text a label shows (a :func:`tip_label`'s, or any label's ``value``)."""
    return str(widget.plain) if isinstance(widget, _TitledText) else str(widget.value)


def set_tooltip(widget: Any, text: str | None) -> None:
    """Give ``widget`` (a label, a control or a button) ``text`` as hover text."""
    if isinstance(widget, _TitledText):
        widget.show(widget.plain, text)
        return
    name = "tooltip" if _modern() or isinstance(widget, ipywidgets.Button) else None
    if name is None and hasattr(widget, "description_tooltip"):
        name = "description_tooltip"  # ipywidgets 7: shown over the control's description
    if name is not None and getattr(widget, name) != text:
        setattr(widget, name, text)


def tooltip_of(widget: Any) -> str | None:
    """The hover text :func:`set_tooltip` or :func:`show_text` gave ``widget``."""
    if isinstance(widget, _TitledText):
        return widget.tip
    if _modern() or isinstance(widget, ipywidgets.Button):
        return widget.tooltip  # type: ignore[no-any-return]
    return getattr(widget, "description_tooltip", None)


def set_text_color(widget: Any, color: str) -> None:
    """Colour ``widget``'s text with ``color``, one of :data:`PALETTE`'s."""
    if color not in _COLOR_CLASSES:
        raise ValueError(f"{color!r} is not one of the view's colours {sorted(_COLOR_CLASSES)}")
    if _modern():
        if widget.style.text_color != color:
            widget.style.text_color = color
        return
    before = _colors.get(widget)
    if before != color:
        if before is not None:
            widget.remove_class(_COLOR_CLASSES[before])
        widget.add_class(_COLOR_CLASSES[color])
        _colors[widget] = color


def text_color(widget: Any) -> str | None:
    """The colour :func:`set_text_color` gave ``widget`` (``None``: the default)."""
    if _modern():
        return widget.style.text_color or None
    return _colors.get(widget)
