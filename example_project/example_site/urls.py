from django.urls import path

from demo import views
from django_mcpatterns.views import StatusView, debug_or_staff

urlpatterns = [
    path("", views.home, name="home"),
    path("status/", StatusView.as_view(permission=debug_or_staff), name="status"),
]
