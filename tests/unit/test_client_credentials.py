"""Where clients take their credentials from (sdk/credentials.py): precedence of arguments,
environment and the client configuration file, refusals that name the setting and its
source, key files readable by their owner alone, secrets never shown; the per-call metadata
they add (bearer key, agent proofs); and what `apiary status` says the CLI presents."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.cli.calls import Presented, refusal
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.proof import PROOF_KEY, parse_proof, proof_payload
from apiary.core.signatures import public_bytes, verifies
from apiary.errors import PermissionDeniedError, UnauthenticatedError, ValidationError
from apiary.sdk.connection import Connection
from apiary.sdk.credentials import (
    REGISTER_METHOD,
    CallProver,
    ClientCredentials,
    ClientTls,
)
from apiary.server.auth.devca import issue_dev_certificates

KEY = "apk_abcdefghijkm_" + "S" * 43
SECRET = "S" * 43
OTHER_KEY = "apk_zyxwvutsrqpo_" + "T" * 43
HEARTBEAT = "/sw4rm.registry.RegistryService/Heartbeat"


def _home(tmp_path: Path) -> dict[str, str]:
    """An environment whose default configuration file is under `tmp_path`."""
    return {"HOME": str(tmp_path / "home")}


def _config(tmp_path: Path, text: str, mode: int = 0o600, name: str = "client.toml") -> Path:
    path = tmp_path / "home" / ".config" / "apiary" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _key_file(tmp_path: Path, key: str = KEY, mode: int = 0o600) -> Path:
    path = tmp_path / "api-key"
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


def _refused(env: dict[str, str], config_file: Path | None = None) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        ClientCredentials.load(env, config_file)
    return caught.value


# --- where each setting comes from ------------------------------------------------------------


def test_nothing_anywhere_is_anonymous_with_the_default_audience(tmp_path: Path) -> None:
    loaded = ClientCredentials.load(_home(tmp_path))
    assert (loaded.api_key, loaded.tls, loaded.audience, loaded.coordinator) == (
        "", None, "apiary", "",
    )  # fmt: skip
    assert loaded.describe() == "none (anonymous; dev mode only)"
    assert loaded.bearer() is None


def test_arguments_win_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    _config(tmp_path, f'[client]\napi_key = "{OTHER_KEY}"\naudience = "from-file"\n'
                      'grpc = "file.example:1"\n')  # fmt: skip
    env = {**_home(tmp_path)}
    from_file = ClientCredentials.load(env)
    assert (from_file.api_key, from_file.audience, from_file.coordinator) == (
        OTHER_KEY, "from-file", "file.example:1",
    )  # fmt: skip
    env.update(APIARY_API_KEY=KEY, APIARY_AUDIENCE="from-env", APIARY_COORDINATOR="env:2")
    from_env = ClientCredentials.load(env)
    assert (from_env.api_key, from_env.audience, from_env.coordinator) == (
        KEY, "from-env", "env:2",
    )  # fmt: skip
    assert from_env.sources["api_key"] == "APIARY_API_KEY"
    given = ClientCredentials.load(env, api_key="", audience="given", coordinator="given:3")
    assert (given.api_key, given.audience, given.coordinator) == ("", "given", "given:3")
    assert given.sources["audience"] == "argument"


def test_each_setting_falls_back_on_its_own(tmp_path: Path) -> None:
    config = _config(tmp_path, f'[client]\napi_key = "{OTHER_KEY}"\naudience = "file-aud"\n')
    loaded = ClientCredentials.load({**_home(tmp_path), "APIARY_API_KEY": KEY})
    assert (loaded.api_key, loaded.audience) == (KEY, "file-aud")
    assert loaded.sources == {"api_key": "APIARY_API_KEY", "audience": str(config)}


def test_the_file_is_found_by_variable_xdg_home_or_home(tmp_path: Path) -> None:
    named = tmp_path / "elsewhere.toml"
    named.write_text('[client]\naudience = "named"\n')
    xdg = tmp_path / "xdg" / "apiary" / "client.toml"
    xdg.parent.mkdir(parents=True)
    xdg.write_text('[client]\naudience = "xdg"\n')
    _config(tmp_path, '[client]\naudience = "home"\n')
    env = _home(tmp_path)
    assert ClientCredentials.load(env).audience == "home"
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    assert ClientCredentials.load(env).audience == "xdg"
    env["APIARY_CLIENT_CONFIG"] = str(named)
    assert ClientCredentials.load(env).audience == "named"
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('[client]\naudience = "explicit"\n')
    assert ClientCredentials.load(env, explicit).audience == "explicit"


def test_a_named_file_must_exist_the_default_one_need_not(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    refused = _refused({**_home(tmp_path), "APIARY_CLIENT_CONFIG": str(missing)})
    assert refused.details["field"] == "APIARY_CLIENT_CONFIG" and str(missing) in refused.message
    refused = _refused(_home(tmp_path), missing)
    assert refused.details["field"] == "config_file" and str(missing) in refused.message
    assert ClientCredentials.load(_home(tmp_path)).api_key == ""


def test_tls_comes_whole_from_the_first_place_that_sets_any(tmp_path: Path) -> None:
    for name in ("ca.pem", "me.pem", "me.key", "env-ca.pem"):
        (tmp_path / "home" / ".config" / "apiary").mkdir(parents=True, exist_ok=True)
        (tmp_path / "home" / ".config" / "apiary" / name).write_text("x")
    config = _config(tmp_path, '[client]\ntls_ca = "ca.pem"\ntls_cert = "me.pem"\n'
                               'tls_key = "me.key"\n')  # fmt: skip
    folder = config.parent
    from_file = ClientCredentials.load(_home(tmp_path))
    # Relative paths are the file's folder's.
    assert from_file.tls == ClientTls(folder / "ca.pem", folder / "me.pem", folder / "me.key")
    assert from_file.describe() == f"client certificate {folder / 'me.pem'} (from {config})"
    # One variable of the group set: the file's certificate is not mixed in.
    env = {**_home(tmp_path), "APIARY_TLS_CA": str(folder / "env-ca.pem")}
    from_env = ClientCredentials.load(env)
    assert from_env.tls == ClientTls(folder / "env-ca.pem")
    assert from_env.client_certificate is None
    given = ClientTls(ca=folder / "ca.pem")
    assert ClientCredentials.load(env, tls=given).tls is given


def test_a_key_file_is_read_and_named_as_the_source(tmp_path: Path) -> None:
    key_file = _key_file(tmp_path)
    _config(tmp_path, f'[client]\napi_key_file = "{key_file}"\n', mode=0o644)
    loaded = ClientCredentials.load(_home(tmp_path))
    assert loaded.api_key == KEY
    assert loaded.describe() == f"API key abcdefghijkm (from {key_file})"


# --- profiles: named sets of settings in the same file ----------------------------------------

PROFILES = """
[client]
coordinator = "127.0.0.1:1001"
tenant = "acme"

[profiles.staging]
coordinator = "staging.example:50051"
api_key_file = "staging-key"

[profiles.lab]
grpc = "lab.example:50051"
"""


def test_a_profile_is_chosen_by_argument_or_apiary_profile_and_used_whole(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, PROFILES)
    (config.parent / "staging-key").write_text(KEY + "\n")
    (config.parent / "staging-key").chmod(0o600)
    env = _home(tmp_path)
    plain = ClientCredentials.load(env)
    assert (plain.coordinator, plain.tenant, plain.api_key, plain.profile) == (
        "127.0.0.1:1001", "acme", "", "",
    )  # fmt: skip
    staging = f"{config} [profiles.staging]"
    for chosen in (
        ClientCredentials.load(env, profile="staging"),
        ClientCredentials.load({**env, "APIARY_PROFILE": "staging"}),
    ):
        # Nothing of [client] is mixed in: no tenant.
        assert (chosen.coordinator, chosen.tenant, chosen.api_key, chosen.profile) == (
            "staging.example:50051", "", KEY, "staging",
        )  # fmt: skip
        assert chosen.sources["coordinator"] == staging
        assert chosen.sources["api_key"] == str(config.parent / "staging-key")
    # The environment and arguments still come first; an argument names the profile first.
    over = ClientCredentials.load({**env, "APIARY_COORDINATOR": "env.example:2"}, profile="lab")
    assert over.coordinator == "env.example:2"
    assert over.sources["coordinator"] == "APIARY_COORDINATOR"
    lab = ClientCredentials.load({**env, "APIARY_PROFILE": "staging"}, profile="lab")
    assert (lab.coordinator, lab.profile) == ("lab.example:50051", "lab")
    assert ClientCredentials.load({**env, "APIARY_PROFILE": "staging"}, profile="").profile == ""


def test_an_unknown_profile_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        ClientCredentials.load(_home(tmp_path), profile="staging")
    assert caught.value.details["field"] == "profile"
    assert "no profile 'staging'" in caught.value.message
    assert "there is no client configuration file" in caught.value.message
    config = _config(tmp_path, PROFILES)
    with pytest.raises(ValidationError) as caught:
        ClientCredentials.load({**_home(tmp_path), "APIARY_PROFILE": "prod"})
    assert f"{config} has lab, staging" in caught.value.message
    with pytest.raises(ValidationError) as caught:
        ClientCredentials.load(_home(tmp_path), profile="../etc")
    assert caught.value.details["field"] == "profile"


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ('[profiles.x]\ncoordinator = "no-port"\n', "profiles.x.coordinator", "HOST:PORT"),
        ('[profiles.x]\napi_kee = "k"\n', "profiles.x.api_kee", "unknown setting"),
        ('[profiles.x]\ntls_cert = "me.pem"\n', "profiles.x.tls_key", "mTLS takes both"),
        ('[profiles.x]\ncoordinator = "a:1"\ngrpc = "b:2"\n', "profiles.x.coordinator",
         "not both"),
        ('profiles = "x"\n', "profiles", "[profiles.NAME] tables"),
        ('[profiles."a b"]\n', "profiles.a b", "a profile's name"),
    ],
)  # fmt: skip
def test_a_bad_profile_names_the_setting_the_profile_and_the_file(
    tmp_path: Path, text: str, field: str, says: str
) -> None:
    config = _config(tmp_path, text)
    with pytest.raises(ValidationError) as caught:
        ClientCredentials.load(_home(tmp_path), profile="x")
    assert caught.value.details["field"] == field
    assert says in caught.value.message and str(config) in caught.value.message


# --- refusals name the setting and where it came from -----------------------------------------


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ('[client]\napi_kee = "x"\n', "client.api_kee", "unknown setting"),
        ('api_key = "x"\n', "api_key", "[client] table"),
        ("[client]\naudience = 7\n", "client.audience", "must be a string"),
        ('[client]\ngrpc = "no-port"\n', "client.grpc", "HOST:PORT"),
        ('[client]\naudience = "two words"\n', "client.audience", "printable"),
        ('[client]\ntls_cert = "me.pem"\n', "client.tls_key", "mTLS takes both"),
        ('[client]\ntls_ca = "absent.pem"\n', "client.tls_ca", "absent.pem"),
        ("[client\n", "config_file", "not TOML"),
    ],
)
def test_a_bad_file_value_names_the_setting_and_the_file(
    tmp_path: Path, text: str, field: str, says: str
) -> None:
    config = _config(tmp_path, text)
    refused = _refused(_home(tmp_path))
    assert refused.details["field"] == field
    assert says in refused.message and str(config) in refused.message


def test_a_key_inline_and_in_a_file_is_refused(tmp_path: Path) -> None:
    key_file = _key_file(tmp_path)
    config = _config(tmp_path, f'[client]\napi_key = "{KEY}"\napi_key_file = "{key_file}"\n')
    refused = _refused(_home(tmp_path))
    assert refused.details["field"] == "client.api_key"
    assert "not both" in refused.message and str(config) in refused.message


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (f"Bearer {KEY}", "without 'Bearer '"),
        (f"{KEY} trailing", "printable ASCII"),
        ("apk_\u00e9" + SECRET, "printable ASCII"),
        ("k" * 5000, "up to 4096"),
    ],
)
def test_a_bad_key_in_the_environment_names_the_variable_and_never_echoes_it(
    tmp_path: Path, value: str, says: str
) -> None:
    refused = _refused({**_home(tmp_path), "APIARY_API_KEY": value})
    assert refused.details["field"] == "APIARY_API_KEY" and says in refused.message
    assert SECRET not in refused.message and "k" * 20 not in refused.message


def test_bad_environment_values_name_their_variable(tmp_path: Path) -> None:
    for variable, value in (("APIARY_AUDIENCE", "a b"), ("APIARY_COORDINATOR", "nowhere")):
        refused = _refused({**_home(tmp_path), variable: value})
        assert refused.details["field"] == variable
    refused = _refused({**_home(tmp_path), "APIARY_TLS_CERT": "me.pem"})
    assert refused.details["field"] == "APIARY_TLS_KEY"


def test_bad_arguments_are_refused_too(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"api_key: give the key alone"):
        ClientCredentials.load(_home(tmp_path), api_key=f"Bearer {KEY}")
    with pytest.raises(ValidationError, match=r"audience: must be"):
        ClientCredentials(audience="")


# --- files that hold a key --------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_a_key_file_others_can_read_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    key_file = _key_file(tmp_path, mode=mode)
    config = _config(tmp_path, f'[client]\napi_key_file = "{key_file}"\n')
    refused = _refused(_home(tmp_path))
    assert refused.details["field"] == "client.api_key_file"
    assert f"chmod 600 {key_file}" in refused.message
    assert f"mode {mode:04o}" in refused.message and str(config) in refused.message
    assert SECRET not in refused.message


def test_a_key_file_for_the_owner_alone_is_accepted(tmp_path: Path) -> None:
    for mode in (0o600, 0o400):
        key_file = _key_file(tmp_path, mode=mode)
        _config(tmp_path, f'[client]\napi_key_file = "{key_file}"\n')
        assert ClientCredentials.load(_home(tmp_path)).api_key == KEY
        key_file.chmod(0o600)


def test_a_config_file_holding_a_key_must_be_the_owners_alone(tmp_path: Path) -> None:
    config = _config(tmp_path, f'[client]\napi_key = "{KEY}"\n', mode=0o644)
    refused = _refused(_home(tmp_path))
    assert refused.details["field"] == "client.api_key"
    assert f"chmod 600 {config}" in refused.message and SECRET not in refused.message
    config.chmod(0o600)
    assert ClientCredentials.load(_home(tmp_path)).api_key == KEY
    # Without a key the file may be shared.
    _config(tmp_path, '[client]\naudience = "shared"\n', mode=0o644)
    assert ClientCredentials.load(_home(tmp_path)).audience == "shared"


def test_an_empty_or_unreadable_key_file_is_refused(tmp_path: Path) -> None:
    key_file = _key_file(tmp_path, key="")
    _config(tmp_path, f'[client]\napi_key_file = "{key_file}"\n')
    assert "is empty" in _refused(_home(tmp_path)).message
    key_file.unlink()
    refused = _refused(_home(tmp_path))
    assert "cannot read" in refused.message and str(key_file) in refused.message


# --- secrets are never shown ------------------------------------------------------------------


def test_repr_and_str_show_the_key_id_never_the_secret(tmp_path: Path) -> None:
    loaded = ClientCredentials.load({**_home(tmp_path), "APIARY_API_KEY": KEY})
    for shown in (repr(loaded), str(loaded), f"{loaded}", loaded.describe()):
        assert SECRET not in shown
    assert "apk_abcdefghijkm_***" in repr(loaded)
    assert loaded.key_id == "abcdefghijkm"
    assert loaded.describe() == "API key abcdefghijkm (from APIARY_API_KEY)"


def test_an_operator_token_is_masked_whole() -> None:
    token = ClientCredentials(api_key="operator-secret-token")
    assert token.key_id == "" and token.masked_key == "***"
    assert "operator-secret-token" not in repr(token)
    assert token.describe() == "an operator token (from argument)"


# --- what the calls carry ---------------------------------------------------------------------


def test_the_bearer_key_yields_to_a_credential_the_call_carries() -> None:
    bearer = ClientCredentials(api_key=KEY).bearer()
    assert bearer is not None
    assert list(bearer(HEARTBEAT, [("sw4rm-agent-id", "bob")])) == [
        ("authorization", f"Bearer {KEY}")
    ]
    assert list(bearer(HEARTBEAT, [("authorization", "Bearer operator-token")])) == []
    assert list(bearer(HEARTBEAT, [(PROOF_KEY, "v1;bob;1;x;y")])) == []


def test_a_call_proof_verifies_for_its_method_with_a_fresh_nonce() -> None:
    key = Ed25519PrivateKey.generate()
    prover = CallProver("bob", key, audience="aud", now=lambda: 1_700_000_000.123)
    ((name, first),) = prover(HEARTBEAT, [])
    ((_, second),) = prover(HEARTBEAT, [])
    assert name == PROOF_KEY
    proofs = [parse_proof(first), parse_proof(second)]
    for proof in proofs:
        assert not isinstance(proof, str)
        assert (proof.agent_id, proof.unix_ms, len(proof.nonce)) == ("bob", 1_700_000_000_123, 16)
        signed = proof_payload("aud", HEARTBEAT, "bob", proof.unix_ms, proof.nonce)
        assert verifies(public_bytes(key), signed, proof.signature)
        other = proof_payload("aud", REGISTER_METHOD, "bob", proof.unix_ms, proof.nonce)
        assert not verifies(public_bytes(key), other, proof.signature)
    assert not isinstance(proofs[0], str) and not isinstance(proofs[1], str)
    assert proofs[0].nonce != proofs[1].nonce


def test_a_call_proof_is_not_added_to_registration_or_beside_another_credential() -> None:
    prover = CallProver("bob", Ed25519PrivateKey.generate())
    assert list(prover(REGISTER_METHOD, [])) == []
    assert list(prover(HEARTBEAT, [("authorization", "Bearer t")])) == []
    assert list(prover(HEARTBEAT, [(PROOF_KEY, "given")])) == []


async def test_an_agent_proves_its_calls_by_default_only_without_a_key_or_certificate(
    tmp_path: Path,
) -> None:
    key = Ed25519PrivateKey.generate()
    worker = Principal(PrincipalKind.AGENT, "bob")
    issued = issue_dev_certificates(tmp_path, [worker], now=dt.datetime.now(dt.UTC))
    cert = ClientTls(issued.ca_cert, issued.clients[0].cert, issued.clients[0].key)
    cases: list[tuple[dict[str, Any], bool]] = [
        ({"signing_key": key}, True),
        ({}, False),
        ({"signing_key": key, "credentials": ClientCredentials(api_key=KEY)}, False),
        ({"signing_key": key, "tls": cert}, False),
        ({"signing_key": key, "credentials": ClientCredentials(tls=cert)}, False),
        ({"signing_key": key, "prove_calls": False}, False),
        ({"signing_key": key, "credentials": ClientCredentials(api_key=KEY),
          "prove_calls": True}, True),
    ]  # fmt: skip
    for options, proving in cases:
        options.setdefault("credentials", ClientCredentials())
        # Port 9 (discard): nothing is called, so nothing needs to listen.
        connection = Connection("bob", coordinator="127.0.0.1:9", **options)
        connection.connect()
        try:
            assert connection.proves_calls is proving, options
        finally:
            await connection.stop(deregister=False)


def test_proving_calls_needs_the_agents_key() -> None:
    with pytest.raises(ValidationError, match=r"prove_calls: .*signing_key"):
        Connection("bob", coordinator="127.0.0.1:9", prove_calls=True)


# --- what the CLI says it presents ------------------------------------------------------------


def test_the_cli_names_an_api_key_by_id_and_source() -> None:
    presented = Presented.of(ClientCredentials(api_key=KEY, sources={"api_key": "APIARY_API_KEY"}))
    assert presented.text == "API key abcdefghijkm (from APIARY_API_KEY)"
    assert presented.acting_as == "API key abcdefghijkm from APIARY_API_KEY"
    doc = presented.to_json()
    assert (doc["presents"], doc["key_id"], doc["source"], doc["tenant"]) == (
        "api_key", "abcdefghijkm", "APIARY_API_KEY", None,
    )  # fmt: skip
    assert SECRET not in str(doc)
    token = Presented.of(ClientCredentials(api_key=KEY), token="operator-token")
    assert token.acting_as == "an operator token from --token or APIARY_TOKEN"
    assert "operator-token" not in str(token.to_json())
    assert Presented.of(ClientCredentials()).text == "none (anonymous; dev mode only)"


def test_the_cli_names_a_certificates_principal_and_tenant(tmp_path: Path) -> None:
    worker = Principal(PrincipalKind.AGENT, "worker-1", "team-a")
    issued = issue_dev_certificates(tmp_path / "certs", [worker], now=dt.datetime.now(dt.UTC))
    (client,) = issued.clients
    tls = ClientTls(issued.ca_cert, client.cert, client.key)
    presented = Presented.of(ClientCredentials(tls=tls, sources={"tls": "environment"}))
    assert presented.text == (
        "client certificate apiary://team-a/agent/worker-1 (from APIARY_TLS_CERT); "
        "acts as agent:worker-1@team-a, tenant team-a"
    )
    doc = presented.to_json()
    assert (doc["presents"], doc["principal"], doc["tenant"], doc["certificate"]) == (
        "client_certificate", "agent:worker-1@team-a", "team-a", str(client.cert),
    )  # fmt: skip
    # An API key beside the certificate is what the coordinator goes by.
    both = Presented.of(ClientCredentials(api_key=KEY, tls=tls))
    assert (both.kind, both.principal) == ("api_key", None)


def test_a_refusal_as_unauthenticated_or_denied_says_whom_the_cli_acted_as(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("APIARY_CLIENT_CONFIG", raising=False)
    for name in ("APIARY_TLS_CA", "APIARY_TLS_CERT", "APIARY_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APIARY_API_KEY", KEY)
    denied = PermissionDeniedError("agent:bob@default may not call /x: no", {"field": "x"})
    line = refusal("status", denied, with_field=False)
    assert line.endswith("(acting as API key abcdefghijkm from APIARY_API_KEY)")
    unauthenticated = refusal("hitl", UnauthenticatedError("unknown API key"), token="t")
    assert unauthenticated.endswith("(acting as an operator token from --token or APIARY_TOKEN)")
    monkeypatch.setenv("APIARY_API_KEY", "Bearer nope")
    assert "(acting as unknown: the credentials cannot be loaded: APIARY_API_KEY" in refusal(
        "status", denied
    )
    monkeypatch.delenv("APIARY_API_KEY")
    assert refusal("status", denied).endswith("(acting as anonymous, with no credential)")
    assert "acting as" not in refusal("status", ValidationError("bad"))


def test_the_tenant_comes_from_the_environment_or_the_file_and_is_checked(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text('[client]\ntenant = "acme"\n')
    config.chmod(0o600)
    assert ClientCredentials.load({}, config).tenant == "acme"
    assert ClientCredentials.load({"APIARY_TENANT": "globex"}, config).tenant == "globex"
    assert ClientCredentials(api_key="").tenant == ""
    with pytest.raises(ValidationError) as caught:
        ClientCredentials.load({"APIARY_TENANT": "not a tenant"}, config)
    assert "APIARY_TENANT" in caught.value.message or caught.value.details["field"] == "tenant"
    add = ClientCredentials(tenant="acme").tenant_metadata()
    assert add is not None
    assert list(add("/a.B/C", [])) == [("apiary-tenant", "acme")]
    assert list(add("/a.B/C", [("apiary-tenant", "other")])) == []
