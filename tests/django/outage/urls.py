from django.urls import path

from . import views

urlpatterns = [
    path("add/", views.add),
    path("locked/", views.locked),
    path("limited/", views.limited),
    path("members/", views.members),
]
