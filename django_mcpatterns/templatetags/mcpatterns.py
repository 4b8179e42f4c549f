"""``{% load mcpatterns %}``: template fragments cached with stampede protection.

``{% cachefragment %}`` has the shape of Django's ``{% cache %}``::

    {% load mcpatterns %}
    {% cachefragment 300 sidebar request.user.pk using="fragments" namespace=ns %}
        ... expensive ...
    {% endcachefragment %}

but caches with ``get_or_compute``: after ``timeout`` seconds one request
re-renders the fragment while the others are served the stale one, and on a
miss one request renders while the others wait for it.  Its own name, so that
it can be loaded next to Django's ``{% load cache %}`` without either
replacing the other.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from django.core.cache import InvalidCacheBackendError, caches
from django.core.cache.utils import make_template_fragment_key
from django.core.exceptions import ImproperlyConfigured
from django.template import (
    Context,
    Library,
    Node,
    NodeList,
    TemplateSyntaxError,
    VariableDoesNotExist,
)
from django.template.base import FilterExpression, Parser, Token

from ..decorators import inline_policy, patterns_cache

if TYPE_CHECKING:
    from ..backend import StoreCache
    from ..patterns.namespaces import CacheNamespace

register = Library()

TAG = "cachefragment"
_OPTIONS = ("using", "namespace")


class FragmentNode(Node):
    """A ``{% cachefragment %}`` block."""

    def __init__(
        self,
        nodelist: NodeList,
        timeout: FilterExpression,
        fragment_name: str,
        vary_on: list[FilterExpression],
        options: dict[str, FilterExpression],
    ) -> None:
        self.nodelist = nodelist
        self.timeout = timeout
        self.fragment_name = fragment_name
        self.vary_on = vary_on
        self.options = options

    def render(self, context: Context) -> str:
        timeout = self._timeout(context)
        cache = self._cache(context)
        # Django's own key: without namespace=, make_template_fragment_key(name,
        # vary_on) invalidates these fragments as it does those of {% cache %};
        # with it, the key is the namespace's (cache.namespace(*parts).delete(key)).
        key = make_template_fragment_key(
            self.fragment_name, [var.resolve(context) for var in self.vary_on]
        )
        target = self._namespace(cache, context)
        render = functools.partial(self.nodelist.render, context)
        return target.get_or_compute(key, render, timeout, policy=inline_policy(cache, None))

    def _resolve(self, expression: FilterExpression, context: Context) -> Any:
        try:
            return expression.resolve(context)
        except VariableDoesNotExist as exc:
            raise TemplateSyntaxError(
                f"{TAG!r} tag got an unknown variable: {expression.var!r}"
            ) from exc

    def _timeout(self, context: Context) -> int | None:
        timeout = self._resolve(self.timeout, context)
        if timeout is None:
            return None  # as {% cache %}: never expires
        try:
            return int(timeout)
        except (ValueError, TypeError) as exc:
            raise TemplateSyntaxError(
                f"{TAG!r} tag got a non-integer timeout value: {timeout!r}"
            ) from exc

    def _cache(self, context: Context) -> StoreCache:
        using = self.options.get("using")
        if using is not None:
            alias = self._resolve(using, context)
            try:
                caches[alias]
            except InvalidCacheBackendError as exc:
                raise TemplateSyntaxError(
                    f"Invalid cache name specified for {TAG} tag: {alias!r}"
                ) from exc
        else:  # as {% cache %}: "template_fragments" if there is one
            try:
                caches["template_fragments"]
                alias = "template_fragments"
            except InvalidCacheBackendError:
                alias = "default"
        try:
            return patterns_cache(alias)
        except ImproperlyConfigured as exc:
            raise TemplateSyntaxError(f"{TAG!r} tag: {exc}") from exc

    def _namespace(self, cache: StoreCache, context: Context) -> StoreCache | CacheNamespace:
        expression = self.options.get("namespace")
        if expression is None:
            return cache
        parts = self._resolve(expression, context)
        if isinstance(parts, str | int) and not isinstance(parts, bool):
            parts = (parts,)
        if not isinstance(parts, tuple | list) or not parts:
            raise TemplateSyntaxError(
                f"{TAG!r} tag: namespace must be a str, an int or a list of them, not {parts!r}"
            )
        return cache.namespace(*parts)


@register.tag(TAG)
def do_cachefragment(parser: Parser, token: Token) -> FragmentNode:
    """Cache a template fragment with soft expiry.

    Usage::

        {% load mcpatterns %}
        {% cachefragment timeout fragment_name [vary_on ...] [using="alias"] [namespace=parts] %}
            ... expensive ...
        {% endcachefragment %}

    ``timeout`` (seconds, may be a variable; ``None``: never stale) and the
    fragment name (not a variable) are required.  ``using`` names the cache
    (default: ``template_fragments`` if configured, else ``default``), which
    must be a django-mcpatterns backend.  ``namespace`` is a str, an int or a
    list of them: the parts of ``cache.namespace(*parts)``, invalidated
    together with it.
    """
    nodelist = parser.parse((f"end{TAG}",))
    parser.delete_first_token()
    bits = token.split_contents()
    options: dict[str, FilterExpression] = {}
    while len(bits) > 3:
        name, sep, value = bits[-1].partition("=")
        if not sep or name not in _OPTIONS:
            break
        if name in options:
            raise TemplateSyntaxError(f"{bits[0]!r} tag received {name}= more than once")
        options[name] = parser.compile_filter(value)
        bits.pop()
    if len(bits) < 3:
        raise TemplateSyntaxError(f"{bits[0]!r} tag requires at least 2 arguments.")
    return FragmentNode(
        nodelist,
        parser.compile_filter(bits[1]),
        bits[2],  # the fragment name is not a variable, as in {% cache %}
        [parser.compile_filter(bit) for bit in bits[3:]],
        options,
    )
