from django.urls import path

from . import views

urlpatterns = [
    path("critical/", views.critical),
    path("multiget/", views.multiget),
]
