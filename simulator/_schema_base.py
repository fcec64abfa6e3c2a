"""Pieces of the scenario schema shared by the main models and the fault models."""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from wattpipe.simulator.hardware import mig_profile_slices

__all__ = ["MigInstance", "MigSpec", "hashed_uuid"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def hashed_uuid(*parts: object) -> str:
    """A UUID-shaped string (8-4-4-4-12 hex) derived from ``parts``: stable across runs."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _hex64(*parts: object) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


class MigInstance(_Model):
    gi: int = Field(ge=0, le=14)
    profile: str

    @field_validator("profile")
    @classmethod
    def _profile_shape(cls, value: str) -> str:
        mig_profile_slices(value)  # raises with the expected shape in the message
        return value

    @property
    def slices(self) -> int:
        return mig_profile_slices(self.profile)


class MigSpec(_Model):
    instances: list[MigInstance] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_gi(self) -> MigSpec:
        ids = [inst.gi for inst in self.instances]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate gi in {ids}")
        return self

    def instance(self, gi: int) -> MigInstance | None:
        return next((inst for inst in self.instances if inst.gi == gi), None)
