"""Backends: the implementations a node chooses between by name, and the registry of each family (ROS-free).

A *family* is what one node's ``backend`` parameter chooses from: the tracker node's tracker backends, the
head camera's camera backends, the drivers' joint backends, the world model's generators... Each family is
one :class:`BackendRegistry`, created next to the family's base class. An implementation registers itself in
its own module, with its name and its own settings block (:class:`~.params.Param` entries: type, default,
units, bounds)::

    @TRACKER_BACKENDS.register
    class SyntheticOperator(TrackerSource):
        name = "synthetic"
        SETTINGS = (Param("seed", int, 0, "random seed", min=0, max=2**31 - 1),)

        @classmethod
        def from_settings(cls, settings, context):  # settings: {"seed": ...}; context: what the node knows
            return cls(serials=context.serials, seed=settings["seed"])

The node asks the registry: its :class:`BackendSchema` offers the registered names as the choices of
``backend`` and each implementation's settings as ``<name>.<key>`` parameters, and :meth:`BackendRegistry.create`
builds the chosen one. An unknown name is an :class:`UnknownBackendError` listing the known ones; nothing
falls back to a default.

Discovery: on first use a registry imports every module of its family's package (``pkgutil``), so an
implementation in a new module of that package is found without editing anything else, then loads the
entry points of the group ``rynn_teleop.<family>`` (out-of-tree backends: a class, or a module that
registers on import, named as the backend). Registration must stay cheap: a module that needs torch or a
vendor SDK imports it when a backend is built or started, not at import.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import pkgutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from ..errors import ConfigurationError, ParameterError
from .params import Param, ParamSchema, did_you_mean

ENTRY_POINT_PREFIX = "rynn_teleop."  # + family: the entry-point group of out-of-tree backends

B = TypeVar("B", bound=type)


class UnknownBackendError(ParameterError):
    """A backend name that no implementation of the family registered.

    Attributes:
        key: the parameter that named it (``"backend"``).
        name: the name asked for.
        known: every registered name of the family.
    """

    def __init__(self, key: str, name: str, what: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(key, f"parameter {key!r} = {name!r}: unknown {what}; known: "
                              f"{', '.join(self.known) or '(none)'}{did_you_mean(name, self.known)}")


class Backend:
    """What a registered implementation declares (a mixin of each family's base class).

    ``name`` is what the node's ``backend`` parameter says; ``SETTINGS`` its own parameters, declared under
    ``<name>.`` in the node's schema; :meth:`from_settings` builds one. Capabilities the node adapts to are
    further class attributes of the family's base class (``aligns_to_ticks``, ...).
    """

    name: ClassVar[str]
    SETTINGS: ClassVar[tuple[Param, ...]] = ()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: Any) -> Any:
        """A new instance from its validated ``settings`` (setting name -> value) and the node's ``context``
        (a family's NamedTuple of what the node knows: rates, topics, joints...).

        Default: the settings are the constructor's keyword arguments (the context is not used).
        """
        return cls(**settings)


class BackendRegistry(Mapping[str, type]):
    """The implementations of one family, by name (read as a mapping name -> class, sorted by name).

    Args:
        family: short name; the entry-point group of out-of-tree implementations is ``rynn_teleop.<family>``.
        what: the family in words, for messages ("tracker backend").
        package: the dotted package whose modules are imported on first use (None: entry points only).
        base: the class (or classes) every implementation must subclass.
    """

    def __init__(self, family: str, what: str, *, package: str | None, base: type | tuple[type, ...] = Backend):
        self.family = family
        self.what = what
        self.package = package
        self.base = base
        self.group = ENTRY_POINT_PREFIX + family
        self._classes: dict[str, type] = {}
        self._lock = threading.RLock()
        self._discovered = False
        self._version = 0

    # ------------------------------------------------------------------ registration
    def register(self, cls: B) -> B:
        """Class decorator: add ``cls`` under ``cls.name`` (the same class again changes nothing).

        Raises:
            ConfigurationError: not a subclass of the family's base, no usable ``name``, ``SETTINGS`` that
                are not Params, or a name another class already registered.
        """
        where = f"{self.what} {getattr(cls, '__qualname__', cls)!r}"
        if not isinstance(cls, type) or not issubclass(cls, self.base):
            bases = self.base if isinstance(self.base, tuple) else (self.base,)
            raise ConfigurationError(f"{where} is not a subclass of {' or '.join(b.__name__ for b in bases)}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name or "." in name or name != name.strip():
            raise ConfigurationError(f"{where} needs a class attribute `name`: a non-empty string without dots")
        settings = getattr(cls, "SETTINGS", ())
        if not all(isinstance(s, Param) for s in settings):
            raise ConfigurationError(f"{where}: SETTINGS must be core.params.Param entries")
        with self._lock:
            known = self._classes.get(name)
            if known is not None and known is not cls and _identity(known) != _identity(cls):
                raise ConfigurationError(f"{self.what} {name!r} is registered twice: by {_identity(known)} and "
                                         f"{_identity(cls)}")
            if known is not cls:
                self._classes[name] = cls
                self._version += 1
        return cls

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests; nothing happens if it is not registered)."""
        with self._lock:
            if self._classes.pop(name, None) is not None:
                self._version += 1

    def discover(self, *, again: bool = False) -> None:
        """Import the family's package modules and load its entry points (once; ``again``: once more).

        Raises:
            ConfigurationError: an entry point that cannot be loaded or registers no backend of its name.
        """
        with self._lock:
            if self._discovered and not again:
                return
            self._discovered = True
            try:
                if self.package is not None:
                    package = importlib.import_module(self.package)
                    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
                        if not info.name.rsplit(".", 1)[-1].startswith("_"):
                            importlib.import_module(info.name)
                for entry in importlib.metadata.entry_points(group=self.group):
                    self._load(entry)
            except BaseException:
                self._discovered = False
                raise

    def _load(self, entry: importlib.metadata.EntryPoint) -> None:
        where = f"{self.what} {entry.name!r} (entry point {entry.value!r} of group {self.group!r})"
        try:
            obj = entry.load()
        except Exception as exc:
            raise ConfigurationError(f"{where} cannot be loaded: {exc!r}") from exc
        if isinstance(obj, type):
            if getattr(obj, "name", None) != entry.name:
                raise ConfigurationError(f"{where}: the class is named {getattr(obj, 'name', None)!r}; an entry "
                                         "point must be named as its backend")
            self.register(obj)
        elif entry.name not in self._classes:
            raise ConfigurationError(f"{where} registered no {self.what} of that name")

    # ------------------------------------------------------------------ lookup
    def version(self) -> int:
        """A number that changes whenever a backend is added or removed (discovers first)."""
        self.discover()
        return self._version

    def __getitem__(self, name: str) -> type:
        self.discover()
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        self.discover()
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        self.discover()
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._classes

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        return tuple(self)

    def backend(self, name: str, key: str = "backend") -> type:
        """The class registered as ``name``.

        Raises:
            UnknownBackendError: no such name (``key``: the parameter that gave it).
        """
        if name not in self:
            raise UnknownBackendError(key, name, self.what, self.names())
        return self._classes[name]

    # ------------------------------------------------------------------ node parameters
    def params(self) -> list[Param]:
        """Every backend's settings as ``<name>.<key>`` parameters, backends sorted by name."""
        out = []
        for name, cls in self.items():
            for param in cls.SETTINGS:
                out.append(dataclasses.replace(param, name=f"{name}.{param.name}",
                                               description=f"{name} backend: {param.description}"))
        return out

    def create(self, name: str, values: Mapping[str, Any], context: Any, key: str = "backend") -> Any:
        """Build backend ``name`` from a node's validated parameter ``values`` (its ``<name>.*`` settings) and
        the node's ``context``.

        Raises:
            UnknownBackendError: no backend ``name``.
            ParameterError: the backend refuses a setting (the key is re-named ``<name>.<key>``).
        """
        cls = self.backend(name, key)
        own = {p.name for p in cls.SETTINGS}
        settings = {k: values[f"{name}.{k}"] for k in own}
        try:
            return cls.from_settings(settings, context)
        except ParameterError as exc:
            if exc.key not in own or isinstance(exc, UnknownBackendError):
                raise
            raise ParameterError(f"{name}.{exc.key}", f"parameter {f'{name}.{exc.key}'!r}: {exc}") from None

    def make(self, name: str, **kwargs: Any) -> Any:
        """A new ``name`` built with constructor keyword arguments (tests, tools).

        Raises:
            UnknownBackendError: no backend ``name``.
            ConfigurationError: arguments the constructor does not take, or values it refuses.
        """
        cls = self.backend(name)
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as exc:
            raise ConfigurationError(f"{self.what} {name!r}: {exc}") from exc
        return cls(**kwargs)


def _identity(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class BackendSchema(ParamSchema):
    """A node's parameters with a ``backend`` choice from a registry and every backend's settings block.

    The choice comes first, then ``params``, then each registered backend's settings under ``<name>.``.
    The table follows the registry: a backend registered later (an entry point, a test) appears in the
    choices and adds its settings. Settings of a backend that is not chosen are accepted and validated (one
    parameter file holds every backend's), a key of no backend is an unknown parameter.

    Args:
        node_name: the ROS node name.
        params: the node's own parameters.
        backends: the family.
        default: the backend chosen by default (must be registered).
        description: of the choice parameter.
        key: the choice parameter's name.
        renamed: former key -> new key (refused with a message naming the new key).
    """

    def __init__(self, node_name: str, params: Sequence[Param], *, backends: BackendRegistry, default: str,
                 description: str, key: str = "backend", renamed: Mapping[str, str] | None = None) -> None:
        super().__init__(node_name, params, renamed=renamed)
        self.backends = backends
        self.key = key
        self._own = tuple(params)
        self._default = default
        self._description = description
        self._built: tuple[int, Mapping[str, Param]] | None = None

    @property
    def params(self) -> Mapping[str, Param]:
        version = self.backends.version()
        built = self._built
        if built is None or built[0] != version:
            choice = Param(self.key, str, self._default, self._description, choices=self.backends.names())
            built = self._built = (version, self._table([choice, *self._own, *self.backends.params()]))
        return built[1]

    def validate(self, values: Mapping[str, Any], *, allow_partial: bool = True) -> dict[str, Any]:
        """As :meth:`ParamSchema.validate`; an unknown backend name is an :class:`UnknownBackendError`."""
        name = values.get(self.key)
        if isinstance(name, str) and name not in self.backends:
            raise UnknownBackendError(self.key, name, self.backends.what, self.backends.names())
        return super().validate(values, allow_partial=allow_partial)

    def create(self, values: Mapping[str, Any], context: Any) -> Any:
        """The backend chosen in a node's validated ``values``, built (see :meth:`BackendRegistry.create`)."""
        return self.backends.create(values[self.key], values, context, self.key)
