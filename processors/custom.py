"""Type ``custom``: a receiver, processor or exporter loaded by import path, without packaging it.

::

    processors:
      custom/reweight: {class: "mypkg.rules:Reweight", factor: 0.5}

The class is imported (from the installed packages, PYTHONPATH or the working directory) when the
pipeline is built and called with the other options as keyword
arguments (plus ``context=`` if its constructor takes one). For a plugin you ship, prefer an entry
point in the ``wattpipe.components`` group: it gets its own type name and a validated options model.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from pydantic import ConfigDict, Field

from wattpipe.pipeline.components import ComponentConfig, ComponentKind, CreateContext, Factory

__all__ = ["CustomConfig", "factory", "load_class"]


class CustomConfig(ComponentConfig):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    class_: str = Field(alias="class", pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    """``package.module:ClassName``."""

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def load_class(path: str) -> type:
    module_name, _, attr = path.partition(":")
    # Like `python -m` (and uvicorn's app dir), modules beside where wattpipe runs are importable,
    # so a rule file next to the config works without packaging it.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"class '{path}': cannot import module '{module_name}': {exc}") from None
    except Exception as exc:
        # The module exists but its own code failed at import: say so in a line the config check can
        # report, instead of a traceback out of `wattpipe validate`.
        raise ImportError(
            f"class '{path}': importing module '{module_name}' failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"class '{path}': module '{module_name}' has no '{attr}'") from None
    if not inspect.isclass(obj):
        raise TypeError(f"class '{path}' is a {type(obj).__name__}, not a class")
    return obj


def _creator(kind: ComponentKind) -> Any:
    def create(ctx: CreateContext, config: ComponentConfig) -> object:
        assert isinstance(config, CustomConfig)
        cls = load_class(config.class_)
        options = config.options()
        signature = inspect.signature(cls)
        if "context" in options:
            raise TypeError(f"class '{config.class_}': 'context' is given by wattpipe, it cannot be an option")
        if "context" in signature.parameters:
            options["context"] = ctx
        # Check the options against the signature before calling, so that a TypeError raised by the
        # class's own code is reported as itself, not blamed on the options.
        try:
            signature.bind(**options)
        except TypeError as exc:
            raise TypeError(f"class '{config.class_}' does not accept these options: {exc}") from None
        return cls(**options)

    return create


factory = [
    Factory(
        type="custom",
        kind=kind,
        config_model=CustomConfig,
        create=_creator(kind),
        description=f"{'An' if kind[0] in 'aeiou' else 'A'} {kind} class loaded by import path (class: 'module:Class'), options passed as arguments.",
        stability="alpha",
    )
    for kind in ("receiver", "processor", "exporter")
]
