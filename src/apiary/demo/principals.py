"""Who takes part in a demo run, and what each one presents: the demo runs in secure mode
(DESIGN.md section 9), so every call it makes, over gRPC or HTTP, is some principal's.

`issue_principals` makes, in the run's directory:

- `certs/`: a certificate authority of the run's own (apiary.server.auth.devca), the
  coordinator's server certificate (both ports, mTLS: the CA is also `tls_client_ca`), and a
  client certificate per principal naming it by its `apiary://default/<kind>/<name>` SAN;
- `keys/`: an Ed25519 signing key per agent, registered with the agent and signing every
  envelope it sends (`[router] signing_required = true`);
- `certs/<kind>-<name>.toml`: each principal's client configuration (`[client]` tls_ca,
  tls_cert, tls_key), which the agent processes are started with and which a person reuses
  as `APIARY_CLIENT_CONFIG=...` to act as that principal.

The principals, each with what it needs and no more:

- each agent process, as the agent it is (agents hold no roles: they act only as themselves);
- `user`, the agent the job sends the brief as and reads the planner's report with;
- the operator who decides the merge (the person at the terminal or `demo-operator`), with
  the roles of its `[[hitl.operators]]` entry: deciding an invocation needs an operator;
- `demo-driver`, the job's reader and the browser's: an operator holding `events` and `dlq`,
  what the operator console reads (the event log, the dead letters), so that a person
  watching the run in the console is refused nothing;
- `demo-app`, the run's application: it drives a session of the runtime control plane (its
  own: a session belongs to the principal that made it) and exports its evidence.
"""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.rules import Role
from apiary.sdk.credentials import ClientCredentials, ClientTls
from apiary.sdk.keys import write_signing_key
from apiary.server.auth.devca import issue_dev_certificates

CERTS_DIR = "certs"
KEYS_DIR = "keys"
USER = "user"
"""The agent id the job sends the brief as."""
DRIVER = "demo-driver"
DRIVER_ROLES = (Role.DLQ.value, Role.EVENTS.value)
"""The console's reads: the event log (`events`) and its dead letter panel (`dlq`)."""
APPLICATION = "demo-app"
"""The application principal that drives the run's runtime control plane session."""
CERTIFICATE_DAYS = 30
"""Long enough to reopen the run with `apiary serve --config` for a while, no longer."""


@dataclass(frozen=True, slots=True)
class Member:
    """One principal of the run and the files it authenticates with."""

    principal: Principal
    does: str
    """What it does in the run (the summary lists it)."""
    tls: ClientTls
    """The run's CA and this principal's client certificate and key."""
    client_config: Path
    """Its `[client]` configuration: `APIARY_CLIENT_CONFIG=<this file>`."""
    signing_key: Path | None = None
    """An agent's Ed25519 key (`apiary agent run --signing-key`)."""

    @property
    def credentials(self) -> ClientCredentials:
        """What its calls present: its client certificate, nothing from the environment."""
        return ClientCredentials(tls=self.tls)

    @property
    def roles(self) -> str:
        """Its roles as the summary says them."""
        if self.principal.kind is not PrincipalKind.OPERATOR:
            return "none: acts only as itself"
        return ", ".join(sorted(self.principal.roles)) or "none"

    def ssl_context(self) -> ssl.SSLContext:
        """A client context for the HTTP port: trusts the run's CA, presents the certificate."""
        assert self.tls.ca is not None and self.tls.cert is not None and self.tls.key is not None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(self.tls.cert, self.tls.key)
        return context


@dataclass(frozen=True, slots=True)
class RunPrincipals:
    """The run's CA, the coordinator's certificate, and every principal of the run."""

    ca: Path
    server_cert: Path
    server_key: Path
    members: tuple[Member, ...]

    def agent(self, agent_id: str) -> Member:
        return self._find(PrincipalKind.AGENT, agent_id)

    def operator(self, name: str) -> Member:
        return self._find(PrincipalKind.OPERATOR, name)

    @property
    def driver(self) -> Member:
        return self._find(PrincipalKind.OPERATOR, DRIVER)

    @property
    def application(self) -> Member:
        return self._find(PrincipalKind.APPLICATION, APPLICATION)

    def _find(self, kind: PrincipalKind, name: str) -> Member:
        for member in self.members:
            if member.principal.kind is kind and member.principal.name == name:
                return member
        raise KeyError(f"no {kind.value} {name!r} among the run's principals")


def issue_principals(
    directory: Path,
    agents: Sequence[tuple[str, str]],
    operator: str,
    operator_roles: Sequence[str],
    *,
    now: dt.datetime,
) -> RunPrincipals:
    """Write the run's CA, certificates, client configurations and signing keys under
    `directory` for `agents` ((agent id, what it does) each), `user`, the HITL `operator`
    with `operator_roles`, the driver and the application. ValidationError when a name cannot be a
    principal's (the message names it) or is taken twice."""
    wanted = [
        *((Principal(PrincipalKind.AGENT, a), does) for a, does in agents),
        (Principal(PrincipalKind.AGENT, USER), "the job's agent: sends the brief, reads the reply"),
        (
            Principal(PrincipalKind.OPERATOR, operator, roles=frozenset(operator_roles)),
            "decides the merge (HITL)",
        ),
        (
            Principal(PrincipalKind.OPERATOR, DRIVER, roles=frozenset(DRIVER_ROLES)),
            "the job's reader: checks the operator console and its data (a browser's too)",
        ),
        (
            Principal(PrincipalKind.APPLICATION, APPLICATION),
            "the application: asks the indexer through the runtime control plane, exports "
            "the session's evidence",
        ),
    ]
    certs = directory / CERTS_DIR
    issued = issue_dev_certificates(certs, [p for p, _ in wanted], days=CERTIFICATE_DAYS, now=now)
    keys = directory / KEYS_DIR
    keys.mkdir(mode=0o700, exist_ok=True)
    members = []
    for (principal, does), client in zip(wanted, issued.clients, strict=True):
        signing_key = None
        if principal.kind is PrincipalKind.AGENT:
            signing_key = keys / f"{principal.name}.pem"
            write_signing_key(signing_key)
        members.append(
            Member(
                principal,
                does,
                ClientTls(issued.ca_cert, client.cert, client.key),
                _client_config(client.cert, issued.ca_cert, client.key, principal),
                signing_key,
            )
        )
    return RunPrincipals(issued.ca_cert, issued.server_cert, issued.server_key, tuple(members))


def _client_config(cert: Path, ca: Path, key: Path, principal: Principal) -> Path:
    """Beside the certificate, relative paths (the file's folder is where they resolve)."""
    path = cert.with_suffix(".toml")
    path.write_text(
        f"# What {principal.label} presents: APIARY_CLIENT_CONFIG={path} apiary ...\n"
        "[client]\n"
        f'tls_ca = "{ca.name}"\n'
        f'tls_cert = "{cert.name}"\n'
        f'tls_key = "{key.name}"\n'
    )
    return path
