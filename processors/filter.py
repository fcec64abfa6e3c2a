"""Processor ``filter``: keep or drop records by kind and by attribute regex.

The usual use is cardinality control: drop per-process series and keep pods::

    filter/no-pids:
      exclude: {kinds: [process]}

A record is kept when it matches ``include`` (if given) and does not match ``exclude`` (if given). A
rule matches a record when its kind is in ``kinds`` (if given) and every regex in ``attributes``
fully matches that attribute (an absent attribute never matches). Attributes are read as exporters
would render them, so an earlier ``attributes`` processor's renames apply.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, get_args

from pydantic import field_validator

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.records import Record, RecordKind, record_kind

__all__ = ["FilterConfig", "FilterProcessor", "MatchRule", "factory"]

KINDS = frozenset(get_args(RecordKind))


class MatchRule(ComponentConfig):
    kinds: list[str] = []
    attributes: dict[str, str] = {}

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - KINDS)
        if unknown:
            raise ValueError(f"unknown kind(s) {', '.join(unknown)}; kinds are {', '.join(sorted(KINDS))}")
        return value

    @field_validator("attributes", mode="before")
    @classmethod
    def _numbers_as_text(cls, value: object) -> object:
        # `pid: 100` or `device_index: 0` reads as an int from YAML; as a pattern it means the same text.
        if isinstance(value, dict):
            return {
                k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in value.items()
            }
        return value

    @field_validator("attributes")
    @classmethod
    def _valid_regex(cls, value: dict[str, str]) -> dict[str, str]:
        for key, pattern in value.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"attributes.{key}: '{pattern}' is not a valid regular expression: {exc}") from None
        return value


class FilterConfig(ComponentConfig):
    include: MatchRule | None = None
    exclude: MatchRule | None = None


class _Rule:
    def __init__(self, rule: MatchRule) -> None:
        self.kinds = frozenset(rule.kinds)
        self.attributes = [(k, re.compile(v)) for k, v in rule.attributes.items()]

    def matches(self, kind: str, labels: dict[str, str]) -> bool:
        if self.kinds and kind not in self.kinds:
            return False
        for key, pattern in self.attributes:
            value = labels.get(key)
            if value is None or not pattern.fullmatch(value):
                return False
        return True


class FilterProcessor:
    needs: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()

    def __init__(self, config: FilterConfig, ctx: CreateContext | None = None) -> None:
        # ctx: unused; every component class takes (config, ctx), so the class is its own factory.
        self.include = _Rule(config.include) if config.include is not None else None
        self.exclude = _Rule(config.exclude) if config.exclude is not None else None

    def keep(self, batch: Batch, record: Record) -> bool:
        kind = record_kind(record)
        labels = (
            batch.labels(record)
            if (self.include and self.include.attributes) or (self.exclude and self.exclude.attributes)
            else {}
        )
        if self.include is not None and not self.include.matches(kind, labels):
            return False
        return self.exclude is None or not self.exclude.matches(kind, labels)

    def process(self, batch: Batch) -> Batch:
        changes: dict[str, Any] = {}
        for name in Batch.FIELDS:
            records: tuple[Record, ...] = getattr(batch, name)
            if not records:
                continue
            kept = tuple(r for r in records if self.keep(batch, r))
            if len(kept) != len(records):
                changes[name] = kept
        if not changes:
            return batch
        # A filter thins a field; it does not make it "provided" where nothing filled it, so `present`
        # is kept as it was (Batch.replace would mark every changed field present).
        return dataclasses.replace(batch, **changes)


factory = Factory.of(
    FilterProcessor,
    type="filter",
    kind="processor",
    config_model=FilterConfig,
    description="Keeps or drops records by kind (device, process, container, pod, instance, vm) and attribute regex.",
    stability="beta",
)
