"""Option objects drive their own checks, stored form and command-line flags from their fields."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import pytest
from click.testing import CliRunner

from longctx.cli import main
from longctx.cli.flags import flags_of, options_from_flags
from longctx.errors import ConfigError
from longctx.options.fields import OptionFields, option, option_spec
from longctx.options.groups import CorpusOptions, Limits, RequestOptions, ServerOptions


def _positive(name: str, value: Any) -> Any:
    if value is not None and value < 1:
        raise ConfigError(f"{name} must be positive")
    return value


@dataclasses.dataclass(frozen=True)
class WithTopK(RequestOptions):
    """RequestOptions with one more option: the one edit adding an option takes."""

    top_k: int | None = option(
        None, check=_positive, load=int, on_resume=True, flag="--top-k", value_type="int",
        help="Sample from the K likeliest tokens.",
    )  # fmt: skip


def test_a_new_field_is_a_flag_a_check_and_a_stored_key() -> None:
    seen: list[WithTopK] = []

    @click.command()
    @options_from_flags(WithTopK, "request")
    def command(request: WithTopK) -> None:
        seen.append(request)

    runner = CliRunner()
    assert "--top-k INTEGER" in runner.invoke(command, ["--help"]).stdout
    assert "Sample from the K likeliest tokens." in runner.invoke(command, ["--help"]).stdout
    result = runner.invoke(command, ["--top-k", "5", "--max-tokens", "9"])
    assert result.exit_code == 0, result.output
    assert seen == [WithTopK(top_k=5, max_tokens=9)]
    stored = seen[0].to_dict()
    assert stored["top_k"] == 5 and WithTopK.from_dict(stored) == seen[0]
    assert WithTopK.from_dict({"max_tokens": 9}) == WithTopK(max_tokens=9)  # a row from before the field
    assert runner.invoke(command, []).exit_code == 0 and seen[-1] == WithTopK()
    with pytest.raises(ConfigError, match="top_k must be positive"):
        WithTopK(top_k=0)
    assert "top_k" in {flag.parameter for flag in flags_of(WithTopK) if flag.spec.on_resume}


@pytest.mark.parametrize(
    "options",
    [
        RequestOptions(
            max_tokens=7, temperature=0.5, seed=3, cache_salt="tenant", concurrency=2, dispatch="lead",
            reserved_question_tokens=10, extra_body={"top_p": 0.9}, follow_changes=False,
            warm_start=True, counter_check=False, token_history=True, offload_prefix_only=True,
            canary_every=5, prompt_cache_key="k", prompt_ids=False,
        ),
        CorpusOptions(
            ordering="path", include=("*.py",), exclude=("tests/",), limits=Limits(max_files=9),
            allow_secrets=True, max_stale_share=0.5, default_ignores=False, pdf_pages="auto",
            page_image_side=560, image_files=True,
        ),
        ServerOptions(
            base_url=("http://a:1/v1", "http://b:2/v1"), model="m", timeout=9.0, stall_timeout=8.0,
            affinity_headers=("x-a",), replica_retry_seconds=1.0, router_policy="smg:cache_aware",
            affinity_body_fields=("prompt_cache_key",),
        ),
    ],
    ids=lambda options: type(options).__name__,
)  # fmt: skip
def test_the_stored_form_is_every_stored_field_and_reads_back(options: OptionFields) -> None:
    stored = options.to_dict()
    fields = dataclasses.fields(options)  # type: ignore[arg-type]
    assert set(stored) == {field.name for field in fields if option_spec(field).stored}
    assert all(value != getattr(type(options)(), name) for name, value in stored.items()), "set every field"
    assert type(options).from_dict(stored) == options
    assert type(options).from_dict({}) == type(options)()


def test_what_is_not_stored_stays_out_of_the_stored_form() -> None:
    assert "api_key" not in ServerOptions(api_key="secret").to_dict()
    assert "special_tokens" not in CorpusOptions(special_tokens=("<x>",)).to_dict()


def test_every_flag_of_the_option_objects_is_on_the_command_line_as_its_field_says() -> None:
    runner = CliRunner()
    commands = {
        name: runner.invoke(main, [name, "--help"]).stdout for name in ("ask", "batch", "chat", "job")
    }
    wanted = {
        "ask": [*flags_of(ServerOptions), *flags_of(CorpusOptions), *flags_of(RequestOptions)],
        "batch": flags_of(RequestOptions, ["concurrency"]),
        "chat": flags_of(RequestOptions, ["follow_changes", "warm_start", "token_history"]),
        "job": flags_of(RequestOptions, ["concurrency"]),
    }
    every_flagged = {
        flag.path
        for options in (ServerOptions, CorpusOptions, RequestOptions)
        for flag in flags_of(options, _groups(options))
    }
    assert {flag.path for flags in wanted.values() for flag in flags} == every_flagged
    for command, flags in wanted.items():
        for flag in flags:
            assert flag.spec.flag is not None
            assert flag.spec.flag.split("/")[0] in commands[command], (command, flag.spec.flag)
            assert flag.spec.help.format(default=flag.field_default)[:40] in " ".join(
                commands[command].split()
            )


def _groups(options: type[OptionFields]) -> set[str]:
    """Every group of flags ``options`` has, nested options' too."""
    nested = [option_spec(field).nested for field in dataclasses.fields(options)]  # type: ignore[arg-type]
    own = {option_spec(field).group for field in dataclasses.fields(options)}  # type: ignore[arg-type]
    return own.union(*(_groups(inner) for inner in nested if inner is not None))


def test_an_unknown_group_of_flags_is_refused() -> None:
    with pytest.raises(TypeError, match="no flags of group typo"):
        flags_of(RequestOptions, ["typo"])
