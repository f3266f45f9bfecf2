"""A logged request as the tokens the server would cache, and the text they came from.

Exact, never estimated: the served model's own tokenizer and chat template.

- :class:`ServerRenderer`: the server's tokenize route (the engine profile's),
  chat requests with ``messages`` (and ``tools``) through its chat template,
  completions prompts as the completions route tokenizes them.
- :class:`ModelFolderRenderer`: a model folder offline: its ``tokenizer.json``
  (or ``tiktoken.model``) and the chat template of ``tokenizer_config.json``
  or ``chat_template.jinja``, rendered with jinja2 (the one jinja2 import;
  an optional package, like ``tokenizers``).

Beside the tokens, each request has a plain *text form* (``Rendered.text``):
its messages one after another, each opened by its role, so that a break
found at a token offset can be shown and classified as text. The text form
is never tokenized.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from longctx.backends.tokenizer import ServerTokenizer
from longctx.errors import BackendError, TokenizerError
from longctx.lint.logs import LoggedRequest, message_text
from longctx.recordtypes import record_type
from longctx.tokens import tokenizer_from_model_dir

__all__ = ["ModelFolderRenderer", "Rendered", "Renderer", "ServerRenderer", "Span", "render", "text_form"]


@record_type
class Span:
    """Where one part of a request (``tools``, ``system``, message 2...) sits in its text form."""

    name: str
    role: str
    start: int
    end: int
    message_index: int | None


@record_type
class Rendered:
    """A request's token ids as the server makes them, its text form and the spans of its parts."""

    tokens: tuple[int, ...]
    text: str
    spans: tuple[Span, ...]

    def span_at(self, offset: int) -> Span | None:
        """The part of the text form holding character ``offset`` (the last part past the end)."""
        for span in self.spans:
            if span.start <= offset < span.end:
                return span
        return self.spans[-1] if self.spans else None


class Renderer(Protocol):
    """Turns a logged request into the token ids the server would see."""

    @property
    def identity(self) -> str: ...

    def tokens(self, request: LoggedRequest) -> list[int]: ...


def text_form(request: LoggedRequest) -> tuple[str, tuple[Span, ...]]:
    """The request's text form and its parts' spans (see the module docstring)."""
    pieces: list[str] = []
    spans: list[Span] = []
    position = 0

    def add(name: str, role: str, text: str, index: int | None) -> None:
        nonlocal position
        header = f"[{name}]\n"
        pieces.append(header + text + "\n")
        spans.append(Span(name, role, position + len(header), position + len(header) + len(text), index))
        position += len(header) + len(text) + 1

    if request.tools:
        add("tools", "tools", json.dumps(list(request.tools), ensure_ascii=False), None)
    if request.kind == "completions":
        prompt = request.prompt
        add("prompt", "prompt", prompt if isinstance(prompt, str) else " ".join(map(str, prompt or ())), None)
    for index, message in enumerate(request.messages):
        role = str(message.get("role", "?"))
        add(f"message {index} ({role})", role, message_text(message), index)
    return "".join(pieces), tuple(spans)


def render(renderer: Renderer, request: LoggedRequest) -> Rendered:
    """``request`` through ``renderer``, with its text form."""
    text, spans = text_form(request)
    return Rendered(tuple(renderer.tokens(request)), text, spans)


class ServerRenderer:
    """Token ids from the server's own tokenize route, through its chat template for chat requests."""

    def __init__(self, tokenizer: ServerTokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def identity(self) -> str:
        return self.tokenizer.identity

    def tokens(self, request: LoggedRequest) -> list[int]:
        if request.kind == "completions":
            if isinstance(request.prompt, tuple):
                return list(request.prompt)
            body: dict[str, Any] = {"prompt": request.prompt or ""}
        else:
            body = {
                "messages": [dict(message) for message in request.messages],
                "add_generation_prompt": True,
            }
            if request.tools:
                body["tools"] = [dict(tool) for tool in request.tools]
        path = self.tokenizer.profile.tokenize_path
        assert path is not None  # a ServerTokenizer exists only for a profile with a tokenize route
        try:
            answer = self.tokenizer.endpoint.post_json(path, {"model": self.tokenizer.model, **body})
        except BackendError as error:
            raise TokenizerError(f"the server could not tokenize request {request.label}: {error}") from error
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise TokenizerError(f"the tokenize route answered no tokens for request {request.label}")
        return [int(token) for token in tokens]


class ModelFolderRenderer:
    """Token ids offline, from a model folder's tokenizer and chat template."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise TokenizerError(f"{self.folder} is not a model folder")
        self._tokenizer = tokenizer_from_model_dir(self.folder)
        self._config = _tokenizer_config(self.folder)
        self._template: Any = None

    @property
    def identity(self) -> str:
        return self._tokenizer.identity

    def tokens(self, request: LoggedRequest) -> list[int]:
        if request.kind == "completions":
            if isinstance(request.prompt, tuple):
                return list(request.prompt)
            return self._bos() + self._tokenizer.encode(request.prompt or "")
        return self._tokenizer.encode(self.chat_text(request.messages, request.tools))

    def chat_text(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> str:
        """The messages through the folder's chat template, with the generation prompt."""
        template = self._compiled()
        arguments: dict[str, Any] = {
            "messages": [dict(message) for message in messages],
            "add_generation_prompt": True,
            "bos_token": _token_text(self._config.get("bos_token")),
            "eos_token": _token_text(self._config.get("eos_token")),
        }
        if tools:
            arguments["tools"] = [dict(tool) for tool in tools]
        try:
            return str(template.render(**arguments))
        except Exception as error:
            raise TokenizerError(f"the chat template of {self.folder} failed: {error}") from error

    def _bos(self) -> list[int]:
        bos = _token_text(self._config.get("bos_token"))
        if not bos or self._config.get("add_bos_token") is False:
            return []
        return self._tokenizer.encode(bos)

    def _compiled(self) -> Any:
        if self._template is not None:
            return self._template
        source = self._config.get("chat_template")
        standalone = self.folder / "chat_template.jinja"
        if not isinstance(source, str) and standalone.is_file():
            source = standalone.read_text(encoding="utf-8")
        if isinstance(source, list):  # named templates: the default one
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        if not isinstance(source, str):
            raise TokenizerError(
                f"{self.folder} has no chat template (tokenizer_config.json, chat_template.jinja)"
            )
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment  # optional: chat logs offline only
        except ImportError as error:
            raise TokenizerError(
                "rendering a chat template offline needs the optional 'jinja2' package "
                "(pip install 'longctx-sdk[lint]'), or tokenize with the server (--server)"
            ) from error

        def raise_exception(message: str) -> None:
            raise TokenizerError(f"the chat template refused the request: {message}")

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = time.strftime
        environment.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, ensure_ascii=False, indent=indent
        )
        self._template = environment.from_string(source)
        return self._template


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TokenizerError(f"cannot read {path}: {error}") from error
    return loaded if isinstance(loaded, dict) else {}


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""
