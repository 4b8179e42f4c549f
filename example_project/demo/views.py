"""The example's pages; each one shows a caching pattern where a real site would use it.

- ``home``: an expensive report, the whole page behind ``stampede_guard``;
- ``profile_detail``: data cached in the profile's namespace, invalidated when
  the profile is saved (``profile_edit``, rate-limited: 5 saves a minute per
  client and profile);
- ``interest_add``/``interest_remove``: a memcached set (``sadd``/``srem``);
- ``leaderboard_rebuild``: a batch job behind a lock, one at a time;
- every page: a members sidebar, a ``{% cachefragment %}`` in a namespace.
"""

from collections.abc import Callable

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from django_mcpatterns.decorators import ratelimit, stampede_guard

from . import queries
from .forms import InterestForm, ProfileForm
from .interests import add_interest, interests, remove_interest
from .models import Profile

FRONT_PAGE_SECONDS = 30
PROFILE_SAVES = "5/m"


def _editor(request: HttpRequest) -> str:
    """Whose budget a save spends: this client's, for this profile."""
    assert request.resolver_match is not None
    return f"{request.META.get('REMOTE_ADDR')}:{request.resolver_match.kwargs['pk']}"


@stampede_guard(FRONT_PAGE_SECONDS)
def home(request: HttpRequest) -> HttpResponse:
    # Fresh for 30 s; after that one request re-renders the page while every
    # other one is served the stale page at once (no pile-up on the report).
    context = {"report": queries.community_report(), "fresh_for": FRONT_PAGE_SECONDS}
    return render(request, "demo/home.html", context)


def profile_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _profile_page(request, pk, InterestForm())


@require_http_methods(["GET", "HEAD", "POST"])
@ratelimit(PROFILE_SAVES, key=_editor, methods=("POST",))  # 429 + Retry-After past it
def profile_edit(request: HttpRequest, pk: int) -> HttpResponse:
    profile = get_object_or_404(Profile, pk=pk)
    if request.method == "POST":
        form = ProfileForm(request.POST, instance=profile)
        if form.is_valid():
            form.save()  # invalidate_on_change (apps.py) drops the profile's namespace
            return redirect(profile)
    else:
        form = ProfileForm(instance=profile)
    return render(request, "demo/profile_form.html", {"form": form, "profile": profile})


@require_POST
def interest_add(request: HttpRequest, pk: int) -> HttpResponse:
    return _change_interests(request, pk, add_interest)


@require_POST
def interest_remove(request: HttpRequest, pk: int) -> HttpResponse:
    return _change_interests(request, pk, remove_interest)


def leaderboard(request: HttpRequest) -> HttpResponse:
    return _leaderboard_page(request)


@require_POST
def leaderboard_rebuild(request: HttpRequest) -> HttpResponse:
    if not queries.rebuild_leaderboard():
        # Another request holds the lock: say so rather than queue a second job.
        return _leaderboard_page(request, refused=True, status=409)
    return redirect("demo:leaderboard")


def _profile_page(request: HttpRequest, pk: int, form: InterestForm) -> HttpResponse:
    card = queries.profile_card(pk)
    if card is None:
        raise Http404("No such profile")
    context = {"card": card, "interests": interests(pk), "form": form}
    return render(request, "demo/profile_detail.html", context)


def _change_interests(
    request: HttpRequest, pk: int, change: Callable[[int, str], None]
) -> HttpResponse:
    get_object_or_404(Profile, pk=pk)
    form = InterestForm(request.POST)
    if not form.is_valid():
        return _profile_page(request, pk, form)
    change(pk, form.cleaned_data["name"])
    return redirect("demo:profile", pk=pk)


def _leaderboard_page(
    request: HttpRequest, refused: bool = False, status: int = 200
) -> HttpResponse:
    context = {
        "board": queries.leaderboard(),
        "running": refused or queries.rebuild_running(),
        "refused": refused,
    }
    return render(request, "demo/leaderboard.html", context, status=status)
