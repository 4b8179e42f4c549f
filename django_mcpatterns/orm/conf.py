"""``settings.MCPATTERNS_ORM``, parsed once and checked: an unknown key names the valid ones."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db.models import Model

__all__ = ["OPS", "OrmSettings", "may_have_rules", "orm_settings"]

OPS = frozenset({"get", "fetch", "count", "exists", "aggregate"})
_KEYS = frozenset(
    {"cache", "timeout", "models", "audit", "stamp_timeout", "wait", "prefix", "lease"}
)
_LEASES = ("meta", "placeholder", "cas")
_MODEL_KEYS = frozenset({"ops", "timeout"})


@dataclass(frozen=True)
class ModelRule:
    """What ``MCPATTERNS_ORM["models"]`` says about the models a pattern matches."""

    pattern: str
    ops: frozenset[str]
    timeout: int | None


@dataclass(frozen=True)
class OrmSettings:
    """The ORM cache's configuration (see docs/orm.md for each key)."""

    cache: str = "default"
    timeout: int = 900
    stamp_timeout: int = 86400
    rules: tuple[ModelRule, ...] = ()
    audit: float = 0.0
    wait: float = 0.2
    prefix: str = "orm:"
    lease: str = "meta"
    _resolved: dict[str, ModelRule | None] = field(default_factory=dict, compare=False)

    def rule(self, model: type[Model]) -> ModelRule | None:
        """The rule for ``model`` (its label, lower case): an exact name before a wildcard."""
        label = model._meta.label_lower
        try:
            return self._resolved[label]
        except KeyError:
            pass
        exact = [r for r in self.rules if r.pattern == label]
        wild = [
            r for r in self.rules if r.pattern != label and fnmatch.fnmatchcase(label, r.pattern)
        ]
        candidates = exact or wild
        found = candidates[0] if candidates else None
        self._resolved[label] = found
        return found


def _ops(value: Any, where: str) -> frozenset[str]:
    if value == "all":
        return OPS
    if isinstance(value, str) or not all(isinstance(op, str) for op in value):
        raise ImproperlyConfigured(f'{where}["ops"] must be "all" or a list of {sorted(OPS)}')
    unknown = set(value) - OPS
    if unknown:
        raise ImproperlyConfigured(
            f'{where}["ops"] has {sorted(unknown)}: the operations are {sorted(OPS)} or "all"'
        )
    return frozenset(value)


def _timeout(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ImproperlyConfigured(f"{where} must be a positive number of seconds, not {value!r}")
    return value


def parse(raw: Mapping[str, Any]) -> OrmSettings:
    """Check and parse a ``MCPATTERNS_ORM`` mapping."""
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("MCPATTERNS_ORM must be a dict")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ImproperlyConfigured(
            f"MCPATTERNS_ORM has unknown keys {sorted(unknown)}; the keys are {sorted(_KEYS)}"
        )
    rules = []
    for pattern, spec in (raw.get("models") or {}).items():
        where = f'MCPATTERNS_ORM["models"][{pattern!r}]'
        if not isinstance(spec, Mapping) or set(spec) - _MODEL_KEYS:
            raise ImproperlyConfigured(f"{where} must be a dict with keys {sorted(_MODEL_KEYS)}")
        if "." not in pattern:
            raise ImproperlyConfigured(f'{where}: name models "app_label.model" or "app_label.*"')
        timeout = spec.get("timeout")
        rules.append(
            ModelRule(
                pattern.lower(),
                _ops(spec.get("ops", "all"), where),
                None if timeout is None else _timeout(timeout, f'{where}["timeout"]'),
            )
        )
    audit = raw.get("audit", 0.0)
    if isinstance(audit, bool) or not isinstance(audit, (int, float)) or not 0 <= audit <= 1:
        raise ImproperlyConfigured('MCPATTERNS_ORM["audit"] is the fraction of hits re-read: 0..1')
    wait = raw.get("wait", 0.2)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise ImproperlyConfigured('MCPATTERNS_ORM["wait"] must be seconds >= 0')
    lease = raw.get("lease", "meta")
    if lease not in _LEASES:
        raise ImproperlyConfigured(
            f'MCPATTERNS_ORM["lease"] is one of {list(_LEASES)}, not {lease!r}'
        )
    return OrmSettings(
        lease=lease,
        cache=str(raw.get("cache", "default")),
        timeout=_timeout(raw.get("timeout", 900), 'MCPATTERNS_ORM["timeout"]'),
        stamp_timeout=_timeout(raw.get("stamp_timeout", 86400), 'MCPATTERNS_ORM["stamp_timeout"]'),
        rules=tuple(rules),
        audit=float(audit),
        wait=float(wait),
        prefix=str(raw.get("prefix", "orm:")),
    )


_last: list[Any] = [object(), None]
_rules: list[bool] = [True]


def may_have_rules() -> bool:
    """Whether ``MCPATTERNS_ORM["models"]`` may name models (cheap: no settings read).

    False only after the current settings were parsed without rules; a change of the
    setting (``setting_changed``) makes it True until they are parsed again.
    """
    return _rules[0]


def _changed(setting: str, **_: Any) -> None:
    if setting == "MCPATTERNS_ORM":
        _rules[0] = True


setting_changed.connect(_changed, dispatch_uid="mcpatterns_orm_rules", weak=False)


def orm_settings() -> OrmSettings:
    """The current settings (parsed again when ``settings.MCPATTERNS_ORM`` is replaced)."""
    raw = getattr(settings, "MCPATTERNS_ORM", None)
    if raw is not _last[0]:
        _last[1] = parse(raw if raw is not None else {})
        _last[0] = raw
        _rules[0] = bool(_last[1].rules)
    parsed: OrmSettings = _last[1]
    return parsed
