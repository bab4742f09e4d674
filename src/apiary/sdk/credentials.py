"""What a client presents to a coordinator (DESIGN.md section 9), taken from one place.

Agents, `apiary.Client` and every CLI command get their credentials from
`ClientCredentials.load()`; each setting comes from the first of:

1. explicit arguments (`ClientCredentials.load(api_key=...)`, or `credentials=` given to
   `open_channel`, `Client`, `Connection`, `Agent`);
2. the environment: `APIARY_API_KEY`, `APIARY_TLS_CA` / `APIARY_TLS_CERT` / `APIARY_TLS_KEY`,
   `APIARY_AUDIENCE`, `APIARY_COORDINATOR`, `APIARY_TENANT`;
3. the client configuration file, `$APIARY_CLIENT_CONFIG`, else
   `$XDG_CONFIG_HOME/apiary/client.toml` (`~/.config/apiary/client.toml`): its `[client]`
   table, or, when a profile is chosen (`load(profile=...)`, else `APIARY_PROFILE`; the CLI's
   `--profile`), that profile's table instead:

       [client]
       api_key_file = "~/.config/apiary/api-key"  # or api_key = "apk_..."
       tls_ca = "ca.pem"                           # relative paths: from the file's folder
       tls_cert = "me.pem"                         # mTLS: a certificate and its key
       tls_key = "me.key"
       audience = "apiary"                         # what agents' call proofs name
       coordinator = "coordinator.example:50051"   # (older files: grpc = ...)
       tenant = "acme"                             # apiary-tenant on every call (optional)

       [profiles.staging]                          # the same settings, used whole
       coordinator = "staging.example:50051"
       tls_ca = "staging-ca.pem"
       api_key_file = "staging-key"

A profile is a complete set of settings: nothing of `[client]` is mixed into it.

The TLS settings are one group, taken whole from the first place that sets any of them, so
that a certificate is never paired with a key from somewhere else. A file that holds an API
key (`api_key_file`, or the configuration file when it says `api_key`) must be readable by
its owner alone (`chmod 600`), as SSH insists for its keys.

An API key is a secret: nothing here logs or prints it, and `repr` shows only its key id.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.core.access.principal import DEFAULT_TENANT, TENANT_KEY
from apiary.core.access.proof import (
    DEFAULT_AUDIENCE,
    PROOF_KEY,
    CallProof,
    encode_proof,
    proof_payload,
)
from apiary.errors import ValidationError

API_KEY_ENV: Final = "APIARY_API_KEY"
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
AUDIENCE_ENV: Final = "APIARY_AUDIENCE"
TENANT_ENV: Final = "APIARY_TENANT"
COORDINATOR_ENV: Final = "APIARY_COORDINATOR"
DEFAULT_COORDINATOR: Final = "127.0.0.1:50051"
"""Where a client connects when nothing names a coordinator."""
PROFILE_ENV: Final = "APIARY_PROFILE"
CONFIG_ENV: Final = "APIARY_CLIENT_CONFIG"
TLS_CA_ENV: Final = "APIARY_TLS_CA"
TLS_CERT_ENV: Final = "APIARY_TLS_CERT"
TLS_KEY_ENV: Final = "APIARY_TLS_KEY"
CONFIG_TABLE: Final = "client"
PROFILES_TABLE: Final = "profiles"
CONFIG_KEYS: Final = (
    "api_key", "api_key_file", "tls_ca", "tls_cert", "tls_key", "audience", "coordinator",
    "grpc", "tenant",
)  # fmt: skip
OLD_COORDINATOR_KEY: Final = "grpc"
"""The older name of a table's `coordinator` setting, still read."""
AUTHORIZATION: Final = "authorization"
BEARER: Final = "Bearer "
ARGUMENT: Final = "argument"
"""The source of a setting given explicitly by the program."""
ENVIRONMENT: Final = "environment"
"""The source of TLS settings taken from APIARY_TLS_CA / _CERT / _KEY."""
ANONYMOUS_TEXT: Final = "none (anonymous; dev mode only)"
REGISTER_METHOD: Final = "/sw4rm.registry.RegistryService/RegisterAgent"
NONCE_BYTES: Final = 16
MAX_KEY_CHARS: Final = 4096
MAX_CONFIG_BYTES: Final = 64 * 1024

_API_KEY_ID = re.compile(r"^apk_([a-z2-7]+)_")
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):[0-9]{1,5}$")
_PROFILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

Pairs = Sequence[tuple[str, str | bytes]]
CallMetadata = Callable[[str, Pairs], Sequence[tuple[str, str]]]
"""Given a call's full method name (`/package.Service/Method`) and the metadata it carries
so far, the metadata to add to it (none: nothing)."""


@dataclass(frozen=True, slots=True)
class ClientTls:
    """TLS towards the coordinator: the CA to trust (None: the system's roots) and, for
    mTLS, this client's certificate and key (both or neither)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValidationError.for_field(
                "cert" if self.cert is None else "key",
                "a client certificate and its key go together (mTLS needs both)",
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTls | None:
        """From APIARY_TLS_CA / APIARY_TLS_CERT / APIARY_TLS_KEY; None when none is set."""
        env = os.environ if env is None else env
        values = {name: env.get(name, "") for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV)}
        if not any(values.values()):
            return None
        if bool(values[TLS_CERT_ENV]) != bool(values[TLS_KEY_ENV]):
            missing = TLS_CERT_ENV if not values[TLS_CERT_ENV] else TLS_KEY_ENV
            raise ValidationError.for_field(missing, "is needed too: mTLS takes both")
        ca, cert, key = (Path(v) if v else None for v in values.values())
        return cls(ca, cert, key)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, TLS_CA_ENV),
            private_key=_read(self.key, TLS_KEY_ENV),
            certificate_chain=_read(self.cert, TLS_CERT_ENV),
        )


@dataclass(frozen=True, slots=True, repr=False)
class ClientCredentials:
    """What every call of a client presents: an API key (or an operator token) as
    `authorization: Bearer`, and TLS settings, whose client certificate authenticates the
    calls that carry no other credential. `audience` is what an agent's per-call proofs
    name; `coordinator` is the address the configuration gives (HOST:PORT, "" for none).

    `sources` says where each setting came from (`api_key`, `tls`, `audience`,
    `coordinator` -> "argument", a variable's name, or a file), for messages and
    `apiary status`."""

    api_key: str = ""
    tls: ClientTls | None = None
    audience: str = DEFAULT_AUDIENCE
    coordinator: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    tenant: str = ""
    """The tenant the calls act in (`apiary-tenant`): a global operator's choice, and the
    tenant whose registry checks an agent's per-call proofs; "" for the principal's own."""
    profile: str = ""
    """The configuration file's profile the settings were taken from ("" for `[client]`)."""

    def __post_init__(self) -> None:
        for name, why in (
            ("api_key", _key_problem(self.api_key)),
            ("audience", _audience_problem(self.audience)),
            ("coordinator", _address_problem(self.coordinator)),
            ("tenant", _tenant_problem(self.tenant)),
        ):
            if why is not None:
                raise ValidationError.for_field(name, why)

    def __repr__(self) -> str:
        return (
            f"ClientCredentials(api_key={self.masked_key!r}, tls={self.tls!r}, "
            f"audience={self.audience!r}, coordinator={self.coordinator!r}, "
            f"tenant={self.tenant!r}, profile={self.profile!r})"
        )

    __str__ = __repr__

    @property
    def key_id(self) -> str:
        """The key id of an API key (`apk_<key id>_<secret>`): the part that may be shown.
        "" without a key, or for an operator token, which has no id."""
        found = _API_KEY_ID.match(self.api_key)
        return found.group(1) if found else ""

    @property
    def masked_key(self) -> str:
        """The API key with its secret hidden: `apk_<key id>_***`, `***` for an operator
        token, "" without a key."""
        if not self.api_key:
            return ""
        return f"apk_{self.key_id}_***" if self.key_id else "***"

    @property
    def client_certificate(self) -> Path | None:
        """The certificate mTLS presents, if any."""
        return self.tls.cert if self.tls is not None else None

    def presented(self) -> tuple[str, str]:
        """What the calls present and where it came from, for people (the secret never in
        it): ("API key <key id>", "APIARY_API_KEY"), ("an operator token", "argument"),
        ("client certificate <file>", "APIARY_TLS_CERT"), or ("none", "") for anonymous
        calls. An API key is what the coordinator goes by when there is a certificate too."""
        if self.api_key:
            what = f"API key {self.key_id}" if self.key_id else "an operator token"
            return what, self.sources.get("api_key", ARGUMENT)
        if self.client_certificate is not None:
            where = self.sources.get("tls", ARGUMENT)
            return f"client certificate {self.client_certificate}", (
                TLS_CERT_ENV if where == ENVIRONMENT else where
            )
        return "none", ""

    def describe(self) -> str:
        """`presented()` as one phrase: `API key <key id> (from APIARY_API_KEY)`, ...,
        `none (anonymous; dev mode only)`."""
        what, source = self.presented()
        return f"{what} (from {source})" if source else ANONYMOUS_TEXT

    def bearer(self) -> CallMetadata | None:
        """The per-call metadata that presents the API key, or None without one: every call
        carries `authorization: Bearer <key>` unless it carries its own credential (an
        operator token given for the call, or an agent's proof), which wins."""
        if not self.api_key:
            return None
        value = BEARER + self.api_key

        def add(method: str, present: Pairs) -> Sequence[tuple[str, str]]:
            if any(key in (AUTHORIZATION, PROOF_KEY) for key, _ in present):
                return ()
            return ((AUTHORIZATION, value),)

        return add

    def tenant_metadata(self) -> CallMetadata | None:
        """The per-call metadata naming the tenant (None without one), unless the call
        names one itself."""
        if not self.tenant:
            return None
        chosen = self.tenant

        def add(method: str, present: Pairs) -> Sequence[tuple[str, str]]:
            if any(key == TENANT_KEY for key, _ in present):
                return ()
            return ((TENANT_KEY, chosen),)

        return add

    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        config_file: Path | None = None,
        *,
        api_key: str | None = None,
        tls: ClientTls | None = None,
        audience: str | None = None,
        coordinator: str | None = None,
        tenant: str | None = None,
        profile: str | None = None,
    ) -> ClientCredentials:
        """The credentials from the arguments, then `env` (default: the process
        environment), then the configuration file (`config_file`, else as the module
        docstring says): its `[client]` table, or the `[profiles.NAME]` table of `profile`
        (else `APIARY_PROFILE`). A bad value raises ValidationError naming the setting and
        the variable or file it came from; so does a profile the file does not have."""
        env = os.environ if env is None else env
        sources: dict[str, str] = {}
        chosen_profile = _pick(profile, env, PROFILE_ENV, "profile", sources) or ""
        if chosen_profile:
            _check(_profile_problem(chosen_profile), "profile", sources["profile"])
        config = _Config.read(config_file, env, chosen_profile)
        key = _pick(api_key, env, API_KEY_ENV, "api_key", sources)
        if key is None:
            key = config.api_key(sources)
        else:
            _check(_key_problem(key), "api_key", sources["api_key"])
        chosen_tls = _pick_tls(tls, env, config, sources)
        chosen_audience = _pick(audience, env, AUDIENCE_ENV, "audience", sources)
        if chosen_audience is None:
            chosen_audience = config.text("audience", _audience_problem, sources)
        else:
            _check(_audience_problem(chosen_audience), "audience", sources["audience"])
        address = _pick(coordinator, env, COORDINATOR_ENV, "coordinator", sources)
        if address is None:
            address = config.coordinator(sources)
        else:
            _check(_address_problem(address), "coordinator", sources["coordinator"])
        chosen_tenant = _pick(tenant, env, TENANT_ENV, "tenant", sources)
        if chosen_tenant is None:
            chosen_tenant = config.text("tenant", _tenant_problem, sources)
        else:
            _check(_tenant_problem(chosen_tenant), "tenant", sources["tenant"])
        return cls(
            key or "", chosen_tls, chosen_audience or DEFAULT_AUDIENCE, address or "", sources,
            chosen_tenant or "", chosen_profile,
        )  # fmt: skip


class CallProver:
    """Adds an agent's per-call proof (`apiary-agent-proof`, core/access/proof.py) to each
    call: its registered Ed25519 key signs the audience, the method, its id, the time in
    milliseconds and a fresh 16-byte nonce, so the coordinator knows the call is the
    agent's without a shared secret, and refuses it replayed or for another method.

    RegisterAgent carries none (a first registration has no registered key to check it
    against; the request is signed by `sw4rm-signature` instead), nor does a call that
    carries its own proof or `authorization`."""

    def __init__(
        self,
        agent_id: str,
        key: Ed25519PrivateKey,
        *,
        audience: str = DEFAULT_AUDIENCE,
        tenant: str = "",
        now: Callable[[], float] = time.time,
    ) -> None:
        self._agent_id = agent_id
        self._key = key
        self._audience = audience
        self._tenant = tenant or DEFAULT_TENANT
        """The tenant the proofs are for (the calls' `apiary-tenant`; default `default`)."""
        self._now = now

    def proof(self, method: str) -> str:
        """The metadata value proving one call of `method`."""
        unix_ms = int(self._now() * 1000)
        nonce = secrets.token_bytes(NONCE_BYTES)
        payload = proof_payload(
            self._audience, method, self._agent_id, unix_ms, nonce, self._tenant
        )
        signature = self._key.sign(payload)
        return encode_proof(CallProof(self._agent_id, unix_ms, nonce, signature))

    def __call__(self, method: str, present: Pairs) -> Sequence[tuple[str, str]]:
        if method == REGISTER_METHOD or any(
            key in (AUTHORIZATION, PROOF_KEY) for key, _ in present
        ):
            return ()
        return ((PROOF_KEY, self.proof(method)),)


# --- the configuration file -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Config:
    """The table a configuration file gives the client (`[client]`, or the chosen profile's),
    its values checked for type; `where` names it in messages and sources."""

    path: Path | None
    values: Mapping[str, str]
    where: str = ""
    table: str = CONFIG_TABLE
    """`client`, or `profiles.NAME`: settings are named `<table>.<setting>` in refusals."""

    @classmethod
    def read(cls, given: Path | None, env: Mapping[str, str], profile: str = "") -> _Config:
        """The file's `[client]` table, or `profile`'s."""
        path, named_by = _config_path(given, env)
        try:
            with path.open("rb") as source:
                data = source.read(MAX_CONFIG_BYTES + 1)
        except FileNotFoundError:
            if named_by:
                raise ValidationError.for_field(
                    named_by, f"{path} does not exist; create it or name another file"
                ) from None
            if profile:
                raise _unknown_profile(profile, path, ()) from None
            return cls(None, {})
        except OSError as exc:
            raise ValidationError.for_field(
                named_by or "config_file", f"cannot read {path}: {exc.strerror}"
            ) from None
        if len(data) > MAX_CONFIG_BYTES:
            raise ValidationError.for_field(
                named_by or "config_file",
                f"{path} is over {MAX_CONFIG_BYTES} bytes: not a client configuration",
            )
        client, profiles = _tables(path, data)
        if not profile:
            return cls(path, client, str(path))
        if profile not in profiles:
            raise _unknown_profile(profile, path, sorted(profiles))
        table = f"{PROFILES_TABLE}.{profile}"
        return cls(path, profiles[profile], f"{path} [{table}]", table)

    def api_key(self, sources: dict[str, str]) -> str | None:
        """The key the file gives, inline or in `api_key_file`; both files checked to be
        readable by their owner alone."""
        inline, named = self.values.get("api_key"), self.values.get("api_key_file")
        if inline is None and named is None:
            return None
        assert self.path is not None
        if inline is not None and named is not None:
            raise ValidationError.for_field(
                f"{self.table}.api_key", f"give api_key or api_key_file in {self.where}, not both"
            )
        if inline is not None:
            _check(_key_problem(inline), f"{self.table}.api_key", self.where)
            try:
                too_open = _shared(self.path.stat().st_mode, self.path)
            except OSError as exc:
                too_open = f"cannot read {self.path}: {exc.strerror}"
            if too_open is not None:
                raise ValidationError.for_field(f"{self.table}.api_key", too_open)
            sources["api_key"] = self.where
            return inline
        assert named is not None
        key_file = self._path_of(named)
        key = _read_key_file(key_file, self.where, self.table)
        sources["api_key"] = str(key_file)
        return key

    def text(
        self,
        name: str,
        problem: Callable[[str], str | None],
        sources: dict[str, str],
        *,
        into: str = "",
    ) -> str | None:
        value = self.values.get(name)
        if value is None:
            return None
        _check(problem(value), f"{self.table}.{name}", self.where)
        sources[into or name] = self.where
        return value

    def coordinator(self, sources: dict[str, str]) -> str | None:
        """The table's `coordinator`, or its older name `grpc` (not both)."""
        if "coordinator" in self.values and OLD_COORDINATOR_KEY in self.values:
            raise ValidationError.for_field(
                f"{self.table}.coordinator",
                f"give coordinator or {OLD_COORDINATOR_KEY} in {self.where}, not both",
            )
        name = OLD_COORDINATOR_KEY if OLD_COORDINATOR_KEY in self.values else "coordinator"
        return self.text(name, _address_problem, sources, into="coordinator")

    def tls(self) -> ClientTls | None:
        given = {k: self.values[k] for k in ("tls_ca", "tls_cert", "tls_key") if k in self.values}
        if not given:
            return None
        if ("tls_cert" in given) != ("tls_key" in given):
            missing = "tls_key" if "tls_cert" in given else "tls_cert"
            raise ValidationError.for_field(
                f"{self.table}.{missing}", f"is needed too in {self.where}: mTLS takes both"
            )
        paths: dict[str, Path] = {}
        for name, value in given.items():
            path = self._path_of(value)
            if not path.is_file():
                raise ValidationError.for_field(
                    f"{self.table}.{name}", f"{path} (in {self.where}) is not a readable file"
                )
            paths[name] = path
        return ClientTls(paths.get("tls_ca"), paths.get("tls_cert"), paths.get("tls_key"))

    def _path_of(self, value: str) -> Path:
        """`value` as a path: `~` is the home folder, relative to the file's folder."""
        assert self.path is not None
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.path.parent / path


def _config_path(given: Path | None, env: Mapping[str, str]) -> tuple[Path, str]:
    """The configuration file to read, and what named it ("" for the default place, where
    the file may be missing; a file named explicitly must exist)."""
    if given is not None:
        return given, "config_file"
    named = env.get(CONFIG_ENV, "")
    if named:
        return Path(named).expanduser(), CONFIG_ENV
    base = env.get("XDG_CONFIG_HOME", "")
    if base:
        return Path(base) / "apiary" / "client.toml", ""
    home = env.get("HOME", "")
    return (Path(home) if home else Path.home()) / ".config" / "apiary" / "client.toml", ""


def _tables(path: Path, data: bytes) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The file's `[client]` table and its profiles (`[profiles.NAME]`), checked."""
    try:
        doc = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValidationError.for_field("config_file", f"{path} is not TOML: {exc}") from None
    for name in doc:
        if name not in (CONFIG_TABLE, PROFILES_TABLE):
            raise ValidationError.for_field(
                name,
                f"unknown setting in {path}: client settings go in a [{CONFIG_TABLE}] table "
                f"or a [{PROFILES_TABLE}.NAME] table ({', '.join(CONFIG_KEYS)})",
            )
    client = _values(doc.get(CONFIG_TABLE, {}), CONFIG_TABLE, path)
    named: Any = doc.get(PROFILES_TABLE, {})
    if not isinstance(named, dict):
        raise ValidationError.for_field(
            PROFILES_TABLE, f"must hold [{PROFILES_TABLE}.NAME] tables in {path}"
        )
    profiles: dict[str, dict[str, str]] = {}
    for name, table in named.items():
        where = f"{PROFILES_TABLE}.{name}"
        why = _profile_problem(name)
        if why is not None:
            raise ValidationError.for_field(where, f"{why} (in {path})")
        profiles[name] = _values(table, where, path)
    return client, profiles


def _values(table: Any, where: str, path: Path) -> dict[str, str]:
    """The settings of one table (`where`: its name), known and strings."""
    if not isinstance(table, dict):
        raise ValidationError.for_field(where, f"must be a [{where}] table in {path}")
    values: dict[str, str] = {}
    for name, value in table.items():
        if name not in CONFIG_KEYS:
            raise ValidationError.for_field(
                f"{where}.{name}", f"unknown setting in {path}; known: {', '.join(CONFIG_KEYS)}"
            )
        if not isinstance(value, str):
            raise ValidationError.for_field(f"{where}.{name}", f"must be a string in {path}")
        values[name] = value
    return values


def _unknown_profile(profile: str, path: Path, known: Sequence[str]) -> ValidationError:
    """The refusal of a profile `path` does not have."""
    if known:
        has = f"{path} has {', '.join(known)}"
    elif path.exists():
        has = f"{path} has no [{PROFILES_TABLE}.NAME] tables"
    else:
        has = f"there is no client configuration file {path}"
    return ValidationError.for_field("profile", f"no profile {profile!r}: {has}")


# --- picking and checking ---------------------------------------------------------------------


def _pick(
    given: str | None, env: Mapping[str, str], variable: str, name: str, sources: dict[str, str]
) -> str | None:
    """An explicit value, else a set variable, else None (the file decides)."""
    if given is not None:
        sources[name] = ARGUMENT
        return given
    value = env.get(variable, "")
    if value:
        sources[name] = variable
        return value
    return None


def _pick_tls(
    given: ClientTls | None, env: Mapping[str, str], config: _Config, sources: dict[str, str]
) -> ClientTls | None:
    if given is not None:
        sources["tls"] = ARGUMENT
        return given
    from_env = ClientTls.from_env(env)
    if from_env is not None:
        sources["tls"] = ENVIRONMENT
        return from_env
    from_file = config.tls()
    if from_file is not None:
        sources["tls"] = config.where
    return from_file


def _check(why: str | None, name: str, where: str) -> None:
    """Refuse a bad value, naming the variable it came from, else the setting and its file."""
    if why is None:
        return
    if where.startswith("APIARY_"):
        raise ValidationError.for_field(where, why)
    suffix = "" if where == ARGUMENT else f" (in {where})"
    raise ValidationError.for_field(name, why + suffix)


def _key_problem(value: str) -> str | None:
    """Why `value` is no usable API key or token (never echoing it), or None."""
    if not value:
        return None
    if value[: len(BEARER)].lower() == BEARER.lower():
        return "give the key alone, without 'Bearer '"
    if len(value) > MAX_KEY_CHARS or not _PRINTABLE.match(value):
        return (
            f"must be up to {MAX_KEY_CHARS} printable ASCII characters without spaces, as "
            "`apiary auth create` printed it"
        )
    return None


def _profile_problem(value: str) -> str | None:
    if not _PROFILE.match(value):
        return "a profile's name is 1-64 letters, digits or ._- (a [profiles.NAME] table)"
    return None


def _tenant_problem(value: str) -> str | None:
    if value and not _TENANT.match(value):
        return "must be 1-128 letters, digits or ._@:- (a tenant's name)"
    return None


def _audience_problem(value: str) -> str | None:
    if not value or len(value) > 128 or not _PRINTABLE.match(value):
        return (
            "must be 1-128 printable ASCII characters without spaces, as the coordinator's "
            "[auth] audience says"
        )
    return None


def _address_problem(value: str) -> str | None:
    if value and not _HOST_PORT.match(value):
        return f"{value[:64]!r} must be HOST:PORT (e.g. 127.0.0.1:50051)"
    return None


def _shared(mode: int, path: Path) -> str | None:
    """Why a file holding a key with `mode` is too open, or None: like an SSH key, it is
    its owner's alone (a file others may write could have its key swapped, too)."""
    if not mode & 0o077:
        return None
    return (
        f"{path} holds an API key and is open to group or others "
        f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`"
    )


def _read_key_file(path: Path, config: str, table: str = CONFIG_TABLE) -> str:
    """The key in `path` (named by `api_key_file` in `config`), its mode checked on the open
    file, so that nothing can swap the file between the check and the read."""

    def refuse(why: str) -> ValidationError:
        return ValidationError.for_field(f"{table}.api_key_file", f"{why} (in {config})")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise refuse(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as source:
        too_open = _shared(os.fstat(fd).st_mode, path)
        if too_open is not None:
            raise refuse(too_open)
        data = source.read(MAX_KEY_CHARS + 2)
    try:
        key = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise refuse(f"{path} is not an API key (not ASCII text)") from None
    if not key:
        raise refuse(f"{path} is empty; put the API key in it")
    why = _key_problem(key)
    if why is not None:
        raise refuse(f"{path}: {why}")
    return key


def _read(path: Path | None, name: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValidationError.for_field(name, f"cannot read {path}: {exc.strerror}") from None
