"""The ``django_mcpatterns.orm`` app: installs the queryset methods and the write hooks."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


class OrmConfig(AppConfig):
    name = "django_mcpatterns.orm"
    label = "mcpatterns_orm"
    verbose_name = "django-mcpatterns ORM cache"

    def ready(self) -> None:
        from . import queryset, reads, writes
        from .conf import orm_settings

        orm_settings()  # a bad MCPATTERNS_ORM fails at startup, with the valid keys named
        queryset.install()
        writes.install()

        def reset(setting: str, **_: Any) -> None:
            if setting in ("CACHES", "MCPATTERNS_ORM"):
                reads.reset()

        setting_changed.connect(reset, dispatch_uid="mcpatterns_orm_reset", weak=False)
