"""Cron expressions for SCHEDULE-triggered workflow nodes (RFC 17.7: "cron-like").

The standard five fields, separated by whitespace, evaluated in UTC:

    minute (0-59)  hour (0-23)  day-of-month (1-31)  month (1-12 or jan-dec)
    day-of-week (0-7 or sun-sat; 0 and 7 are both Sunday)

Each field is a comma-separated list of items; an item is `*`, a value `5`, a range `1-5`,
or either with a step: `*/15`, `10-40/10`, `5/20` (from 5 to the field's maximum). Names
(`jan`, `MON`) are accepted in month and day-of-week, also as range ends (`mon-fri`). The
shorthands `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`) and
`@hourly` stand for their usual expressions.

As in Vixie cron, when both day-of-month and day-of-week are restricted (neither starts with
`*`), a day matches when either matches; otherwise both must.

`parse_cron` raises ValidationError naming the field for anything else, and for an
expression that can never fire (`0 0 30 2 *`). `CronSchedule.next_after(t)` is the first
matching minute strictly after the epoch time `t`; it skips whole months, days and hours that
cannot match, so even a once-in-four-years schedule takes a few hundred steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from apiary.errors import ValidationError

_MONTHS: Final = (
    "jan",
    "feb",
    "mar",
    "apr",
    "may",
    "jun",
    "jul",
    "aug",
    "sep",
    "oct",
    "nov",
    "dec",
)
_DAYS: Final = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_SHORTHANDS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_SEARCH_YEARS: Final = 9
"""How far ahead `next_after` looks: Feb 29 can be 8 years away (around 2100)."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0


_FIELDS: Final = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTHS, 1),
    _Field("day-of-week", 0, 7, _DAYS, 0),
)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed expression: the matching values of each field (day-of-week 0-6, Sunday 0)."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    def matches_day(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def next_after(self, t: float) -> float:
        """The first matching minute strictly after epoch time `t` (UTC), as epoch seconds.

        ValueError when none comes within nine years (parse_cron refuses such expressions).
        """
        at = datetime.fromtimestamp((int(t) // 60) * 60, UTC) + timedelta(minutes=1)
        last_year = at.year + _SEARCH_YEARS
        while at.year <= last_year:
            if at.month not in self.months:
                year, month = (at.year + 1, 1) if at.month == 12 else (at.year, at.month + 1)
                at = datetime(year, month, 1, tzinfo=UTC)
            elif not self.matches_day(at):
                at = (at + timedelta(days=1)).replace(hour=0, minute=0)
            elif at.hour not in self.hours:
                at = (at + timedelta(hours=1)).replace(minute=0)
            elif at.minute not in self.minutes:
                at += timedelta(minutes=1)
            else:
                return at.timestamp()
        raise ValueError(f"cron {self.expression!r} does not fire within {_SEARCH_YEARS} years")


def parse_cron(text: object, field: str = "cron") -> CronSchedule:
    """Parse a five-field cron expression (module docstring); ValidationError naming `field`."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationError.for_field(field, "must be a cron expression such as '*/5 * * * *'")
    expression = " ".join(text.split())
    parts = _SHORTHANDS.get(expression.lower(), expression).split()
    if len(parts) != len(_FIELDS):
        raise ValidationError.for_field(
            field,
            f"{expression!r} has {len(parts)} fields; cron takes 5 "
            "(minute hour day-of-month month day-of-week)",
        )
    values = [_parse_field(part, spec, field) for part, spec in zip(parts, _FIELDS, strict=True)]
    schedule = CronSchedule(
        expression=expression,
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=frozenset(v % 7 for v in values[4]),
        days_restricted=not parts[2].startswith("*"),
        weekdays_restricted=not parts[4].startswith("*"),
    )
    try:
        schedule.next_after(datetime(2000, 1, 1, tzinfo=UTC).timestamp())
    except ValueError:
        raise ValidationError.for_field(field, f"{expression!r} never fires") from None
    return schedule


def _parse_field(text: str, spec: _Field, field: str) -> frozenset[int]:
    found: set[int] = set()
    for item in text.split(","):
        found.update(_parse_item(item, spec, field))
    return frozenset(found)


def _parse_item(item: str, spec: _Field, field: str) -> range:
    where = f"{spec.name} item {item!r}"
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) < 1:
            raise ValidationError.for_field(field, f"{where}: the step must be a positive integer")
        step = int(step_text)
    if body == "*":
        return range(spec.low, spec.high + 1, step)
    low_text, dash, high_text = body.partition("-")
    low = _value(low_text, spec, field, where)
    high = _value(high_text, spec, field, where) if dash else (spec.high if slash else low)
    if high < low:
        raise ValidationError.for_field(field, f"{where}: the range runs backwards")
    return range(low, high + 1, step)


def _value(text: str, spec: _Field, field: str, where: str) -> int:
    lowered = text.lower()
    if lowered in spec.names:
        return spec.names.index(lowered) + spec.name_base
    if not text.isdigit():
        raise ValidationError.for_field(
            field, f"{where}: {text!r} is not a number{' or a name' if spec.names else ''}"
        )
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise ValidationError.for_field(
            field, f"{where}: {value} is outside {spec.low}-{spec.high}"
        )
    return value
