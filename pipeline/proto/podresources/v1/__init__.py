"""Kubelet pod-resources API v1: ``api_pb2`` (messages) and ``api_pb2_grpc`` (``PodResourcesLister``).

Generated from ``api.proto`` by ``scripts/gen_protos.py``; never edit the generated modules by hand.
"""
