"""The URLconf of tests/django/test_debug_toolbar.py: a page and the toolbar's views."""

from debug_toolbar.toolbar import debug_toolbar_urls
from django.urls import path

from tests.django.test_debug_toolbar import apage, orm_page, page

urlpatterns = [
    path("page/", page),
    path("apage/", apage),
    path("orm/", orm_page),
    *debug_toolbar_urls(),
]
