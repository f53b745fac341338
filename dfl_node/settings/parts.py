"""Settings made of parts, named flat: the model behind :class:`~dfl_node.settings.node.NodeConfig` and
:class:`~dfl_node.settings.experiment.ExperimentConfig`.

Inside the program a node's settings are nested by the part that reads them (``config.network.grpc_port``,
``config.membership.heartbeat``), so that each part of a node is handed its own settings and nothing else. An
operator names every setting flat, as before: a flag ``--grpc-port``, a variable ``DFL_GRPC_PORT``, a config
file's ``grpc_port:``. A :class:`Composite` takes both: given flat keys, it routes each to the part that declares
it (:meth:`Composite.route`) before validating, and it lists, dumps and names its settings flat
(:meth:`Composite.flat_fields`, :meth:`Composite.flat`, :meth:`Composite.flat_key`). Flat keys are unique across
a composite's parts, and no part is named like a key (a test checks both), so the two spellings never clash.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import cache
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo


class Composite(BaseModel):
    """Settings whose fields named in :attr:`parts` are models of their own (one per part of the program);
    every other field is a setting of the composite itself."""

    model_config = ConfigDict(extra="forbid")
    parts: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _route(cls, data: Any) -> Any:
        return cls.route(data) if isinstance(data, Mapping) else data

    @classmethod
    def route(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """``data`` with each flat key moved into its part. A part may also be given whole (a model, or a mapping
        of its keys); flat keys of it given beside override it. Every part is there, if empty, so that a required
        setting left out is reported by its own key. A key that is nobody's stays where it was, for validation to
        refuse by its name."""
        owner = {key: part for key, (part, _) in cls.flat_fields().items() if part is not None}
        routed: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for key, value in data.items():
            if key in cls.parts:
                given = ({name: getattr(value, name) for name in value.model_fields_set}
                         if isinstance(value, BaseModel) else value)
                if not isinstance(given, Mapping):
                    routed[key] = value  # for validation to refuse
                    continue
                parts[key] = {**dict(given), **parts.get(key, {})}
            elif key in owner:
                parts.setdefault(owner[key], {})[key] = value
            else:
                routed[key] = value
        return {**routed, **{part: parts.get(part, {}) for part in cls.parts}}

    @classmethod
    def flat_fields(cls) -> dict[str, tuple[str | None, FieldInfo]]:
        """Every setting by its flat key: the part that holds it (None: the composite itself) and its field."""
        return _flat_fields(cls)

    @classmethod
    def flat_key(cls, loc: tuple[int | str, ...]) -> tuple[str, tuple[int | str, ...]]:
        """A validation error's location as the flat key it is about ("" for the composite or a part as a whole),
        and the rest of the location (the item of a list)."""
        if loc and loc[0] in cls.parts:
            loc = loc[1:]
        return (str(loc[0]), loc[1:]) if loc else ("", ())

    def flat(self, keys: Collection[str] | None = None, **dump: Any) -> dict[str, Any]:
        """The settings as flat keys, in :meth:`flat_fields`' order (only ``keys``, where given), dumped as
        ``model_dump``'s other keyword arguments say (``mode="json"``, ``exclude_none``)."""
        values: dict[str, Any] = {}
        for key, value in self.model_dump(**dump).items():
            if key in self.parts:
                values.update(value)
            else:
                values[key] = value
        return {key: values[key] for key in self.flat_fields() if key in values and (keys is None or key in keys)}

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update``'s settings, named flat (or a part whole), each in its part. Like pydantic's, the
        values are not validated; unlike it, a key that is no setting is refused."""
        if not update:
            return super().model_copy(deep=deep)
        fields = self.flat_fields()
        unknown = sorted(key for key in update if key not in fields and key not in self.parts)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no setting {', '.join(unknown)}")
        top = {key: value for key, value in update.items() if key in self.parts or fields[key][0] is None}
        parts: dict[str, dict[str, Any]] = {}
        for key, value in update.items():
            if key not in top:
                parts.setdefault(str(fields[key][0]), {})[key] = value
        copied = {part: getattr(self, part).model_copy(update=values, deep=deep) for part, values in parts.items()}
        return super().model_copy(update={**top, **copied}, deep=deep)

    def unusable_here(self) -> dict[str, str]:
        """Settings valid anywhere that this machine cannot honour, by flat key (none by default)."""
        return {}


@cache
def _flat_fields(cls: type[Composite]) -> dict[str, tuple[str | None, FieldInfo]]:
    found: dict[str, tuple[str | None, FieldInfo]] = {}
    for name, field in cls.model_fields.items():
        if name not in cls.parts:
            found[name] = (None, field)
            continue
        part = field.annotation
        assert isinstance(part, type) and issubclass(part, BaseModel), f"{cls.__name__}.{name} is not a model"
        for key, inner in part.model_fields.items():
            assert key not in found, f"{cls.__name__}: setting {key!r} is in two parts"
            found[key] = (name, inner)
    return found
