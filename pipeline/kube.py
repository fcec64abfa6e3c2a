"""A Kubernetes API client for the components that need one (dcgm endpoint discovery, the k8s processor).

Here, in pipeline/, because a receiver and a processor both use it and components never import each
other; pipeline/ already speaks the kubelet's API (``pipeline/proto``), so knowing how to reach the API
server is no new kind of knowledge for it.

Built on a Configuration of its own, so the kubernetes package's global default is left alone, with no
retries (each caller retries on its own schedule). The kubernetes package costs ~20 MB to import, so
it is imported here, at first use, never at plugin load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes import client

__all__ = ["api_client", "kube_env"]


def api_client(env: Mapping[str, str]) -> client.ApiClient | None:
    """In-cluster credentials when running in a pod, else the first kubeconfig ``KUBECONFIG`` names, else None.

    Raises whatever a broken kubeconfig raises.
    """
    from kubernetes import client, config

    configuration = client.Configuration()
    configuration.retries = 0
    if env.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass  # a pod without a service-account token: a kubeconfig may still say where to go
    kubeconfig = env.get("KUBECONFIG", "").split(":")[0]
    if not kubeconfig:
        return None
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, persist_config=False, client_configuration=configuration
    )
    return api


def kube_env(env: Mapping[str, str], kubeconfig: str) -> Mapping[str, str]:
    """``env`` as :func:`api_client` should read it when a component's config names ``kubeconfig``: that
    file, before in-cluster credentials and ``$KUBECONFIG`` (empty: ``env`` unchanged)."""
    if not kubeconfig:
        return env
    return {**env, "KUBECONFIG": kubeconfig, "KUBERNETES_SERVICE_HOST": ""}
