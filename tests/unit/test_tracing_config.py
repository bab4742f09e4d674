"""The [tracing] table: off by default, its settings from TOML, errors that name the setting;
and the W3C header values as Apiary carries them."""

from __future__ import annotations

from pathlib import Path

import pytest

from apiary.core.trace_context import TraceContext, from_headers
from apiary.errors import ValidationError
from apiary.server.config import tracing as tracing_config
from apiary.server.config.loader import load_config
from apiary.server.tracing.settings import TracingSettings

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _config(tmp_path: Path, text: str) -> TracingSettings:
    file = tmp_path / "apiary.toml"
    file.write_text(text)
    return load_config(file, {}, {}).tracing


def test_tracing_is_off_without_the_table(tmp_path: Path) -> None:
    assert load_config(None, {}, {}).tracing == TracingSettings()
    assert _config(tmp_path, '[server]\nstore = "memory://"\n').enabled is False


def test_the_tracing_table_sets_every_setting(tmp_path: Path) -> None:
    settings = _config(
        tmp_path,
        '[tracing]\nenabled = true\notlp_endpoint = "https://collector.internal:4317"\n'
        'service_name = "apiary-eu"\nsample_ratio = 0.25\n',
    )
    assert settings == TracingSettings(
        enabled=True, otlp_endpoint="https://collector.internal:4317",
        service_name="apiary-eu", sample_ratio=0.25,
    )  # fmt: skip
    assert _config(tmp_path, "[tracing]\nsample_ratio = 1\n").sample_ratio == 1.0


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("sample_ratio = 1.5", "tracing.sample_ratio", "between 0 and 1"),
        ("sample_ratio = -0.1", "tracing.sample_ratio", "between 0 and 1"),
        ('sample_ratio = "all"', "tracing.sample_ratio", "must be a number"),
        ('enabled = "yes"', "tracing.enabled", "must be true or false"),
        ('otlp_endpoint = "collector:4317"', "tracing.otlp_endpoint", "http:// or https://"),
        ('service_name = " "', "tracing.service_name", "must not be empty"),
        ("exporter = 'zipkin'", "tracing.exporter", "unknown setting tracing.exporter"),
    ],
)
def test_a_bad_tracing_setting_is_named(tmp_path: Path, text: str, field: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _config(tmp_path, f"[tracing]\n{text}\n")
    assert caught.value.details["field"] == field
    assert says in caught.value.message
    assert "apiary.toml [tracing]" in caught.value.message


def test_enabled_tracing_without_the_sdk_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing_config, "_importable", lambda name: name != "opentelemetry.sdk")
    with pytest.raises(ValidationError) as caught:
        _config(tmp_path, "[tracing]\nenabled = true\n")
    assert caught.value.details["field"] == "tracing.enabled"
    assert "pip install 'apiary[tracing]'" in caught.value.message
    # Off, nothing needs to be installed.
    assert _config(tmp_path, "[tracing]\nenabled = false\n").enabled is False


def test_trace_context_from_headers() -> None:
    assert from_headers({}) is None
    assert from_headers({"traceparent": ""}) is None
    found = from_headers({"traceparent": PARENT, "tracestate": "vendor=1", "other": "x"})
    assert found == TraceContext(PARENT, "vendor=1")
    assert (found.trace_id, found.span_id) == (
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7",
    )  # fmt: skip
    assert found.headers() == {"traceparent": PARENT, "tracestate": "vendor=1"}
    assert TraceContext(PARENT).headers() == {"traceparent": PARENT}
    assert TraceContext("not-a-traceparent").trace_id == ""
