"""DAG validation of a workflow's dependencies (RFC 17.7 "DAG Validation and Cycle Detection").

`validate_dag` takes each node's dependencies and checks, in one pass of Kahn's topological
sort, in O(V + E) time and memory:

1. at least one node;
2. every dependency names a node of the workflow (ValidationError naming
   `nodes.<id>.dependencies`);
3. no node depends on itself (same field);
4. no cycle: the nodes Kahn's algorithm cannot order are exactly those on a cycle or
   downstream of one. One cycle among them is found by walking unordered dependencies from
   any of them (each has one: that is why it was not ordered) until a node repeats, and the
   error (`workflow_cycle_detected`) names its nodes in execution order, plus the nodes that
   are unreachable because of it (no path from any root);
5. at least one root (a node without dependencies). A definition without a root always has a
   cycle (every node has a dependency and the graph is finite), so this is reported within
   the cycle error.

A definition that passes has no unreachable node: every node's dependencies lead back to a
root. The warning RFC 17.7 asks for ("SHOULD warn ... unreachable nodes") can therefore only
accompany a cycle, and is carried in the cycle error's `unreachable` detail.

Duplicate entries in one node's dependencies count once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apiary.errors import ValidationError, WorkflowCycleDetectedError

_SHOWN = 20
"""Most node ids an error message lists (the details carry them all)."""


@dataclass(frozen=True, slots=True)
class DagReport:
    """A valid DAG: its roots and one topological order (dependencies before dependents)."""

    roots: tuple[str, ...]
    order: tuple[str, ...]
    dependents: Mapping[str, tuple[str, ...]]
    """For each node, the nodes that depend on it directly."""


def validate_dag(graph: Mapping[str, Sequence[str]]) -> DagReport:
    """Validate `graph` (node id -> its dependencies); see the module docstring."""
    if not graph:
        raise ValidationError.for_field("nodes", "a workflow needs at least one node")
    dependents: dict[str, list[str]] = {node: [] for node in graph}
    missing: dict[str, int] = {}
    for node, dependencies in graph.items():
        unique = dict.fromkeys(dependencies)
        for dependency in unique:
            if dependency == node:
                raise ValidationError.for_field(
                    f"nodes.{node}.dependencies", f"node {node!r} depends on itself", node_id=node
                )
            found = dependents.get(dependency)
            if found is None:
                raise ValidationError.for_field(
                    f"nodes.{node}.dependencies",
                    f"names {dependency!r}, which is not a node of this workflow",
                    node_id=node, dependency=dependency,
                )  # fmt: skip
            found.append(node)
        missing[node] = len(unique)
    roots = tuple(node for node, count in missing.items() if count == 0)
    order: list[str] = []
    ready = deque(roots)
    while ready:
        node = ready.popleft()
        order.append(node)
        for dependent in dependents[node]:
            missing[dependent] -= 1
            if missing[dependent] == 0:
                ready.append(dependent)
    if len(order) < len(graph):
        _raise_cycle(graph, missing, roots)
    return DagReport(roots, tuple(order), {n: tuple(d) for n, d in dependents.items()})


def _raise_cycle(
    graph: Mapping[str, Sequence[str]], missing: Mapping[str, int], roots: tuple[str, ...]
) -> None:
    blocked = {node for node, count in missing.items() if count > 0}
    cycle = _one_cycle(graph, blocked)
    on_cycle = set(cycle)
    unreachable = sorted(blocked - on_cycle)
    text = " -> ".join([*cycle[:_SHOWN], cycle[0]] if len(cycle) <= _SHOWN else cycle[:_SHOWN])
    message = f"the dependencies form a cycle: {text}"
    if len(cycle) > _SHOWN:
        message += f" ... ({len(cycle)} nodes)"
    if not roots:
        message += "; no root node (every node has dependencies)"
    if unreachable:
        shown = ", ".join(unreachable[:_SHOWN]) + (" ..." if len(unreachable) > _SHOWN else "")
        message += f"; unreachable from any root because of it: {shown}"
    raise WorkflowCycleDetectedError(
        message,
        {"cycle": ",".join(cycle), "unreachable": ",".join(unreachable),
         "roots": str(len(roots))},
    )  # fmt: skip


def _one_cycle(graph: Mapping[str, Sequence[str]], blocked: set[str]) -> list[str]:
    """A cycle among `blocked` in execution order (each node is a dependency of the next),
    starting at its smallest id."""
    start = min(blocked)
    seen: dict[str, int] = {}
    path: list[str] = []
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(d for d in graph[node] if d in blocked)
    cycle = path[seen[node] :]
    cycle.reverse()  # the walk followed dependencies: backwards
    pivot = cycle.index(min(cycle))
    return cycle[pivot:] + cycle[:pivot]
