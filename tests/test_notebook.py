"""examples/doc_qa.ipynb, executed against the test suite's vLLM server."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from longctx.testing import LocalServer

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
