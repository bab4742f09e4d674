"""Invite tokens (INTEROP.md): a JWT signed EdDSA by the swarm master, and its URL form.

    header  {"alg":"EdDSA","typ":"JWT"}          compact JSON, base64url without padding
    claims  swarm_id, master, endpoint (with /swarm), expires_at (ISO-8601, optional),
            max_uses (optional), iat (unix seconds)
    token   b64u(header) "." b64u(claims) "." b64u(Ed25519(header "." claims))
    URL     swarm://<swarm_id>@<host:port>?token=<jwt>

Unlike the implementation INTEROP.md describes, `expires_at`, `max_uses` and the endpoint
claim are enforced (`check_invite`).
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from apiary.swarm.errors import SwarmError
from apiary.swarm.keys import Identity, verify
from apiary.swarm.wire import check_endpoint, parse_timestamp

HEADER = {"alg": "EdDSA", "typ": "JWT"}


@dataclass(frozen=True, slots=True)
class InviteClaims:
    swarm_id: str
    master: str
    endpoint: str
    iat: int
    expires_at: str | None = None
    max_uses: int | None = None

    def to_json(self) -> dict[str, Any]:
        claims: dict[str, Any] = {
            "swarm_id": self.swarm_id, "master": self.master, "endpoint": self.endpoint,
        }  # fmt: skip
        if self.expires_at is not None:
            claims["expires_at"] = self.expires_at
        if self.max_uses is not None:
            claims["max_uses"] = self.max_uses
        claims["iat"] = self.iat
        return claims


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _compact(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def encode_invite(identity: Identity, claims: InviteClaims) -> str:
    signing = f"{_b64u(_compact(HEADER))}.{_b64u(_compact(claims.to_json()))}"
    signature = base64.b64decode(identity.sign(signing.encode()))
    return f"{signing}.{_b64u(signature)}"


def _bad(problem: str) -> SwarmError:
    return SwarmError(400, "INVALID_TOKEN", f"invite token: {problem}", field="invite_token")


def decode_invite(token: object, *, insecure: bool = False) -> InviteClaims:
    """The token's claims, NOT verified (see `check_invite`); 400 INVALID_TOKEN if malformed.
    With `insecure` the endpoint claim may be plain http:// to a loopback address."""
    if not isinstance(token, str) or token.count(".") != 2:
        raise _bad("must be a JWT (three base64url parts)")
    head, body, _ = token.split(".")
    try:
        header = json.loads(_unb64u(head))
        claims = json.loads(_unb64u(body))
    except (ValueError, binascii.Error):
        raise _bad("header or claims are not base64url JSON") from None
    if not isinstance(header, dict) or header.get("alg") != "EdDSA":
        raise _bad("alg must be EdDSA")
    if not isinstance(claims, dict):
        raise _bad("claims must be a JSON object")
    for name in ("swarm_id", "master", "endpoint"):
        if not isinstance(claims.get(name), str) or not claims[name]:
            raise _bad(f"claim {name} is required")
    iat = claims.get("iat")
    if isinstance(iat, bool) or not isinstance(iat, int) or iat < 0:
        raise _bad("claim iat must be a unix time in seconds")
    max_uses = claims.get("max_uses")
    if max_uses is not None and (
        isinstance(max_uses, bool) or not isinstance(max_uses, int) or max_uses < 1
    ):
        raise _bad("claim max_uses must be an integer >= 1 or null")
    expires_at = claims.get("expires_at")
    if expires_at is not None:
        try:
            parse_timestamp(expires_at, "expires_at")
        except SwarmError:
            raise _bad("claim expires_at must be an ISO-8601 date-time") from None
    try:
        check_endpoint(claims["endpoint"], "endpoint", insecure=insecure)
    except SwarmError as exc:
        raise _bad(f"claim endpoint {exc.message.partition(': ')[2]}") from None
    return InviteClaims(
        swarm_id=claims["swarm_id"], master=claims["master"], endpoint=claims["endpoint"],
        iat=iat, expires_at=expires_at, max_uses=max_uses,
    )  # fmt: skip


def verify_invite(
    token: str, issuer_key: str, *, swarm_id: str, endpoint: str, insecure: bool = False
) -> InviteClaims:
    """The claims of a token signed by `issuer_key` for a join at `endpoint` of `swarm_id`;
    400 INVALID_TOKEN otherwise. Expiry and use count are `check_invite`'s."""
    claims = decode_invite(token, insecure=insecure)
    signing, _, signature = token.rpartition(".")
    try:
        raw = _unb64u(signature)
    except (ValueError, binascii.Error):
        raise _bad("signature is not base64url") from None
    if not verify(issuer_key, signing.encode(), base64.b64encode(raw).decode()):
        raise _bad("signature does not verify for the swarm master")
    if claims.swarm_id != swarm_id:
        raise _bad(f"issued for swarm {claims.swarm_id}, not {swarm_id}")
    if claims.endpoint.rstrip("/") != endpoint.rstrip("/"):
        raise _bad(f"issued for endpoint {claims.endpoint}, not {endpoint}")
    return claims


def check_invite(
    token: str,
    master_key: str,
    *,
    swarm_id: str,
    endpoint: str,
    now: float,
    uses: int,
    insecure: bool = False,
) -> InviteClaims:
    """Verify a token for a join at `endpoint` of `swarm_id`: signature by the master's key,
    the swarm and endpoint claims, expiry and use count. 400 INVALID_TOKEN, TOKEN_EXPIRED or
    TOKEN_EXHAUSTED otherwise."""
    claims = verify_invite(token, master_key, swarm_id=swarm_id, endpoint=endpoint,
                           insecure=insecure)  # fmt: skip
    if claims.expires_at is not None and parse_timestamp(claims.expires_at, "expires_at") <= now:
        raise SwarmError(400, "TOKEN_EXPIRED", f"invite token expired at {claims.expires_at}",
                         field="invite_token")  # fmt: skip
    if claims.max_uses is not None and uses >= claims.max_uses:
        raise SwarmError(400, "TOKEN_EXHAUSTED",
                         f"invite token already used {uses} of {claims.max_uses} time(s)",
                         field="invite_token")  # fmt: skip
    return claims


def token_key(token: str) -> str:
    """What a token's uses are counted under: its signature (unique per token)."""
    return token.rpartition(".")[2]


def invite_url(claims: InviteClaims, token: str) -> str:
    """swarm://<swarm_id>@<host:port>?token=<jwt>"""
    host = urllib.parse.urlsplit(claims.endpoint).netloc
    return f"swarm://{claims.swarm_id}@{host}?token={token}"


def parse_invite_url(url: str, *, insecure: bool = False) -> tuple[str, str, str]:
    """'swarm://<swarm_id>@<host:port>?token=<jwt>' (or a bare JWT) -> (swarm_id, host, jwt)."""
    if "://" not in url:
        claims = decode_invite(url, insecure=insecure)
        return claims.swarm_id, urllib.parse.urlsplit(claims.endpoint).netloc, url
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query).get("token", [""])[0]
    if parts.scheme != "swarm" or "@" not in parts.netloc or not token:
        raise _bad("an invite URL looks like swarm://<swarm_id>@<host:port>?token=<jwt>")
    swarm_id, _, host = parts.netloc.partition("@")
    return swarm_id, host, token
