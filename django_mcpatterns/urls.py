"""`include("django_mcpatterns.urls")`: the status page, staff only, as "mcpatterns:status"."""

from django.urls import path

from .views import StatusView

app_name = "mcpatterns"
urlpatterns = [path("", StatusView.as_view(), name="status")]
