"""The shared TLS context reads the CA certificates at the first handshake and still verifies.

Against a real HTTPS server on 127.0.0.1 with a certificate made here: trusted through
``SSL_CERT_FILE`` the request succeeds; not trusted, it fails. A client over plain HTTP never
reads the certificates (a new process's ``longctx batch`` against a local engine saved 50-140 ms).
"""

from __future__ import annotations

import asyncio
import datetime
import http.server
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from longctx.backends import http as lx_http
from longctx.backends import httpx2_bridge
from longctx.errors import ServerUnreachable

HOST = "127.0.0.1"


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class _Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(wrap: ssl.SSLContext | None) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    if wrap is not None:
        server.socket = wrap.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scheme = "https" if wrap is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fresh_context(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The process's context made anew for the test (and after it); the count of CA bundles read."""
    reads: list[int] = []
    real = httpx2_bridge.httpx2.create_ssl_context

    def counted(*args: object, **kwargs: object) -> ssl.SSLContext:
        reads.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx2_bridge.httpx2, "create_ssl_context", counted)
    lx_http.tls_context.cache_clear()
    yield reads
    lx_http.tls_context.cache_clear()


@pytest.fixture
def https_url(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    cert, key = _certificate(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    for url in _serve(server_side):
        yield url, cert


def test_plain_http_reads_no_certificates(fresh_context: list[int]) -> None:
    for url in _serve(None):
        endpoint = lx_http.HttpEndpoint(url + "/v1", timeout=10)
        try:
            assert endpoint.get_json("/v1/models")["data"][0]["id"] == "m"
        finally:
            endpoint.close()
    assert fresh_context == []


def test_https_verifies_against_the_certificates_read_at_the_first_handshake(
    fresh_context: list[int], https_url: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = https_url
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    endpoints = [lx_http.HttpEndpoint(url + "/v1", timeout=10) for _ in range(2)]
    try:
        assert fresh_context == []  # made, not yet read
        for endpoint in endpoints:
            assert endpoint.get_json("/v1/models")["data"][0]["id"] == "m"
    finally:
        for endpoint in endpoints:
            endpoint.close()
    assert fresh_context == [1]  # read once, for both clients


def test_https_to_an_untrusted_certificate_fails(
    fresh_context: list[int], https_url: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = https_url
    (tmp_path / "other").mkdir()
    other, _ = _certificate(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))  # trusts another certificate only
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    endpoint = lx_http.HttpEndpoint(url + "/v1", timeout=10)
    try:
        with pytest.raises(ServerUnreachable, match=r"(?i)certificate"):
            endpoint.get_json("/v1/models")
    finally:
        endpoint.close()


def test_an_async_client_verifies_too(
    fresh_context: list[int], https_url: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async clients (a batch's requests) hand their handshakes over as the sync ones do."""
    url, cert = https_url
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)

    async def models() -> object:
        client = lx_http.make_async_client(timeout=10, stall_timeout=10)
        try:
            async with client.stream("GET", url + "/v1/models", content=b"", headers={}) as response:
                return json.loads(await response.aread())["data"][0]["id"]
        finally:
            await client.aclose()

    assert asyncio.run(models()) == "m"
    assert fresh_context == [1]
