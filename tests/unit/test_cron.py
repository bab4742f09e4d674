"""The cron parser of SCHEDULE triggers: the five standard fields with ranges, lists, steps
and names; next fire times in UTC; clear errors naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apiary.core.cron import parse_cron
from apiary.errors import ValidationError


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M %a")


def test_fields_accept_values_ranges_lists_steps_and_names() -> None:
    c = parse_cron("*/15 9-17/4 1,15 jan-mar,DEC mon-fri")
    assert c.minutes == {0, 15, 30, 45}
    assert c.hours == {9, 13, 17}
    assert c.days == {1, 15}
    assert c.months == {1, 2, 3, 12}
    assert c.weekdays == {1, 2, 3, 4, 5}
    assert parse_cron("5/20 * * * 7").minutes == {5, 25, 45}
    assert parse_cron("0 0 * * 7").weekdays == {0}  # 7 is Sunday, like 0
    assert parse_cron("  0   12 * * *  ").expression == "0 12 * * *"


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("* * * * *", "2024-05-01 10:00:30", "2024-05-01 10:01 Wed"),
        ("*/15 * * * *", "2024-05-01 10:15:00", "2024-05-01 10:30 Wed"),
        ("0 0 1 1 *", "2024-05-01 10:00", "2025-01-01 00:00 Wed"),
        ("30 8 * * mon", "2024-05-01 10:00", "2024-05-06 08:30 Mon"),
        ("0 0 29 2 *", "2024-03-01 00:00", "2028-02-29 00:00 Tue"),
        ("59 23 31 12 *", "2024-12-31 23:59", "2025-12-31 23:59 Wed"),
        # Both days restricted: either matches (Vixie cron): the 13th or any Friday.
        ("0 0 13 * fri", "2024-09-01 00:00", "2024-09-06 00:00 Fri"),
        ("0 0 13 * fri", "2024-09-07 00:00", "2024-09-13 00:00 Fri"),
        ("0 0 13 * fri", "2024-10-01 00:00", "2024-10-04 00:00 Fri"),
        ("@daily", "2024-05-01 10:00", "2024-05-02 00:00 Thu"),
        ("@hourly", "2024-05-01 10:00", "2024-05-01 11:00 Wed"),
        ("@weekly", "2024-05-01 10:00", "2024-05-05 00:00 Sun"),
        ("@monthly", "2024-05-01 10:00", "2024-06-01 00:00 Sat"),
        ("@yearly", "2024-05-01 10:00", "2025-01-01 00:00 Wed"),
    ],
)
def test_the_next_fire_time_is_the_first_match_strictly_after(
    expression: str, after: str, expected: str
) -> None:
    assert iso(parse_cron(expression).next_after(at(after))) == expected


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("* * * *", "has 4 fields"),
        ("60 * * * *", "minute item '60': 60 is outside 0-59"),
        ("* 24 * * *", "hour item '24'"),
        ("* * 0 * *", "day-of-month item '0'"),
        ("* * * 13 *", "month item '13'"),
        ("* * * foo *", "'foo' is not a number or a name"),
        ("* * * * 8", "day-of-week item '8'"),
        ("*/0 * * * *", "the step must be a positive integer"),
        ("10-5 * * * *", "the range runs backwards"),
        ("1,,2 * * * *", "'' is not a number"),
        ("0 0 30 2 *", "never fires"),
        ("", "must be a cron expression"),
    ],
)
def test_bad_expressions_are_refused_naming_the_field(expression: str, problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_cron(expression, "nodes.n.metadata.cron")
    assert caught.value.details["field"] == "nodes.n.metadata.cron"
    assert problem in caught.value.message


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["*/7 * * * *", "0 */5 * * *", "15 10 * * 1-5", "0 0 1,15 * *",
                     "0 0 13 * fri", "0 12 * feb sun", "*/30 1-3 * * *"]),
    st.integers(at("2020-01-01 00:00"), at("2040-01-01 00:00")),
)  # fmt: skip
def test_next_after_matches_and_skips_no_earlier_minute(expression: str, after: int) -> None:
    cron = parse_cron(expression)
    found = cron.next_after(after)
    moment = datetime.fromtimestamp(found, UTC)
    assert found > after and found % 60 == 0
    assert moment.minute in cron.minutes and moment.hour in cron.hours
    assert moment.month in cron.months and cron.matches_day(moment)
    # No matching minute in between: stepping back over at most a day's minutes finds none.
    for back in range(60, min(int(found - after), 86_400), 60):
        earlier = datetime.fromtimestamp(found - back, UTC)
        assert not (
            earlier.minute in cron.minutes and earlier.hour in cron.hours
            and earlier.month in cron.months and cron.matches_day(earlier)
        ), (expression, iso(found - back))  # fmt: skip
