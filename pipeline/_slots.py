"""Constructors for frozen, slotted dataclasses that set each slot through its descriptor.

A frozen dataclass's ``__init__`` goes through ``object.__setattr__`` by name for every field (its own
``__setattr__`` refuses), and records are made per process per tick: :func:`quick_init` gives a class the same
keyword-only ``__init__`` made cheaper, and :func:`positional` a positional one for the hottest paths
(``pipeline/constructors.py``). Both are generated from the class's own field names, as dataclasses does.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["positional", "quick_init", "slot_setters"]


def slot_setters(cls: type[Any], names: list[str]) -> tuple[dict[str, Any], list[str]]:
    """For a generated constructor: each named field's slot descriptor setter (``_set0``, ``_set1``, … in a
    namespace for ``exec``) and the body line that sets it on ``self`` from the parameter of its name."""
    namespace: dict[str, Any] = {}
    body: list[str] = []
    for number, name in enumerate(names):
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        namespace[f"_set{number}"] = vars(owner)[name].__set__
        body.append(f"    _set{number}(self, {name})")
    return namespace, body


def quick_init(cls: type[Any]) -> None:
    """Give a record class the ``__init__`` dataclasses writes, made cheaper: the same keyword-only
    signature and defaults, but each slot is set through its own descriptor instead of
    ``object.__setattr__`` by name. A frozen dataclass needs the latter for every field (its
    ``__setattr__`` refuses), and that lookup is most of a record's cost: records are made per process per
    tick (three each), and this about halves what each costs (the figures: docs/benchmarks.md). The
    class stays a frozen, slotted dataclass: assignment still raises, ``dataclasses.replace`` uses this."""
    fields = dataclasses.fields(cls)
    namespace, body = slot_setters(cls, [f.name for f in fields])
    params: list[str] = []
    for number, f in enumerate(fields):
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a default factory needs the dataclass __init__")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_default{number}"] = f.default
            params.append(f"{f.name}=_default{number}")
    source = f"def __init__(self, *, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(source, namespace)  # generated from the class's own field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)  # inspect.signature shows the field types
    cls.__init__ = init


_F = TypeVar("_F", bound=Callable[..., Any])


def positional(cls: type[Any]) -> Callable[[_F], _F]:
    """Replace the decorated stub by a positional constructor of ``cls`` for a hot path: a record made
    per process per tick, where passing nine fields by keyword costs as much as setting them.

    The stub is the typed signature (mypy checks every call against it): its parameters must be exactly
    the class's fields in the class's order (``time``, ``extra``, then the class's own), none with a
    default, so a call reads like the class's definition. The generated function sets each slot through
    its descriptor, as the class's own ``__init__`` does, so the record is the very one ``cls(**fields)``
    makes (equal, hashed alike, frozen)."""

    def generate(stub: _F) -> _F:
        names = list(inspect.signature(stub).parameters)
        fields = [f.name for f in dataclasses.fields(cls)]
        if names != fields:
            raise TypeError(
                f"{stub.__name__}: parameters {names} are not the fields of {cls.__name__} in its order: {fields}"
            )
        namespace, body = slot_setters(cls, names)
        namespace.update(_new=object.__new__, _cls=cls)
        body = ["    self = _new(_cls)", *body, "    return self"]
        source = f"def {stub.__name__}({', '.join(names)}):\n" + "\n".join(body) + "\n"
        exec(source, namespace)  # generated from the stub's own parameter names
        made: _F = namespace[stub.__name__]
        functools.update_wrapper(made, stub)
        del made.__wrapped__  # type: ignore[attr-defined]  # the stub's body is not the function
        return made

    return generate
