"""The ORM cache's counts on the status page and in the debug toolbar's panel."""

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


def test_debug_toolbar_panel_counts_the_requests_orm_events(shop: Any) -> None:
    from django_mcpatterns import debug_toolbar as panel

    c = Category.objects.create(name="c")
    recording = panel._Recording()
    token = panel._recording.set(recording)
    try:
        with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "django_mcpatterns.orm"]):
            panel._listen_to_orm()
            Product.objects.filter(category=c).cache().count()
            Product.objects.filter(category=c).cache().count()
    finally:
        panel._recording.reset(token)
    assert recording.orm["mcpatterns_orm_shop.product"]["hit"] == 1
    assert recording.orm["mcpatterns_orm_shop.product"]["miss"] == 1
