"""Configuration layering: defaults < TOML < environment < flags, with named errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from apiary.engine.settings import SchedulerSettings
from apiary.errors import ValidationError
from apiary.server.config.address import Address
from apiary.server.config.loader import load_config
from apiary.server.config.server import exposure_problem, secured


def test_defaults() -> None:
    config = load_config(None, {}, {})
    assert str(config.grpc) == "127.0.0.1:50051"
    assert str(config.http) == "127.0.0.1:8080"
    assert config.data_dir == Path(".apiary")
    assert config.store == ""


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        '[server]\ngrpc = "0.0.0.0:1"\nhttp = "0.0.0.0:2"\ndata_dir = "/f"\nlog_level = "debug"\n'
    )
    env = {"APIARY_HTTP": "127.0.0.1:3", "APIARY_DATA_DIR": "/e"}
    config = load_config(file, env, {"data_dir": "/flag", "grpc": None})
    assert config.grpc == Address("0.0.0.0", 1)
    assert config.http == Address("127.0.0.1", 3)
    assert config.data_dir == Path("/flag")
    assert config.log_level == "DEBUG"


def test_config_file_from_environment(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('[server]\nstore = "memory://"\n')
    assert load_config(None, {"APIARY_CONFIG": str(file)}, {}).store == "memory://"


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"grpc": "nope"}, "grpc"),
        ({"http": "127.0.0.1:99999"}, "http"),
        ({"log_level": "LOUD"}, "log_level"),
    ],
)
def test_bad_flags_name_the_setting(flags: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load_config(None, {}, flags)
    assert field in caught.value.message


def test_unknown_file_setting_is_named(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[server]\ngrcp = '127.0.0.1:1'\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert "grcp" in caught.value.message


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="does not exist"):
        load_config(tmp_path / "absent.toml", {}, {})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ValidationError, match=str(bad)):
        load_config(bad, {}, {})


def test_ipv6_address() -> None:
    address = Address.parse("[::1]:0", "grpc")
    assert address == Address("::1", 0)
    assert str(address) == "[::1]:0"


def test_router_table_sets_messaging_settings(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        "[router]\nbuffer_capacity = 500\nack_timeout_s = 30\nhlc_required = true\n"
        "hand_over_wait_s = 0\nstrict_correlation_ids = true\n[router.limits]\nDATA = 1024\n"
    )
    router = load_config(file, {}, {}).router
    assert (router.buffer_capacity, router.ack_timeout_s, router.hlc_required) == (500, 30.0, True)
    assert router.hand_over_wait_s == 0.0
    assert router.strict_correlation_ids is True
    assert router.limits.data == 1024


def test_router_acl_table_sets_message_grants(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        "[[router.acl.messages]]\nagents = ['planner']\ntypes = ['DATA']\nto = ['coder-*']\n"
        "[[router.acl.messages]]\nagents = ['coder-*']\ntypes = ['*']\n"
    )
    acl = load_config(file, {}, {}).router.acl
    assert [(g.agents, g.types, g.to) for g in acl.messages] == [
        (("planner",), ("DATA",), ("coder-*",)),
        (("coder-*",), ("*",), ("*",)),
    ]


def test_router_table_turns_adaptive_credit_windows_on(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        "[router]\ncredit_window = 16\ncredit_adaptive = true\ncredit_min_window = 2\n"
        "credit_target_latency_s = 0.5\n"
    )
    router = load_config(file, {}, {}).router
    assert (router.credit_adaptive, router.credit_min_window, router.credit_target_latency_s) == (
        True, 2, 0.5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("buffer_capacity = 0", "buffer_capacity"),
        ("ack_timeout_s = 'soon'", "ack_timeout_s"),
        ("bufer_capacity = 5", "bufer_capacity"),
        ("hand_over_wait_s = -1", "hand_over_wait_s"),
        ("strict_correlation_ids = 'yes'", "strict_correlation_ids"),
        ("acl = 1", "acl"),
        ("[[router.acl.messages]]\nagents = ['a']\ntypes = ['DATUM']", "acl.messages[0].types"),
        ("credit_adaptive = true", "credit_adaptive"),  # no credit_window to adapt
        ("credit_window = 4\ncredit_adaptive = true\ncredit_min_window = 5", "credit_min_window"),
        (
            "credit_window = 4\ncredit_adaptive = true\ncredit_target_latency_s = 0",
            "credit_target_latency_s",
        ),
        ("credit_min_window = 0", "credit_min_window"),
    ],
)
def test_bad_router_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(f"[router]\n{table}\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert field in caught.value.message


def test_an_ack_deadline_too_short_for_the_prefetch_is_refused(tmp_path: Path) -> None:
    """A prefetched task is acknowledged RECEIVED after waiting 1 s: an ACK deadline below
    2 s would redeliver it while it waits its turn."""
    file = tmp_path / "c.toml"
    file.write_text("[router]\nack_timeout_s = 1.9\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert caught.value.details == {"field": "router.ack_timeout_s"}
    assert f"[scheduler] prefetch = {SchedulerSettings().prefetch} needs" in caught.value.message
    file.write_text("[router]\nack_timeout_s = 2\n")
    assert load_config(file, {}, {}).router.ack_timeout_s == 2.0
    file.write_text("[router]\nack_timeout_s = 0.5\n[scheduler]\nprefetch = 0\n")
    assert load_config(file, {}, {}).router.ack_timeout_s == 0.5


def test_hitl_table_configures_policy_and_operators(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        "[hitl]\ntimeout_s = 120\ntimeout_action = 'AUTO_RESOLVE'\n"
        "unavailable_policy = 'EXTEND_TIMEOUT'\npresence_required = true\n"
        "[[hitl.operators]]\nname = 'olivia'\ntoken = 'secret'\nroles = ['admin']\n"
        "[[hitl.operators]]\nname = 'sam'\n"
        "token_sha256 = '2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b'\n"
    )
    hitl = load_config(file, {}, {}).hitl
    assert hitl.policy.default_timeout_s == 120.0
    assert (hitl.policy.timeout_action, hitl.policy.unavailable_policy) == (
        "AUTO_RESOLVE", "EXTEND_TIMEOUT",
    )  # fmt: skip
    assert hitl.presence_required is True
    assert [o.name for o in hitl.operators] == ["olivia", "sam"]
    assert hitl.operators[0].token_sha256 != "secret"  # only the digest is kept


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("[hitl]\ntimeout_action = 'MAYBE'\n", "timeout_action"),
        ("[hitl]\ntimout_s = 5\n", "timout_s"),
        ("[[hitl.operators]]\nname = 'x'\n", "token"),
        ("[[hitl.operators]]\ntoken = 'x'\n", "name"),
    ],
)
def test_bad_hitl_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(table)
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert field in caught.value.message


# --- [scheduler] ------------------------------------------------------------------------------

_FULL_SCHEDULER = """
[scheduler]
default_max_parallel = 16
max_queued = 5000
duplicate_jobs = "reject"
dispatch_attempts = 5
retry_after_s = 2
inference_timeout_s = 7.5
hitl_timeout_s = 600

[scheduler.max_parallel_instances]
coder = 2
reviewer = 4

[scheduler.conflicts]
threshold = 0.8
serialize_below = 0.05

[scheduler.conflicts.overrides]
read-only = "parallel"
migration = "serialize"
deploy = "escalate"

[scheduler.preemption]
safe_point_timeout_s = 10
grace_s = 1.5
max_section_s = 120

[scheduler.lanes]
privileged_rate = 50
privileged_burst = 5

[scheduler.lanes.weights]
PRIVILEGED = 8
BULK = 2

[scheduler.lifecycle]
auto_recover = false
max_auto_recoveries = 1

[scheduler.lifecycle.timeouts]
initializing = 30
waiting = 900
recovering = 60

[scheduler.lifecycle.per_type.coder]
initializing = 120
waiting = 0

[scheduler.inference]
kind = "openai"
url = "http://127.0.0.1:11434/v1"
model = "qwen2.5-coder"
api_key_env = "APIARY_INFERENCE_KEY"
timeout_s = 3
"""


@pytest.mark.conformance(
    "concurrency.instances.admin-configurable",
    "concurrency.inference.threshold-configurable",
    "concurrency.policy.configurable",
)
def test_scheduler_table_round_trips_into_the_settings(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(_FULL_SCHEDULER)
    s = load_config(file, {}, {}).scheduler
    assert dict(s.max_parallel_instances) == {"coder": 2, "reviewer": 4}
    assert s.instance_limit("coder") == 2 and s.instance_limit("other") == 16
    assert (s.max_queued, s.duplicate_jobs, s.dispatch_attempts) == (5000, "reject", 5)
    assert (s.retry_after_s, s.inference_timeout_s, s.hitl_timeout_s) == (2.0, 7.5, 600.0)
    assert (s.conflicts.threshold, s.conflicts.serialize_below) == (0.8, 0.05)
    assert {k: v.value for k, v in s.conflicts.overrides.items()} == {
        "read-only": "parallel", "migration": "serialize", "deploy": "escalate",
    }  # fmt: skip
    assert (s.preemption.safe_point_timeout_s, s.preemption.grace_s) == (10.0, 1.5)
    assert s.preemption.max_section_s == 120.0
    assert dict(s.lanes.weights) == {"PRIVILEGED": 8, "STANDARD": 2, "BULK": 2}
    assert (s.lanes.privileged_rate, s.lanes.privileged_burst) == (50.0, 5)
    life = s.lifecycle
    assert (life.auto_recover, life.max_auto_recoveries) == (False, 1)
    assert (life.timeouts.initializing, life.timeouts.waiting) == (30.0, 900.0)
    assert life.timeouts.recovering == 60.0 and life.timeouts.suspended == 3600.0
    coder = life.timeouts_for("coder")
    assert (coder.initializing, coder.waiting, coder.recovering) == (120.0, None, 60.0)
    assert life.timeouts_for("reviewer") == life.timeouts
    inference = s.inference
    assert (inference.kind, inference.url, inference.model) == (
        "openai", "http://127.0.0.1:11434/v1", "qwen2.5-coder",
    )  # fmt: skip
    assert (inference.api_key_env, inference.timeout_s) == ("APIARY_INFERENCE_KEY", 3.0)


def test_scheduler_defaults_when_the_table_is_absent(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[server]\nstore = 'memory://'\n")
    assert load_config(file, {}, {}).scheduler == SchedulerSettings()
    assert load_config(None, {}, {}).scheduler == SchedulerSettings()
    empty = tmp_path / "e.toml"
    empty.write_text("[scheduler]\n")
    settings = load_config(empty, {}, {}).scheduler
    assert settings == SchedulerSettings()
    assert settings.inference.kind == "rules"


@pytest.mark.parametrize(
    ("table", "field"),
    [
        # unknown keys, at every level
        ("[scheduler]\nmax_parallel = 3\n", "max_parallel"),
        ("[scheduler.conflicts]\ntreshold = 0.5\n", "conflicts.treshold"),
        ("[scheduler.preemption]\ngrace = 1\n", "preemption.grace"),
        ("[scheduler.lanes]\nrate = 1\n", "lanes.rate"),
        ("[scheduler.lanes.weights]\nURGENT = 3\n", "lanes.weights"),
        ("[scheduler.lifecycle]\nauto_recovery = true\n", "lifecycle.auto_recovery"),
        ("[scheduler.lifecycle.timeouts]\ninit = 5\n", "lifecycle.timeouts.init"),
        ("[scheduler.lifecycle.per_type.coder]\nboot = 5\n", "lifecycle.per_type.coder.boot"),
        ("[scheduler.inference]\nendpoint = 'http://x'\n", "inference.endpoint"),
        ("[scheduler.inference]\napi_key = 'sk-secret'\n", "inference.api_key"),
        # wrong types
        ("[scheduler]\ndefault_max_parallel = '4'\n", "default_max_parallel"),
        ("[scheduler]\nmax_queued = 2.5\n", "max_queued"),
        ("[scheduler]\ndispatch_attempts = true\n", "dispatch_attempts"),
        ("[scheduler]\nretry_after_s = 'soon'\n", "retry_after_s"),
        ("[scheduler]\nconflicts = 0.5\n", "conflicts"),
        ("[scheduler.max_parallel_instances]\ncoder = 'two'\n", "max_parallel_instances.coder"),
        ("[scheduler.conflicts]\nthreshold = 'high'\n", "conflicts.threshold"),
        ("[scheduler.conflicts.overrides]\nmigration = 1\n", "conflicts.overrides.migration"),
        ("[scheduler.lanes]\nprivileged_burst = 1.5\n", "lanes.privileged_burst"),
        ("[scheduler.lanes.weights]\nBULK = 'x'\n", "lanes.weights.BULK"),
        ("[scheduler.lifecycle]\nauto_recover = 1\n", "lifecycle.auto_recover"),
        ("[scheduler.lifecycle.timeouts]\nsuspended = 'long'\n", "lifecycle.timeouts.suspended"),
        ("[scheduler.lifecycle.per_type]\ncoder = 5\n", "lifecycle.per_type.coder"),
        ("[scheduler.inference]\ntimeout_s = 'fast'\n", "inference.timeout_s"),
        # well-typed but out of range
        ("[scheduler]\ndefault_max_parallel = 0\n", "default_max_parallel"),
        ("[scheduler]\nduplicate_jobs = 'ignore'\n", "duplicate_jobs"),
        ("[scheduler]\nretry_after_s = 0\n", "retry_after_s"),
        ("[scheduler]\ninference_timeout_s = -1\n", "inference_timeout_s"),
        ("[scheduler]\nhitl_timeout_s = -1\n", "hitl_timeout_s"),
        ("[scheduler.max_parallel_instances]\ncoder = 0\n", "max_parallel_instances.coder"),
        ("[scheduler.conflicts]\nthreshold = 1.5\n", "conflicts.threshold"),
        ("[scheduler.conflicts]\nthreshold = 0.3\nserialize_below = 0.5\n", "serialize_below"),
        ("[scheduler.conflicts.overrides]\nmigration = 'sometimes'\n", "overrides.migration"),
        ("[scheduler.preemption]\ngrace_s = 0\n", "preemption.grace_s"),
        ("[scheduler.preemption]\nmax_section_s = -1\n", "preemption.max_section_s"),
        ("[scheduler.lanes.weights]\nBULK = 0\n", "lanes.weights"),
        ("[scheduler.lanes]\nprivileged_rate = 0\n", "lanes.privileged_rate"),
        ("[scheduler.lifecycle]\nmax_auto_recoveries = -1\n", "max_auto_recoveries"),
        ("[scheduler.lifecycle.timeouts]\nrecovering = 0\n", "timeouts.recovering"),
        ("[scheduler.inference]\nkind = 'magic'\n", "inference.kind"),
        ("[scheduler.inference]\nkind = 'openai'\nmodel = 'm'\n", "inference.url"),
        ("[scheduler.inference]\nkind = 'openai'\nurl = 'http://h/v1'\n", "inference.model"),
        ("[scheduler.inference]\ntimeout_s = 0\n", "inference.timeout_s"),
    ],
)
def test_bad_scheduler_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(table)
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert field in caught.value.message
    assert str(file) in caught.value.message  # and the source


def test_scheduler_must_be_a_table(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("scheduler = 3\n")
    with pytest.raises(ValidationError, match=r"\[scheduler\] must be a table"):
        load_config(file, {}, {})


def test_router_lanes_table(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[router.lanes]\nprivileged_burst = 3\n[router.lanes.weights]\nSTANDARD = 3\n")
    lanes = load_config(file, {}, {}).router.lanes
    assert dict(lanes.weights) == {"PRIVILEGED": 4, "STANDARD": 3, "BULK": 1}
    assert lanes.privileged_burst == 3


@pytest.mark.conformance("concurrency.instances.reasonable-defaults")
def test_the_default_instance_limit_follows_the_machine() -> None:
    cpus = os.cpu_count() or 1
    assert SchedulerSettings().default_max_parallel == max(8, 4 * cpus)
    assert SchedulerSettings().instance_limit("unconfigured-type") == max(8, 4 * cpus)
    limited = SchedulerSettings(max_parallel_instances={"coder": 2})
    assert limited.instance_limit("coder") == 2


# --- [handoff] --------------------------------------------------------------------------------


def test_handoff_table_sets_the_policy(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[handoff]\ndefault_timeout_s = 60\nmax_attempts = 5\nreroute = false\n")
    policy = load_config(file, {}, {}).handoff
    assert (policy.default_timeout_s, policy.max_attempts, policy.reroute) == (60, 5, False)
    assert load_config(None, {}, {}).handoff.max_attempts == 3


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("[handoff]\nretries = 3\n", "handoff.retries"),
        ("[handoff]\nmax_attempts = 0\n", "handoff.max_attempts"),
        ("[handoff]\nmax_attempts = '3'\n", "handoff.max_attempts"),
        ("[handoff]\ndefault_timeout_s = 'soon'\n", "handoff.default_timeout_s"),
        ("[handoff]\nreroute = 1\n", "handoff.reroute"),
        ("handoff = 3\n", "handoff"),
    ],
)
def test_bad_handoff_settings_are_named_with_their_file(
    tmp_path: Path, table: str, field: str
) -> None:
    file = tmp_path / "c.toml"
    file.write_text(table)
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert caught.value.details["field"] == field
    assert str(file) in caught.value.message


# --- [worktrees] -----------------------------------------------------------------------------


def test_worktrees_table_round_trips_into_the_settings(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(
        "[worktrees]\nretry_base_s = 0.5\nmax_retries = 5\nrecovery_timeout_s = 120\n"
        'default_ttl_s = 600\nmax_ttl_s = 3600\nhitl_timeout_s = 30\nroot = "shared/wt"\n'
        '[[worktrees.repos]]\nid = "api"\npath = "/srv/git/api"\n'
        '[[worktrees.repos]]\nid = "docs"\npath = "repos/docs"\n'
    )
    settings = load_config(file, {}, {}).worktrees
    policy = settings.policy
    assert (policy.retry_base_s, policy.max_retries, policy.recovery_timeout_s) == (0.5, 5, 120.0)
    assert (policy.default_ttl_s, policy.max_ttl_s, settings.hitl_timeout_s) == (
        600.0,
        3600.0,
        30.0,
    )
    # A relative path is taken from the configuration file's directory.
    assert settings.repo_paths() == {
        "api": Path("/srv/git/api"), "docs": (tmp_path / "repos" / "docs").resolve(),
    }  # fmt: skip
    assert settings.root == (tmp_path / "shared" / "wt").resolve()


def test_worktrees_defaults_when_the_table_is_absent(tmp_path: Path) -> None:
    settings = load_config(None, {}, {}).worktrees
    assert (settings.repos, settings.root) == ((), None)
    policy = settings.policy
    assert (policy.retry_base_s, policy.max_retries, policy.recovery_timeout_s) == (1.0, 3, 60.0)
    assert policy.default_ttl_s == 900.0


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("max_retries = -1", "max_retries"),
        ("max_retries = 1.5", "max_retries"),
        ('recovery_timeout_s = "soon"', "recovery_timeout_s"),
        ("recovery_timeout_s = 0", "recovery_timeout_s"),
        ("teleport = true", "teleport"),
        ("hitl_timeout_s = -1", "hitl_timeout_s"),
        ("root = 7", "root"),
        ('root = ""', "root"),
        ('repos = "api"', "repos"),
        ('[[worktrees.repos]]\nid = "../api"\npath = "/x"', "repos.id"),
        ('[[worktrees.repos]]\nid = "api"', "repos.path"),
        ('[[worktrees.repos]]\nid = "api"\npath = "/x"\nbranch = "main"', "repos.branch"),
        ('[[worktrees.repos]]\nid = "a"\npath = "/x"\n[[worktrees.repos]]\nid = "a"\npath = "/y"',
         "repos.id"),
    ],
)  # fmt: skip
def test_bad_worktree_settings_name_the_field(tmp_path: Path, table: str, field: str) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(f"[worktrees]\n{table}\n")
    with pytest.raises(ValidationError) as caught:
        load_config(file, {}, {})
    assert caught.value.details["field"] == field
    assert "[worktrees]" in caught.value.message


# The posture follows the deployment: development mode on loopback, TLS and signing once an
# address is reachable from elsewhere (the baseline, validation and worktree confinement,
# holds in both).
@pytest.mark.conformance(
    "security.signing.required-cross-network", "security.deployment.adapt-posture"
)
def test_a_non_loopback_address_needs_tls_and_signing_or_insecure(tmp_path: Path) -> None:
    exposed = load_config(None, {}, {"grpc": "0.0.0.0:50051"})
    problem = exposure_problem(exposed)
    assert problem is not None
    assert "grpc address 0.0.0.0:50051" in problem and "--insecure" in problem
    assert "tls_cert" in problem and "signing_required" in problem
    assert exposure_problem(exposed, insecure=True) is None
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("certificate")
    key.write_text("key")
    signed = tmp_path / "signed.toml"
    signed.write_text('[server]\nhttp = "192.0.2.7:8080"\n[router]\nsigning_required = true\n')
    only_signing = exposure_problem(load_config(signed, {}, {}))
    assert only_signing is not None and "tls_cert" in only_signing
    assert "signing_required" not in only_signing
    tls = {"tls_cert": str(cert), "tls_key": str(key)}
    only_tls = exposure_problem(load_config(None, {}, {"grpc": "0.0.0.0:1", **tls}))
    assert only_tls is not None and "signing_required" in only_tls
    signed_only = exposure_problem(load_config(signed, {}, tls))
    assert signed_only is not None and "[auth] secure" in signed_only and "--secure" in signed_only
    assert exposure_problem(secured(load_config(signed, {}, tls))) is None
    for local in ("127.0.0.1:1", "[::1]:1", "localhost:1"):
        assert exposure_problem(load_config(None, {}, {"grpc": local})) is None


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"tls_cert": "CERT"}, "tls_key"),
        ({"tls_key": "KEY"}, "tls_cert"),
        ({"tls_client_ca": "CERT"}, "tls_client_ca"),
        ({"tls_cert": "CERT", "tls_key": "missing.pem"}, "tls_key"),
    ],
)
def test_tls_settings_go_together_and_must_be_readable(
    tmp_path: Path, flags: dict[str, str], field: str
) -> None:
    (tmp_path / "cert.pem").write_text("certificate")
    (tmp_path / "key.pem").write_text("key")
    paths = {"CERT": tmp_path / "cert.pem", "KEY": tmp_path / "key.pem"}
    resolved = {k: str(paths.get(v, tmp_path / v)) for k, v in flags.items()}
    with pytest.raises(ValidationError) as caught:
        load_config(None, {}, resolved)
    assert caught.value.details["field"] == field


@pytest.mark.parametrize(
    ("cluster", "tls", "field"),
    [
        ('client_cert = "CERT"', True, "cluster.client_key"),
        ('client_key = "KEY"', True, "cluster.client_cert"),
        ('client_cert = "CERT"\nclient_key = "KEY"', False, "cluster.client_cert"),
        ('client_cert = "CERT"\nclient_key = "missing.pem"', True, "cluster.client_key"),
    ],
)
def test_a_replicas_client_certificate_takes_its_key_tls_and_readable_files(
    tmp_path: Path, cluster: str, tls: bool, field: str
) -> None:
    (tmp_path / "cert.pem").write_text("certificate")
    (tmp_path / "key.pem").write_text("key")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    table = cluster.replace("CERT", str(cert)).replace("KEY", str(key))
    table = table.replace("missing.pem", str(tmp_path / "missing.pem"))
    path = tmp_path / "apiary.toml"
    path.write_text(f"[cluster]\n{table}\n")
    flags = {"tls_cert": str(cert), "tls_key": str(key)} if tls else {}
    with pytest.raises(ValidationError) as caught:
        load_config(path, {}, flags)
    assert caught.value.details["field"] == field
    path.write_text(f'[cluster]\nclient_cert = "{cert}"\nclient_key = "{key}"\n')
    loaded = load_config(path, {}, {"tls_cert": str(cert), "tls_key": str(key)}).cluster
    assert (loaded.client_cert, loaded.client_key) == (cert, key)


@pytest.mark.conformance("security.signing.required-cross-network")
def test_serve_refuses_a_non_loopback_address_without_signing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "serve", "--data-dir", str(tmp_path / "d"),
         "--grpc", "0.0.0.0:0", "--http", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "not loopback" in done.stderr and "signing_required" in done.stderr


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite:?writer=fork", "writer must be loop or thread or process, not 'fork'"),
        ("sqlite:///tmp/x.db?synchronous=off", "synchronous must be NORMAL or FULL"),
        ("sqlite://host/x.db", "sqlite:///ABSOLUTE/PATH.db"),
        ("mysql://db", "unsupported store URL (scheme 'mysql')"),
    ],
)
def test_a_store_url_of_a_refused_form_is_a_configuration_error(url: str, problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load_config(None, {"APIARY_STORE": url}, {})
    assert caught.value.message.startswith("store: ") and problem in caught.value.message
    assert caught.value.details == {"field": "store"}
    for good in ("", "sqlite:?writer=process", "memory://", "postgresql://u@h/db"):
        assert load_config(None, {}, {"store": good}).store == good


def test_serve_refuses_a_bad_store_url_before_it_creates_anything(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "apiary.cli.main", "serve", "--data-dir", str(tmp_path / "d"),
         "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--store", "sqlite:?writer=fork"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    problem = "writer must be loop or thread or process, not 'fork'"
    assert done.stderr.strip() == f"apiary serve: store: {problem}"
    assert not (tmp_path / "d").exists()


def test_secure_mode_needs_tls_and_turns_signing_and_authorization_on(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        secured(load_config(None, {}, {}))
    assert (
        caught.value.details["field"] == "tls_cert" and "apiary certs dev" in caught.value.message
    )
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("certificate")
    key.write_text("key")
    plain = load_config(None, {}, {"tls_cert": str(cert), "tls_key": str(key)})
    assert not plain.auth.secure and not plain.router.signing_required
    secure = secured(plain)
    assert secure.auth.secure and secure.router.signing_required


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("secure = 1", "secure"),
        ("proof_window_s = 0", "proof_window_s"),
        ("proof_window_s = 3601", "proof_window_s"),
        ("proof_window_s = true", "proof_window_s"),
        ('audience = "a b"', "audience"),
        ("keys_file = 3", "keys_file"),
        ("colour = 1", "colour"),
        ("certificates = 1", "certificates"),
    ],
)
def test_the_auth_table_names_the_bad_setting(tmp_path: Path, table: str, field: str) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text(f"[auth]\n{table}\n")
    with pytest.raises(ValidationError) as caught:
        load_config(path, {}, {})
    assert caught.value.details["field"] == field
    assert str(path) in caught.value.message


def test_the_auth_table_reads_each_setting(tmp_path: Path) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text(
        '[auth]\nsecure = true\nproof_window_s = 30\naudience = "prod"\nlog_allowed = false\n'
        '[[auth.certificates]]\ncommon_name = "ci-runner"\nkind = "application"\nname = "ci"\n'
    )
    auth = load_config(path, {}, {}).auth
    assert auth.secure and auth.proof_window_s == 30.0 and auth.audience == "prod"
    assert auth.log_allowed is False
    assert [(r.common_name, r.name) for r in auth.certificates] == [("ci-runner", "ci")]


def test_quotas_are_read_per_tenant_with_a_default_for_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text(
        '[auth.quotas.acme]\nagents = 3\nstored_bytes = 1000\n[auth.quotas."*"]\ntasks = 7\n'
    )
    auth = load_config(path, {}, {}).auth
    assert (auth.quota("acme").agents, auth.quota("acme").stored_bytes) == (3, 1000)
    assert auth.quota("acme").tasks is None
    assert auth.quota("globex").tasks == 7


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("[auth.quotas.acme]\nagents = -1\n", "quotas.agents"),
        ("[auth.quotas.acme]\nagents = 1.5\n", "quotas.agents"),
        ("[auth.quotas.acme]\nwidgets = 1\n", "quotas.widgets"),
        ('[auth.quotas."a b"]\nagents = 1\n', "quotas"),
        ("[auth]\nquotas = 3\n", "quotas"),
        ('[auth]\ntenants = ["ok", "not ok"]\n', "tenants"),
    ],
)
def test_bad_quotas_and_tenants_name_the_setting(tmp_path: Path, table: str, field: str) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text(table)
    with pytest.raises(ValidationError) as caught:
        load_config(path, {}, {})
    assert caught.value.details["field"] == field
