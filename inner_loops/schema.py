"""Settings checked by pydantic: the one path from plain data to a dataclass of settings, for the harness's
config, the driver's (``ESConfig``) and the trainers' (``config_checks.check_fields``). Constraints are pydantic's
own (``Field(gt=0)``, ``Literal``), or a check (``ok``) where they cannot say it; every refusal is a ``SettingError``
made from pydantic's error as data (its ``loc``, ``type`` and ``ctx``), saying what is allowed by the field's
``Field(description=...)``."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any, Callable, Iterable, Literal

from pydantic import AfterValidator, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, SchemaValidator, ValidationError

from metarl.inner_loops.errors import SettingError

# Sizes, counts and budgets become int32 inside JAX (loop bounds, array shapes, step counters); a field with a
# range of its own (the seed's, a trainer's sizes) keeps it, and its refusal says its own range.
INT32_MAX = 2**31 - 1
# pydantic's errors as what is allowed: strict types (no "3" for 3, no 1 for true, no tuple for a list), finite numbers
_ALLOWED = {"int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "true or false",
            "dict_type": "a mapping", "list_type": "a list", "tuple_type": "a list such as [64, 64]",
            "finite_number": "a finite number"}
_STRICT = {"strict": True, "allow_inf_nan": False, "extra_fields_behavior": "forbid"}


def ok(check: Callable[[Any], Any]) -> AfterValidator:
    """``Annotated`` metadata refusing a value ``check`` refuses, for what pydantic's constraints cannot say."""
    def checked(value):
        if not check(value):
            raise ValueError("refused")   # the field's description says what is allowed
        return value
    return AfterValidator(checked)


@dataclasses.dataclass(frozen=True)
class Problem:
    """``Annotated`` metadata: how a refusal of the field's value reads, ``text.format(value)`` (``"unknown {!r}"``),
    where it says more than the value; pydantic passes it by, ``validate`` reads it."""
    text: str = "{!r}"


def _int32(value):
    if type(value) is int and not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise PydanticCustomError("int32", "beyond int32")
    return value


def _adapted(node, in_union: bool = False):
    """pydantic's schema, ``_STRICT`` but taking each dataclass as a mapping (strict alone takes only
    instances), a Union's error that of its last type (the last one tried), ints within int32 (pydantic's
    ``lt``/``ge`` where a field sets no ``le``/``ge`` of its own, or a check after a Union, whose one error would hide
    its int's)."""
    if isinstance(node, dict) and node.get("type") == "dataclass":
        node.update(strict=False, config=_STRICT)
    if isinstance(node, dict) and node.get("type") == "union":
        node["custom_error_type"] = {"str": "string"}.get(last := node["choices"][-1]["type"], last) + "_type"
        _adapted(node["choices"], in_union=True)
        union = dict(node)
        node.clear()
        node.update(type="function-after", function={"type": "no-info", "function": _int32}, schema=union)
        return node
    if isinstance(node, dict) and node.get("type") == "int" and not in_union:
        if "le" not in node:
            node.setdefault("lt", INT32_MAX + 1)
        node.setdefault("ge", -INT32_MAX - 1)
    for child in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
        _adapted(child, in_union)
    return node


_adapter = functools.cache(TypeAdapter)
_validator = functools.cache(lambda tp: SchemaValidator(_adapted(TypeAdapter(tp).core_schema), _STRICT))


def to_dict(value):
    """A dataclass of settings as nested plain dicts and lists, keyed as in the config files (a field's alias)."""
    return _adapter(type(value)).dump_python(value, by_alias=True, warnings=False)


def suggest(name: str, names: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the names closest to a misspelt ``name`` (difflib), else nothing."""
    close = " or ".join(difflib.get_close_matches(name, list(names), n=3))
    return close and f" (did you mean {close}?)"


def _keys(tp, loc: tuple) -> list[str]:   # of the dataclass at ``loc`` in dataclass ``tp``
    return list(functools.reduce(dict.get, loc, to_dict(tp())))


def _field_type(tp, loc: tuple):
    """The annotation of the field at ``loc`` in dataclass ``tp`` (as far as ``loc`` names fields)."""
    for key in loc:
        if not dataclasses.is_dataclass(tp):
            break
        names = {f.metadata.get("alias", f.name): f.name for f in dataclasses.fields(tp)}
        tp = typing.get_type_hints(tp, include_extras=True)[names[key]]
    return tp


def _described(tp) -> str | None:
    """What an annotation allows: its ``Field``'s description, else its ``Literal``'s values."""
    for meta in getattr(tp, "__metadata__", ()):
        if isinstance(meta, FieldInfo) and meta.description:
            return meta.description
    if typing.get_origin(tp) is Literal:
        return ", ".join(map(str, typing.get_args(tp)))
    return next(filter(None, map(_described, typing.get_args(tp))), None)


def validate(tp, value):
    """``value`` as type ``tp`` (pydantic), else a ``SettingError`` naming the field by its keys joined with dots."""
    try:
        return _validator(tp).validate_python(value)
    except ValidationError as err:
        error = err.errors()[0]
    field, loc, kind, value = ".".join(map(str, error["loc"])), error["loc"], error["type"], error["input"]
    if kind in ("unexpected_keyword_argument", "invalid_key"):
        keys = _keys(tp, loc[:-1])
        raise SettingError(field, "unknown setting", ", ".join(keys) + suggest(str(loc[-1]), keys))
    if kind == "dataclass_type":
        raise SettingError(field, repr(value), "a mapping of " + ", ".join(_keys(tp, loc)))
    if kind == "int32" or INT32_MAX in (error.get("ctx", {}).get("lt", 0) - 1, -1 - error.get("ctx", {}).get("ge", 0)):
        raise SettingError(field, str(value), f"an integer of at most {INT32_MAX}")
    if kind in _ALLOWED:
        raise SettingError(field, repr(value), _ALLOWED[kind])
    annotation = _field_type(tp, loc)
    problem = next((meta.text for meta in getattr(annotation, "__metadata__", ()) if isinstance(meta, Problem)), None)
    shown = "empty" if isinstance(value, str) and not value.strip() else repr(value)   # as given
    raise SettingError(field, problem.format(value) if problem else shown, _described(annotation) or error["msg"])
