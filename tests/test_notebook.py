"""The example notebooks (doc_qa, typed_records), executed against the test suite's vLLM server."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from engine_helpers import whitespace_ban
from nbclient import NotebookClient

from longctx.testing import EngineHarness, LocalServer

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "doc_qa.ipynb"


def test_the_document_qa_notebook_runs_and_shows_the_report(
    vllm_server: LocalServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LONGCTX_BASE_URL", vllm_server.api_base)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel inherits this environment: the server above and the test's LONGCTX_HOME.
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    ]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    html = "".join(output.get("data", {}).get("text/html", "") for output in outputs)
    assert "longctx-report" in html and "hit rate" in html
    text = "".join(output.get("text", "") for output in outputs)
    assert "cached" in text
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert images, "report.plot() drew no chart"


TYPED = Path(__file__).resolve().parent.parent / "examples" / "typed_records.ipynb"


def test_the_typed_records_notebook_extracts_validated_records_from_pdfs(
    vllm_server: LocalServer, longctx_harness: EngineHarness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LONGCTX_BASE_URL", vllm_server.api_base)
    # The tiny random-weight model fills constrained JSON with whitespace: banned (a real model needs none).
    monkeypatch.setenv("LONGCTX_EXAMPLE_EXTRA_BODY", json.dumps(whitespace_ban(longctx_harness.model())))
    notebook = nbformat.read(TYPED, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()

    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    ]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    text = "".join(output.get("text", "") for output in outputs)
    results = "".join(output.get("data", {}).get("text/plain", "") for output in outputs)
    assert "['Contract', 'Contract', 'Contract']" in results  # each record validated into the model
    assert '"contracts": [' in text
    assert "cut at max_tokens" in text and "finish_reason length" in text
    html = "".join(output.get("data", {}).get("text/html", "") for output in outputs)
    assert "longctx-report" in html
