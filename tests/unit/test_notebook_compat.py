"""The seam for ipywidgets 7 and 8 and IPython 7 and 8/9: the same answers on the versions
installed here (the stack lanes run this file on Colab's and Kaggle's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import ipywidgets
import pytest

from nb_accel.notebook import compat_widgets
from nb_accel.notebook.compat_widgets import (
    PALETTE,
    set_text_color,
    set_tooltip,
    show_text,
    stylesheet,
    text_color,
    text_of,
    tip_label,
    tooltip_of,
)


def test_a_tip_label_shows_plain_text_with_hover_text_and_colour() -> None:
    label = tip_label(bold=True)
    show_text(label, "failed: <ValueError> & more", tooltip="the whole story")
    set_text_color(label, PALETTE["danger"])
    assert text_of(label) == "failed: <ValueError> & more"
    assert tooltip_of(label) == "the whole story"
    assert text_color(label) == PALETTE["danger"]
    set_text_color(label, PALETTE["muted"])
    assert text_color(label) == PALETTE["muted"]
    show_text(label, "done")
    assert text_of(label) == "done" and tooltip_of(label) is None
    if compat_widgets.WIDGETS_MAJOR >= 8:
        assert isinstance(label, ipywidgets.Label) and label.style.font_weight == "bold"
    else:  # shown as markup: the text escaped, the hover text a title, one colour class
        show_text(label, "a <b>", tooltip='say "hi"')
        assert label.value == '<span title="say &quot;hi&quot;">a &lt;b&gt;</span>'
        classes = label.get_state()["_dom_classes"]  # what the front end is sent
        assert [c for c in classes if c.startswith("nb-accel-")] == [
            "nb-accel-bold",
            "nb-accel-muted",
        ]


def test_controls_and_buttons_take_hover_text() -> None:
    dropdown = ipywidgets.Dropdown(options=["a"], description="Pick")
    button = ipywidgets.Button(description="Save")
    set_tooltip(dropdown, "pick one")
    set_tooltip(button, "write the file")
    assert tooltip_of(dropdown) == "pick one" and tooltip_of(button) == "write the file"
    trait = "tooltip" if compat_widgets.WIDGETS_MAJOR >= 8 else "description_tooltip"
    assert getattr(dropdown, trait) == "pick one"  # what the front end shows


def test_the_stylesheet_holds_a_rule_for_every_colour_where_traits_cannot_colour() -> None:
    sheets = stylesheet()
    if compat_widgets.WIDGETS_MAJOR >= 8:
        assert sheets == ()
        return
    (sheet,) = sheets
    assert sheet.layout.display == "none"
    for name, color in PALETTE.items():
        assert f".nb-accel-{name} {{ color: {color} !important; }}" in sheet.value
    assert ".nb-accel-bold" in sheet.value


def test_only_the_views_colours_are_taken() -> None:
    with pytest.raises(ValueError, match="not one of the view's colours"):
        set_text_color(ipywidgets.HTML(), "#123456")


#: A kernel-less IPython shell running cells as a notebook would, printing what the seam says.
SHELL_SCRIPT = textwrap.dedent(
    """
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_cell("import nb_accel\\ndef early():\\n    return 1", store_history=True)
    shell.run_cell("def late():\\n    return 2", store_history=True)
    shell.run_cell("x = 3", store_history=True)
    from nb_accel.notebook import compat_shell
    for name in ("early", "late"):
        print(name, compat_shell.cell_label(shell, shell.user_ns[name].__code__.co_filename))
    print("other", compat_shell.cell_label(shell, compat_shell.__file__))
    error = ValueError("boom")
    error.__notes__ = ["Raised on rank 1 of 2"]
    lines = shell.InteractiveTB.structured_traceback(ValueError, error, None, tb_offset=0)
    shown = compat_shell.with_notes(shell, error, lines)
    print("notes", sum("Raised on rank 1 of 2" in line for line in shown))
    path = shell.user_ns["late"].__code__.co_filename
    colored = '  File \\x1b[0;32m"' + path + '"\\x1b[0m, line 2'
    print("named", compat_shell.name_cell_files(shell, [colored])[0].replace("\\x1b", "ESC"))
    """
)


def test_cells_are_named_and_notes_shown_once_on_this_ipython() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SHELL_SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert said["early"] == "('Cell', 'In[1]')"  # cached before nb_accel was imported
    assert said["late"] == "('Cell', 'In[2]')"
    assert said["other"] == "None"
    assert said["notes"] == "1"  # IPython 8 shows notes itself; on 7 the seam adds them
    assert said["named"] == "  ESC[0;32mCell In[2]ESC[0m, line 2"  # as IPython 8 writes it


def test_colab_s_custom_widget_manager_is_turned_on_once_for_ipywidgets_8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Colab's own package exists only there: a stand-in with its one function, counting calls
    calls: list[str] = []
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: calls.append("enabled")  # type: ignore[attr-defined]
    colab = types.ModuleType("google.colab")
    colab.output = output  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    monkeypatch.setattr(compat_widgets, "_front_end_ready", False)
    compat_widgets.ready_front_end()
    compat_widgets.ready_front_end()
    assert calls == (["enabled"] if compat_widgets.WIDGETS_MAJOR >= 8 else [])


def test_nothing_is_turned_on_outside_colab(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(compat_widgets, "_front_end_ready", False)
    compat_widgets.ready_front_end()
    assert compat_widgets._front_end_ready is False
