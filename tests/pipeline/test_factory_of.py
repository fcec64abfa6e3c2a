"""Factory.of: a component class is its own factory, built as ``cls(config, ctx)``."""

from __future__ import annotations

import pytest

from tests.helpers.context import make_context
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory


class EchoConfig(ComponentConfig):
    word: str = "hi"


class OtherConfig(ComponentConfig):
    pass


class Echo:
    def __init__(self, config: EchoConfig, ctx: CreateContext) -> None:
        self.config = config
        self.ctx = ctx


FACTORY = Factory.of(Echo, type="echo", kind="exporter", config_model=EchoConfig, description="d", stability="beta")


def test_factory_of_builds_the_class_from_config_and_context() -> None:
    ctx = make_context("echo", "exporter")
    made = FACTORY.create(ctx, EchoConfig(word="yo"))
    assert isinstance(made, Echo)
    assert made.config == EchoConfig(word="yo")
    assert made.ctx is ctx
    assert (FACTORY.type, FACTORY.kind, FACTORY.config_model, FACTORY.stability) == (
        "echo",
        "exporter",
        EchoConfig,
        "beta",
    )
    assert FACTORY.provides == frozenset()


def test_factory_of_refuses_another_config_model() -> None:
    with pytest.raises(TypeError, match="exporter 'echo': expected EchoConfig, got OtherConfig"):
        FACTORY.create(make_context("echo", "exporter"), OtherConfig())
