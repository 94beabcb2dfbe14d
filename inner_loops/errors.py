"""A bad setting as data: which argument, what is wrong with it and what is allowed. Each layer names
its own arguments; the layer above re-names the field (``at``) by its own path, never by reading the text."""
from __future__ import annotations

from typing import Optional


class SettingError(ValueError):
    """``field: problem; allowed: allowed`` (without ``; allowed:`` when ``allowed`` is None), one line."""

    def __init__(self, field: str, problem: str, allowed: Optional[str] = None):
        self.field, self.problem, self.allowed = field, problem, allowed
        super().__init__(f"{field}: {problem}" + ("" if allowed is None else f"; allowed: {allowed}"))

    def at(self, field: str) -> "SettingError":
        """The same error naming its setting ``field`` (as the caller's config names it)."""
        return type(self)(field, self.problem, self.allowed)

    @classmethod
    def of(cls, err: ValueError) -> "SettingError":
        """``err`` as a SettingError: itself, or the first line of a plain ``ValueError`` of a class of the user's
        own, which may name its argument first ("steps: 0; allowed: >= 1", docs/extending.md); field "" where it
        names none. The one place an error's text is read, and never an error of metarl's own."""
        if isinstance(err, cls):
            return err
        line = (str(err).strip() or type(err).__name__).splitlines()[0]
        key, colon, rest = line.partition(":")
        if colon and " " not in key.strip():
            return cls(key.strip(), rest.strip())
        return cls("", line)
