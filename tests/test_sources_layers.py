"""Layered packs of git repositories: a commit changes the pack's tail, not its prefix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git

from longctx.errors import BudgetError, ConfigError
from longctx.options.groups import CorpusOptions
from longctx.packing import CHANGES_MARKER, Budget, Pack, build_pack, compare_packs
from longctx.sources.corpus import Limits, load_corpus
from longctx.sources.history import LEVELS
from longctx.tokens.tokenizers import EstimateTokenizer

__all__ = ["isolated_git"]  # imported so that it is autouse here

_T0 = 1_700_000_000


def _write(repo: Path, name: str, text: str) -> None:
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(repo, "add", name)


def _history(repo: Path, commits: int) -> Path:
    """A repository of twenty files whose first-parent history has ``commits`` commits.

    The first commit adds every file; each later one appends a line to
    ``notes.md``, the file that keeps changing, as in a maintained project.
    """
    init_repo(repo)
    for number in range(20):
        _write(repo, f"src/module_{number:02d}.py", f"# module {number}\n" + "VALUE = 1\n" * 40)
    _write(repo, "notes.md", "# notes\n")
    commit(repo, "start", when=_T0)
    for number in range(1, commits):
        (repo / "notes.md").write_text((repo / "notes.md").read_text() + f"- change {number}\n")
        git(repo, "add", "notes.md")
        commit(repo, f"change {number}", when=_T0 + 100 * number)
    return repo


def _commit_edit(repo: Path, name: str, text: str, when: int) -> None:
    _write(repo, name, text)
    commit(repo, f"edit {name}", when=when)


def _pack(repo: Path, options: CorpusOptions | None = None) -> Pack:
    return build_pack(load_corpus(repo, options))


def _survives(old: Pack, new: Pack) -> bool:
    """True when everything of ``old`` before its listing is a prefix of ``new``."""
    old_documents = "".join(section.text for section in old.sections[:-2])
    return (new.system + new.prefix).startswith(old.system + old_documents.removeprefix(old.system))


def test_an_edit_to_an_old_file_keeps_the_prefix(tmp_path: Path) -> None:
    # Commits are numbered from 1: commit 1 is the base of commits 1 to 16,
    # and since it notes.md changed.
    repo = _history(tmp_path / "repo", 6)
    before = _pack(repo)
    _commit_edit(repo, "src/module_00.py", "# module 0, rewritten\n", _T0 + 10_000)

    after = _pack(repo)

    assert _survives(before, after)
    comparison = compare_packs(before, after)
    assert comparison.first_difference == "document:src/module_00.py"
    assert comparison.surviving_sections == len(before.sections) - 2  # all but the listing and boundary
    names = [section.name for section in after.sections]
    # The base's copy stays where the base put it; the current copy follows the marker.
    assert "earlier:src/module_00.py" in names
    assert (
        names.index("earlier:src/module_00.py")
        < names.index("changes")
        < names.index("document:src/module_00.py")
    )
    assert after.section("changes").text == CHANGES_MARKER
    assert "rewritten" in after.section("document:src/module_00.py").text
    assert "rewritten" not in after.section("earlier:src/module_00.py").text
    # The listing and the documents are the current files, once each.
    assert [section.path for section in after.documents].count("src/module_00.py") == 1
    assert after.section("listing").text.count("module_00.py") == 1


def test_without_layering_the_same_edit_breaks_the_prefix_at_the_old_file(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    before = _pack(repo, CorpusOptions(max_stale_share=0))
    _commit_edit(repo, "src/module_00.py", "# module 0, rewritten\n", _T0 + 10_000)

    after = _pack(repo, CorpusOptions(max_stale_share=0))

    assert not _survives(before, after)
    assert not any(section.name.startswith(("earlier:", "changes")) for section in after.sections)
    # module_00.py was the first document (the oldest files, by path): only
    # the header and the opening survive.
    assert compare_packs(before, after).surviving_sections == 2


def test_a_deleted_file_keeps_its_earlier_copy_and_leaves_the_listing(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    before = _pack(repo)
    git(repo, "rm", "-q", "src/module_03.py")
    commit(repo, "remove module 3", when=_T0 + 10_000)

    after = _pack(repo)

    assert _survives(before, after)
    assert "earlier:src/module_03.py" in [section.name for section in after.sections]
    assert "module_03.py" not in after.section("listing").text
    corpus = load_corpus(repo)
    assert corpus.manifest.get("src/module_03.py") is None


def test_work_tree_edits_are_changes_too(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    before = _pack(repo)
    (repo / "src" / "module_01.py").write_text("# edited, not committed\n")

    after = _pack(repo)

    assert _survives(before, after)
    corpus = load_corpus(repo)
    edited = [document for document in corpus.documents if document.path == "src/module_01.py"]
    assert [(document.earlier, document.layer, document.dirty) for document in edited] == [
        (True, 0, False),
        (False, 1, True),
    ]


def test_the_base_is_a_function_of_history_so_clones_pack_the_same_bytes(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 7)
    _commit_edit(repo, "src/module_05.py", "# five\n", _T0 + 10_000)
    clone = tmp_path / "elsewhere" / "clone"
    clone.parent.mkdir()
    git(tmp_path, "clone", "-q", str(repo), str(clone))

    original, cloned = load_corpus(repo), load_corpus(clone)

    assert original.layer_base is not None
    assert original.layer_base == cloned.layer_base
    assert build_pack(original).prefix == build_pack(cloned).prefix


def test_at_a_base_commit_the_pack_is_the_plain_stability_pack(tmp_path: Path) -> None:
    # Commit 1 + 16 is a base at every level: nothing changed since it.
    repo = _history(tmp_path / "repo", 1 + LEVELS[0])
    corpus = load_corpus(repo)

    assert corpus.layer_base is None
    assert _pack(repo).prefix == _pack(repo, CorpusOptions(max_stale_share=0)).prefix


def test_a_change_too_large_for_the_share_falls_back_to_a_nearer_base(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)  # level 4's base is commit 5, level 1's is HEAD (commit 6)
    for number in range(20):
        _write(repo, f"src/module_{number:02d}.py", f"# module {number} rewritten\n")
    commit(repo, "rewrite everything", when=_T0 + 10_000)  # commit 7: level 4's base is still 5
    (repo / "notes.md").write_text("work in progress\n")

    layered = load_corpus(repo)

    # Every module changed since commit 1 (level 16) and commit 5 (level 4):
    # far more than a fifth of the bytes either way. Commit 7 itself is the
    # base (level 1), and only the work-tree edit is a change.
    assert layered.layer_base == git(repo, "rev-parse", "HEAD").strip()
    earlier = [document.path for document in layered.documents if document.earlier]
    assert earlier == ["notes.md"]


def test_secrets_in_an_earlier_copy_are_not_packed(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    key = "AKIA" + "Q" * 16
    _write(repo, "src/app.py", "print('hello')\n" * 50)
    _write(repo, "src/config.py", f"AWS_ACCESS_KEY_ID = '{key}'\n")
    commit(repo, "start", when=_T0)  # the base of the next commits
    _commit_edit(repo, "src/config.py", "AWS_ACCESS_KEY_ID = None\n", _T0 + 100)

    corpus = load_corpus(repo)
    pack = build_pack(corpus)

    assert corpus.layer_base is not None
    assert key not in pack.prefix
    assert "AWS_ACCESS_KEY_ID = None" in pack.prefix
    assert not any(document.earlier for document in corpus.documents)


def test_max_stale_share_is_checked(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 2)
    for bad in (-0.1, 1, 1.5, True, "0.2"):
        with pytest.raises(ConfigError, match="max_stale_share"):
            load_corpus(repo, CorpusOptions(max_stale_share=bad))  # type: ignore[arg-type]


def test_a_folder_of_a_repository_is_layered_within_the_folder(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    _commit_edit(repo, "src/module_02.py", "# two\n", _T0 + 10_000)
    _commit_edit(repo, "notes.md", "outside the folder\n", _T0 + 10_100)

    corpus = load_corpus(repo / "src")

    assert corpus.layer_base is not None
    assert [document.path for document in corpus.documents if document.earlier] == ["module_02.py"]
    assert all(not document.path.startswith("notes") for document in corpus.documents)


def test_a_copy_of_the_repository_without_history_is_not_layered(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    plain = tmp_path / "plain"
    shutil.copytree(repo, plain, ignore=shutil.ignore_patterns(".git"))

    assert load_corpus(plain).layer_base is None


def test_an_excluded_file_has_no_earlier_copy_and_one_manifest_entry(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    _commit_edit(repo, "src/module_04.py", "# four\n", _T0 + 10_000)

    corpus = load_corpus(repo, CorpusOptions(exclude=["src/module_04.py"]))

    assert corpus.layer_base is not None
    assert all(document.path != "src/module_04.py" for document in corpus.documents)
    assert [entry.path for entry in corpus.manifest if entry.path == "src/module_04.py"] == [
        "src/module_04.py"
    ]
    assert corpus.manifest.get("src/module_04.py").reason == "excluded-by-glob"  # type: ignore[union-attr]


def test_earlier_copies_count_towards_the_size_limit(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    _commit_edit(repo, "src/module_00.py", "# zero\n", _T0 + 10_000)
    full = load_corpus(repo)
    packed = sum(document.size_bytes for document in full.documents)

    limited = load_corpus(repo, CorpusOptions(limits=Limits(max_total_bytes=packed - 1)))

    # The last document no longer fits: the limited corpus is a prefix of the full one.
    assert [d.path for d in limited.documents] == [d.path for d in full.documents][: len(limited.documents)]
    assert len(limited.documents) == len(full.documents) - 1
    assert limited.manifest.get(full.documents[-1].path).reason == "total-size-limit"  # type: ignore[union-attr]


def test_an_over_budget_layered_pack_names_its_earlier_copies(tmp_path: Path) -> None:
    repo = _history(tmp_path / "repo", 6)
    _commit_edit(repo, "src/module_00.py", "# zero\n", _T0 + 10_000)
    corpus = load_corpus(repo)
    pack = build_pack(corpus, tokenizer=EstimateTokenizer())
    earlier = sum(section.tokens or 0 for section in pack.earlier_copies)
    assert pack.to_dict()["earlier_copy_count"] == len(pack.earlier_copies) == 2  # notes.md, module_00.py

    with pytest.raises(BudgetError, match=f"Of these, {earlier:,} are earlier copies") as raised:
        build_pack(
            corpus, budget=Budget(context_length=1000, reserved_output_tokens=10, reserved_question_tokens=10)
        )

    assert raised.value.total_tokens == pack.total_tokens
    plain = load_corpus(repo, CorpusOptions(max_stale_share=0))
    with pytest.raises(BudgetError) as plain_raised:
        build_pack(
            plain, budget=Budget(context_length=1000, reserved_output_tokens=10, reserved_question_tokens=10)
        )
    assert "earlier copies" not in str(plain_raised.value)


def test_the_pack_line_says_which_base_and_why_a_coarser_one_was_passed_over(tmp_path: Path) -> None:
    from longctx.packing import pack

    repo = _history(tmp_path / "repo", 6)
    for number in range(20):
        _write(repo, f"src/module_{number:02d}.py", f"# module {number} rewritten\n")
    commit(repo, "rewrite everything", when=_T0 + 10_000)
    (repo / "notes.md").write_text("work in progress\n")

    result = pack(repo, reuse=False)
    line = result.summary_line()
    head = git(repo, "rev-parse", "HEAD").strip()
    assert f"layered on base {head[:12]} (every " in line  # HEAD is the base of levels 2 and 1 here
    assert "1 file(s) changed since" in line and "1 earlier copy" in line
    # The coarsest base was passed over: its share, the limit, the cost and the way out.
    base_16 = git(repo, "rev-list", "--max-parents=0", "HEAD").strip()
    assert f"base {base_16[:12]} (every 16 commits) was passed over" in line
    assert "over max_stale_share 20%" in line and "cached prefix is lost once" in line
    assert "--max-stale-share" in line
    assert result.to_dict()["layers"] == result.layer_note


def test_the_pack_line_says_when_layering_is_off_and_says_nothing_for_a_plain_first_pack(
    tmp_path: Path,
) -> None:
    from longctx.packing import pack

    repo = _history(tmp_path / "repo", 1)
    assert pack(repo, reuse=False).layer_note is None
    off = pack(repo, CorpusOptions(max_stale_share=0), reuse=False)
    assert off.layer_note is not None and "layering off" in off.summary_line()
