"""Notebooks: cells rendered in order, outputs dropped, malformed ones reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus_fixtures import NOTEBOOK

from longctx.sources.corpus import load_corpus
from longctx.sources.notebook import NotebookError, render_notebook


def test_cells_are_rendered_in_order_with_markers_and_outputs_dropped() -> None:
    assert render_notebook(NOTEBOOK) == (
        "# %% [markdown]\n# Title\nSome prose.\n\n# %% [code]\nprint('hello')\n\n# %% [raw]\n\n"
    )


def test_format_3_worksheets_are_read() -> None:
    notebook = {
        "nbformat": 3,
        "worksheets": [
            {
                "cells": [
                    {"cell_type": "heading", "level": 2, "source": ["Intro"]},
                    {"cell_type": "code", "input": ["x = 1\n", "x"], "outputs": [{"text": "1"}]},
                ]
            }
        ],
    }
    assert render_notebook(json.dumps(notebook)) == "# %% [markdown]\n## Intro\n\n# %% [code]\nx = 1\nx\n"


def test_an_empty_notebook_renders_as_empty_text() -> None:
    assert render_notebook('{"cells": [], "nbformat": 4}') == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"cells": [', "invalid JSON: Expecting value: line 1 column 12 (char 11)"),
        ("[1, 2]", "not a notebook: the top level is not a JSON object"),
        ('{"nbformat": 4}', "not a notebook: no list of cells"),
        ('{"cells": [42]}', "cell 1: not a JSON object"),
        ('{"cells": [{"source": "x"}]}', "cell 1: no cell_type"),
        (
            '{"cells": [{"cell_type": "code", "source": 7}]}',
            "cell 1: source is neither a string nor a list of strings",
        ),
    ],
)
def test_malformed_notebooks_raise_with_a_message_that_quotes_no_content(text: str, message: str) -> None:
    with pytest.raises(NotebookError) as raised:
        render_notebook(text)
    assert str(raised.value) == message


def test_notebooks_in_a_corpus(tmp_path: Path) -> None:
    (tmp_path / "good.ipynb").write_text(NOTEBOOK)
    (tmp_path / "broken.ipynb").write_text('{"cells": [ {"cell_type": "code", "source": "SECRET-CONTENT"')
    corpus = load_corpus([tmp_path])
    [document] = corpus.documents
    assert document.path == "good.ipynb"
    assert document.kind == "notebook"
    assert "OUTPUT-MUST-NOT-APPEAR" not in document.text
    assert "print('hello')" in document.text
    broken = corpus.manifest.get("broken.ipynb")
    assert broken is not None
    assert (broken.status, broken.reason) == ("skipped", "corrupt")
    assert broken.notes[0].startswith("invalid JSON: Expecting")
    assert "SECRET-CONTENT" not in corpus.manifest.to_json()
