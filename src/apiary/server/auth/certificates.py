"""Who an mTLS client certificate names (DESIGN.md section 9).

The TLS stack has already checked the certificate against `[server] tls_client_ca`; this
module only decides which principal it stands for, in two ways:

- A mapping in the configuration, for certificates issued by someone else's CA whose names
  Apiary does not choose. Each rule matches one exact SAN URI or one subject common name:

      [[auth.certificates]]
      uri = "spiffe://example.org/ns/ci/sa/builder"   # or common_name = "builder"
      kind = "application"                            # agent | operator | application
      name = "builder"
      tenant = "default"                              # optional
      roles = []                                      # operators only

- The convention, for certificates issued for Apiary (`apiary certs dev` writes them): a
  SAN URI `apiary://<tenant>/<kind>/<name>`, with `?roles=a,b` for an operator, names the
  principal itself, so a new agent needs a certificate and no configuration change.

The mapping is consulted first, so an operator can override what a certificate claims. A
certificate that maps to nothing yields None and the caller refuses the call; a certificate
that claims an apiary:// identity in a malformed way is refused outright, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import quote, unquote, urlsplit

from cryptography import x509
from cryptography.x509.oid import NameOID

from apiary.core.access.principal import (
    DEFAULT_TENANT,
    Mechanism,
    Principal,
    PrincipalKind,
    check_name,
)
from apiary.errors import UnauthenticatedError, ValidationError

URI_SCHEME = "apiary"
CERTIFICATE_KINDS = (PrincipalKind.AGENT, PrincipalKind.OPERATOR, PrincipalKind.APPLICATION)
"""The kinds a certificate may name (anonymous is the absence of a credential)."""

_RULE_KEYS = ("uri", "common_name", "kind", "name", "tenant", "roles")
_KIND_NAMES = ", ".join(k.value for k in CERTIFICATE_KINDS)
# Characters of names and tenants (principal.NAME_PATTERN) that need no escaping where they go.
_PATH_SAFE = "-._~:@"
_AUTHORITY_SAFE = "-._~"


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateRule:
    """One configured mapping: the certificate whose SAN URI is `uri` exactly, or (without
    `uri`) whose subject common name is `common_name`, authenticates as this principal."""

    uri: str | None = None
    common_name: str | None = None
    kind: PrincipalKind
    name: str
    tenant: str = DEFAULT_TENANT
    roles: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if (self.uri is None) == (self.common_name is None):
            raise ValidationError.for_field(
                "uri", "give exactly one of uri or common_name to say which certificates match"
            )
        if self.uri == "" or self.common_name == "":
            which = "uri" if self.uri == "" else "common_name"
            raise ValidationError.for_field(which, "must not be empty")
        problem = _principal_problem(self.kind, self.name, self.tenant, self.roles)
        if problem is not None:
            raise ValidationError.for_field(*problem)

    @property
    def principal(self) -> Principal:
        return Principal(self.kind, self.name, self.tenant, self.roles, Mechanism.MTLS)


def principal_from_certificate(der: bytes, rules: Sequence[CertificateRule]) -> Principal | None:
    """The principal a verified client certificate (DER) authenticates, or None when neither
    a rule nor the apiary:// convention names one.

    Raises UnauthenticatedError when the certificate cannot be parsed or its apiary:// URI is
    malformed (the message says what is wrong)."""
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise UnauthenticatedError(f"the client certificate cannot be parsed: {exc}") from None
    return _principal(certificate, rules)


def principal_from_pem(pem: bytes, rules: Sequence[CertificateRule]) -> Principal | None:
    """As `principal_from_certificate`, for the PEM form (what gRPC's auth context holds);
    the first certificate of a chain is the client's."""
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise UnauthenticatedError(f"the client certificate cannot be parsed: {exc}") from None
    return _principal(certificate, rules)


def principal_uri(principal: Principal) -> str:
    """The apiary:// URI that names `principal` by the convention (what a certificate issued
    for it carries as its SAN); `parse_principal_uri` reads it back."""
    problem = _principal_problem(principal.kind, principal.name, principal.tenant, principal.roles)
    if problem is not None:
        raise ValidationError.for_field(*problem)
    uri = (
        f"{URI_SCHEME}://{quote(principal.tenant, safe=_AUTHORITY_SAFE)}"
        f"/{principal.kind.value}/{quote(principal.name, safe=_PATH_SAFE)}"
    )
    if principal.roles:
        uri += "?roles=" + ",".join(quote(r, safe=_PATH_SAFE) for r in sorted(principal.roles))
    return uri


def parse_principal_uri(uri: str) -> Principal:
    """The principal an `apiary://<tenant>/<kind>/<name>[?roles=a,b]` URI names.

    Raises UnauthenticatedError naming what is wrong: a certificate that claims an Apiary
    identity and gets it wrong is refused, not passed over."""
    if not uri.isascii() or any(c <= " " or c == "\x7f" for c in uri):
        _malformed(uri, "spaces, control and non-ASCII characters must be percent-encoded")
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        _malformed(uri, str(exc))
    if parts.scheme != URI_SCHEME:
        _malformed(uri, f"the scheme must be {URI_SCHEME}://")
    if "#" in uri:
        _malformed(uri, "it must not have a #fragment")
    tenant = unquote(parts.netloc)
    segments = parts.path.split("/")
    if len(segments) != 3 or segments[0] != "":
        _malformed(uri, f"the form is {URI_SCHEME}://<tenant>/<kind>/<name>")
    kind_text, name = segments[1], unquote(segments[2])
    kind = next((k for k in CERTIFICATE_KINDS if k.value == kind_text), None)
    if kind is None:
        _malformed(uri, f"kind {kind_text[:32]!r} is not one of {_KIND_NAMES}")
    roles = _query_roles(uri, parts.query) if "?" in uri else frozenset[str]()
    problem = _principal_problem(kind, name, tenant, roles)
    if problem is not None:
        _malformed(uri, problem[1])
    return Principal(kind, name, tenant, roles, Mechanism.MTLS)


def certificate_rules(values: list[dict[str, Any]], source: str) -> tuple[CertificateRule, ...]:
    """The `[[auth.certificates]]` tables of a configuration file; `source` names the file in
    errors. Unknown keys, missing or mistyped values, and two rules for the same URI or
    common name (the first would silently win) are ValidationErrors naming the field."""
    if not isinstance(values, list):
        raise ValidationError(
            f"{source}: certificates must be [[auth.certificates]] tables",
            {"field": "auth.certificates"},
        )
    rules: list[CertificateRule] = []
    seen: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(values):
        where = f"{source}: auth.certificates[{i}]"
        rule = _rule(entry, where)
        match = ("uri", rule.uri) if rule.uri is not None else ("common_name", rule.common_name)
        key = (match[0], str(match[1]))
        if key in seen:
            raise ValidationError(
                f"{where}: {key[0]} {key[1][:64]!r} is already mapped by "
                f"auth.certificates[{seen[key]}]; keep one rule per certificate",
                {"field": f"auth.certificates.{key[0]}"},
            )
        seen[key] = i
        rules.append(rule)
    return tuple(rules)


def _rule(entry: Any, where: str) -> CertificateRule:
    if not isinstance(entry, dict):
        raise ValidationError(f"{where}: must be a table", {"field": "auth.certificates"})
    for key in entry:
        if key not in _RULE_KEYS:
            raise ValidationError(
                f"{where}: unknown setting {key}; known: {', '.join(_RULE_KEYS)}",
                {"field": f"auth.certificates.{key}"},
            )
    for key in ("uri", "common_name", "kind", "name", "tenant"):
        if key in entry and not isinstance(entry[key], str):
            raise ValidationError(
                f"{where}: {key} must be a string", {"field": f"auth.certificates.{key}"}
            )
    for key in ("kind", "name"):
        if key not in entry:
            raise ValidationError(
                f"{where}: {key} is required", {"field": f"auth.certificates.{key}"}
            )
    kind = next((k for k in CERTIFICATE_KINDS if k.value == entry["kind"]), None)
    if kind is None:
        raise ValidationError(
            f"{where}: kind {entry['kind'][:32]!r} must be one of {_KIND_NAMES}",
            {"field": "auth.certificates.kind"},
        )
    roles = entry.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise ValidationError(
            f"{where}: roles must be a list of strings", {"field": "auth.certificates.roles"}
        )
    try:
        return CertificateRule(
            uri=entry.get("uri"),
            common_name=entry.get("common_name"),
            kind=kind,
            name=entry["name"],
            tenant=entry.get("tenant", DEFAULT_TENANT),
            roles=frozenset(roles),
        )
    except ValidationError as exc:
        field_name = exc.details.get("field", "")
        raise ValidationError(
            f"{where}: {exc.message}", {"field": f"auth.certificates.{field_name}"}
        ) from None


def _principal(certificate: x509.Certificate, rules: Sequence[CertificateRule]) -> Principal | None:
    uris = _san_uris(certificate)
    for rule in rules:
        if rule.uri is not None and rule.uri in uris:
            return rule.principal
    names = _common_names(certificate)
    for rule in rules:
        if rule.common_name is not None and rule.common_name in names:
            return rule.principal
    claims = sorted({u for u in uris if u.partition(":")[0].lower() == URI_SCHEME})
    if len(claims) > 1:
        raise UnauthenticatedError(
            f"the client certificate names {len(claims)} {URI_SCHEME}:// principals "
            f"({', '.join(c[:96] for c in claims)}); it must name one",
        )
    return parse_principal_uri(claims[0]) if claims else None


def _san_uris(certificate: x509.Certificate) -> list[str]:
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.value.get_values_for_type(x509.UniformResourceIdentifier)]


def _common_names(certificate: x509.Certificate) -> set[str]:
    attributes = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return {a.value if isinstance(a.value, str) else a.value.decode() for a in attributes}


def _query_roles(uri: str, query: str) -> frozenset[str]:
    key, sep, value = query.partition("=")
    if key != "roles" or not sep or "&" in value:
        _malformed(uri, "the only query it takes is ?roles=a,b (an operator's roles)")
    roles = [unquote(r) for r in value.split(",")]
    if "" in roles:
        _malformed(uri, "roles must be a comma-separated list of non-empty role names")
    return frozenset(roles)


def _principal_problem(
    kind: PrincipalKind, name: str, tenant: str, roles: Iterable[str]
) -> tuple[str, str] | None:
    """(field, why) for the first thing that keeps these from naming a principal."""
    if kind not in CERTIFICATE_KINDS:
        return ("kind", f"kind {kind.value!r} must be one of {_KIND_NAMES}")
    for field_name, value in (("name", name), ("tenant", tenant)):
        problem = check_name(value, field_name)
        if problem is not None:
            return (field_name, problem)
    roles = sorted(roles)
    if roles and kind is not PrincipalKind.OPERATOR:
        return ("roles", f"only operators hold roles, not {kind.value}s")
    for role in roles:
        problem = check_name(role, "role")
        if problem is not None:
            return ("roles", problem)
    return None


def _malformed(uri: str, why: str) -> NoReturn:
    raise UnauthenticatedError(
        f"the client certificate's URI {uri[:128]!r} is malformed: {why}", {"uri": uri[:256]}
    )
