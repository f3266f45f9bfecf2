"""Jupyter notebooks (``.ipynb``) to text: cells in order, outputs dropped.

Each cell is rendered after a marker line naming its type, in the
"percent" format editors and jupytext understand::

    # %% [markdown]
    Some prose.

    # %% [code]
    print("hello")

Cells are separated by one blank line; the text ends with a newline when
there is at least one cell. Outputs, execution counts and metadata are
dropped: they change on every run and would break the pack's prefix.
Formats 4 (``cells``) and 3 (``worksheets[].cells``, code in ``input``) are
read.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["NotebookError", "render_notebook"]


class NotebookError(ValueError):
    """The text is not a notebook; the message says why without quoting it."""


def _cell_source(cell: dict[str, Any], index: int) -> str:
    # Format 3 keeps code in "input"; format 4 everywhere in "source".
    source = cell.get("source", cell.get("input", ""))
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        return "".join(source)
    raise NotebookError(f"cell {index + 1}: source is neither a string nor a list of strings")


def _cells(notebook: object) -> list[Any]:
    if not isinstance(notebook, dict):
        raise NotebookError("not a notebook: the top level is not a JSON object")
    cells = notebook.get("cells")
    if cells is None and isinstance(notebook.get("worksheets"), list):
        cells = [
            cell
            for sheet in notebook["worksheets"]
            if isinstance(sheet, dict)
            for cell in sheet.get("cells", [])
        ]
    if not isinstance(cells, list):
        raise NotebookError("not a notebook: no list of cells")
    return cells


def render_notebook(text: str) -> str:
    """Render the notebook JSON ``text`` as described in the module docstring.

    Raises :class:`NotebookError` when ``text`` is not JSON or not shaped
    like a notebook; the message carries the JSON parser's position, never
    the content.
    """
    try:
        notebook = json.loads(text)
    except json.JSONDecodeError as error:
        # str(error) is "<what>: line L column C (char N)", no document text.
        raise NotebookError(f"invalid JSON: {error}") from None
    except RecursionError:
        raise NotebookError("invalid JSON: nested too deeply") from None
    rendered: list[str] = []
    for index, cell in enumerate(_cells(notebook)):
        if not isinstance(cell, dict):
            raise NotebookError(f"cell {index + 1}: not a JSON object")
        cell_type = cell.get("cell_type")
        if not isinstance(cell_type, str) or not cell_type:
            raise NotebookError(f"cell {index + 1}: no cell_type")
        if cell_type == "heading":
            # Format 3 heading cells are markdown headings.
            level = cell.get("level", 1)
            depth = level if isinstance(level, int) and 1 <= level <= 6 else 1
            body = "#" * depth + " " + _cell_source(cell, index)
            cell_type = "markdown"
        else:
            body = _cell_source(cell, index)
        rendered.append(f"# %% [{cell_type}]\n{body.rstrip(chr(10))}\n")
    return "\n".join(rendered)
