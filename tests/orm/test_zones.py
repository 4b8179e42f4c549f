"""Time zones: Django compiles a datetime field's date lookups in the active time zone.

The same Query read under two zones is two SQL statements with two answers, so the
active zone is part of every result's key (the recorded path's plan memo included).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.utils import timezone

from tests.orm.shop.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("spelling", ["cache first", "cache last"])
@pytest.mark.parametrize("lookup", ["at__year", "at__date"])
def test_a_date_lookup_is_read_in_the_active_time_zone(
    shop: Any, spelling: str, lookup: str
) -> None:
    # 23:30 UTC on 31 December 2024 is 08:30 on 1 January 2025 in Tokyo.
    Event.objects.create(at=datetime.datetime(2024, 12, 31, 23, 30, tzinfo=datetime.UTC))
    value: Any = 2024 if lookup == "at__year" else datetime.date(2024, 12, 31)

    def make() -> Any:
        if spelling == "cache first":
            return Event.objects.cache().filter(**{lookup: value})
        return Event.objects.filter(**{lookup: value}).cache()

    with timezone.override("UTC"):
        assert len(make()) == 1
        assert make().count() == 1
    with timezone.override("Asia/Tokyo"):
        assert Event.objects.nocache().filter(**{lookup: value}).count() == 0
        assert len(make()) == 0
        assert make().count() == 0
    with timezone.override("UTC"):  # each zone's result kept apart
        assert len(make()) == 1
