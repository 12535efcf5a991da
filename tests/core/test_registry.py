"""The one registry mechanism: lazy string targets, decorators, helpful errors."""

from __future__ import annotations

import sys

import pytest

from core.errors import ConfigError
from core.registry import Registry, import_target


def test_lazy_target_is_imported_on_first_use():
    reg = Registry("thing")
    sys.modules.pop("json.tool", None)
    reg.register("tool", "json.tool:main")
    assert not reg.is_loaded("tool") and "json.tool" not in sys.modules
    fn = reg.get("tool")
    assert callable(fn) and reg.is_loaded("tool") and "json.tool" in sys.modules


def test_decorator_build_and_meta():
    reg = Registry("model")

    @reg.register("adder", paper="none")
    def adder(a, b=1):
        return a + b

    assert reg.build("adder", 2, b=3) == 5
    assert reg.meta("adder") == {"paper": "none"}
    assert "adder" in reg and reg.names() == ["adder"] and len(reg) == 1


def test_unknown_name_suggests_close_matches():
    reg = Registry("model")
    reg.register("transnormal", "json:dumps")
    with pytest.raises(ConfigError, match="unknown model 'transnormel'; did you mean transnormal"):
        reg.get("transnormel")


def test_duplicate_registration_is_an_error():
    reg = Registry("model")
    reg.register("a", "json:dumps")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", "json:loads")
    reg.register("a", "json:loads", overwrite=True)
    assert reg.get("a").__name__ == "loads"


def test_bad_targets():
    with pytest.raises(ConfigError, match="has no attribute"):
        import_target("json:nope")
    with pytest.raises(ConfigError, match="bad import target"):
        import_target(":dumps")
    with pytest.raises(ConfigError, match="no module named 'no_such_module_xyz'"):
        import_target("no_such_module_xyz:thing")
    assert import_target("json").__name__ == "json"  # a bare module path is the module


def test_missing_dependency_of_a_target_keeps_its_traceback(tmp_path, monkeypatch):
    """A module that imports a missing package whose name is a text prefix of the module's own name is a real
    bug in the module (ModuleNotFoundError propagates), not an unknown import target."""
    (tmp_path / "jsonish_mod.py").write_text("import jsonish  # noqa: F401\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="jsonish"):
        import_target("jsonish_mod:x")


def test_a_misspelt_config_module_of_a_method_is_an_error(monkeypatch):
    """Was: core.config skipped a listed config module that did not import (the method's schemas vanished)."""
    from core import registry
    from core.config import compose
    from core.errors import ConfigError

    registry.load_plugins()  # the real registrations first, so the copies below hold them
    monkeypatch.setattr(registry.METHODS, "_entries", dict(registry.METHODS._entries))
    monkeypatch.setattr(registry.METHODS, "_meta", dict(registry.METHODS._meta))
    registry.register_method("ghost", folder="x", description="x", task="x.task",
                             config="worldmodels.bc.configuration_bcc")
    with pytest.raises(ConfigError, match="method 'ghost' declares config module 'worldmodels.bc.configuration_bcc'"):
        compose(["experiment=bc"])


def test_methods_register_themselves_through_entry_points():
    from core.registry import INFER, METHODS, MODELS, load_plugins, method_specs

    names = load_plugins()
    assert {"bc", "sola", "transnormal", "lacwm"} <= set(names)
    assert {"bc", "sola", "transnormal", "lacwm"} <= set(METHODS.names())
    assert "eacwm" not in METHODS and "eacwm" in dict(METHODS.meta("lacwm")["spec"].arms)  # an arm of lacwm
    assert {"eacwm", "lacwm"} <= set(MODELS.names())  # its checkpoints (method: eacwm) still load
    assert {"normals", "depth360"} <= set(INFER.names())
    assert MODELS.get("sola").__name__ == "SoLAModel"
    assert all(s.config for s in method_specs()), "every method declares its config module"


def test_register_method_refuses_a_name_another_method_owns(monkeypatch):
    """Was: a second method silently took a registered name (its task, model and policy replaced the first's)."""
    from core import registry

    for reg in (registry.METHODS, registry.INFER):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
        monkeypatch.setattr(reg, "_meta", dict(reg._meta))
    echo = registry.InferSpec("_echo", "json:dumps", "echo")
    first = registry.register_method("_taken", folder="pkg/one", description="x", task="pkg.one.task", infer=[echo])
    # the same method again (its register module imported twice) is fine
    assert registry.register_method("_taken", folder="pkg/one", description="x", task="pkg.one.task",
                                    infer=[echo]) == first
    with pytest.raises(ConfigError) as e:
        registry.register_method("_taken", folder="pkg/two", description="y", task="pkg.two.task")
    assert str(e.value) == ("method '_taken' is registered twice: by pkg/one (task pkg.one.task) and by pkg/two "
                            "(task pkg.two.task); rename one of them")
    with pytest.raises(ConfigError, match=r"infer command '_echo' of method '_other' \(pkg/two .*\) is already "
                                          r"registered by method '_taken' \(pkg/one \(task pkg.one.task\)\)"):
        registry.register_method("_other", folder="pkg/two", description="y", task="pkg.two.task", infer=[echo])
    assert registry.METHODS._meta["_taken"]["spec"] == first and "_other" not in registry.METHODS


def test_every_registered_policy_factory_has_the_one_signature():
    """``factory(env, checkpoint=None, **options)``: by name (``checkpoint=None``) or from a checkpoint
    (``core.checkpoint.load_policy``) — no second convention told apart by a parameter's name."""
    import inspect

    from core.registry import POLICIES, load_plugins

    load_plugins()
    methods = [n for n in POLICIES.names() if not POLICIES.get(n).__module__.startswith("tests")]
    assert {"automot", "noreason", "bc", "lacwm", "eacwm"} <= set(methods)
    for name in methods:
        params = inspect.signature(POLICIES.get(name)).parameters
        assert list(params)[0] == "env", name
        assert "checkpoint" in params and params["checkpoint"].default is None, name
