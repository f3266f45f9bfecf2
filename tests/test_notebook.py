"""The example notebooks (doc_qa, typed_records, scanned_pdf), executed against the suite's vLLM servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from engine_helpers import whitespace_ban
from nbclient import NotebookClient

from longctx.testing import EngineHarness, LocalServer

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "doc_qa.ipynb"


def executed(path: Path, folder: Path) -> list[dict[str, Any]]:
    """Every output of ``path``'s code cells, run in ``folder``; a cell that raised fails the test.

    The kernel inherits this environment: the server the test set and its LONGCTX_HOME.
    """
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    ]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    return outputs


def test_the_document_qa_notebook_runs_and_shows_the_report(
    vllm_server: LocalServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LONGCTX_BASE_URL", vllm_server.api_base)
    outputs = executed(NOTEBOOK, tmp_path)
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
    outputs = executed(TYPED, tmp_path)
    text = "".join(output.get("text", "") for output in outputs)
    results = "".join(output.get("data", {}).get("text/plain", "") for output in outputs)
    assert "['Contract', 'Contract', 'Contract']" in results  # each record validated into the model
    assert '"contracts": [' in text
    assert "cut at max_tokens" in text and "finish_reason length" in text
    html = "".join(output.get("data", {}).get("text/html", "") for output in outputs)
    assert "longctx-report" in html


SCANNED = Path(__file__).resolve().parent.parent / "examples" / "scanned_pdf.ipynb"


def test_the_scanned_pdf_notebook_sends_its_page_as_an_image_and_reads_it_from_the_cache(
    vllm_vision_server: LocalServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LONGCTX_BASE_URL", vllm_vision_server.api_base)
    monkeypatch.setenv("LONGCTX_EXAMPLE_PAGE_SIDE", "448")  # about 200 image tokens: fast on a CPU
    outputs = executed(SCANNED, tmp_path)
    text = "".join(output.get("text", "") for output in outputs)
    assert "invoice.pdf: page 1: sent as an image (no usable text layer: no text layer" in text
    assert "(counted by the server (" in text
    image_tokens = int(text.split("1 image(s): ")[1].split()[0].replace(",", ""))
    assert "text: the prompt holds images (token ids cannot carry them)" in text
    cached = [
        int(line.split()[1].replace(",", "")) for line in text.splitlines() if line.startswith("  cached ")
    ]
    assert len(cached) == 2 and cached[1] > image_tokens  # the second question: past the image
    html = "".join(output.get("data", {}).get("text/html", "") for output in outputs)
    assert "longctx-report" in html
