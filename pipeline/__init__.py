"""The engine: configuration, component contract, graph, runtime, state and self-telemetry.

It knows no GPU and imports no component; built-in and third-party components reach it the same way,
through the ``wattpipe.components`` entry points.
"""
