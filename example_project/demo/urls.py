from django.urls import path

from . import async_views, views

app_name = "demo"
urlpatterns = [
    path("", views.home, name="home"),
    path("profiles/<int:pk>/", views.profile_detail, name="profile"),
    path("profiles/<int:pk>/edit/", views.profile_edit, name="profile-edit"),
    path("profiles/<int:pk>/interests/add/", views.interest_add, name="interest-add"),
    path("profiles/<int:pk>/interests/remove/", views.interest_remove, name="interest-remove"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("leaderboard/rebuild/", views.leaderboard_rebuild, name="leaderboard-rebuild"),
    path("async/", async_views.overview, name="async-overview"),
    path("async/tally/", async_views.tally, name="async-tally"),
    path("async/front/", async_views.front, name="async-front"),
]
