"""One gRPC channel to the kubelet's pod-resources socket, redialled whenever it may be stale.

gRPC reconnects a broken channel by itself, but on its own backoff (1 s, growing): after a kubelet
restart the first tick or two would fail for no reason. A restarted kubelet unlinks its socket and binds
a new one at the same path, so the socket file's identity tells us when the channel points at a socket
that is gone: we then dial afresh. The identity is (device, inode, ctime): filesystems reuse a freed
inode number at once (seen on tmpfs), so the inode alone often names the new socket as the old one.
Any failed call also drops the channel.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
from grpc import aio

from wattpipe.pipeline.proto.podresources.v1 import api_pb2, api_pb2_grpc

__all__ = ["KubeletClient", "PodResourcesError", "PodResourcesRateLimited", "PodResourcesUnavailable", "socket_path"]

# The kubelet's own pod-resources clients allow 16 MiB answers (podresources.DefaultMaxMsgSize); gRPC's
# default of 4 MiB could refuse a List on a node with many pods.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodResourcesError(Exception):
    """The kubelet's pod-resources API gave no usable answer this tick."""


class PodResourcesUnavailable(PodResourcesError):
    """The kubelet could not be reached (socket absent, connection refused, no answer in time)."""


class PodResourcesRateLimited(PodResourcesError):
    """The kubelet answered RESOURCE_EXHAUSTED: too many pod-resources calls on this node."""


def socket_path(endpoint: str) -> str | None:
    """The filesystem path of a ``unix:`` gRPC target (``unix:///abs`` or ``unix:rel``), else None."""
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://") :]
    if endpoint.startswith("unix:"):
        return endpoint[len("unix:") :]
    return None


class KubeletClient:
    """``List`` on the pod-resources API; errors come out typed, and never as ``grpc.RpcError``."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.path = socket_path(endpoint)
        self._channel: Any = None  # aio.Channel
        self._stub: Any = None  # api_pb2_grpc.PodResourcesListerStub
        self._socket_identity: tuple[int, int, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dials = 0  # channels opened so far: how often we reconnected

    def socket_exists(self) -> bool:
        return self.path is None or os.path.exists(self.path)

    async def list(self) -> api_pb2.ListPodResourcesResponse:
        identity = self._identity()
        if self.path is not None and identity is None:
            await self.close()
            raise PodResourcesUnavailable(
                f"no kubelet socket at {self.path} (endpoint {self.endpoint}): is the kubelet running, and is "
                "its pod-resources directory mounted?"
            )
        loop = asyncio.get_running_loop()
        if self._channel is None or identity != self._socket_identity or loop is not self._loop:
            await self.close()
            self._channel = aio.insecure_channel(
                self.endpoint,
                options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            self._socket_identity, self._loop = identity, loop
            self.dials += 1
        try:
            response: api_pb2.ListPodResourcesResponse = await self._stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # The kubelet is up and the channel is fine: keep it.
                raise PodResourcesRateLimited(
                    f"the kubelet at {self.endpoint} refused List: RESOURCE_EXHAUSTED (rate limit)"
                ) from None
            await self.close()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                what = "did not answer in time" if code == grpc.StatusCode.DEADLINE_EXCEEDED else "is unreachable"
                raise PodResourcesUnavailable(f"the kubelet at {self.endpoint} {what} ({code.name})") from None
            raise PodResourcesError(
                f"the kubelet at {self.endpoint} failed List: {code.name}: {exc.details()}"
            ) from None
        return response

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        self._socket_identity = None
        if channel is None:
            return
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            return  # bound to a loop that is gone; it cannot be closed from this one
        await channel.close()

    def _identity(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        except OSError as exc:  # EACCES: wattpipe lacks the permission (it must run as root to use the socket)
            raise PodResourcesUnavailable(f"cannot use the kubelet socket {self.path}: {exc.strerror}") from None
        return st.st_dev, st.st_ino, st.st_ctime_ns
