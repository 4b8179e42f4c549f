"""The ORM cache's counts on the status page (the panel: tests/django/test_debug_toolbar.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import RequestFactory, override_settings

from django_mcpatterns.views import StatusView
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


def test_status_page_shows_orm_counts_per_model(shop: Any) -> None:
    c = Category.objects.create(name="c")
    Product.objects.filter(category=c).cache().count()
    Product.objects.filter(category=c).cache().count()
    templates = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
    with override_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, "django_mcpatterns.orm"], TEMPLATES=templates
    ):
        view = StatusView.as_view(permission=lambda request: True)
        response = view(RequestFactory().get("/status/"))
        html = response.render().content.decode()
    assert "ORM cache" in html
    assert 'data-model="mcpatterns_orm_shop.product"' in html
