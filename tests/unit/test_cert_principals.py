"""Which principal an mTLS client certificate names (server/auth/certificates.py): the
apiary:// SAN URI convention, the configured `[[auth.certificates]]` mapping that wins over
it, the refusals a malformed claim earns, and the mapping table's errors."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.access.principal import (
    NAME_PATTERN,
    Mechanism,
    Principal,
    PrincipalKind,
)
from apiary.errors import UnauthenticatedError, ValidationError
from apiary.server.auth.certificates import (
    CertificateRule,
    certificate_rules,
    parse_principal_uri,
    principal_from_certificate,
    principal_from_pem,
    principal_uri,
)

KEY = ec.generate_private_key(ec.SECP256R1())
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
SOURCE = "apiary.toml"


def _certificate(
    *uris: str, common_name: str | None = "client", dns: tuple[str, ...] = ()
) -> x509.Certificate:
    """A self-signed client certificate: mapping reads names and trusts the TLS stack for
    the chain, so the issuer does not matter here."""
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
    name = x509.Name(attributes)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW)
        .not_valid_after(NOW + dt.timedelta(days=1))
    )
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    names += [x509.DNSName(d) for d in dns]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(KEY, hashes.SHA256())


def _der(*uris: str, **kwargs: Any) -> bytes:
    return _certificate(*uris, **kwargs).public_bytes(serialization.Encoding.DER)


def _pem(*uris: str, **kwargs: Any) -> bytes:
    return _certificate(*uris, **kwargs).public_bytes(serialization.Encoding.PEM)


def _refused(der: bytes, *expected: str) -> UnauthenticatedError:
    with pytest.raises(UnauthenticatedError) as caught:
        principal_from_certificate(der, ())
    assert caught.value.code == "unauthenticated"
    for text in expected:
        assert text in caught.value.message, caught.value.message
    return caught.value


# --- the convention ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("apiary://default/agent/bob", Principal(PrincipalKind.AGENT, "bob")),
        (
            "apiary://acme/application/ci-runner",
            Principal(PrincipalKind.APPLICATION, "ci-runner", "acme"),
        ),
        ("apiary://default/operator/alice", Principal(PrincipalKind.OPERATOR, "alice")),
        (
            "apiary://default/operator/alice?roles=admin,hitl",
            Principal(PrincipalKind.OPERATOR, "alice", roles=frozenset({"admin", "hitl"})),
        ),
        # Percent-encoding is decoded before the name is checked.
        ("apiary://default/agent/bob%40host", Principal(PrincipalKind.AGENT, "bob@host")),
        ("apiary://t%3A1/agent/w%2D1", Principal(PrincipalKind.AGENT, "w-1", "t:1")),
        # The scheme is case-insensitive, as URI schemes are.
        ("APIARY://default/agent/bob", Principal(PrincipalKind.AGENT, "bob")),
    ],
)
def test_an_apiary_uri_names_its_principal_authenticated_by_mtls(
    uri: str, expected: Principal
) -> None:
    want = Principal(expected.kind, expected.name, expected.tenant, expected.roles, Mechanism.MTLS)
    assert principal_from_certificate(_der(uri), ()) == want
    assert principal_from_pem(_pem(uri), ()) == want


def test_the_apiary_uri_is_found_among_other_subject_alternative_names() -> None:
    der = _der("spiffe://example.org/x", "apiary://default/agent/bob", dns=("bob.example",))
    principal = principal_from_certificate(der, ())
    assert principal is not None
    assert principal.label == "agent:bob@default"


def test_the_same_apiary_uri_twice_is_one_claim() -> None:
    der = _der("apiary://default/agent/bob", "apiary://default/agent/bob")
    assert principal_from_certificate(der, ()) == Principal(
        PrincipalKind.AGENT, "bob", mechanism=Mechanism.MTLS
    )


@given(
    kind=st.sampled_from([PrincipalKind.AGENT, PrincipalKind.OPERATOR, PrincipalKind.APPLICATION]),
    name=st.from_regex(NAME_PATTERN, fullmatch=True),
    tenant=st.from_regex(NAME_PATTERN, fullmatch=True),
    roles=st.frozensets(st.from_regex(NAME_PATTERN, fullmatch=True), max_size=3),
)
def test_principal_uri_and_parse_principal_uri_round_trip(
    kind: PrincipalKind, name: str, tenant: str, roles: frozenset[str]
) -> None:
    roles = roles if kind is PrincipalKind.OPERATOR else frozenset()
    principal = Principal(kind, name, tenant, roles, Mechanism.MTLS)
    assert parse_principal_uri(principal_uri(principal)) == principal


def test_principal_uri_refuses_what_no_certificate_may_name() -> None:
    with pytest.raises(ValidationError, match="kind"):
        principal_uri(Principal(PrincipalKind.ANONYMOUS, "anonymous"))
    with pytest.raises(ValidationError, match="only operators hold roles"):
        principal_uri(Principal(PrincipalKind.AGENT, "bob", roles=frozenset({"admin"})))
    with pytest.raises(ValidationError, match="name"):
        principal_uri(Principal(PrincipalKind.AGENT, "b/ob"))


# --- nothing maps: the caller refuses ------------------------------------------------------


@pytest.mark.parametrize(
    "der",
    [
        pytest.param(
            _der("spiffe://example.org/ns/ci/sa/builder", dns=("x.example",)), id="other-uris"
        ),
        pytest.param(_der(), id="no-san"),
        pytest.param(_der(common_name=None), id="no-san-no-cn"),
        # A claim must be exactly the scheme: leading space is no apiary URI at all.
        pytest.param(_der(" apiary://default/agent/bob"), id="not-the-scheme"),
    ],
)
def test_a_certificate_with_no_apiary_uri_and_no_rule_maps_to_none(der: bytes) -> None:
    rules = (
        CertificateRule(common_name="someone-else", kind=PrincipalKind.AGENT, name="x"),
        CertificateRule(uri="spiffe://example.org/other", kind=PrincipalKind.AGENT, name="y"),
    )
    assert principal_from_certificate(der, rules) is None


# --- malformed claims are refused, saying what is wrong ------------------------------------


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("apiary://default/agent", "the form is apiary://<tenant>/<kind>/<name>"),
        ("apiary://default/agent/bob/extra", "the form is apiary://<tenant>/<kind>/<name>"),
        ("apiary://default", "the form is apiary://<tenant>/<kind>/<name>"),
        ("apiary:default/agent/bob", "the form is"),
        ("apiary:///agent/bob", "tenant '' must be 1-128"),
        ("apiary://default/robot/bob", "kind 'robot' is not one of agent, operator, application"),
        ("apiary://default/anonymous/bob", "kind 'anonymous' is not one of"),
        ("apiary://default/Agent/bob", "kind 'Agent' is not one of"),
        ("apiary://default/agent/", "name '' must be 1-128"),
        ("apiary://default/agent/b%2Fob", "name 'b/ob' must be"),
        ("apiary://default/agent/-bob", "name '-bob' must be"),
        ("apiary://default/agent/" + "b" * 129, "must be 1-128"),
        ("apiary://de%20fault/agent/bob", "tenant 'de fault' must be"),
        ("apiary://default/agent/bob%ZZ", "name 'bob%ZZ' must be"),
        ("apiary://default/agent/bob?roles=admin", "only operators hold roles, not agents"),
        ("apiary://default/application/ci?roles=x", "only operators hold roles"),
        ("apiary://default/operator/alice?role=admin", "the only query it takes is ?roles=a,b"),
        ("apiary://default/operator/alice?roles=a&x=1", "the only query it takes"),
        ("apiary://default/operator/alice?roles", "the only query it takes"),
        ("apiary://default/operator/alice?roles=a,,b", "non-empty role names"),
        ("apiary://default/operator/alice?roles=", "non-empty role names"),
        ("apiary://default/operator/alice?roles=a%2Fb", "role 'a/b' must be"),
        ("apiary://default/agent/bob#frag", "#fragment"),
        ("apiary://default/agent/bob#", "#fragment"),
        ("apiary://default/operator/alice?", "the only query it takes"),
        ("apiary://default/agent/bo b", "must be percent-encoded"),
        ("apiary://default/agent/bob\n", "must be percent-encoded"),
        ("apiary://[default/agent/bob", "Invalid IPv6 URL"),
    ],
)
def test_a_malformed_apiary_uri_is_refused_naming_what_is_wrong(uri: str, why: str) -> None:
    error = _refused(_der(uri), "is malformed", why)
    assert error.details["uri"] == uri


def test_a_certificate_naming_two_apiary_principals_is_refused() -> None:
    der = _der("apiary://default/agent/bob", "apiary://default/operator/mallory?roles=admin")
    _refused(der, "names 2 apiary:// principals", "it must name one")


def test_a_malformed_claim_is_refused_even_beside_a_wellformed_name() -> None:
    _refused(_der("apiary://default/robot/x", "spiffe://example.org/ok"), "kind 'robot'")


def test_bytes_that_are_no_certificate_are_refused() -> None:
    with pytest.raises(UnauthenticatedError, match="cannot be parsed"):
        principal_from_certificate(b"\x30\x03\x02\x01\x00", ())
    with pytest.raises(UnauthenticatedError, match="cannot be parsed"):
        principal_from_pem(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", ())


# --- the configured mapping ----------------------------------------------------------------


BUILDER = CertificateRule(
    uri="spiffe://example.org/ns/ci/sa/builder", kind=PrincipalKind.APPLICATION, name="builder"
)
ALICE_BY_CN = CertificateRule(
    common_name="Alice Example",
    kind=PrincipalKind.OPERATOR,
    name="alice",
    tenant="acme",
    roles=frozenset({"hitl"}),
)


def test_a_rule_maps_an_exact_san_uri() -> None:
    der = _der("spiffe://example.org/ns/ci/sa/builder", common_name="whatever")
    assert principal_from_certificate(der, (ALICE_BY_CN, BUILDER)) == Principal(
        PrincipalKind.APPLICATION, "builder", mechanism=Mechanism.MTLS
    )
    # Exact: a longer or differently cased URI is another certificate.
    for other in (
        "spiffe://example.org/ns/ci/sa/builder2",
        "SPIFFE://example.org/ns/ci/sa/builder",
    ):
        assert principal_from_certificate(_der(other), (BUILDER,)) is None


def test_a_rule_maps_a_subject_common_name() -> None:
    principal = principal_from_pem(_pem(common_name="Alice Example"), (BUILDER, ALICE_BY_CN))
    assert principal == Principal(
        PrincipalKind.OPERATOR, "alice", "acme", frozenset({"hitl"}), Mechanism.MTLS
    )
    assert principal.has_role("hitl")
    assert principal_from_pem(_pem(common_name="alice example"), (ALICE_BY_CN,)) is None


def test_the_mapping_wins_over_the_convention() -> None:
    claim = "apiary://default/operator/mallory?roles=admin"
    by_uri = CertificateRule(uri=claim, kind=PrincipalKind.AGENT, name="mallory")
    by_cn = CertificateRule(common_name="mallory", kind=PrincipalKind.AGENT, name="mallory-cn")
    der = _der(claim, common_name="mallory")
    assert principal_from_certificate(der, (by_uri,)) == Principal(
        PrincipalKind.AGENT, "mallory", mechanism=Mechanism.MTLS
    )
    assert principal_from_certificate(der, (by_cn,)) == Principal(
        PrincipalKind.AGENT, "mallory-cn", mechanism=Mechanism.MTLS
    )
    # A rule can even rescue a certificate whose own claim would be refused.
    bad = "apiary://default/robot/r2"
    rescue = CertificateRule(uri=bad, kind=PrincipalKind.AGENT, name="r2")
    assert principal_from_certificate(_der(bad), (rescue,)) == Principal(
        PrincipalKind.AGENT, "r2", mechanism=Mechanism.MTLS
    )


def test_a_uri_rule_wins_over_a_common_name_rule_and_rules_apply_in_order() -> None:
    der = _der("urn:example:one", "urn:example:two", common_name="cn")
    by_cn = CertificateRule(common_name="cn", kind=PrincipalKind.AGENT, name="from-cn")
    two = CertificateRule(uri="urn:example:two", kind=PrincipalKind.AGENT, name="two")
    one = CertificateRule(uri="urn:example:one", kind=PrincipalKind.AGENT, name="one")
    assert _name(principal_from_certificate(der, (by_cn, two, one))) == "two"
    assert _name(principal_from_certificate(der, (by_cn, one, two))) == "one"


def _name(principal: Principal | None) -> str:
    assert principal is not None
    return principal.name


@pytest.mark.parametrize(
    ("kwargs", "field", "why"),
    [
        ({"kind": PrincipalKind.AGENT, "name": "a"}, "uri", "exactly one of uri or common_name"),
        (
            {"uri": "u:x", "common_name": "c", "kind": PrincipalKind.AGENT, "name": "a"},
            "uri",
            "exactly one of uri or common_name",
        ),
        ({"uri": "", "kind": PrincipalKind.AGENT, "name": "a"}, "uri", "must not be empty"),
        ({"common_name": "", "kind": PrincipalKind.AGENT, "name": "a"}, "common_name", "empty"),
        ({"uri": "u:x", "kind": PrincipalKind.ANONYMOUS, "name": "a"}, "kind", "must be one of"),
        ({"uri": "u:x", "kind": PrincipalKind.AGENT, "name": "a b"}, "name", "must be 1-128"),
        (
            {"uri": "u:x", "kind": PrincipalKind.AGENT, "name": "a", "tenant": ""},
            "tenant",
            "must be 1-128",
        ),
        (
            {
                "uri": "u:x",
                "kind": PrincipalKind.APPLICATION,
                "name": "a",
                "roles": frozenset({"r"}),
            },
            "roles",
            "only operators hold roles, not applications",
        ),
        (
            {"uri": "u:x", "kind": PrincipalKind.OPERATOR, "name": "a", "roles": frozenset({"r/"})},
            "roles",
            "role 'r/' must be",
        ),
    ],
)
def test_a_rule_that_cannot_name_a_principal_is_refused(
    kwargs: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        CertificateRule(**kwargs)
    assert caught.value.details["field"] == field
    assert why in caught.value.message


# --- the [[auth.certificates]] table ---------------------------------------------------------


def test_certificate_rules_parse_the_table_with_defaults() -> None:
    rules = certificate_rules(
        [
            {
                "uri": "spiffe://example.org/ns/ci/sa/builder",
                "kind": "application",
                "name": "builder",
            },
            {
                "common_name": "Alice Example",
                "kind": "operator",
                "name": "alice",
                "tenant": "acme",
                "roles": ["hitl", "hitl"],
            },
        ],
        SOURCE,
    )
    assert rules == (BUILDER, ALICE_BY_CN)
    assert rules[0].tenant == "default"
    assert rules[0].roles == frozenset()
    assert certificate_rules([], SOURCE) == ()


@pytest.mark.parametrize(
    ("values", "field", "why"),
    [
        (
            {"kind": "agent", "name": "a", "url": "x"},
            "auth.certificates.url",
            "unknown setting url",
        ),
        (
            {"kind": "agent", "name": "a"},
            "auth.certificates.uri",
            "exactly one of uri or common_name",
        ),
        (
            {"uri": "u:x", "common_name": "c", "kind": "agent", "name": "a"},
            "auth.certificates.uri",
            "exactly one of",
        ),
        ({"uri": "u:x", "name": "a"}, "auth.certificates.kind", "kind is required"),
        ({"uri": "u:x", "kind": "agent"}, "auth.certificates.name", "name is required"),
        ({"uri": 5, "kind": "agent", "name": "a"}, "auth.certificates.uri", "uri must be a string"),
        ({"uri": "u:x", "kind": 1, "name": "a"}, "auth.certificates.kind", "must be a string"),
        (
            {"uri": "u:x", "kind": "agent", "name": "a", "tenant": ["t"]},
            "auth.certificates.tenant",
            "tenant must be a string",
        ),
        (
            {"uri": "u:x", "kind": "robot", "name": "a"},
            "auth.certificates.kind",
            "kind 'robot' must be one of agent, operator, application",
        ),
        ({"uri": "u:x", "kind": "anonymous", "name": "a"}, "auth.certificates.kind", "one of"),
        ({"uri": "u:x", "kind": "agent", "name": "a/b"}, "auth.certificates.name", "name 'a/b'"),
        (
            {"uri": "u:x", "kind": "agent", "name": "a", "tenant": " t"},
            "auth.certificates.tenant",
            "tenant ' t' must be",
        ),
        (
            {"uri": "u:x", "kind": "operator", "name": "a", "roles": "admin"},
            "auth.certificates.roles",
            "roles must be a list of strings",
        ),
        (
            {"uri": "u:x", "kind": "operator", "name": "a", "roles": ["admin", 1]},
            "auth.certificates.roles",
            "roles must be a list of strings",
        ),
        (
            {"uri": "u:x", "kind": "agent", "name": "a", "roles": ["admin"]},
            "auth.certificates.roles",
            "only operators hold roles, not agents",
        ),
        (
            {"common_name": "", "kind": "agent", "name": "a"},
            "auth.certificates.common_name",
            "empty",
        ),
    ],
)
def test_certificate_rules_errors_name_the_field_and_the_source(
    values: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        certificate_rules([{"uri": "u:ok", "kind": "agent", "name": "ok"}, values], SOURCE)
    assert caught.value.details["field"] == field
    assert caught.value.message.startswith(f"{SOURCE}: auth.certificates[1]: ")
    assert why in caught.value.message, caught.value.message


def test_certificate_rules_refuse_two_rules_for_the_same_certificate() -> None:
    with pytest.raises(ValidationError) as caught:
        certificate_rules(
            [
                {"common_name": "ci", "kind": "agent", "name": "a"},
                {"uri": "u:x", "kind": "agent", "name": "b"},
                {"common_name": "ci", "kind": "application", "name": "c"},
            ],
            SOURCE,
        )
    assert caught.value.details["field"] == "auth.certificates.common_name"
    assert "auth.certificates[2]: common_name 'ci' is already mapped by auth.certificates[0]" in (
        caught.value.message
    )


@pytest.mark.parametrize("values", [{"uri": "u:x"}, "rules", [["not", "a", "table"]]])
def test_certificate_rules_need_an_array_of_tables(values: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        certificate_rules(values, SOURCE)
    assert caught.value.details["field"] == "auth.certificates"
    assert caught.value.message.startswith(SOURCE)
