"""Processor ``attributes``: add static attributes (``cluster: prod``), rename or drop attributes.

Records stay typed: the edits travel with the Batch and every exporter applies them when it renders a
record's attributes, in the order the pipeline's processors added them::

    attributes/cluster:
      actions:
        - {action: insert, key: cluster, value: "${env:CLUSTER:-dev}"}
        - {action: rename, key: comm, new_key: command, kinds: [process]}
        - {action: drop, key: exe}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from wattpipe.pipeline.batch import Batch, LabelAction
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records import RecordKind

__all__ = ["Action", "AttributesConfig", "AttributesProcessor", "factory"]


class Action(ComponentConfig):
    action: Literal["insert", "upsert", "rename", "drop"]
    key: str = Field(min_length=1)
    value: str | None = None
    new_key: str | None = None
    kinds: list[RecordKind] = []

    @field_validator("value", mode="before")
    @classmethod
    def _scalar_as_text(cls, value: object) -> object:
        # YAML reads `value: 42`, `value: true` and an unquoted ${env:…} holding digits as numbers or
        # booleans; an attribute is text, so take them as the text they were written as.
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return str(value)
        return value

    @model_validator(mode="after")
    def _arguments(self) -> Action:
        if self.action in ("insert", "upsert") and self.value is None:
            raise ValueError(f"{self.action} of '{self.key}' needs a value")
        if self.action == "rename" and not self.new_key:
            raise ValueError(f"rename of '{self.key}' needs new_key")
        if self.action in ("drop", "rename") and self.value is not None:
            raise ValueError(f"{self.action} takes no value")
        if self.action != "rename" and self.new_key is not None:
            raise ValueError(f"{self.action} takes no new_key (only rename does)")
        return self


class AttributesConfig(ComponentConfig):
    actions: list[Action] = Field(min_length=1)


class AttributesProcessor:
    needs: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()

    def __init__(self, config: AttributesConfig, ctx: CreateContext | None = None) -> None:
        # ctx: unused; every component class takes (config, ctx), so the class is its own factory.
        self.actions = tuple(
            LabelAction(
                op=a.action,
                key=a.key,
                value=a.value,
                new_key=a.new_key,
                kinds=frozenset(a.kinds),
            )
            for a in config.actions
        )

    def process(self, batch: Batch) -> Batch:
        return Batch.replace(batch, label_actions=batch.label_actions + self.actions)


factory = Factory.of(
    AttributesProcessor,
    type="attributes",
    kind="processor",
    config_model=AttributesConfig,
    description="Adds static attributes (cluster, region), renames or drops attributes on exported series.",
    stability="beta",
)
