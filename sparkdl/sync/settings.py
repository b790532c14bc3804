"""What every extension point is built from: one fit's settings and facts, read-only.

Each mode, merge, codec and outer optimizer is built once on the driver by the same
call, ``cls.resolve(settings)``, given a :class:`FitSettings`: the user's settings by
name, as :class:`~sparkdl.config.TrainConfig` holds them (``settings.delta_scale``;
``lr_scaling`` already resolved for the model's optimizer), and the facts the fit
resolved first (:attr:`~FitSettings.num_workers`, :attr:`~FitSettings.synchronous`,
:attr:`~FitSettings.whole_epoch`). An extension point reads what it needs and nothing
else, so a new one adds no argument to any call and no branch to the plan.

Example:
    >>> settings = FitSettings({"elastic_alpha": None}, num_workers=4)
    >>> settings.elastic_alpha, settings.num_workers, settings.synchronous
    (None, 4, False)
    >>> settings.epochs
    Traceback (most recent call last):
    ...
    AttributeError: No setting 'epochs' in these settings (they hold ['elastic_alpha']).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["FitSettings"]


@dataclass(frozen=True, eq=False)
class FitSettings:
    """One fit's settings by name, and the facts the fit resolved before its parts.

    Args:
        values: The user's settings by name (``TrainConfig.to_dict()``, with
            ``lr_scaling`` resolved for the model's optimizer); read as attributes.
        num_workers: Workers of the fit.
        synchronous: Pushes are merged in rounds (the mode's ``barrier``).
        whole_epoch: A push spans a whole epoch of a worker (at an even split).
    """

    values: Mapping[str, Any] = field(default_factory=dict)
    num_workers: int = 1
    synchronous: bool = False
    whole_epoch: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values")
        if name.startswith("__") or values is None or name not in values:
            held = sorted(values) if values is not None else []
            raise AttributeError(f"No setting {name!r} in these settings (they hold {held}).")
        return values[name]
