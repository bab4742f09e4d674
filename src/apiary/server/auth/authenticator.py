"""Resolves the principal of a call from what the transport carried (DESIGN.md section 9):
an explicit credential of the call first (`authorization: Bearer` with an API key or an
operator token, or an agent's per-call proof), else the connection's client certificate,
else anonymous. A credential that is presented and wrong is refused, never ignored."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from apiary.core.access.principal import (
    ANONYMOUS,
    DEFAULT_TENANT,
    TENANT_KEY,
    Mechanism,
    Principal,
    PrincipalKind,
)
from apiary.core.access.proof import DEFAULT_AUDIENCE, PROOF_KEY, parse_proof, proof_payload
from apiary.core.cluster.forwarding import FORWARD_KEY
from apiary.core.signatures import verifies
from apiary.engine.operators import BEARER, Operators
from apiary.errors import InternalError, UnauthenticatedError
from apiary.server.auth.certificates import CertificateRule, principal_from_pem
from apiary.server.auth.forwarded import not_clustered
from apiary.server.auth.keys import KEY_PREFIX, CredentialsFileError, KeyRing
from apiary.server.auth.replay import ReplayWindow
from apiary.server.context import CallContext

API_KEY_PREFIX = f"{KEY_PREFIX}_"
log = logging.getLogger("apiary.auth")


class Authenticator:
    def __init__(
        self,
        *,
        operators: Operators,
        keys: KeyRing | None,
        certificates: Sequence[CertificateRule],
        public_key: Callable[[str, str], bytes],
        now: Callable[[], float],
        audience: str = DEFAULT_AUDIENCE,
        window_s: float = 60.0,
        secure: bool = False,
        forwarded: Callable[[str, str], Principal] = not_clustered,
    ) -> None:
        self._operators = operators
        self._forwarded = forwarded
        """The principal of a call another replica forwarded (cluster mode), or the
        refusal (`server.auth.forwarded`)."""
        self._keys = keys
        self._certificates = tuple(certificates)
        self._public_key = public_key
        self._now = now
        self._audience = audience
        self._replays = ReplayWindow(window_s)
        self._secure = secure
        """In dev mode a certificate that maps to no principal leaves the caller anonymous."""

    @property
    def operators_configured(self) -> bool:
        """Whether the configuration has operators (dev-mode rules may then ask for one)."""
        return self._operators.configured

    def principal(self, ctx: CallContext, method: str) -> Principal:
        """Who the call is; UnauthenticatedError for a credential that does not hold. A call
        forwarded by another replica of the cluster acts as the principal that replica
        established, once its signature holds (`server.auth.forwarded`)."""
        forwarded = ctx.get(FORWARD_KEY)
        if forwarded:
            return self._forwarded(forwarded, method)
        authorization = ctx.get("authorization")
        if authorization:
            return self._bearer(authorization)
        proof = ctx.get(PROOF_KEY)
        if proof:
            return self._proof(proof, method, ctx.get(TENANT_KEY))
        pem = ctx.peer_certificate()
        if pem:
            found = principal_from_pem(pem, self._certificates)
            if found is None and not self._secure:
                return ANONYMOUS
            if found is None:
                raise UnauthenticatedError(
                    "the client certificate maps to no principal: give it an "
                    "apiary://<tenant>/<kind>/<name> URI SAN or add an [[auth.certificates]] "
                    "entry for it",
                    {"field": "certificate"},
                )
            return found
        return ANONYMOUS

    def _bearer(self, authorization: str) -> Principal:
        if not authorization.lower().startswith(BEARER):
            raise UnauthenticatedError(
                "authorization must be `Bearer <API key or operator token>`",
                {"field": "authorization"},
            )
        token = authorization[len(BEARER) :].strip()
        if token.startswith(API_KEY_PREFIX) and self._keys is not None:
            try:
                return self._keys.authenticate(token, self._now())
            except CredentialsFileError:
                # The file's path and problem are the operator's to read, not the caller's.
                log.exception("the API key ring cannot be read")
                raise InternalError(
                    "API keys cannot be checked; see the coordinator's log"
                ) from None
        operator = self._operators.authenticate(authorization)
        return Principal(
            PrincipalKind.OPERATOR, operator.name, roles=operator.roles,
            mechanism=Mechanism.OPERATOR_TOKEN,
        )  # fmt: skip

    def _proof(self, text: str, method: str, ctx_tenant: str) -> Principal:
        proof = parse_proof(text)
        if isinstance(proof, str):
            raise UnauthenticatedError(proof, {"field": PROOF_KEY})
        tenant = ctx_tenant or DEFAULT_TENANT
        key = self._public_key(tenant, proof.agent_id)
        payload = proof_payload(
            self._audience, method, proof.agent_id, proof.unix_ms, proof.nonce, tenant
        )
        if not key or not verifies(key, payload, proof.signature):
            raise UnauthenticatedError(
                f"{PROOF_KEY}: not a signature of this call by {proof.agent_id}'s registered key "
                f"(audience {self._audience!r}, method {method})",
                {"field": PROOF_KEY},
            )
        refused = self._replays.accept(
            f"{tenant}\0{proof.agent_id}\0".encode() + proof.nonce,
            proof.unix_ms / 1000,
            self._now(),
        )
        if refused is not None:
            raise UnauthenticatedError(f"{PROOF_KEY}: {refused}", {"field": PROOF_KEY})
        return Principal(
            PrincipalKind.AGENT, proof.agent_id, tenant, mechanism=Mechanism.AGENT_PROOF
        )
