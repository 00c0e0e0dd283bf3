"""DiagramEditor: draw the request lifecycle with text boxes, dropdowns and buttons.

    editor = DiagramEditor(save_to="ch04_task1_diagram.json")
    editor                      # shows the editor; the picture redraws after every change

Add states (a name and what the state holds — prompt tokens, KV blocks, a batch slot…),
add transitions (from, to, label), and press **Check my diagram** for the grader's feedback.
Everything the buttons do is also a method (``add_state``, ``add_transition``, …), so the
editor can be driven from Python. With ``save_to`` the diagram is written to a JSON file on
every change and read back when the editor is created again. The diagram is also stored in
the notebook itself: next to the widget the editor shows one small output (mime type
``application/vnd.minillm.diagram+json``) that it rewrites after every change, so a saved
``.ipynb`` submitted alone carries the diagram, and ``minillm grade`` reads it from there
without running anything.

The picture is drawn by Graphviz. Without the ``dot`` program the editor shows the DOT text
and a one-line hint instead; grading never needs the picture.
"""

from __future__ import annotations

import html
import json
import os
import re

import ipywidgets as widgets

from .diagram import Diagram, from_data, render_svg, to_dot
from ..i18n import resolve
from .chapter import current
from .extract import DIAGRAM_MIME
from .messages import msg

MIN_SCALE = 0.8  # the editor's picture never shrinks below this: 11 pt labels stay ~12 px



class DiagramEditor(widgets.VBox):
    """An ipywidgets editor for a state diagram whose states say what they hold."""

    def __init__(self, states: dict | None = None, transitions: list | None = None, *,
                 save_to: str | os.PathLike | None = None, show_check: bool = True, lang: str | None = None):
        self._d = Diagram()
        self.save_to = os.fspath(save_to) if save_to else None
        self.lang = resolve(lang)  # its labels and messages; default: the notebook's (set_language)
        t = self._t
        _pick = self._pick = t("ed.pick")
        choices = current().diagram_notes[self.lang]  # the chapter's notes on what a state holds

        # --- widgets: states ----------------------------------------------------------------
        self.state_name = widgets.Combobox(placeholder=t("ed.name"), options=(),
                                           ensure_option=False, layout=widgets.Layout(width="190px"))
        self.state_holds = widgets.Text(placeholder=t("ed.holds"),
                                        layout=widgets.Layout(width="360px"))
        self.resource_picker = widgets.Dropdown(options=(_pick,) + choices, value=_pick,
                                                layout=widgets.Layout(width="190px"))
        self.add_state_button = widgets.Button(description=t("ed.add_state"), button_style="primary",
                                               icon="plus", layout=widgets.Layout(width="160px"))
        self.remove_state_button = widgets.Button(description=t("ed.remove_state"), icon="trash",
                                                  layout=widgets.Layout(width="130px"))
        # --- widgets: transitions -----------------------------------------------------------
        self.from_state = widgets.Dropdown(options=(), description=t("ed.from"), layout=widgets.Layout(width="190px"))
        self.to_state = widgets.Dropdown(options=(), description=t("ed.to"), layout=widgets.Layout(width="190px"))
        self.edge_label = widgets.Text(placeholder=t("ed.label"),
                                       layout=widgets.Layout(width="230px"))
        self.add_transition_button = widgets.Button(description=t("ed.add_transition"), button_style="primary",
                                                    icon="long-arrow-right", layout=widgets.Layout(width="140px"))
        self.transition_list = widgets.Dropdown(options=(), description=t("ed.edges"),
                                                layout=widgets.Layout(width="330px"))
        self.remove_transition_button = widgets.Button(description=t("ed.remove_transition"), icon="trash",
                                                       layout=widgets.Layout(width="150px"))
        # --- output ---------------------------------------------------------------------------
        self.status = widgets.HTML()
        self.view = widgets.HTML()
        self.check_button = widgets.Button(description=t("ed.check"), icon="check",
                                           layout=widgets.Layout(width="160px"))
        self.result_view = widgets.HTML()

        self.add_state_button.on_click(lambda _: self._on_add_state())
        self.remove_state_button.on_click(lambda _: self._on_remove_state())
        self.add_transition_button.on_click(lambda _: self._on_add_transition())
        self.remove_transition_button.on_click(lambda _: self._on_remove_transition())
        self.check_button.on_click(lambda _: self.check())
        self.resource_picker.observe(self._on_pick_resource, names="value")
        self.state_name.observe(self._on_name_typed, names="value")

        rows = [
            widgets.HTML(t("ed.states_head")),
            widgets.HBox([self.state_name, self.state_holds, self.resource_picker]),
            widgets.HBox([self.add_state_button, self.remove_state_button]),
            widgets.HTML(t("ed.transitions_head")),
            widgets.HBox([self.from_state, self.to_state, self.edge_label, self.add_transition_button]),
            widgets.HBox([self.transition_list, self.remove_transition_button]),
            self.status, self.view,
        ]
        if show_check:
            rows += [self.check_button, self.result_view]
        super().__init__(rows)

        loaded = False
        if self.save_to and os.path.exists(self.save_to) and states is None and transitions is None:
            loaded = self._load(self.save_to)
        if not loaded:
            for name, holds in (states or {}).items():
                self._d.add_state(str(name), str(holds or ""))
            for t in transitions or ():
                src, dst, label = (*t, "") if len(t) == 2 else t
                self._d.add_state(src)
                self._d.add_state(dst)
                self._d.transitions.append((src, dst, label or ""))
        self._refresh(save=False)

    # --- the Python API (the buttons call these) ---------------------------------------------
    def add_state(self, name: str, holds: str = "") -> None:
        """Add a state, or update what an existing state holds."""
        name = (name or "").strip()
        if not name:
            return self._say(self._t("ed.type_name"), error=True)
        holds = (holds or "").strip()
        existed = name in self._d.states
        self._d.states[name] = holds if (holds or not existed) else self._d.states[name]
        self._refresh()
        self._say(self._t("ed.updated" if existed else "ed.added", name=name))

    def remove_state(self, name: str) -> None:
        if name not in self._d.states:
            return self._say(self._t("ed.no_state", name=name), error=True)
        del self._d.states[name]
        self._d.transitions = [t for t in self._d.transitions if name not in t[:2]]
        self._refresh()
        self._say(self._t("ed.removed_state", name=name))

    def set_holds(self, name: str, holds: str) -> None:
        if name not in self._d.states:
            return self._say(self._t("ed.no_state", name=name), error=True)
        self._d.states[name] = (holds or "").strip()
        self._refresh()

    def add_transition(self, src: str, dst: str, label: str = "") -> None:
        if not src or not dst:
            return self._say(self._t("ed.both_ends"), error=True)
        for end in (src, dst):
            if end not in self._d.states:
                return self._say(self._t("ed.add_first", name=end), error=True)
        edge = (src, dst, (label or "").strip())
        if edge in self._d.transitions:
            return self._say(self._t("ed.already", src=src, dst=dst), error=True)
        self._d.transitions.append(edge)
        self._refresh()
        label = (f"（{edge[2]}）" if self.lang == "zh" else f" ({edge[2]})") if edge[2] else ""
        self._say(self._t("ed.added_edge", src=src, dst=dst, label=label))

    def remove_transition(self, edge) -> None:
        """Remove a transition given as its index or as (from, to[, label])."""
        ts = self._d.transitions
        if isinstance(edge, int):
            index = edge if 0 <= edge < len(ts) else None
        else:
            edge = tuple(edge)
            index = next((i for i, t in enumerate(ts) if t[:len(edge)] == edge), None)
        if index is None:
            return self._say(self._t("ed.no_edge", edge=edge), error=True)
        src, dst, _ = ts.pop(index)
        self._refresh()
        self._say(self._t("ed.removed_edge", src=src, dst=dst))

    def clear(self) -> None:
        self._d = Diagram()
        self._refresh()
        self._say(self._t("ed.cleared"))

    def to_data(self) -> dict:
        """The diagram as plain data: {"states": {name: holds}, "transitions": [[from, to, label]]}."""
        return self._d.to_data()

    def to_dot(self) -> str:
        return to_dot(self._d)

    @property
    def diagram(self) -> Diagram:
        return from_data(self.to_data())

    def check(self):
        """Grade the diagram now and show the feedback under the editor; returns the Result."""
        from .registry import check

        result = check(current().diagram_exercise, self, lang=self.lang)
        self.result_view.value = result._repr_html_()
        return result

    # --- button handlers ------------------------------------------------------------------------
    def _on_add_state(self) -> None:
        self.add_state(self.state_name.value, self.state_holds.value)
        if (self.state_name.value or "").strip() in self._d.states:
            self.state_name.value = ""
            self.state_holds.value = ""

    def _on_remove_state(self) -> None:
        self.remove_state((self.state_name.value or "").strip())

    def _on_add_transition(self) -> None:
        before = len(self._d.transitions)
        self.add_transition(self.from_state.value, self.to_state.value, self.edge_label.value)
        if len(self._d.transitions) > before:
            self.edge_label.value = ""

    def _on_remove_transition(self) -> None:
        if self.transition_list.value is None:
            return self._say(self._t("ed.none_selected"), error=True)
        self.remove_transition(self.transition_list.value)

    def _on_pick_resource(self, change) -> None:
        if change["new"] == self._pick:
            return
        current = self.state_holds.value.strip().rstrip(",;，；")
        sep = "，" if self.lang == "zh" else ", "
        self.state_holds.value = f"{current}{sep}{change['new']}" if current else change["new"]
        self.resource_picker.value = self._pick

    def _on_name_typed(self, change) -> None:
        name = (change["new"] or "").strip()
        if name in self._d.states and not self.state_holds.value:
            self.state_holds.value = self._d.states[name]

    # --- stored in the notebook ------------------------------------------------------------------
    def _stored_bundle(self) -> dict:
        data = self.to_data()
        plain = self._t("ed.stored", n=len(data["states"]), m=len(data["transitions"]))
        return {"text/plain": plain, DIAGRAM_MIME: data}

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(super()._repr_mimebundle_(), raw=True)
        self._display_id = getattr(self, "_display_id", None) or f"minillm-diagram-{id(self)}"
        display(self._stored_bundle(), raw=True, display_id=self._display_id)

    def _update_stored(self) -> None:
        if getattr(self, "_display_id", None):
            try:
                from IPython.display import update_display

                update_display(self._stored_bundle(), raw=True, display_id=self._display_id)
            except Exception:  # no front end (plain Python): the JSON file still has it
                pass

    # --- drawing and saving ----------------------------------------------------------------------
    def _t(self, key: str, **fields) -> str:
        return msg(key, getattr(self, "lang", "en"), **fields)

    def _say(self, text: str, error: bool = False) -> None:
        colour = "#cf222e" if error else "#57606a"
        self.status.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

    def _refresh(self, save: bool = True) -> None:
        names = tuple(self._d.states)
        self.state_name.options = names
        for dd in (self.from_state, self.to_state):
            keep = dd.value if dd.value in names else None
            dd.options = names
            dd.value = keep if keep is not None else (names[0] if names else None)
        self.transition_list.options = [(f"{s} → {t}" + (f"  ({lab})" if lab else ""), i)
                                        for i, (s, t, lab) in enumerate(self._d.transitions)]
        self.view.value = self._render()
        if save:
            self._update_stored()
        if save and self.save_to:
            try:
                with open(self.save_to, "w", encoding="utf-8") as f:
                    json.dump(self.to_data(), f, ensure_ascii=False, indent=1)
            except OSError as exc:
                self._say(self._t("ed.cannot_save", path=self.save_to, error=exc), error=True)

    def _render(self) -> str:
        if self._d.empty:
            return f"<i style='color:#57606a'>{html.escape(self._t('ed.empty'))}</i>"
        dot = self.to_dot()
        svg, why = render_svg(dot)
        if svg is not None:
            svg = re.sub(r"^<\?xml[^>]*>\s*(<!DOCTYPE[^>]*>\s*)?", "", svg.strip())
            # shrink to the output's width (height from the aspect ratio), but not below MIN_SCALE of its
            # size: a full lifecycle with notes is ~2000 px wide, and fitted into a notebook its 11 pt text
            # came out ~7 px; past that the box scrolls sideways instead
            m = re.search(r'<svg[^>]* width="([\d.]+)pt"', svg)
            least = f"min-width:{float(m.group(1)) * 4 / 3 * MIN_SCALE:.0f}px;" if m else ""
            svg = svg.replace("<svg", f'<svg style="max-width:100%;{least}height:auto;display:block"', 1)
            return f"<div style='max-width:100%;overflow-x:auto'>{svg}</div>"
        return (f"<div style='color:#9a6700'>{html.escape(why)}</div>"
                f"<pre style='font-size:12px'>{html.escape(dot)}</pre>")

    def _load(self, path: str) -> bool:
        try:
            with open(path, encoding="utf-8") as f:
                self._d = from_data(json.load(f))
            self._d.notes.clear()
            return True
        except (OSError, ValueError) as exc:
            self._d = Diagram()
            self._say(self._t("ed.cannot_read", path=path, error=exc), error=True)
            return False
