"""Plugin discovery and the method registry, with real pip-installed plugin packages.

``tests/example_plugin`` (method ``echo``) and ``tests/broken_plugin`` (two entry points that
fail on import: ``broken`` raises, ``exit_on_import`` calls ``sys.exit()``) are installed by the
``installed_plugins`` fixture (see conftest.py) and found through their ``specdec.plugins`` entry
points, exactly as a user's installed plugins are.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

import specdec
from specdec import (
    LLM,
    DraftProposal,
    PluginError,
    SamplingParams,
    SpeculativeConfig,
    UnknownMethodError,
    hookimpl,
)
from specdec.config_loader import parse_speculative_config
from specdec import plugins as plugins_module
from specdec.plugins import ENTRY_POINT_GROUP, PLUGINS_ENV, get_registry
from specdec.testing.conformance import MethodConformance


def _echo_config_class():
    from specdec_echo_example import EchoDecodingConfig

    return EchoDecodingConfig


# -- discovery ----------------------------------------------------------------------------------


def test_echo_discovered_through_entry_point(installed_plugins, fresh_registry):
    """The pip-installed example plugin is found via its entry point, credited to its
    distribution name and version, and reachable by name and alias (case/-/_ insensitive)."""
    registry = get_registry()
    info = registry.lookup("echo")
    assert info.name == "echo"
    assert info.distribution == "specdec-plugin-echo-example"
    assert info.version == "0.3.0"
    assert info.plugin == "entrypoint:echo"
    assert info.aliases == ("repeat_last",)
    assert info.config_class is _echo_config_class()
    assert issubclass(info.config_class, SpeculativeConfig)
    assert registry.lookup("Repeat-Last") is info
    assert registry.lookup("ECHO") is info
    assert registry.manager.has_plugin("entrypoint:echo")
    # The installed module really comes from the pip target dir, not from the source tree.
    import specdec_echo_example

    assert str(installed_plugins) in specdec_echo_example.__file__
    # The plugin's extra option is validated like any other config field.
    config = parse_speculative_config({"method": "repeat_last", "num_speculative_tokens": 3, "repeat": 2}, registry)
    assert type(config) is info.config_class
    assert (config.decoding_type, config.max_draft_len, config.repeat) == ("echo", 3, 2)


def test_echo_drafts_the_last_token_repeated(installed_plugins, fresh_registry, tiny):
    """echo's proposals are the last token repeated, capped by ``repeat`` and by the engine's
    per-step budget; output still equals plain greedy decoding."""
    EchoDecodingConfig = _echo_config_class()
    seen: list[tuple[int, list[int], int]] = []

    class Spy:
        @hookimpl(hookwrapper=True)
        def specdec_prepare_draft_tokens(self, requests):
            budgets = [r.max_draft_len for r in requests]
            lasts = [r.token_ids[-1] for r in requests]
            outcome = yield
            for last, budget, proposal in zip(lasts, budgets, outcome.get_result()):
                seen.append((last, proposal.token_ids, budget))

    registry = get_registry()
    registry.register_plugin(Spy(), name="spy")
    try:
        prompt = {"prompt_token_ids": tiny.encode("one two three, one two")}
        params = SamplingParams(max_tokens=20)
        expected = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
        config = EchoDecodingConfig(max_draft_len=5, repeat=3, adaptive_draft_len=False)
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
            got = llm.generate(prompt, params)[0]
    finally:
        registry.unregister_plugin("spy")
    assert got.token_ids == expected.token_ids
    assert got.metrics.num_accepted_tokens > 0
    assert seen
    for last, drafts, budget in seen:
        assert drafts == [last] * min(3, budget)


# -- the conformance suite ------------------------------------------------------------------------


class TestEchoConformance(MethodConformance):
    """The installed third-party plugin passes the conformance suite every method must pass."""

    #: Echo only repeats the last token, which any penalty discourages.
    penalties = {}

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _plugins(cls, installed_plugins):
        # Autouse: set up before the suite's class fixtures, which build LLMs with echo.
        return installed_plugins

    def make_config(self, target, tmp_path):
        return _echo_config_class()(max_draft_len=4)


# -- a broken plugin ------------------------------------------------------------------------------


def test_broken_plugin_is_recorded_not_raised(installed_plugins, fresh_registry, tiny):
    """A plugin failing on import is listed in ``registry.broken`` with its distribution and the
    error, and every other method still loads and runs."""
    registry = get_registry()
    broken = {b.name: b for b in registry.broken}
    assert set(broken) == {"broken", "exit_on_import"}
    entry = broken["broken"]
    assert entry.distribution == "specdec-plugin-broken-example"
    assert entry.version == "0.0.1"
    assert entry.error.startswith("ModuleNotFoundError")
    assert "specdec_missing_dependency_xyz" in entry.error
    assert "Traceback" in entry.detail and "specdec_broken_example" in entry.detail
    assert not registry.manager.has_plugin("entrypoint:broken")
    assert {"echo", "ngram", "none", "user_provided"} <= set(registry.method_names())
    assert "broken" not in registry.method_names()
    # The other plugins still work end to end.
    prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
    for method in ("echo", "ngram"):
        with LLM(tiny.model, {"method": method}, tokenizer=tiny.tokenizer) as llm:
            assert llm.method == method
            assert len(llm.generate(prompt, SamplingParams(max_tokens=6))[0].token_ids) == 6


def test_selecting_broken_plugin_raises_plugin_error_with_cause(installed_plugins, fresh_registry, tiny):
    """Selecting the broken method raises PluginError (not "unknown method") carrying the cause."""
    for spec in ({"method": "broken"}, {"decoding_type": "Broken"}):
        with pytest.raises(PluginError, match="failed to load.*ModuleNotFoundError.*specdec_missing_dependency_xyz") as info:
            LLM(tiny.model, spec, tokenizer=tiny.tokenizer)
        assert not isinstance(info.value, UnknownMethodError)


def test_plugin_calling_sys_exit_on_import_is_a_broken_plugin(installed_plugins, fresh_registry, tiny):
    """A pip-installed plugin whose import calls ``sys.exit()`` is recorded like any broken plugin
    instead of ending the process; selecting it is a PluginError naming the method, its package
    and the exit, and the other methods still run."""
    registry = get_registry()
    entry = {b.name: b for b in registry.broken}["exit_on_import"]
    assert (entry.distribution, entry.version) == ("specdec-plugin-broken-example", "0.0.1")
    assert entry.error == "SystemExit: the plugin called sys.exit('specdec_exit_example needs a GPU') while loading"
    assert "specdec_exit_example" in entry.detail
    assert not registry.manager.has_plugin("entrypoint:exit_on_import")
    with pytest.raises(PluginError, match=r"method 'exit_on_import' is installed \(package specdec-plugin-broken-example "
                                          r"0\.0\.1\) but its plugin failed to load: SystemExit"):
        LLM(tiny.model, {"method": "exit_on_import"}, tokenizer=tiny.tokenizer)
    with LLM(tiny.model, {"method": "echo"}, tokenizer=tiny.tokenizer) as llm:
        assert len(llm.generate({"prompt_token_ids": tiny.encode("hello")}, SamplingParams(max_tokens=4))[0].token_ids) == 4


def test_commands_survive_a_plugin_calling_sys_exit(plugins_env):
    """``specdec list-methods`` in a fresh process with the exiting plugin installed succeeds and
    lists it as failed (before, the plugin's exit silently ended every command)."""
    result = subprocess.run(
        [sys.executable, "-m", "specdec.cli.main", "list-methods", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **plugins_env},
    )
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["exit_on_import"]["status"] == "error" and "sys.exit" in rows["exit_on_import"]["error"]
    assert rows["echo"]["status"] == rows["ngram"]["status"] == "ok"


def test_keyboard_interrupt_while_loading_a_plugin_propagates(tmp_path, monkeypatch):
    """Ctrl-C during plugin loading stops the program; it is not recorded as a broken plugin."""
    (tmp_path / "specdec_interrupting_example.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint("interrupting", "specdec_interrupting_example", ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins_module, "_entry_points", lambda: [entry])
    with pytest.raises(KeyboardInterrupt):
        plugins_module.load_plugins()


def test_in_process_plugin_calling_sys_exit_while_registering(tiny):
    """``register_plugin`` turns a ``sys.exit()`` in ``specdec_register_methods`` into a
    PluginError naming the plugin, and leaves nothing registered."""

    class Exiting:
        @hookimpl
        def specdec_register_methods(self, register):
            register("exit_test", InProcessConfig)
            sys.exit(3)

    registry = get_registry()
    with pytest.raises(PluginError, match=r"plugin 'exit-test' failed to register: SystemExit: .*sys\.exit\(3\)"):
        registry.register_plugin(Exiting(), name="exit-test")
    assert not registry.manager.has_plugin("exit-test")
    assert "exit_test" not in registry.method_names()


# -- SPECDEC_PLUGINS --------------------------------------------------------------------------------


def test_specdec_plugins_env_selects_entry_points(installed_plugins, monkeypatch, fresh_registry):
    """``SPECDEC_PLUGINS=echo`` loads only the echo entry point (builtins always stay)."""
    monkeypatch.setenv(PLUGINS_ENV, "echo")
    registry = get_registry()
    assert registry.method_names() == ["echo", "none", "user_provided"]
    assert registry.broken == []
    with pytest.raises(UnknownMethodError, match="installed: echo, none, user_provided"):
        registry.lookup("ngram")


def test_specdec_plugins_env_list_with_spaces(installed_plugins, monkeypatch, fresh_registry):
    """A comma-separated list (spaces tolerated) selects several entry points, broken ones too."""
    monkeypatch.setenv(PLUGINS_ENV, " ngram , broken")
    registry = get_registry()
    assert registry.method_names() == ["ngram", "none", "user_provided"]
    assert [b.name for b in registry.broken] == ["broken"]


def test_specdec_plugins_empty_loads_only_builtins(installed_plugins, monkeypatch, fresh_registry):
    """``SPECDEC_PLUGINS=`` (empty) loads no entry point; the builtins ``none`` and
    ``user_provided`` are still there."""
    monkeypatch.setenv(PLUGINS_ENV, "")
    registry = get_registry()
    assert registry.method_names() == ["none", "user_provided"]
    assert registry.broken == []
    assert registry.lookup("plain").name == "none"
    assert not any(name.startswith("entrypoint:") for name, _ in registry.manager.list_name_plugin())


# -- in-process plugins -------------------------------------------------------------------------------


class InProcessConfig(SpeculativeConfig):
    """Config of the in-process test method."""


class InProcessPlugin:
    """A plugin object (no package, no entry point) drafting the previous token pair again."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def specdec_register_methods(self, register):
        register("in_process_test", InProcessConfig, aliases=("inproc",), summary="test")

    @hookimpl
    def specdec_prepare_draft_tokens(self, config, requests):
        if not isinstance(config, InProcessConfig):
            return None
        self.calls += 1
        return [DraftProposal(r.token_ids[-2:][: r.max_draft_len]) for r in requests]


def test_register_and_unregister_in_process_plugin(tiny):
    """``register_plugin`` adds an in-process plugin and its methods (usable by name at once);
    ``unregister_plugin`` removes both again."""
    registry = get_registry()
    plugin = InProcessPlugin()
    registry.register_plugin(plugin, name="in-process-test")
    try:
        info = registry.lookup("InProc")
        assert info.name == "in_process_test" and info.plugin == "in-process-test"
        assert info.distribution is None
        prompt = {"prompt_token_ids": tiny.encode("hello world, hello")}
        params = SamplingParams(max_tokens=16)
        config = {"decoding_type": "inproc", "max_draft_len": 2, "adaptive_draft_len": False}
        with LLM(tiny.model, config, tokenizer=tiny.tokenizer) as llm:
            assert llm.method == "in_process_test"
            got = llm.generate(prompt, params)[0]
        assert plugin.calls == got.metrics.num_steps > 0
        assert got.metrics.num_accepted_tokens > 0
        expected = LLM(tiny.model, None, tokenizer=tiny.tokenizer).generate(prompt, params)[0]
        assert got.token_ids == expected.token_ids
    finally:
        registry.unregister_plugin("in-process-test")
    assert not registry.manager.has_plugin("in-process-test")
    assert "in_process_test" not in registry.method_names()
    with pytest.raises(UnknownMethodError):
        registry.lookup("inproc")
    with pytest.raises(UnknownMethodError):
        parse_speculative_config({"method": "in_process_test"}, registry)


class _ClashingPlugin:
    def __init__(self, name, aliases=()):
        self.name, self.aliases = name, aliases

    @hookimpl
    def specdec_register_methods(self, register):
        register(self.name, InProcessConfig, aliases=self.aliases)


@pytest.mark.parametrize(
    ("name", "aliases", "taken", "owner"),
    [
        ("None", (), "none", "none"),
        ("my_method", ("Plain",), "plain", "none"),
        ("user-provided", (), "userprovided", "user_provided"),
    ],
)
def test_name_clash_is_a_clear_plugin_error(name, aliases, taken, owner):
    """A plugin declaring a name or alias another method already has fails with a PluginError
    naming the clashing name and its owner; the existing method is untouched."""
    registry = get_registry()
    before = registry.lookup(owner)
    try:
        with pytest.raises(PluginError, match=f"name {taken!r} is already taken by {owner!r}"):
            registry.register_plugin(_ClashingPlugin(name, aliases), name="clash-test")
    finally:
        if registry.manager.has_plugin("clash-test"):
            registry.unregister_plugin("clash-test")
    assert registry.lookup(owner) is before
    assert "my_method" not in registry.method_names()


class _OtherConfig(SpeculativeConfig):
    pass


class _HalfClashingPlugin:
    """Declares a fresh method, then one whose alias is taken."""

    @hookimpl
    def specdec_register_methods(self, register):
        register("half_clash_fresh", InProcessConfig)
        register("half_clash_other", _OtherConfig, aliases=("plain",))


def test_failed_registration_leaves_nothing_behind():
    """A plugin whose method registration fails is not left half-registered: neither its hooks
    nor the methods it declared before the failing one remain."""
    registry = get_registry()
    try:
        with pytest.raises(PluginError, match="'plain' is already taken"):
            registry.register_plugin(_HalfClashingPlugin(), name="half-clash-test")
        assert not registry.manager.has_plugin("half-clash-test")
        assert "half_clash_fresh" not in registry.method_names()
    finally:
        if registry.manager.has_plugin("half-clash-test"):
            registry.unregister_plugin("half-clash-test")


def test_installed_plugin_name_clash(installed_plugins, fresh_registry):
    """An in-process plugin cannot take the installed echo plugin's alias either."""
    registry = get_registry()
    try:
        with pytest.raises(PluginError, match="'repeatlast' is already taken by 'echo'"):
            registry.register_plugin(_ClashingPlugin("echo2", ("Repeat_Last",)), name="clash-test")
    finally:
        if registry.manager.has_plugin("clash-test"):
            registry.unregister_plugin("clash-test")
    assert registry.lookup("repeat_last").name == "echo"


def test_config_class_must_subclass_speculative_config():
    """Registering a config class that is not a SpeculativeConfig is refused with PluginError."""

    class NotAConfig:
        pass

    class Bad:
        @hookimpl
        def specdec_register_methods(self, register):
            register("bad_config_test", NotAConfig)

    registry = get_registry()
    try:
        with pytest.raises(PluginError, match="must subclass specdec.SpeculativeConfig"):
            registry.register_plugin(Bad(), name="bad-config-test")
    finally:
        if registry.manager.has_plugin("bad-config-test"):
            registry.unregister_plugin("bad-config-test")
    assert "bad_config_test" not in registry.method_names()


def test_public_api_exports_what_plugins_use():
    """Everything the example plugin imports is part of specdec's public API (``__all__``)."""
    for name in ("hookimpl", "DraftProposal", "SpeculativeConfig", "Request", "ResourceManager", "VerifyResult"):
        assert name in specdec.__all__
        assert getattr(specdec, name) is not None
