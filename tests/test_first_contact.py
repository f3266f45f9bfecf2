"""What a new user hits in the first hour: the small ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from longctx.backends.base import Backend
from longctx.cli import main
from longctx.cli.app import EXIT_BAD_INPUT, EXIT_NO_SESSION, EXIT_USAGE, Runtime
from longctx.cli.sessions import _short_source
from longctx.errors import InputError, OutputError
from longctx.serving.recipes import KIMI_K3_NVFP4
from longctx.sessions import Session
from longctx.sources.corpus import load_corpus
from longctx.store import Store, StoredPack


def test_an_empty_store_says_so_in_sessions_list_and_report() -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["sessions", "list"])
    assert listed.exit_code == 0 and listed.stdout == ""
    assert listed.stderr.startswith("no sessions stored in ")
    reported = runner.invoke(main, ["report"])
    assert reported.exit_code == EXIT_NO_SESSION
    assert "no session is stored yet in " in reported.stderr and "(latest)" not in reported.stderr


def test_a_listing_line_shows_two_paths_and_a_count() -> None:
    here = os.getcwd()
    paths = [os.path.join(here, "docs", f"paper{i}.pdf") for i in range(40)]
    assert _short_source(", ".join(paths)) == "docs/paper0.pdf, docs/paper1.pdf (+38 more)"
    assert _short_source("batch of 4 questions, over a repo") == "batch of 4 questions, over a repo"


def test_ask_json_prints_json_on_failure_too(backend: Backend, tmp_path: Path) -> None:
    (tmp_path / "doc.md").write_text("a document\n")
    result = CliRunner().invoke(
        main,
        ["ask", str(tmp_path / "doc.md"), "hi", "--json", "--max-tokens", "0"],
        obj=Runtime(backend=backend),
    )
    assert result.exit_code == EXIT_USAGE
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "ConfigError" and error["exit_code"] == EXIT_USAGE
    assert "max_tokens must be at least 1" in error["message"]
    assert result.stderr.startswith("longctx: error: --max-tokens:")


def test_recipe_has_the_flag_its_note_names() -> None:
    runner = CliRunner()
    kept = runner.invoke(main, ["recipe", KIMI_K3_NVFP4, "--engine", "sglang", "--gpus", "8"])
    dropped = runner.invoke(
        main, ["recipe", KIMI_K3_NVFP4, "--engine", "sglang", "--gpus", "8", "--no-speculative"]
    )
    assert kept.exit_code == dropped.exit_code == 0, kept.output + dropped.output
    assert "DSPARK" in kept.stdout and "--no-speculative" in kept.stderr
    assert "DSPARK" not in dropped.stdout


def test_a_lossily_decoded_file_is_named_on_the_summary_line(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "good.txt").write_text("fine\n")
    (source / "latin1.txt").write_bytes("naïve café\n".encode() + b"\xff\n")  # UTF-8, one stray byte
    result = CliRunner().invoke(
        main, ["pack", str(source), "--tokenizer", "estimate", "-o", str(tmp_path / "p.txt")]
    )
    assert result.exit_code == 0, result.output
    assert "1 file was not valid UTF-8, decoded with U+FFFD replacements: latin1.txt" in result.stderr


def test_str_of_an_input_error_is_the_line_the_cli_prints(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    try:
        load_corpus(missing)
    except InputError as raised:
        error = raised
    else:
        raise AssertionError("load_corpus of a missing path did not raise")
    assert str(error) == f"{missing}: no such file or folder" == error.describe()
    result = CliRunner().invoke(main, ["pack", str(missing), "--tokenizer", "estimate"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr == f"longctx: error: {error}\n"
    # A message that names its path already is not led by it a second time.
    assert str(OutputError(f"cannot write {missing}", path=missing)) == f"cannot write {missing}"


def test_an_error_about_a_file_with_a_credential_names_the_path_and_not_the_text(tmp_path: Path) -> None:
    # The path leads the message; the file's text (here a credential) appears in no error.
    credential = "AKIA" + "ABCDEFGHIJKLMNOP"
    config = tmp_path / "config.json"
    config.write_text(f'{{"aws_key": "{credential}", ')  # cut short: not valid JSON
    result = CliRunner().invoke(main, ["plan", "--config", str(config), "--gpu-memory", "80"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(config) in result.stderr and credential not in result.output


def test_a_forks_first_answer_is_listed_by_sessions_show_under_its_turn(
    backend: Backend, tmp_path: Path
) -> None:
    pack = StoredPack(
        fingerprint="f" * 64, format_version="test/1", system="sys", prefix="<documents/>\n", summary={}
    )
    store = Store.open(tmp_path / "home")
    session = Session(backend, pack, store=store)
    for question in ("a?", "b?", "c?"):
        session.ask(question)
    answer = session.fork(at=1).ask("b-prime?")
    runtime = Runtime(open_store=lambda: Store.open(tmp_path / "home"))
    shown = CliRunner().invoke(main, ["sessions", "show", answer.session_id], obj=runtime)
    assert shown.exit_code == 0, shown.output
    assert f"[turn {answer.turn + 1}] > b-prime?" in shown.stdout  # numbered from 1, as --json numbers it
    assert f"[turn {answer.turn}] > a?" in shown.stdout
