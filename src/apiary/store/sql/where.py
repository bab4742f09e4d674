"""WHERE clauses built up from optional filters: the terms and their parameters together."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from apiary.store.sql.dialect import in_list


class Where:
    """The terms of a WHERE clause (ANDed) and their parameters, in order.

    A filter left as None adds nothing; `among` an empty collection makes the clause one that
    nothing can match (`impossible`), which a listing answers without asking the database.
    """

    __slots__ = ("impossible", "params", "terms")

    def __init__(self) -> None:
        self.terms: list[str] = []
        self.params: list[Any] = []
        self.impossible = False

    def term(self, sql: str, *params: Any) -> Where:
        """Add the canonical term `sql` with its parameters."""
        self.terms.append(sql)
        self.params.extend(params)
        return self

    def compare(self, column_and_operator: str, value: Any | None) -> Where:
        """Add `column op ?` ("failed_at >=", "agent_id =") unless `value` is None."""
        if value is not None:
            self.terms.append(f"{column_and_operator} ?")
            self.params.append(value)
        return self

    def among(self, column: str, values: Collection[Any] | None) -> Where:
        """Add `column IN (...)` of `values` (sorted: one text per set) unless None."""
        if values is not None:
            if not values:
                self.impossible = True
                return self
            ordered = sorted(values)
            self.terms.append(in_list(column, len(ordered)))
            self.params.extend(ordered)
        return self

    @property
    def sql(self) -> str:
        """The terms ANDed ("1 = 1" for none)."""
        return " AND ".join(self.terms) or "1 = 1"
