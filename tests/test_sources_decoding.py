"""Binary detection from content, text decoding and line endings."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longctx.sources.decoding import decode_text, looks_binary, normalise_newlines


@pytest.mark.parametrize(
    ("data", "binary"),
    [
        (b"", False),
        (b"plain text\n", False),
        (b"tab\tand form feed\x0c and escape \x1b[31mred\x1b[0m\n", False),
        (b"a\x00b", True),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", True),
        (bytes(range(1, 32)) * 10, True),  # control bytes, no NUL
        (b"caf\xe9 latin-1 text\n", False),
        (codecs.BOM_UTF16_LE + "hi".encode("utf-16-le"), False),  # NUL bytes, but a BOM says UTF-16
        (codecs.BOM_UTF16_BE + "hi".encode("utf-16-be"), False),
        (codecs.BOM_UTF32_LE + "hi".encode("utf-32-le"), False),
        (codecs.BOM_UTF8 + b"\x00binary after a UTF-8 BOM", True),
    ],
)
def test_binary_detection_looks_at_content(data: bytes, binary: bool) -> None:
    assert looks_binary(data) is binary


def test_a_nul_byte_after_the_first_8_kib_does_not_make_a_file_binary() -> None:
    assert looks_binary(b"x" * 8192 + b"\x00") is False
    assert looks_binary(b"x" * 8191 + b"\x00") is True


@pytest.mark.parametrize(
    ("data", "text", "encoding", "lossy"),
    [
        (b"hello\n", "hello\n", "utf-8", False),
        ("héllo".encode(), "héllo", "utf-8", False),
        (codecs.BOM_UTF8 + "héllo".encode(), "héllo", "utf-8-sig", False),
        (codecs.BOM_UTF16_LE + "héllo €".encode("utf-16-le"), "héllo €", "utf-16-le", False),
        (codecs.BOM_UTF16_BE + "héllo €".encode("utf-16-be"), "héllo €", "utf-16-be", False),
        (codecs.BOM_UTF32_LE + "x".encode("utf-32-le"), "x", "utf-32-le", False),
        ("naïve\n".encode() + b"\xe9\n", "naïve\n\ufffd\n", "utf-8", True),  # UTF-8, a stray byte
        (codecs.BOM_UTF16_LE + b"a\x00\x00\xd8", "a\ufffd", "utf-16-le", True),  # lone surrogate
    ],
)
def test_decoding(data: bytes, text: str, encoding: str, lossy: bool) -> None:
    decoded = decode_text(data)
    assert (decoded.text, decoded.encoding, decoded.lossy) == (text, encoding, lossy)


def test_line_endings_become_lf() -> None:
    assert normalise_newlines("a\r\nb\rc\nd\r\n\r\n") == "a\nb\nc\nd\n\n"
    assert normalise_newlines("no carriage return") == "no carriage return"


_MARKS = {
    "utf-8": (b"", "utf-8"),
    "utf-8-sig": (codecs.BOM_UTF8, "utf-8"),
    "utf-16-le": (codecs.BOM_UTF16_LE, "utf-16-le"),
    "utf-16-be": (codecs.BOM_UTF16_BE, "utf-16-be"),
    "utf-32-le": (codecs.BOM_UTF32_LE, "utf-32-le"),
    "utf-32-be": (codecs.BOM_UTF32_BE, "utf-32-be"),
}


@given(
    st.one_of(
        st.binary(max_size=2000),
        st.sampled_from([m for m, _ in _MARKS.values()]).flatmap(
            lambda mark: st.binary(max_size=200).map(lambda body: mark + body)
        ),
    )
)
def test_decoding_never_raises_and_is_faithful_unless_lossy(data: bytes) -> None:
    decoded = decode_text(data)
    if decoded.detected:
        assert not decoded.lossy and decoded.text == data.decode(decoded.encoding)
        return
    mark, codec = _MARKS[decoded.encoding]
    assert data.startswith(mark)
    if decoded.lossy:
        assert "\ufffd" in decoded.text
    else:
        assert decoded.text.encode(codec) == data[len(mark) :]


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=500))
def test_utf8_text_round_trips(text: str) -> None:
    decoded = decode_text(text.encode("utf-8"))
    if text.startswith("\ufeff"):
        assert decoded.text == text[1:]
    else:
        assert decoded.text == text
    assert not decoded.lossy


@given(st.text(max_size=300))
def test_normalised_text_has_no_carriage_return_and_is_stable(text: str) -> None:
    once = normalise_newlines(text)
    assert "\r" not in once
    assert normalise_newlines(once) == once
    assert once.count("\n") == text.count("\n") + text.count("\r") - text.count("\r\n")


@pytest.mark.parametrize(
    ("text", "codec", "encoding"),
    [
        ("café naïve, crème brûlée, à la façon de ma grand-mère\n", "latin-1", "cp1252"),
        ("\u201cSmart quotes\u201d \u2013 and a dash, from Word\n", "cp1252", "cp1252"),
        ("Привет, как дела? Всё хорошо.\n", "cp1251", "cp1251"),
        ("データの読み込み\n", "shift_jis", "cp932"),
    ],
)
def test_text_that_is_not_utf8_is_decoded_in_its_detected_encoding(
    text: str, codec: str, encoding: str
) -> None:
    decoded = decode_text(text.encode(codec))
    assert (decoded.text, decoded.encoding, decoded.lossy, decoded.detected) == (text, encoding, False, True)


def test_valid_utf8_never_loads_the_detector() -> None:
    """UTF-8, nearly every file, costs one decode: charset-normalizer is imported only for the rest."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from longctx.sources.decoding import decode_text\n"
        "decode_text('héllo wörld\\n'.encode() * 100)\n"
        "print('charset_normalizer' in sys.modules)\n"
        "decode_text(b'caf\\xe9 cr\\xe8me\\n')\n"
        "print('charset_normalizer' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
