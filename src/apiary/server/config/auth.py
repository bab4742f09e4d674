"""The [auth] table (AuthSettings; docs/security.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apiary.core.access.principal import check_name
from apiary.errors import ValidationError
from apiary.server.auth.certificates import certificate_rules
from apiary.server.auth.settings import EVERY_TENANT, AuthSettings, Quota

MAX_PROOF_WINDOW_S = 3600.0


def auth_settings(values: Mapping[str, Any], source: str) -> AuthSettings:
    """AuthSettings from the [auth] table; errors name the setting and `source`."""
    known = {
        "secure", "certificates", "keys_file", "audience", "proof_window_s", "log_allowed",
        "tenants", "quotas",
    }  # fmt: skip
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValidationError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            {"field": unknown[0]},
        )
    settings: dict[str, Any] = {}
    for key in ("secure", "log_allowed"):
        if key in values:
            if not isinstance(values[key], bool):
                raise ValidationError(f"{source}: {key} must be true or false", {"field": key})
            settings[key] = values[key]
    for key in ("keys_file", "audience"):
        if key in values:
            if not isinstance(values[key], str):
                raise ValidationError(f"{source}: {key} must be a string", {"field": key})
            settings[key] = values[key]
    if "audience" in settings and (problem := check_name(settings["audience"], "audience")):
        raise ValidationError(f"{source}: {problem}", {"field": "audience"})
    if "proof_window_s" in values:
        window = values["proof_window_s"]
        if isinstance(window, bool) or not isinstance(window, int | float):
            raise ValidationError(
                f"{source}: proof_window_s must be a number", {"field": "proof_window_s"}
            )
        if not 0 < window <= MAX_PROOF_WINDOW_S:
            raise ValidationError(
                f"{source}: proof_window_s must be within (0, {MAX_PROOF_WINDOW_S:g}] seconds",
                {"field": "proof_window_s"},
            )
        settings["proof_window_s"] = float(window)
    if "tenants" in values:
        tenants = values["tenants"]
        if not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants):
            raise ValidationError(
                f"{source}: tenants must be a list of tenant names", {"field": "tenants"}
            )
        for tenant in tenants:
            if problem := check_name(tenant, "tenant"):
                raise ValidationError(f"{source}: tenants: {problem}", {"field": "tenants"})
        settings["tenants"] = tuple(dict.fromkeys(tenants))
    if "quotas" in values:
        settings["quotas"] = _quotas(values["quotas"], source)
    if "certificates" in values:
        entries = values["certificates"]
        if not isinstance(entries, list):
            raise ValidationError(
                f"{source}: certificates must be [[auth.certificates]] tables",
                {"field": "certificates"},
            )
        settings["certificates"] = certificate_rules(entries, source)
    return AuthSettings(**settings)


def _quotas(values: Any, source: str) -> dict[str, Quota]:
    """[auth.quotas.TENANT] tables of limits (`*`: every tenant without its own)."""
    if not isinstance(values, dict):
        raise ValidationError(
            f"{source}: quotas must be [auth.quotas.TENANT] tables", {"field": "quotas"}
        )
    quotas = {}
    for tenant, limits in values.items():
        where = f"{source} quotas.{tenant}"
        if tenant != EVERY_TENANT and (problem := check_name(tenant, "tenant")):
            raise ValidationError(f"{where}: {problem}", {"field": "quotas"})
        if not isinstance(limits, dict):
            raise ValidationError(f"{where}: must be a table of limits", {"field": "quotas"})
        known = set(Quota.__dataclass_fields__)
        for key, limit in limits.items():
            if key not in known:
                raise ValidationError(
                    f"{where}: unknown limit {key}; known: {', '.join(sorted(known))}",
                    {"field": f"quotas.{key}"},
                )
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise ValidationError(
                    f"{where}: {key} must be a non-negative integer", {"field": f"quotas.{key}"}
                )
        quotas[tenant] = Quota(**limits)
    return quotas
