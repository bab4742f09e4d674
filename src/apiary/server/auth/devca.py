"""A local certificate authority for trying the secure mode (`apiary certs dev`).

One directory holds a CA, a server certificate for the coordinator's ports, and a client
certificate per principal, each client certificate naming its principal by the apiary://
SAN URI convention (certificates.py), so the coordinator needs no mapping to know who is
calling. Running it again over the same directory reuses the CA, so certificates issued
later are trusted by a coordinator already configured with `tls_client_ca = ca.pem`.

These are development certificates: keys are written unencrypted (mode 0600) beside the
certificates. A deployment uses its own CA and, where its names differ from the convention,
`[[auth.certificates]]` rules.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from apiary.core.access.principal import Principal
from apiary.errors import ValidationError
from apiary.server.auth.certificates import principal_uri

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
MAX_DAYS = 3650
"""Development certificates are not meant to last; ten years is the most they are issued for."""
CA_MIN_DAYS = 365
"""The CA outlives the certificates it signs, so more can be added to the directory later."""
CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates are valid from slightly before `now`, so a peer whose clock is a little
behind accepts them."""

_CA_NAME = "Apiary development CA"


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A client certificate written for `principal`; `uri` is the SAN that names it."""

    principal: Principal
    uri: str
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class DevCertificates:
    """What `issue_dev_certificates` wrote: the `[server]` files (`server_cert`,
    `server_key`, and `ca_cert` as `tls_client_ca`) and one client pair per principal."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    clients: tuple[IssuedCertificate, ...]
    ca_created: bool
    """False when an existing CA in the directory signed these certificates."""


@dataclass(frozen=True, slots=True)
class _Authority:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def issue_dev_certificates(
    directory: Path,
    principals: Sequence[Principal],
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = 30,
    now: dt.datetime,
) -> DevCertificates:
    """Write a CA (or reuse the one in `directory`), a server certificate for `hosts`
    (DNS names and IP addresses), and a client certificate per principal, valid for `days`
    from `now`. ECDSA P-256 keys; private keys are written with mode 0600.

    Raises ValidationError for bad hosts, names or days, a half-present or mismatched CA, or
    a reused CA that expires before the new certificates would."""
    if now.tzinfo is None:
        raise ValidationError.for_field("now", "must carry a time zone (use UTC)")
    if not 1 <= days <= MAX_DAYS:
        raise ValidationError.for_field("days", f"must be 1 to {MAX_DAYS}, not {days}")
    if not hosts:
        raise ValidationError.for_field("hosts", "name at least one host the server answers as")
    server_names = [_general_name(h) for h in hosts]
    uris = [principal_uri(p) for p in principals]
    _check_unique_files(principals)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {name: directory / name for name in ("ca.pem", "ca.key", "server.pem", "server.key")}
    not_after = now + dt.timedelta(days=days)
    authority = _existing_authority(paths["ca.pem"], paths["ca.key"])
    ca_created = authority is None
    if authority is None:
        authority = _new_authority(now, max(days, CA_MIN_DAYS))
        _write_key(paths["ca.key"], authority.key)
        _write_certificate(paths["ca.pem"], authority.certificate)
    elif authority.certificate.not_valid_after_utc < not_after:
        raise ValidationError.for_field(
            "days",
            f"the CA in {directory} is valid until "
            f"{authority.certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, before these "
            f"certificates would expire; ask for fewer days or use a new directory",
        )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _leaf(authority, server_key, hosts[0], server_names, True, now, not_after)
    _write_key(paths["server.key"], server_key)
    _write_certificate(paths["server.pem"], server)
    clients = []
    for principal, uri in zip(principals, uris, strict=True):
        key = ec.generate_private_key(ec.SECP256R1())
        san = [x509.UniformResourceIdentifier(uri)]
        certificate = _leaf(authority, key, principal.name, san, False, now, not_after)
        stem = directory / f"{principal.kind.value}-{principal.name}"
        cert_path, key_path = stem.with_name(stem.name + ".pem"), stem.with_name(stem.name + ".key")
        _write_key(key_path, key)
        _write_certificate(cert_path, certificate)
        clients.append(IssuedCertificate(principal, uri, cert_path, key_path))
    return DevCertificates(
        directory,
        paths["ca.pem"],
        paths["ca.key"],
        paths["server.pem"],
        paths["server.key"],
        tuple(clients),
        ca_created,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.split(".")
    if not host.isascii() or not all(
        label and len(label) <= 63 and label.replace("-", "").isalnum() for label in labels
    ):
        raise ValidationError.for_field(
            "hosts", f"{host[:64]!r} is neither an IP address nor a DNS name"
        )
    return x509.DNSName(host.lower())


def _check_unique_files(principals: Sequence[Principal]) -> None:
    seen: set[str] = set()
    for principal in principals:
        stem = f"{principal.kind.value}-{principal.name}"
        if stem in seen:
            raise ValidationError.for_field(
                "principals", f"{principal.kind.value} {principal.name!r} is named twice"
            )
        seen.add(stem)


def _existing_authority(cert_path: Path, key_path: Path) -> _Authority | None:
    if not cert_path.exists() and not key_path.exists():
        return None
    if not (cert_path.exists() and key_path.exists()):
        present, missing = (cert_path, key_path) if cert_path.exists() else (key_path, cert_path)
        raise ValidationError.for_field(
            "directory",
            f"{present} is there but {missing} is not; restore it, or remove both to make a "
            "new CA (certificates it signed will no longer be trusted)",
        )
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValidationError.for_field(
            "directory", f"cannot load the CA in {cert_path.parent}: {exc}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != (
        certificate.public_key()
    ):
        raise ValidationError.for_field(
            "directory", f"{key_path} is not the key of {cert_path}; restore the matching pair"
        )
    return _Authority(certificate, key)


def _new_authority(now: dt.datetime, days: int) -> _Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _CA_NAME)])
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Authority(certificate, key)


def _leaf(
    authority: _Authority,
    key: ec.EllipticCurvePrivateKey,
    common_name: str,
    names: Sequence[x509.GeneralName],
    server: bool,
    now: dt.datetime,
    not_after: dt.datetime,
) -> x509.Certificate:
    public = key.public_key()
    # A server's certificate is also its client certificate towards other replicas of a
    # cluster whose leader requires one (docs/cluster.md, `cluster.client_cert`).
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    return (
        x509.CertificateBuilder()
        # A common name is at most 64 characters; the SAN carries the full identity.
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
        .issuer_name(authority.certificate.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
            critical=False,
        )
        .sign(authority.key, hashes.SHA256())
    )


def _write_certificate(path: Path, certificate: x509.Certificate) -> None:
    _write(path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(path, pem, 0o600)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write through a temporary file renamed into place: a reader never sees half a file,
    and a key is never readable by others, not even for a moment."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
