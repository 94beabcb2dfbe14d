"""Parts named by ``_target_``: a dotted path to a class, built by ``hydra.utils.instantiate`` with
its constructor arguments from the config. Every problem is a one-line ``ValueError`` naming the
argument (``_target_``, or one of the class's), as the caller's ``field`` and ``arg_field`` say.

    component: {kind: value_loss, _target_: my_pkg.losses.HuberValueLoss, delta: 1.0}
    inner:     {_target_: my_pkg.trainer.MyConfig, total_timesteps: 20000}
    es:        {_target_: my_pkg.strategies.MyES, args: {momentum: 0.5}}

The module must be importable where the run starts (installed, or on ``sys.path``: ``python -m``
puts the current directory there, ``PYTHONPATH`` adds others).
"""
from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable

from metarl.inner_loops.errors import SettingError

TARGET = "_target_"


def locate(path: Any, field: str = TARGET) -> Any:
    """The object at the dotted ``path``; ``field`` names the setting in the error."""
    allowed = "the dotted path of an importable class, such as my_pkg.module.MyClass"
    if not isinstance(path, str) or "." not in path.strip("."):
        raise SettingError(field, repr(path), allowed)
    parts = path.split(".")
    module, error = None, None
    for i in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as err:
            error = error or err
            continue
        except Exception as err:  # the module exists but fails on import
            raise SettingError(field, f"{path!r} cannot be imported ({type(err).__name__}: "
                               f"{_first_line(err)})", allowed) from None
        obj = module
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            raise SettingError(field, f"{path!r} cannot be imported ({'.'.join(parts[:i])} has no "
                               f"{'.'.join(parts[i:])})", allowed) from None
        return obj
    raise SettingError(field, f"{path!r} cannot be imported (ModuleNotFoundError: {_first_line(error)})",
                       allowed)


def locate_instance(path: Any, field: str, cls: type, allowed: str) -> Any:
    """The ``cls`` at the dotted ``path`` (a registry entry of the user's own); ``field`` names the setting in the
    error and ``allowed`` what it may be."""
    found = locate(path, field)
    if not isinstance(found, cls):
        raise SettingError(field, f"{path} is a {type(found).__name__}, not a {cls.__name__}", allowed)
    return found


def locate_class(path: Any, field: str, base: type, allowed: str) -> type:
    """The subclass of ``base`` at the dotted ``path`` (a class of the user's own, which the caller builds);
    ``field`` names the setting in the error and ``allowed`` what it may be."""
    found = locate(path, field)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise SettingError(field, f"{path} is a {type(found).__name__}, not a {base.__name__} subclass", allowed)
    return found


def constructor_arguments(cls: Any) -> tuple[list[str], bool]:
    """``(argument names, takes any keyword)`` of a class's constructor. Through ``**kwargs`` the
    base classes' arguments count too, since that is where a subclass passes them on; only a chain
    that ends in ``**kwargs`` (or cannot be read) takes any keyword."""
    names: list[str] = []
    for klass in getattr(cls, "__mro__", (cls,)):
        init = klass.__init__ if isinstance(klass, type) else klass
        if init is object.__init__:
            return names, False
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            return names, True
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name != "self" and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names, False
    return names, True


def instantiate(path: str, args: dict, field: str = TARGET, arg_field: str | Callable[[str], str] = "",
                injected: dict | None = None, reserved: tuple = ()) -> Any:
    """Build the class at ``path`` with the config's ``args`` plus the objects metarl hands it
    (``injected``, e.g. the parameter template). Errors name ``field`` for the class and an argument by
    its name, after ``arg_field``: a prefix or ``argument -> name``."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    name_of = arg_field if callable(arg_field) else (lambda key: f"{arg_field}{key}")
    cls = locate(path, field)
    if not callable(cls):
        raise SettingError(field, f"{path!r} is not a class", "the dotted path of a class")
    names, any_kwargs = constructor_arguments(cls)
    injected = dict(injected or {})
    for key in args:
        if key in reserved or key in injected:
            raise SettingError(name_of(key), "set by metarl, not by the config",
                               ", ".join(n for n in names if n not in injected and n not in reserved) or "none")
        if not any_kwargs and key not in names:
            allowed = [n for n in names if n not in injected and n not in reserved]
            close = difflib.get_close_matches(key, allowed, n=1)
            raise SettingError(name_of(key), f"not an argument of {path}",
                               (", ".join(allowed) or "none") + (f" (did you mean {close[0]}?)" if close else ""))
    # Hydra builds the class with the config's arguments (a nested `_target_` among them is built
    # too); lists are handed over as tuples afterwards, since Hydra would turn them back into lists and
    # static config fields must be hashable, and metarl's own objects (templates, optimizers) go in
    # directly rather than through OmegaConf.
    lists = {k: tuple(v) for k, v in args.items() if isinstance(v, list)}
    rest = {k: v for k, v in args.items() if k not in lists}
    try:
        factory = hydra_instantiate({TARGET: path, "_partial_": True, **rest}, _convert_="all")
        return factory(**lists, **injected)
    except InstantiationException as err:
        cause = err.__cause__ or err
    except (ValueError, TypeError, AssertionError) as err:
        cause = err
    if isinstance(cause, AssertionError):
        raise cause
    setting = SettingError.of(cause) if isinstance(cause, ValueError) else None
    if setting is not None and setting.field:   # the class names its own argument
        raise setting.at(name_of(setting.field)) from None
    raise SettingError(field, f"{path} failed to build ({type(cause).__name__}: {_first_line(cause)})") from None


def _first_line(err: BaseException | None) -> str:
    text = str(err).strip() if err is not None else ""
    return text.splitlines()[0] if text else type(err).__name__
