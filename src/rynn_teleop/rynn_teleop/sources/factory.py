"""Building a source by name: the registry each source family (trackers, hands, cameras) keeps."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigurationError


def build_source(registry: Mapping[str, type], kind: str, what: str, kwargs: Mapping[str, Any]) -> Any:
    """A not-yet-started ``registry[kind]`` built with ``kwargs``.

    Args:
        registry: kind -> source class.
        kind: the requested kind (a node parameter).
        what: the family in words, for messages ("tracker source", ...).
    Raises:
        ConfigurationError: unknown kind (listing the known ones), arguments that
            kind does not take, or invalid values (from the source's constructor).
    """
    cls = registry.get(kind)
    if cls is None:
        raise ConfigurationError(f"unknown {what} {kind!r}; choose one of {', '.join(sorted(registry))}")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise ConfigurationError(f"{what} {kind!r}: {exc}") from exc
    return cls(**kwargs)


class SourceRegistry(dict):
    """kind -> class of one source family, and :meth:`make` to build one by kind.

    Args:
        what: the family in words, for messages ("tracker source", ...).
        classes: the family's source classes, each with its ``kind``.
    """

    def __init__(self, what: str, classes: Iterable[type]) -> None:
        super().__init__((cls.kind, cls) for cls in classes)
        self.what = what

    def make(self, kind: str, **kwargs: Any) -> Any:
        """A not-yet-started source of ``kind`` built with ``kwargs`` (raises as :func:`build_source`)."""
        return build_source(self, kind, self.what, kwargs)
