"""What a rank shows besides text: ``display()``, IPython's display tools and a cell's rich last
value, sent to the kernel as plain MIME bundles.

A rank has no kernel of its own, so the notebook tools that expect one (IPython's ``display`` and
``clear_output``, ``tqdm.notebook``, widgets) are routed here to act in the cell, per rank.
"""

from __future__ import annotations

import base64
import importlib.abc
import importlib.machinery
import io
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from distlab.i18n import tr
from distlab.protocol import Display
from distlab.rank_io import CapturedOutput, Send

current_display: RankDisplay | None = None  # the rank's display(), once the rank is up


_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def mime_bundle(obj: Any) -> tuple[dict[str, object], dict[str, object]]:
    """The richest representations of ``obj`` that a notebook can show, without IPython, as plain
    values: the kernel reads a message only when everything in it is a builtin type, and a
    ``_repr_html_`` may well return a numpy string. A widget's view is left out: its model lives on
    the rank, where no browser can reach it, and JupyterLab would show "model not found"."""
    data, metadata = _mime_bundle(obj)
    if data.pop(_WIDGET_VIEW, None) is not None:
        data["text/plain"] = f"{data['text/plain']}\n" + tr(
            "(a widget on a rank cannot reach the browser: show widgets in a normal cell, "
            "and bring values over with %dist_pull)")
    return _plain(data), _plain(metadata)


def _plain(value: Any) -> Any:
    """``value`` with builtin types only (JSON's, as a notebook stores them)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    for convert, sign in ((int, "__index__"), (float, "__float__")):  # numpy's and torch's scalars
        if isinstance(value, convert) or hasattr(value, sign):
            try:
                return convert(value)
            except (TypeError, ValueError, OverflowError):
                pass
    return str(value)


def _mime_bundle(obj: Any) -> tuple[dict[str, object], dict[str, object]]:
    data: dict[str, object] = {"text/plain": repr(obj)}
    metadata: dict[str, object] = {}
    if type(obj).__module__.startswith("matplotlib") and hasattr(obj, "savefig"):
        buffer = io.BytesIO()
        obj.savefig(buffer, format="png", bbox_inches="tight")
        data["image/png"] = base64.b64encode(buffer.getvalue()).decode()
        return data, metadata
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(bundle):
        result = bundle()
        if isinstance(result, tuple):
            result, metadata = result
        data.update(result or {})
        return data, metadata
    for mime, method in (
        ("text/html", "_repr_html_"), ("image/svg+xml", "_repr_svg_"), ("text/markdown", "_repr_markdown_"),
        ("text/latex", "_repr_latex_"), ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"),
        ("application/json", "_repr_json_"),
    ):
        render = getattr(obj, method, None)
        value = render() if callable(render) else None
        if isinstance(value, tuple) and len(value) == 2:  # (data, metadata), as IPython's Image gives
            value, metadata[mime] = value
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        if value is not None:
            data[mime] = value
    return data, metadata


class RankDisplay:
    """A rank's ``display()``: shows objects (figures, HTML, anything with a repr) in the cell,
    labelled by rank, and takes IPython's arguments. Every output gets an id, so that
    ``handle.update``, ``update_display`` and ``clear_output`` act on this rank's outputs in
    place. ``clear_output`` clears what this rank displayed, never another rank's output nor
    printed lines: a loop of ``clear_output(wait=True); display(fig)`` is one live picture per rank.
    """

    def __init__(self, rank: int, send: Send, output: CapturedOutput) -> None:
        self._rank, self._send, self._output = rank, send, output
        self._token = os.urandom(4).hex()  # ids stay unique when a rank is restarted
        self._count = 0
        self._shown: list[str] = []     # ids this rank displayed in this cell
        self._reusable: list[str] = []  # cleared with wait=True: the next display takes their place

    def new_task(self) -> None:
        """A cell clears only what it displayed itself."""
        self._shown, self._reusable = [], []

    def __call__(self, *objs: Any, raw: bool = False, metadata: dict[str, object] | None = None,
                 display_id: Any = None, update: bool = False, clear: bool = False,
                 **_options: Any) -> DisplayHandle | None:
        if clear:
            self.clear_output(wait=True)
        if update and not display_id:
            raise TypeError("display_id required for update_display")
        if display_id is True:
            display_id = self._new_id()
        self._output.sync()
        for obj in objs:
            data, extra = (_plain(obj), {}) if raw and isinstance(obj, dict) else mime_bundle(obj)
            extra = {**extra, **_plain(metadata or {})}
            if update:
                self._send(Display(self._rank, data, extra, display_id=str(display_id), update=True))
            else:
                self._show(data, extra, str(display_id) if display_id is not None else None)
        return DisplayHandle(self, str(display_id)) if display_id else None

    def clear_output(self, wait: bool = False) -> None:
        """Clear this rank's displays in this cell: now, or (``wait``) when it next displays."""
        self._reusable += self._shown
        self._shown = []
        if not wait:
            self._blank(self._reusable)
            self._reusable = []

    def _show(self, data: dict[str, object], metadata: dict[str, object], display_id: str | None) -> None:
        cleared, self._reusable = self._reusable, []  # what clear_output(wait=True) left to clear
        place = next((i for i in cleared if i.startswith(self._token)), None) if display_id is None else None
        if place is not None:  # shown where the cleared output was (an id of the learner's keeps its own)
            display_id = place
            self._send(Display(self._rank, data, metadata, display_id=display_id, update=True))
        else:
            display_id = display_id or self._new_id()
            self._send(Display(self._rank, data, metadata, display_id=display_id))
        self._blank([i for i in cleared if i != display_id])
        self._shown.append(display_id)

    def _blank(self, display_ids: list[str]) -> None:
        for display_id in display_ids:
            self._send(Display(self._rank, {"text/plain": ""}, {}, display_id=display_id, update=True))

    def _new_id(self) -> str:
        self._count += 1
        return f"{self._token}-{self._count}"


class DisplayHandle:
    """What ``display(..., display_id=True)`` returns on a rank, as IPython's handle does."""

    def __init__(self, display: RankDisplay, display_id: str) -> None:
        self._display = display
        self.display_id = display_id

    def __repr__(self) -> str:
        return f"<DisplayHandle display_id={self.display_id}>"

    def display(self, obj: Any, **options: Any) -> None:
        self._display(obj, display_id=self.display_id, **options)

    def update(self, obj: Any, **options: Any) -> None:
        self._display(obj, display_id=self.display_id, update=True, **options)


def show_value(value: Any) -> None:
    """A cell's last value: printed when text is all it has (a tensor, a number), as the labelled
    line it always was; shown richly when it has more (a DataFrame's table, HTML, an image)."""
    data, metadata = mime_bundle(value)
    if set(data) == {"text/plain"} or current_display is None:
        print(data["text/plain"])
    else:  # the bundle made above, not a second one (repr and _repr_html_ may be costly)
        current_display(data, raw=True, metadata=metadata)


def route_notebook_tools() -> None:
    """Notebook tools that, on a rank with no kernel around them, would not show in the cell, are
    routed to the rank's own, now or whenever they are first imported (importing them here would
    add their import time to every cold start):

    - ``from IPython.display import display, HTML``: IPython prints ``<IPython.core.display.HTML
      object>``; its ``display`` and ``clear_output`` become the rank's, which act in the cell.
    - ``from tqdm.notebook import tqdm``: a widget bar, which no browser can reach from a rank, so it
      never moved; it becomes tqdm's text bar, which the cell shows as one live line per rank.
    """
    for name, route in _ROUTES.items():
        module = sys.modules.get(name)
        if module is not None:
            route(module)
    if not any(isinstance(finder, _RouteOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RouteOnImport())


def _route_display(module: types.ModuleType) -> None:
    module.display = _display_for_ipython  # type: ignore[attr-defined]
    module.clear_output = _clear_output_for_ipython  # type: ignore[attr-defined]


def _route_tqdm(module: types.ModuleType) -> None:
    from tqdm import std

    module.tqdm = module.tqdm_notebook = std.tqdm  # type: ignore[attr-defined]
    module.trange = module.tnrange = std.trange  # type: ignore[attr-defined]


_ROUTES: dict[str, Callable[[types.ModuleType], None]] = {
    "IPython.core.display_functions": _route_display,  # before IPython.display copies the names
    "tqdm.notebook": _route_tqdm,
}


def _display_for_ipython(*objs: Any, **options: Any) -> Any:
    if current_display is None:
        print(*(repr(obj) for obj in objs))
        return None
    return current_display(*objs, **options)


def _clear_output_for_ipython(wait: bool = False) -> None:
    """IPython's ``clear_output`` without a kernel writes terminal escape codes into the output."""
    if current_display is not None:
        current_display.clear_output(wait)


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Finds a module of ``_ROUTES`` with the other finders, and routes it as soon as it has run,
    before any other module copies its names."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        route = _ROUTES.get(fullname)
        if route is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = _then_route(spec.loader.exec_module, route)  # type: ignore[method-assign,assignment]
                return spec
        return None


def _then_route(run: Callable[[types.ModuleType], None],
                route: Callable[[types.ModuleType], None]) -> Callable[[types.ModuleType], None]:
    def exec_module(module: types.ModuleType) -> None:
        run(module)
        route(module)

    return exec_module
