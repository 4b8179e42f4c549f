from django.urls import include, path

from django_mcpatterns.views import StatusView, debug_or_staff

urlpatterns = [
    path("", include("demo.urls")),
    path("status/", StatusView.as_view(permission=debug_or_staff), name="status"),
]
