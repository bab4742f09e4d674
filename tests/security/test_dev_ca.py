"""The development CA (server/auth/devca.py) over real sockets: its certificates let a client
in over mTLS on a real gRPC server and a real aiohttp server, the peer certificate each
server sees maps to the client's principal, and a client with no certificate, or one from
another CA, is refused during the handshake. Also what the CA writes: file modes, names,
key usages, reuse of an existing CA, and the limits it refuses."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from apiary.core.access.principal import Mechanism, Principal, PrincipalKind
from apiary.errors import ValidationError
from apiary.sdk.channel import ClientTls, open_channel
from apiary.server.auth.certificates import principal_from_certificate, principal_from_pem
from apiary.server.auth.devca import DevCertificates, IssuedCertificate, issue_dev_certificates
from apiary.server.config.server import ServerConfig
from apiary.server.tls import grpc_credentials, http_context

BOB = Principal(PrincipalKind.AGENT, "bob")
ALICE = Principal(PrincipalKind.OPERATOR, "alice", roles=frozenset({"admin", "hitl"}))
CI = Principal(PrincipalKind.APPLICATION, "ci", "acme")
WHO = "/apiary.test.Whoami/Who"
DEADLINE_S = 10.0


def _now() -> dt.datetime:
    # The TLS stacks check validity against the real clock, so the certificates must too.
    return dt.datetime.now(dt.UTC)


@pytest.fixture
def certs(tmp_path: Path) -> DevCertificates:
    return issue_dev_certificates(tmp_path / "certs", [BOB, ALICE, CI], now=_now())


@pytest.fixture
def stranger(tmp_path: Path) -> IssuedCertificate:
    """Bob's certificate again, from a CA the servers do not trust."""
    return issue_dev_certificates(tmp_path / "elsewhere", [BOB], now=_now()).clients[0]


def _config(certs: DevCertificates) -> ServerConfig:
    return ServerConfig(
        tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=certs.ca_cert
    )


def _mtls(principal: Principal) -> Principal:
    return replace(principal, mechanism=Mechanism.MTLS)


# --- gRPC ----------------------------------------------------------------------------------


@dataclass
class GrpcServer:
    address: str
    seen: list[dict[str, list[bytes]]]
    identity_keys: list[str | None]


@pytest.fixture
async def grpc_server(certs: DevCertificates) -> AsyncIterator[GrpcServer]:
    """A real grpc.aio server requiring client certificates from the dev CA, serving the
    standard health service and one method that records the call's auth context."""
    seen: list[dict[str, list[bytes]]] = []
    identity_keys: list[str | None] = []

    async def who(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        seen.append({k: list(v) for k, v in context.auth_context().items()})
        identity_keys.append(context.peer_identity_key())
        return b"ok"

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "apiary.test.Whoami", {"Who": grpc.unary_unary_rpc_method_handler(who)}
            )
        ]
    )
    credentials = grpc_credentials(_config(certs))
    assert credentials is not None
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield GrpcServer(f"127.0.0.1:{port}", seen, identity_keys)
    finally:
        await server.stop(None)


async def _check_health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
    return int(response.status)


async def test_a_dev_client_certificate_gets_in_and_its_peer_certificate_maps_to_its_principal(
    certs: DevCertificates, grpc_server: GrpcServer
) -> None:
    bob = certs.clients[0]
    tls = ClientTls(ca=certs.ca_cert, cert=bob.cert, key=bob.key)
    async with open_channel(grpc_server.address, tls) as channel:
        assert await _check_health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert await channel.unary_unary(WHO)(b"", timeout=DEADLINE_S) == b"ok"
    [context] = grpc_server.seen
    assert context["transport_security_type"] == [b"ssl"]
    # The verified peer certificate, PEM, under x509_pem_cert; its SAN URI under both
    # x509_subject_alternative_name (gRPC's peer identity) and peer_uri.
    [pem] = context["x509_pem_cert"]
    assert pem == bob.cert.read_bytes()
    assert context["x509_subject_alternative_name"] == [b"apiary://default/agent/bob"]
    assert context["peer_uri"] == [b"apiary://default/agent/bob"]
    assert context["x509_common_name"] == [b"bob"]
    assert grpc_server.identity_keys == ["x509_subject_alternative_name"]
    assert principal_from_pem(pem, ()) == _mtls(BOB)


async def test_an_operator_certificate_carries_its_roles_through_the_handshake(
    certs: DevCertificates, grpc_server: GrpcServer
) -> None:
    alice = certs.clients[1]
    tls = ClientTls(ca=certs.ca_cert, cert=alice.cert, key=alice.key)
    async with open_channel(grpc_server.address, tls) as channel:
        await channel.unary_unary(WHO)(b"", timeout=DEADLINE_S)
    [context] = grpc_server.seen
    assert context["peer_uri"] == [b"apiary://default/operator/alice?roles=admin,hitl"]
    principal = principal_from_pem(context["x509_pem_cert"][0], ())
    assert principal == _mtls(ALICE)
    assert principal is not None and principal.has_role("hitl")


async def test_a_grpc_client_without_a_certificate_is_refused(
    certs: DevCertificates, grpc_server: GrpcServer
) -> None:
    async with open_channel(grpc_server.address, ClientTls(ca=certs.ca_cert)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _check_health(channel)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert grpc_server.seen == []


async def test_a_grpc_client_certificate_from_another_ca_is_refused(
    certs: DevCertificates, grpc_server: GrpcServer, stranger: IssuedCertificate
) -> None:
    tls = ClientTls(ca=certs.ca_cert, cert=stranger.cert, key=stranger.key)
    async with open_channel(grpc_server.address, tls) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(WHO)(b"", timeout=DEADLINE_S)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert grpc_server.seen == []


async def test_a_grpc_client_that_does_not_trust_the_dev_ca_refuses_the_server(
    certs: DevCertificates, grpc_server: GrpcServer, stranger: IssuedCertificate, tmp_path: Path
) -> None:
    other_ca = tmp_path / "elsewhere" / "ca.pem"
    bob = certs.clients[0]
    async with open_channel(grpc_server.address, ClientTls(other_ca, bob.cert, bob.key)) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _check_health(ch)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


# --- HTTP (aiohttp) ------------------------------------------------------------------------


@pytest.fixture
async def http_server(certs: DevCertificates) -> AsyncIterator[str]:
    """A real aiohttp server on the coordinator's HTTP TLS context, answering with the label
    of the principal its peer certificate maps to."""

    async def whoami(request: web.Request) -> web.Response:
        assert request.transport is not None
        ssl_object = request.transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        principal = principal_from_certificate(der, ())
        assert principal is not None
        assert principal.mechanism is Mechanism.MTLS
        return web.Response(text=principal.label)

    context = http_context(_config(certs))
    assert context is not None
    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"https://{host}:{port}/whoami"
    finally:
        await runner.cleanup()


def _client_context(ca: Path, client: IssuedCertificate | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


async def _get(url: str, context: ssl.SSLContext) -> str:
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, ssl=context) as response,
    ):
        assert response.status == 200
        return await response.text()


@pytest.mark.parametrize("index", [0, 1, 2])
async def test_aiohttp_sees_the_peer_certificate_of_each_dev_client(
    certs: DevCertificates, http_server: str, index: int
) -> None:
    client = certs.clients[index]
    text = await _get(http_server, _client_context(certs.ca_cert, client))
    assert text == client.principal.label


async def test_an_http_client_without_a_certificate_is_refused(
    certs: DevCertificates, http_server: str
) -> None:
    with pytest.raises(aiohttp.ClientError):
        await _get(http_server, _client_context(certs.ca_cert, None))


async def test_an_http_client_certificate_from_another_ca_is_refused(
    certs: DevCertificates, http_server: str, stranger: IssuedCertificate
) -> None:
    with pytest.raises(aiohttp.ClientError):
        await _get(http_server, _client_context(certs.ca_cert, stranger))


# --- what the CA writes ----------------------------------------------------------------------


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_private_keys_are_0600_and_files_are_named_for_their_principals(
    certs: DevCertificates,
) -> None:
    assert [(c.cert.name, c.key.name) for c in certs.clients] == [
        ("agent-bob.pem", "agent-bob.key"),
        ("operator-alice.pem", "operator-alice.key"),
        ("application-ci.pem", "application-ci.key"),
    ]
    assert [c.uri for c in certs.clients] == [
        "apiary://default/agent/bob",
        "apiary://default/operator/alice?roles=admin,hitl",
        "apiary://acme/application/ci",
    ]
    for key in (certs.ca_key, certs.server_key, *(c.key for c in certs.clients)):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert sorted(p.name for p in certs.directory.iterdir()) == sorted(
        ["ca.pem", "ca.key", "server.pem", "server.key"]
        + [p.name for c in certs.clients for p in (c.cert, c.key)]
    )
    assert certs.ca_created


def test_certificates_carry_their_names_key_usages_and_p256_keys(certs: DevCertificates) -> None:
    ca = _load(certs.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server = _load(certs.server_cert)
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # (client authentication too: a replica presents it to an mTLS leader)
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    for client in certs.clients:
        certificate = _load(client.cert)
        certificate.verify_directly_issued_by(ca)
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        key = certificate.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        assert key.curve.name == "secp256r1"
        assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_validity_follows_days_from_now_and_the_ca_outlives_it(tmp_path: Path) -> None:
    now = _now().replace(microsecond=0)
    issued = issue_dev_certificates(tmp_path, [BOB], days=7, now=now)
    client = _load(issued.clients[0].cert)
    assert client.not_valid_after_utc == now + dt.timedelta(days=7)
    assert client.not_valid_before_utc < now
    assert _load(issued.ca_cert).not_valid_after_utc >= now + dt.timedelta(days=365)


def test_a_second_run_reuses_the_ca_so_later_certificates_are_trusted(
    certs: DevCertificates,
) -> None:
    ca_before = (certs.ca_cert.read_bytes(), certs.ca_key.read_bytes())
    later = issue_dev_certificates(
        certs.directory, [Principal(PrincipalKind.AGENT, "carol")], hosts=("10.0.0.7",), now=_now()
    )
    assert not later.ca_created
    assert (later.ca_cert.read_bytes(), later.ca_key.read_bytes()) == ca_before
    carol = _load(later.clients[0].cert)
    carol.verify_directly_issued_by(_load(certs.ca_cert))
    assert principal_from_pem(later.clients[0].cert.read_bytes(), ()) == Principal(
        PrincipalKind.AGENT, "carol", mechanism=Mechanism.MTLS
    )
    # Earlier client certificates stay; the server certificate now names the new host.
    assert certs.clients[0].cert.exists()
    san = _load(later.server_cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]


def test_a_half_present_or_mismatched_ca_is_refused(tmp_path: Path) -> None:
    first = issue_dev_certificates(tmp_path / "a", [], now=_now())
    other = issue_dev_certificates(tmp_path / "b", [], now=_now())
    first.ca_key.write_bytes(other.ca_key.read_bytes())
    with pytest.raises(ValidationError, match="is not the key of"):
        issue_dev_certificates(first.directory, [BOB], now=_now())
    other.ca_cert.unlink()
    with pytest.raises(ValidationError, match=r"ca\.key is there but .*ca\.pem is not"):
        issue_dev_certificates(other.directory, [BOB], now=_now())
    assert not (other.directory / "agent-bob.pem").exists()


@pytest.mark.parametrize(
    ("kwargs", "field", "why"),
    [
        ({"days": 0}, "days", "must be 1 to 3650, not 0"),
        ({"days": 3651}, "days", "must be 1 to 3650, not 3651"),
        ({"hosts": ()}, "hosts", "at least one host"),
        ({"hosts": ("bad host",)}, "hosts", "neither an IP address nor a DNS name"),
        ({"hosts": ("a..b",)}, "hosts", "neither"),
        ({"principals": [Principal(PrincipalKind.AGENT, "b/ob")]}, "name", "must be 1-128"),
        ({"principals": [BOB, BOB]}, "principals", "named twice"),
        ({"principals": [Principal(PrincipalKind.ANONYMOUS, "x")]}, "kind", "must be one of"),
        (
            {"principals": [Principal(PrincipalKind.AGENT, "b", roles=frozenset({"admin"}))]},
            "roles",
            "only operators hold roles",
        ),
        ({"now": dt.datetime(2030, 1, 1)}, "now", "time zone"),
    ],
)
def test_bad_requests_are_refused_before_anything_is_written(
    tmp_path: Path, kwargs: dict[str, object], field: str, why: str
) -> None:
    arguments: dict[str, object] = {"principals": [BOB], "now": _now(), **kwargs}
    target = tmp_path / "certs"
    with pytest.raises(ValidationError) as caught:
        issue_dev_certificates(target, **arguments)  # type: ignore[arg-type]
    assert caught.value.details["field"] == field
    assert why in caught.value.message
    assert not target.exists()


def test_a_reused_ca_that_would_expire_first_is_refused(tmp_path: Path) -> None:
    issue_dev_certificates(tmp_path, [BOB], days=30, now=_now())
    with pytest.raises(ValidationError) as caught:
        issue_dev_certificates(tmp_path, [ALICE], days=400, now=_now())
    assert caught.value.details["field"] == "days"
    assert "ask for fewer days or use a new directory" in caught.value.message
    assert not (tmp_path / "operator-alice.pem").exists()
