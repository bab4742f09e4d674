"""Running tasks indexed by what their scopes name, for the conflict gate (RFC 9.2, 9.3).

The rule-based engine (`core.scope_overlap`) calls two scopes safe to run in parallel with
full confidence when both name repositories, none of them shared, and they share no resource
(its rules 1 and 2). Such a pair needs no assessment, and under load it is nearly every pair.
`RunningScopes.candidates` returns the running tasks a candidate might not be that safe with:
those naming one of its repositories, those naming none (they may be in any), those sharing
the first segment of a resource name (nested names share it: `db` covers `db.orders`), and
those added as `always` (the gate uses it for operation types a policy override governs). A
candidate that names no repository may meet every running task: `None` means all of them.
"""

from __future__ import annotations

from apiary.core.scope_overlap import Scope


def _root(resource: str) -> str:
    return resource.split(".", 1)[0]


class RunningScopes:
    """The running tasks' scopes by repository and resource root."""

    def __init__(self) -> None:
        self._by_repo: dict[str, set[str]] = {}
        self._by_resource: dict[str, set[str]] = {}
        self._anywhere: set[str] = set()
        self._always: set[str] = set()
        self._keys: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, task_id: str, scope: Scope, *, always: bool = False) -> None:
        """Index a task that started running (again: replaces what was indexed)."""
        self.remove(task_id)
        roots = tuple(sorted({_root(r) for r in scope.resources}))
        self._keys[task_id] = (scope.repos, roots)
        for repo in scope.repos:
            self._by_repo.setdefault(repo, set()).add(task_id)
        if not scope.repos:
            self._anywhere.add(task_id)
        for root in roots:
            self._by_resource.setdefault(root, set()).add(task_id)
        if always:
            self._always.add(task_id)

    def remove(self, task_id: str) -> None:
        """Forget a task that no longer runs (nothing happens for an unknown one)."""
        keys = self._keys.pop(task_id, None)
        if keys is None:
            return
        repos, roots = keys
        for index, names in ((self._by_repo, repos), (self._by_resource, roots)):
            for name in names:
                members = index.get(name)
                if members is not None:
                    members.discard(task_id)
                    if not members:
                        del index[name]
        self._anywhere.discard(task_id)
        self._always.discard(task_id)

    def candidates(self, scope: Scope) -> set[str] | None:
        """The running tasks that `scope` might conflict with; None for all of them."""
        if not scope.repos:
            return None
        found = set(self._anywhere) | self._always
        for repo in scope.repos:
            found |= self._by_repo.get(repo, set())
        for root in {_root(r) for r in scope.resources}:
            found |= self._by_resource.get(root, set())
        return found
