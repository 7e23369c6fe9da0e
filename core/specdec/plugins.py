"""Plugin loading and the method registry.

Built-in plugins (plain decoding, user-provided drafters, the default verifier) are registered
on every load. Outside plugins come from the ``specdec.plugins`` entry-point group, one entry
point per method. ``SPECDEC_PLUGINS=a,b`` loads only those entry points (empty: none).

A plugin that fails to import is recorded, not raised: ``specdec list-methods`` shows it, and
selecting its method raises :class:`~specdec.errors.PluginError` with the cause. That includes a
plugin calling ``sys.exit()`` while it loads (``SystemExit`` would otherwise end whatever command
merely looked the methods up); ``KeyboardInterrupt`` still propagates.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import traceback
from dataclasses import dataclass, field

import pluggy

from specdec import hookspecs
from specdec.config import SpeculativeConfig
from specdec.errors import PluginError, UnknownMethodError

ENTRY_POINT_GROUP = "specdec.plugins"
PLUGINS_ENV = "SPECDEC_PLUGINS"


def normalize_method_name(name: str) -> str:
    """Method names match ignoring case, ``-`` and ``_`` (``Draft_Target`` == ``drafttarget``)."""
    return re.sub(r"[-_\s]", "", name).lower()


@dataclass
class MethodInfo:
    name: str
    config_class: type[SpeculativeConfig]
    aliases: tuple[str, ...] = ()
    summary: str = ""
    plugin: str = ""
    distribution: str | None = None
    version: str | None = None


@dataclass
class BrokenPlugin:
    name: str
    distribution: str | None
    version: str | None
    error: str
    detail: str = ""


@dataclass
class PluginRegistry:
    """The loaded plugin manager, the methods plugins declared and the plugins that broke."""

    manager: pluggy.PluginManager
    methods: dict[str, MethodInfo] = field(default_factory=dict)
    broken: list[BrokenPlugin] = field(default_factory=list)
    _names: dict[str, str] = field(default_factory=dict)

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.manager.hook

    def method_names(self) -> list[str]:
        return sorted(self.methods)

    def lookup(self, name: str) -> MethodInfo:
        """Find a method by name or alias, or raise a clear error."""
        key = normalize_method_name(name)
        if key in self._names:
            return self.methods[self._names[key]]
        for plugin in self.broken:
            if normalize_method_name(plugin.name) == key:
                package = f" (package {plugin.distribution} {plugin.version})" if plugin.distribution else ""
                raise PluginError(f"method {name!r} is installed{package} but its plugin failed to load: {plugin.error}")
        raise UnknownMethodError(
            f"unknown speculative method {name!r}; installed: {', '.join(self.method_names())}"
        )

    def method_for_config(self, config: SpeculativeConfig) -> MethodInfo:
        for info in self.methods.values():
            if type(config) is info.config_class:
                return info
        raise UnknownMethodError(
            f"{type(config).__name__} is not the config class of any installed method; "
            f"installed: {', '.join(self.method_names())}"
        )

    def register_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register an in-process plugin (a module or object with hookimpls) and its methods."""
        plugin_name = self.manager.register(plugin, name=name) or ""
        try:
            self.manager.check_pending()
            self._collect(plugin, plugin_name, distribution=None, version=None)
        except (Exception, SystemExit) as exc:
            self.unregister_plugin(plugin_name)
            if isinstance(exc, SystemExit):
                raise PluginError(f"plugin {plugin_name!r} failed to register: {_load_error(exc)}") from exc
            raise

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin and every method it declared."""
        if self.manager.has_plugin(name):
            self.manager.unregister(name=name)
        for method in [m for m in self.methods.values() if m.plugin == name]:
            del self.methods[method.name]
        self._names = {k: v for k, v in self._names.items() if v in self.methods}

    def _collect(self, plugin: object, plugin_name: str, distribution: str | None, version: str | None) -> None:
        impl = getattr(plugin, "specdec_register_methods", None)
        if impl is None:
            return

        def register(
            name: str,
            config_class: type[SpeculativeConfig],
            aliases: tuple[str, ...] | list[str] = (),
            summary: str = "",
        ) -> None:
            if not (isinstance(config_class, type) and issubclass(config_class, SpeculativeConfig)):
                raise PluginError(f"method {name!r}: config class must subclass specdec.SpeculativeConfig")
            keys = [normalize_method_name(n) for n in (name, *aliases)]
            clash = [k for k in keys if k in self._names]
            if clash:
                raise PluginError(f"method {name!r}: name {clash[0]!r} is already taken by {self._names[clash[0]]!r}")
            config_class.method_name = name
            self.methods[name] = MethodInfo(
                name, config_class, tuple(aliases), summary, plugin_name, distribution, version
            )
            for k in keys:
                self._names[k] = name

        impl(register=register)


def _load_error(exc: BaseException) -> str:
    """How a plugin's load failure is reported: the exception's type and message."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: the plugin called sys.exit({exc.code!r}) while loading"
    return f"{type(exc).__name__}: {exc}"


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def load_plugins() -> PluginRegistry:
    """Build a fresh registry: built-in plugins, then the selected entry points."""
    from specdec.builtin import BUILTIN_PLUGINS

    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    registry = PluginRegistry(manager)
    core_version = importlib.metadata.version("specdec")
    for module in BUILTIN_PLUGINS:
        manager.register(module, name=module.__name__)
        registry._collect(module, module.__name__, "specdec", core_version)

    selected = os.environ.get(PLUGINS_ENV)
    allowed = None if selected is None else {n.strip() for n in selected.split(",") if n.strip()}
    for ep in _entry_points():
        if allowed is not None and ep.name not in allowed:
            continue
        dist = ep.dist.name if ep.dist else None
        version = ep.dist.version if ep.dist else None
        try:
            plugin = ep.load()
            manager.register(plugin, name=f"entrypoint:{ep.name}")
            manager.check_pending()
            registry._collect(plugin, f"entrypoint:{ep.name}", dist, version)
        except (Exception, SystemExit) as exc:  # a broken plugin must not take the others (or the process) down
            registry.unregister_plugin(f"entrypoint:{ep.name}")
            registry.broken.append(BrokenPlugin(ep.name, dist, version, _load_error(exc), traceback.format_exc()))
    return registry


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_plugins()
    return _registry


def reset_registry() -> None:
    """Forget the loaded plugins (the next :func:`get_registry` loads them again)."""
    global _registry
    _registry = None
