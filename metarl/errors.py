"""Errors in the config's terms. Only the commands make them an ``error:`` line and exit code 2."""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Iterable

from metarl.inner_loops.errors import SettingError
from metarl.inner_loops.schema import suggest


class ConfigError(ValueError):
    """A bad setting; the message is one line naming the field."""


class LayerError(ConfigError, SettingError):
    """inner_loops' or outer_loops' ``SettingError`` with its field named by the config's path (``layer_errors``)."""


# inner_loops and outer_loops name their own arguments (SettingError("popsize", ...)); their config paths,
# by what the harness hands a layer: {argument: path, "*": prefix of the others}.
LAYER_PATHS = {"es": {"*": "es."}, "component": {"*": "component."}, "inner": {"*": "inner."},
               "kind": {"_target_": "component.kind"}, "evolution": {"num_seeds": "fitness.num_seeds", "*": "es."}}


def layer_path(where: str | Callable[[str], str], key: str) -> str:
    """A lower layer's argument ``key`` as the config names it: by ``LAYER_PATHS[where]``, or ``where(key)``."""
    if callable(where):
        return where(key)
    paths = LAYER_PATHS[where]
    return paths.get(key) or (paths.get("*", "") + key).rstrip(".") or "config"


@contextlib.contextmanager
def layer_errors(where: str | Callable[[str], str]):
    """inner_loops' and outer_loops' ``SettingError`` (or a user class's ``ValueError``, ``SettingError.of``) as a
    ``ConfigError`` naming the config's path for its field; one naming no field names the part of the config."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as err:
        setting = SettingError.of(err)
        raise LayerError(layer_path(where, setting.field), setting.problem, setting.allowed) from None


def one_line(err: Exception, keys: Iterable[str] = ()) -> ConfigError:
    """Hydra's or OmegaConf's error as one line naming the key, override or group; a misspelt name's closest ones."""
    first = (str(err).strip() or type(err).__name__).splitlines()[0].rstrip(".")
    named = re.search(r"(?:override|argument) '?\+*([^'= ]+)=", first) or re.search(r"override '\+*([^']+)'", first)
    key = (getattr(err.__cause__, "full_key", None) or getattr(err, "full_key", None)
           or (named and named[1]) or getattr(err, "override", "").split("=", 1)[0].lstrip("+~") or None)
    if missing := re.search(r"Could not find '(.+)/([^/']+)'", first):  # a group's option: Hydra lists the others
        listed = str(err).split("Available options", 1)[-1].split("Config search path", 1)[0]
        options = [line.strip() for line in listed.splitlines() if line.startswith("\t")]
        key, own = missing[1], " (or --config-dir DIR for your own)" * (missing[1] == "experiment")
        allowed = ", ".join(options) + own + suggest(missing[2], options)
    elif "Additional config directory" in first:
        key, allowed = "--config-dir", "a folder that holds your experiment/NAME.yaml files"
    elif "Could not override" in first or "not in struct" in first:
        allowed = "a key of the config (--help lists them)" + suggest(named[1] if named else str(key), keys)
    elif "Ambiguous value" in first:
        first = "lists several values"
        allowed = "one value, a list written [a,b], or -m to sweep over the values (one run each)"
    elif key and str(key).startswith("hydra"):
        allowed = "a key of Hydra's config (--cfg hydra shows them)"
    else:
        allowed = ("KEY=VALUE with VALUE a number, a word, true/false, null or a list such as [64,64] (quoted in "
                   "the shell)")
    return ConfigError(f"{key or 'overrides'}: {first}; allowed: {allowed}")
