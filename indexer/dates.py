"""Dates as the StreamingQA protocol writes them, and the day numbers the index ids carry."""

from __future__ import annotations

import datetime as dt
import re

# Day 0 of the index id space. News older than this cannot be indexed (none is expected).
EPOCH = dt.date(1900, 1, 1)


class InvalidDateError(ValueError):
    """A date string that is not a real calendar date in an accepted format."""


def parse_day(value: str, *, what: str = "date") -> dt.date:
    """Parse 'YYYY-MM-DD' or 'YYYY/MM/DD' (RealTimeQA uses both); anything else is an error.

    A trailing time part ('2023/01/07/05:11', '2023-01-07T05:11:00') is ignored.
    """
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if not isinstance(value, str) or not value.strip():
        raise InvalidDateError(f"{what} is missing (use YYYY-MM-DD)")
    text = value.strip().replace("/", "-")
    head = text[:10]
    try:
        day = dt.date.fromisoformat(head)
    except ValueError:
        raise InvalidDateError(f"{what} {value!r} is not a date (use YYYY-MM-DD)") from None
    if len(text) > 10 and text[10] not in "T -":
        raise InvalidDateError(f"{what} {value!r} is not a date (use YYYY-MM-DD)")
    return day


_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_iso_day(value: object, *, what: str = "date") -> dt.date:
    """Exactly 'YYYY-MM-DD' (what the API and the pages take): no time part, no other layout.

    Example:
        >>> parse_iso_day("2024-02-20")
        datetime.date(2024, 2, 20)
    """
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise InvalidDateError(f"{what} is missing (use YYYY-MM-DD)")
    if not _ISO_DAY.fullmatch(text):
        raise InvalidDateError(f"{what} {value!r} is not a date (use YYYY-MM-DD)")
    return parse_day(text, what=what)


def parse_month(value: str) -> dt.date:
    """Parse 'YYYY-MM' into the first day of that month."""
    try:
        year, month = value.strip().split("-")
        if len(year) != 4 or len(month) != 2:
            raise ValueError
        first = dt.date(int(year), int(month), 1)
    except (ValueError, AttributeError):
        raise InvalidDateError(f"month {value!r} is not a month (use YYYY-MM)") from None
    if first.year >= dt.MAXYEAR:  # its end and the month after it would not be dates
        raise InvalidDateError(f"month {value!r} is out of range (before {dt.MAXYEAR}-01)")
    return first


def month_key(day: dt.date) -> str:
    """'2023-04' for any day in April 2023."""
    return f"{day.year:04d}-{day.month:02d}"


def month_start(day: dt.date) -> dt.date:
    return day.replace(day=1)


def next_month(day: dt.date) -> dt.date:
    """First day of the month after `day`'s month."""
    return dt.date(day.year + (day.month == 12), day.month % 12 + 1, 1)


def month_end(day: dt.date) -> dt.date:
    """Last day of `day`'s month."""
    return next_month(day) - dt.timedelta(days=1)


def months_before(day: dt.date, months: int) -> dt.date:
    """The same day `months` earlier (the month's last day where it is shorter)."""
    y, m = divmod(day.year * 12 + day.month - 1 - months, 12)
    first = dt.date(y, m + 1, 1)
    return first.replace(day=min(day.day, month_end(first).day))


def format_long(day: dt.date) -> str:
    """'Thursday, February 7, 2019': the StreamingQA passage and question date prefix."""
    return f"{day:%A}, {day:%B} {day.day}, {day.year}"


def day_number(day: dt.date) -> int:
    """Days since EPOCH; the high part of a passage's FAISS id."""
    n = (day - EPOCH).days
    if n < 0:
        raise InvalidDateError(f"date {day.isoformat()} is before {EPOCH.isoformat()} and cannot be indexed")
    return n


def from_day_number(n: int) -> dt.date:
    return EPOCH + dt.timedelta(days=int(n))
