"""Names users pass (``mode=``, ``merge=``) mapped to the classes that implement them.

Example:
    >>> things = Registry("thing")
    >>> @things.register
    ... class Spoon:
    ...     name = "spoon"
    >>> things.get("spoon").__name__, tuple(things)
    ('Spoon', ('spoon',))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from sparkdl.errors import ConfigError

__all__ = ["Registry"]

_C = TypeVar("_C", bound=type[Any])


class Registry(Generic[_C]):
    """Classes by their ``name`` attribute, for one setting.

    Args:
        setting: The setting the names are given as (for error messages).
    """

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self._classes: dict[str, _C] = {}

    def register(self, cls: _C) -> _C:
        """Class decorator: makes ``cls`` available as ``<setting>=cls.name``."""
        name = getattr(cls, "name", "")
        if not name:
            raise ValueError(f"{cls.__name__} needs a class attribute 'name'.")
        self._classes[name] = cls
        return cls

    def unregister(self, name: str) -> None:
        """Removes ``name`` (a class registered for a test, say)."""
        self._classes.pop(name, None)

    def get(self, name: str) -> _C:
        """The class registered as ``name``.

        Raises:
            ConfigError: No class has that name.
        """
        try:
            return self._classes[name]
        except (KeyError, TypeError):
            raise ConfigError(
                f"Expected {self.setting} to be one of {tuple(self._classes)}. "
                f"Received: {self.setting}={name!r}"
            ) from None

    def items(self) -> list[tuple[str, _C]]:
        """``(name, class)`` pairs in registration order."""
        return list(self._classes.items())

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)
