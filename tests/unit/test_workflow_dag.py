"""Workflow definition validation (RFC 17.7): each error path names its field, cycles are
reported with their nodes, and the pass is linear in nodes plus edges."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apiary.core.workflow.dag import validate_dag
from apiary.core.workflow.definition import (
    FailurePolicy,
    NodeSpec,
    TriggerType,
    WorkflowSpec,
    default_scope,
    node_options,
    parse_trigger,
    spec_from_json,
    spec_to_json,
    validate_workflow,
)
from apiary.errors import ValidationError, WorkflowCycleDetectedError


def spec(*nodes: NodeSpec, **meta: str) -> WorkflowSpec:
    return WorkflowSpec("wf", {n.node_id: n for n in nodes}, metadata=meta)


def field_of(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return exc.value.details["field"]


@pytest.mark.conformance(
    "workflow.validation.dag", "patterns.workflow.validation.dag",
    "workflow.cycle.detect", "patterns.workflow.cycle.detect",
    "workflow.cycle.report-nodes", "patterns.workflow.cycle.report-nodes",
    # A node with no path from any root exists only behind a cycle (module docstring of
    # core.workflow_dag), which must be refused; the refusal warns of them by name.
    "workflow.validation.warn-unreachable", "patterns.workflow.validation.warn-unreachable",
)  # fmt: skip
def test_a_cycle_is_refused_and_its_nodes_named_in_order() -> None:
    graph = {"root": [], "a": ["root", "c"], "b": ["a"], "c": ["b"], "after": ["c"]}
    with pytest.raises(WorkflowCycleDetectedError) as caught:
        validate_dag(graph)
    assert caught.value.code == "workflow_cycle_detected"
    assert caught.value.details["cycle"] == "a,b,c"  # a runs before b, b before c, c before a
    assert "a -> b -> c -> a" in caught.value.message
    # Nodes behind the cycle have no path from any root: named too.
    assert caught.value.details["unreachable"] == "after"
    assert "unreachable from any root because of it: after" in caught.value.message


@pytest.mark.conformance("workflow.roots.at-least-one", "patterns.workflow.roots.at-least-one")
def test_a_workflow_without_a_root_is_refused() -> None:
    with pytest.raises(WorkflowCycleDetectedError) as caught:
        validate_dag({"a": ["b"], "b": ["a"]})
    assert "no root node" in caught.value.message
    with pytest.raises(ValidationError) as empty:
        validate_dag({})
    assert field_of(empty) == "nodes"


@pytest.mark.conformance(
    "workflow.validation.deps-exist", "patterns.workflow.validation.deps-exist"
)
def test_a_dependency_on_an_unknown_node_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        validate_dag({"a": [], "b": ["a", "ghost"]})
    assert field_of(caught) == "nodes.b.dependencies"
    assert "'ghost'" in caught.value.message


@pytest.mark.conformance(
    "workflow.validation.no-self-dependency", "patterns.workflow.validation.no-self-dependency"
)
def test_a_self_dependency_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        validate_dag({"a": [], "b": ["b"]})
    assert field_of(caught) == "nodes.b.dependencies"
    assert "depends on itself" in caught.value.message


def test_a_valid_dag_has_its_roots_and_a_topological_order() -> None:
    report = validate_dag({"d": ["b", "c", "b"], "b": ["a"], "c": ["a"], "a": []})
    assert report.roots == ("a",)
    assert report.order.index("a") < report.order.index("b") < report.order.index("d")
    assert report.dependents["a"] == ("b", "c") and report.dependents["b"] == ("d",)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.data())
def test_the_order_respects_every_edge_of_random_dags(size: int, data: st.DataObject) -> None:
    # Edges only point from lower to higher index: acyclic by construction.
    graph = {
        f"n{i}": [f"n{j}" for j in data.draw(st.sets(st.integers(0, i - 1))) if i]
        if i else [] for i in range(size)
    }  # fmt: skip
    report = validate_dag(graph)
    position = {node: i for i, node in enumerate(report.order)}
    assert sorted(report.order) == sorted(graph)
    assert all(position[d] < position[n] for n, deps in graph.items() for d in deps)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 25), st.data())
def test_any_back_edge_is_found_as_a_real_cycle(size: int, data: st.DataObject) -> None:
    graph: dict[str, list[str]] = {f"n{i}": [f"n{i - 1}"] if i else [] for i in range(size)}
    low = data.draw(st.integers(0, size - 2))
    high = data.draw(st.integers(low + 1, size - 1))
    graph[f"n{low}"].append(f"n{high}")  # n_low now depends on a node after it
    with pytest.raises(WorkflowCycleDetectedError) as caught:
        validate_dag(graph)
    cycle = caught.value.details["cycle"].split(",")
    # Each node of the reported cycle is a dependency of the next, around the loop.
    for before, after in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert before in graph[after]


@pytest.mark.conformance(
    "workflow.cycle.topological-sort", "patterns.workflow.cycle.topological-sort",
    "workflow.cycle.linear-time", "patterns.workflow.cycle.linear-time",
)  # fmt: skip
def test_validation_touches_each_node_and_edge_a_bounded_number_of_times() -> None:
    """Kahn's algorithm, counted rather than timed: dependency lists are read through a
    counting sequence, so the work for 1k and for 100k nodes can be compared exactly."""

    class Counting(list[str]):
        reads = 0

        def __iter__(self) -> Any:
            for item in super().__iter__():
                Counting.reads += 1
                yield item

    def chain_with_fanout(n: int) -> dict[str, Counting]:
        return {f"n{i}": Counting([f"n{j}" for j in (i - 1, i // 2) if 0 <= j < i and i])
                for i in range(n)}  # fmt: skip

    per_item = []
    for n in (1_000, 100_000):
        graph = chain_with_fanout(n)
        edges = sum(len(deps) for deps in graph.values())
        Counting.reads = 0
        validate_dag(graph)
        per_item.append(Counting.reads / (n + edges))
    assert per_item[0] == pytest.approx(per_item[1], rel=0.01)  # linear: constant per item
    cyclic = chain_with_fanout(100_000)
    cyclic["n0"] = Counting(["n99999"])
    edges = sum(len(deps) for deps in cyclic.values())
    Counting.reads = 0
    with pytest.raises(WorkflowCycleDetectedError):
        validate_dag(cyclic)
    assert Counting.reads <= 3 * (len(cyclic) + edges)  # finding the cycle is linear too


# --- definitions ------------------------------------------------------------------------------


def test_bad_fields_are_refused_naming_them() -> None:
    cases: list[tuple[WorkflowSpec, str]] = [
        (WorkflowSpec("", {"a": NodeSpec("a", "x")}), "workflow_id"),
        (WorkflowSpec("has space", {"a": NodeSpec("a", "x")}), "workflow_id"),
        (spec(NodeSpec("a", "")), "nodes.a.agent_id"),
        (spec(NodeSpec("a", "scheduler")), "nodes.a.agent_id"),
        (WorkflowSpec("wf", {"a": NodeSpec("b", "x")}), "nodes.a.node_id"),
        (spec(NodeSpec("a", "x", input_mapping={"p": "a..b"})), "nodes.a.input_mapping['p']"),
        (spec(NodeSpec("a", "x", output_mapping={"$.x[": "y"})), "nodes.a.output_mapping['$.x[']"),
        (spec(NodeSpec("a", "x", metadata={"retries": "many"})), "nodes.a.metadata.retries"),
        (spec(NodeSpec("a", "x", metadata={"retries": "101"})), "nodes.a.metadata.retries"),
        (spec(NodeSpec("a", "x"), retries="-1"), "metadata.retries"),
        (spec(NodeSpec("a", "x", metadata={"priority": "21"})), "nodes.a.metadata.priority"),
        (spec(NodeSpec("a", "x", metadata={"retry_delay_s": "nan"})),
         "nodes.a.metadata.retry_delay_s"),
        (spec(NodeSpec("a", "x"), on_failure="explode"), "metadata.on_failure"),
        (spec(NodeSpec("a", "x", metadata={"scope": "path:../etc"})), "nodes.a.metadata.scope"),
        (spec(NodeSpec("a", "x", metadata={"condition": ""})), "nodes.a.metadata.condition"),
        (spec(NodeSpec("a", "x", trigger=TriggerType.SCHEDULE)), "nodes.a.metadata.cron"),
        (spec(NodeSpec("a", "x", metadata={"cron": "* * * * *"})), "nodes.a.metadata.cron"),
        (spec(NodeSpec("a", "x", trigger=TriggerType.EVENT, metadata={"event_type": "EMAIL"})),
         "nodes.a.metadata.event_type"),
        (spec(NodeSpec("a", "x", trigger=TriggerType.EVENT, metadata={"event_match": "[1]"})),
         "nodes.a.metadata.event_match"),
    ]  # fmt: skip
    for bad, name in cases:
        with pytest.raises(ValidationError) as caught:
            validate_workflow(bad)
        assert field_of(caught) == name, (bad, caught.value)


def test_node_options_come_from_the_node_then_the_workflow() -> None:
    wf = spec(
        NodeSpec("a", "x", metadata={"retries": "3", "on_failure": "FAIL", "priority": "-5"}),
        NodeSpec("b.1", "x"),
        retries="1", retry_delay_s="2.5", on_failure="skip",
    )  # fmt: skip
    a, b = node_options(wf, wf.nodes["a"]), node_options(wf, wf.nodes["b.1"])
    assert (a.max_attempts, a.on_failure, a.priority) == (4, FailurePolicy.FAIL, -5)
    assert (b.max_attempts, b.retry_delay_s, b.on_failure) == (2, 2.5, FailurePolicy.SKIP)
    assert [b.retry_delay(n) for n in (1, 2, 3)] == [2.5, 5.0, 10.0]
    assert a.scope == "resource:workflow.wf.a"
    # An id that is not a plain resource name part is hashed: never shared by accident.
    assert b.scope.startswith("resource:workflow.wf.h") and b.scope != default_scope("wf", "b")


def test_triggers_parse_from_names_and_numbers() -> None:
    assert parse_trigger("") is TriggerType.DEPENDENCY
    assert parse_trigger(0) is TriggerType.DEPENDENCY
    assert parse_trigger("event") is TriggerType.EVENT
    assert parse_trigger(2) is TriggerType.SCHEDULE
    with pytest.raises(ValidationError):
        parse_trigger("LATER")


def test_the_json_form_round_trips_and_accepts_hand_written_files() -> None:
    text = """{"workflow_id": "etl", "metadata": {"retries": 2},
               "nodes": {"parse": {"agent_id": "p", "output_mapping": {"rows": "records"}},
                         "load": {"agent_id": "l", "dependencies": ["parse"],
                                  "trigger_type": "manual",
                                  "metadata": {"event_match": {"a": 1}}}}}"""
    parsed = spec_from_json(json.loads(text))
    assert parsed.nodes["load"].trigger is TriggerType.MANUAL
    assert parsed.metadata == {"retries": "2"}  # non-string values are kept as JSON text
    assert parsed.nodes["load"].metadata == {"event_match": '{"a": 1}'}
    assert spec_from_json(spec_to_json(parsed)) == parsed
    for bad, name in (
        ({"nodes": []}, "nodes"),
        ({"workflow_id": 3, "nodes": {}}, "workflow_id"),
        ({"nodes": {"a": {"agent_id": "x", "dependencies": "b"}}}, "nodes.a.dependencies"),
        ({"nodes": {"a": {"agent_id": "x", "trigger_type": "soon"}}}, "nodes.a.trigger_type"),
        ({"nodes": {"a": {"agent_id": "x", "input_mapping": {"k": 1}}}}, "nodes.a.input_mapping"),
    ):
        with pytest.raises(ValidationError) as caught:
            spec_from_json(bad)
        assert field_of(caught) == name
