"""Protocol buffers wattpipe speaks, each with its generated modules (``scripts/gen_protos.py``)."""
