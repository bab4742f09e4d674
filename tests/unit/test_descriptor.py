"""AgentDescriptor registration rules (RFC 14)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.descriptor import (
    COMMUNICATION_CLASSES,
    MAX_AGENT_ID_LENGTH,
    MAX_DESCRIPTION_WORDS,
    AgentDescriptorFields,
    effective_communication_class,
    validate_descriptor,
    word_count,
)
from apiary.errors import ValidationError

KEY = bytes(range(32))


def descriptor(**changes: Any) -> AgentDescriptorFields:
    base = AgentDescriptorFields(
        agent_id="agent-42",
        name="Ticket triage",
        description="Reads new tickets and routes them to the right team.",
        capabilities=("triage", "ticket:route"),
        communication_class="STANDARD",
        modalities_supported=("application/json", "text/*"),
        reasoning_connectors=("builtin://rules",),
        public_key=KEY,
    )
    return dataclasses.replace(base, **changes)


def field_of(d: AgentDescriptorFields, *, signing_required: bool = False) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        validate_descriptor(d, signing_required=signing_required)
    assert info.value.code == "validation_error"
    return info.value


def test_a_complete_descriptor_is_valid() -> None:
    validate_descriptor(descriptor())
    validate_descriptor(descriptor(), signing_required=True)


def test_minimal_descriptor_is_valid() -> None:
    validate_descriptor(
        AgentDescriptorFields(
            agent_id="a", name="A", reasoning_connectors=("https://llm.example/v1",)
        )
    )


# --- agent_id and name ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "agent_id",
    ["", "a b", "a\tb", "a\x00b", "a\nb", "a\x7fb", "x" * (MAX_AGENT_ID_LENGTH + 1)],
)
def test_bad_agent_ids(agent_id: str) -> None:
    assert field_of(descriptor(agent_id=agent_id)).details["field"] == "agent.agent_id"


def test_agent_id_at_the_length_limit_is_valid() -> None:
    validate_descriptor(descriptor(agent_id="x" * MAX_AGENT_ID_LENGTH))


@pytest.mark.parametrize("name", ["", "   ", "a\x00b", "n" * 257])
def test_bad_names(name: str) -> None:
    assert field_of(descriptor(name=name)).details["field"] == "agent.name"


# --- description ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("   ", 0), ("one", 1), (" two  words ", 2), ("a\tb\nc\u00a0d", 4)],
)
def test_word_count(text: str, count: int) -> None:
    assert word_count(text) == count


def test_description_of_200_words_is_valid_201_is_not() -> None:
    validate_descriptor(descriptor(description=" ".join(["w"] * MAX_DESCRIPTION_WORDS)))
    error = field_of(descriptor(description=" ".join(["w"] * (MAX_DESCRIPTION_WORDS + 1))))
    assert error.details == {"field": "agent.description", "words": "201"}


@given(words=st.lists(st.text("abcxyz", min_size=1, max_size=5), max_size=260))
def test_description_limit_counts_words(words: list[str]) -> None:
    d = descriptor(description="  \n".join(words))
    if len(words) <= MAX_DESCRIPTION_WORDS:
        validate_descriptor(d)
    else:
        assert field_of(d).details["field"] == "agent.description"


# --- capabilities -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capabilities", "index"),
    [
        (("ok", ""), "1"),
        (("has space",), "0"),
        (("ok", "tab\there"), "1"),
        (("ctl\x01",), "0"),
        (("dup", "other", "dup"), "2"),
        (("c" * 257,), "0"),
    ],
)
def test_bad_capabilities(capabilities: tuple[str, ...], index: str) -> None:
    error = field_of(descriptor(capabilities=capabilities))
    assert error.details == {"field": "agent.capabilities", "index": index}


def test_no_capabilities_is_valid() -> None:
    validate_descriptor(descriptor(capabilities=()))


# --- communication class ----------------------------------------------------------------------


@pytest.mark.parametrize("value", COMMUNICATION_CLASSES)
def test_the_three_classes_map_to_themselves(value: str) -> None:
    assert effective_communication_class(value) == value
    validate_descriptor(descriptor(communication_class=value))


def test_unspecified_class_is_standard() -> None:
    assert effective_communication_class("COMM_CLASS_UNSPECIFIED") == "STANDARD"
    validate_descriptor(descriptor(communication_class="COMM_CLASS_UNSPECIFIED"))


@pytest.mark.parametrize("value", ["", "standard", "URGENT", "1"])
def test_other_classes_are_refused(value: str) -> None:
    error = field_of(descriptor(communication_class=value))
    assert error.details["field"] == "agent.communication_class"
    with pytest.raises(ValidationError):
        effective_communication_class(value)


# --- modalities -------------------------------------------------------------------------------


def test_wildcard_and_parameterised_modalities_are_valid() -> None:
    modalities = ("*/*", "image/*", "text/plain; charset=utf-8", "application/vnd.a+json")
    validate_descriptor(descriptor(modalities_supported=modalities))


@pytest.mark.parametrize("bad", ["json", "*/json", "image/", "", "text/pl ain"])
def test_bad_modalities(bad: str) -> None:
    error = field_of(descriptor(modalities_supported=("application/json", bad)))
    assert error.details == {"field": "agent.modalities_supported", "index": "1"}


# --- reasoning connectors ---------------------------------------------------------------------


def test_at_least_one_connector_is_required() -> None:
    error = field_of(descriptor(reasoning_connectors=()))
    assert error.details == {"field": "agent.reasoning_connectors"}
    assert "add a reasoning connector such as 'builtin://rules'" in error.message


@pytest.mark.parametrize(
    "connector", ["builtin://rules", "https://llm.example/v1", "grpc://10.0.0.1:50051", "urn:x"]
)
def test_connector_uris(connector: str) -> None:
    validate_descriptor(descriptor(reasoning_connectors=(connector,)))


@pytest.mark.parametrize(
    "connector", ["", "rules", "://x", "1http://x", "https://a b", "builtin:", "x:\x00"]
)
def test_bad_connectors(connector: str) -> None:
    error = field_of(descriptor(reasoning_connectors=("builtin://rules", connector)))
    assert error.details == {"field": "agent.reasoning_connectors", "index": "1"}


# --- public key -------------------------------------------------------------------------------


def test_empty_key_is_allowed_without_signing() -> None:
    validate_descriptor(descriptor(public_key=b""))


def test_key_is_required_with_signing() -> None:
    error = field_of(descriptor(public_key=b""), signing_required=True)
    assert error.details["field"] == "agent.public_key"
    assert "signing" in error.message


@pytest.mark.parametrize("length", [1, 31, 33, 64])
@pytest.mark.parametrize("signing_required", [False, True])
def test_key_must_be_32_bytes(length: int, signing_required: bool) -> None:
    error = field_of(descriptor(public_key=b"k" * length), signing_required=signing_required)
    assert error.details["field"] == "agent.public_key"
