"""One registry per extension point: named rows in the order they were registered. The calibration
methods (trtq.calib.methods) and compare's tasks (trtq.compare.tasks) are the two; everything that
names a method or a task reads its table, so a new one is one function and one row."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from trtq.errors import ConfigError

Row = TypeVar("Row")


class Registry(Generic[Row]):
    """Rows with a ``name``, found by it; ``key`` is the config key the names are checked for, and
    ``also`` names that key takes besides the rows (``auto``)."""

    def __init__(self, key: str, also: tuple[str, ...] = ()):
        self.key, self.also = key, also
        self._rows: dict[str, Row] = {}

    def register(self, row: Row) -> Row:
        """Add ``row`` (its name replaces a row of the same name, in place)."""
        self._rows[row.name] = row  # type: ignore[attr-defined]
        return row

    def unregister(self, name: str) -> None:
        """Remove a row (tests that register one of their own)."""
        self._rows.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._rows)

    def rows(self) -> tuple[Row, ...]:
        return tuple(self._rows.values())

    def find(self, name: Any) -> Row | None:
        return self._rows.get(name) if isinstance(name, str) else None

    def get(self, name: Any) -> Row:
        """The row ``name``; for another value a ConfigError naming the key and the choices."""
        row = self.find(name)
        if row is None:
            raise ConfigError(
                f"config key '{self.key}' must be one of "
                + ", ".join(repr(n) for n in (*self.also, *self._rows))
                + f", got {name!r}"
            )
        return row

    def __contains__(self, name: Any) -> bool:
        return self.find(name) is not None
