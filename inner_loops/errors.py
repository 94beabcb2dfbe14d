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
