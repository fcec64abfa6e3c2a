"""Processor ``k8s``: who each GPU process is in Kubernetes terms (pid → container → pod), as Workload records.

The pod UID and container id come from the process's cgroup (the ``procfs`` receiver's HostProcess);
pod name, namespace and container name from the Kubernetes API: a background thread lists and watches
the pods of *this node* (``spec.nodeName``, never a cluster-wide list) into a bounded cache, and
``process()`` only reads that cache, so a tick never waits on the API server. Without API access, or for
a pod the cache does not know yet, the kubelet's pod-resources allocations name the owner of the
process's GPU when exactly one container owns it. Without host PID visibility (no ``hostPID``) the
device's energy goes to its owning containers, equally: see :mod:`processors.k8s._resolve`.

Allow-listed pod labels and annotations are copied into ``Workload.extra`` as ``label_<name>`` and
``annotation_<name>``.

Besides each process's record, the processor lists the pods and containers that exist on the node
(``Workload.listed`` entries, :mod:`processors.k8s._roster`), so that the energy processor ends a container
or pod series when its pod is gone rather than when its processes pause. The API's list is made again only
when the cache changes: its entries carry the time of the tick that made them.

A process's energy may arrive after it exited (on a MIG GPU, held for dcgm-exporter's sample covering
it): each pid the driver stops listing on a device keeps its workload there for ``keep_exited``, and a share
of it on that device then gets a record as if it were listed, for that device alone (``device_id`` in its
``extra``; :mod:`processors.k8s._exited`). That memory is kept in the state file, with the pairs listed at the
stop: attribution's held energy survives a restart, and is released after it for processes that exited before.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from wattpipe.pipeline.batch import Batch
from wattpipe.pipeline.components import ComponentConfig, CreateContext, Factory
from wattpipe.pipeline.config import Duration
from wattpipe.pipeline.records import Workload
from wattpipe.processors.k8s._cache import PodCache, PodInfo, PodView, pod_info, strip_runtime
from wattpipe.processors.k8s._exited import ExitedProcesses
from wattpipe.processors.k8s._resolve import DEGRADED, resolve
from wattpipe.processors.k8s._roster import from_allocations, from_api
from wattpipe.processors.k8s._watch import PodWatcher, api_client

if TYPE_CHECKING:  # the kubernetes client costs ~20 MB to import: only when it is used
    from kubernetes.client import ApiClient

__all__ = [
    "DEGRADED",
    "K8sConfig",
    "K8sProcessor",
    "PodCache",
    "PodInfo",
    "PodView",
    "factory",
    "pod_info",
    "strip_runtime",
]


class K8sConfig(ComponentConfig):
    api: Literal["auto", "off"] = "auto"
    """auto: in-cluster credentials, else the kubeconfig ``KUBECONFIG`` names, else none (pod-resources
    only); off: never ask the API server."""
    node_name: str = ""
    """The node whose pods to watch; empty: ``NODE_NAME`` from the environment (the downward API's
    ``spec.nodeName``), read at start. Neither: no API access."""
    labels: list[str] = Field(default_factory=list)
    """Pod labels to copy into each Workload, as ``label_<name>``."""
    annotations: list[str] = Field(default_factory=list)
    """Pod annotations to copy into each Workload, as ``annotation_<name>``."""
    request_timeout: Duration = Field(default=10.0, gt=0)
    """One list call (and connecting a watch)."""
    watch_timeout: Duration = Field(default=300.0, ge=1)
    """How long the server keeps one watch open (``timeoutSeconds``) before it is opened anew."""
    backoff_max: Duration = Field(default=30.0, gt=0)
    """Longest wait between tries while the API server fails (from 1 s, doubling)."""
    keep_deleted: Duration = Field(default=60.0, ge=0)
    """How long a deleted pod stays known: its last processes may outlive the API's DELETED event."""
    max_pods: int = Field(default=1000, ge=1)
    """Most pods cached (deleted ones included); beyond it new pods are not cached and count as unknown."""
    keep_exited: Duration = Field(default=120.0, ge=0)
    """How long a process the driver no longer lists keeps its workload. Energy held for it (a MIG GPU
    waiting for dcgm-exporter's sample: up to attribution's ``mig_max_wait``, 90 s by default) arrives after
    it exited and must still reach its container and pod: keep this above ``mig_max_wait`` plus one tick."""
    max_exited: int = Field(default=4096, ge=0)
    """Most exited processes remembered (one per device each left); beyond it the earliest exits are forgotten
    first (and logged): their late energy then counts for the process, not for its container and pod. 0: none
    remembered."""

    @field_validator("labels", "annotations")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value):
            raise ValueError("label and annotation names cannot be empty")
        return list(dict.fromkeys(value))


class K8sProcessor:
    needs = frozenset({"gpu_processes"})
    provides = frozenset({"workloads"})

    def __init__(self, config: K8sConfig, ctx: CreateContext, *, env: Mapping[str, str] | None = None) -> None:
        """``env``: the environment to read ``NODE_NAME``, ``KUBECONFIG`` and ``KUBERNETES_SERVICE_HOST``
        from (default: the process's)."""
        self.config = config
        self.ctx = ctx
        self.component_id = ctx.component_id
        self.log = ctx.logger
        self._env = env if env is not None else os.environ
        self.cache = PodCache(config.max_pods, config.keep_deleted)
        self.watcher: PodWatcher | None = None
        self.node_name = ""
        self._dropped_logged = 0
        self._exited = ExitedProcesses(config.keep_exited, config.max_exited)
        self._exited_dropped_logged = 0
        self._seen: dict[int, Workload] = {}  # pid → how it resolved while /proc still had it
        self._cgroup_uids: dict[str, str] = {}  # a static pod's API UID → the UID its cgroup shows
        self._listed: tuple[PodView | None, tuple[Workload, ...]] = (None, ())  # the API list, for its view

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._restore()  # first: a section it cannot use raises before the watch thread starts
        self.node_name = self.config.node_name or self._env.get("NODE_NAME", "")
        if self.config.api == "off":
            self.log.info("processor %s: api off: pod names from pod-resources allocations only", self.component_id)
            return
        api = self._api_client()
        if isinstance(api, str):
            self.log.warning(
                "processor %s: no Kubernetes API access (%s): pod names from pod-resources allocations only",
                self.component_id,
                api,
            )
            return
        self.watcher = PodWatcher(
            api,
            self.node_name,
            self.cache,
            functools.partial(pod_info, labels=self.config.labels, annotations=self.config.annotations),
            monotonic=self.ctx.clock.monotonic,
            log=self.ctx.telemetry.log,
            component_id=self.component_id,
            request_timeout_s=self.config.request_timeout,
            watch_timeout_s=self.config.watch_timeout,
            backoff_max_s=self.config.backoff_max,
        )
        self.watcher.start()

    def _restore(self) -> None:
        """Who the exited processes were (and those listed at the stop), as the last checkpoint had them: energy
        attribution held for them is released after a restart, and must still reach their container and pod."""
        saved = self.ctx.state.section(self.ctx.state_key)
        if not saved:
            return
        if not isinstance(saved.get("exited"), dict) or not isinstance(saved.get("seen"), list):
            raise ValueError("not a k8s section: it has no exited processes and no seen pids")
        exited = ExitedProcesses(self.config.keep_exited, self.config.max_exited)
        exited.load(saved["exited"], self.ctx.clock.now())
        if not all(isinstance(pid, int) and not isinstance(pid, bool) for pid in saved["seen"]):
            raise ValueError(f"seen {saved['seen']!r}: not a list of pids")
        listed = {pair[0]: w for pair, w in exited.listed.items()}
        seen = {pid: listed[pid] for pid in saved["seen"] if pid in listed}  # (how a pid resolved while /proc had it)
        self._exited, self._seen = exited, seen  # all or nothing
        self.log.info(
            "processor %s: %d exited process(es) remembered, %d listed at the stop",
            self.component_id,
            len(exited),
            len(exited.listed),
        )

    def snapshot(self) -> dict[str, Any]:
        now = self.ctx.clock.now()
        return {"exited": self._exited.dump(now.wall_offset_s), "seen": sorted(self._seen)}

    def _api_client(self) -> ApiClient | str:
        """A configured client, or why there is none."""
        if not self.node_name:
            # Never a cluster-wide list: without the node there is nothing to scope the watch to.
            return "node_name is not set, nor NODE_NAME (set it from spec.nodeName with the downward API)"
        try:
            api = api_client(self._env)
        except Exception as exc:  # a broken kubeconfig raises anything from ConfigException to yaml errors
            return f"the Kubernetes client cannot be configured: {type(exc).__name__}: {exc}"
        return api if api is not None else "not in a pod, and KUBECONFIG is not set"

    def shutdown(self) -> None:
        watcher, self.watcher = self.watcher, None
        if watcher is not None and not watcher.stop():
            self.log.warning(
                "processor %s: the pod watch thread is still finishing a request; it ends with the process",
                self.component_id,
            )

    # --- the tick --------------------------------------------------------------------------------

    @property
    def view(self) -> PodView:
        return self.cache.view

    def process(self, batch: Batch) -> Batch:
        self.cache.expire(batch.time.monotonic_s)
        if self.cache.dropped > self._dropped_logged:
            self._dropped_logged = self.cache.dropped
            self.ctx.telemetry.log.log(
                logging.WARNING,
                "full",
                f"processor {self.component_id}: pod cache full ({self.config.max_pods} pods): "
                f"{self.cache.dropped} pod(s) not cached; raise max_pods",
            )
        view = self.cache.view  # once: the watch thread may publish another meanwhile
        workloads, self._seen = resolve(batch, view, self._seen)
        self._learn_cgroup_uids(workloads, view)
        # Late workloads first: one of a pid the driver lists again (reused) is for its device only, and a
        # consumer that looks Workloads up by pid alone (cpu_attribution) keeps the pid's own, the last.
        late = self._late(batch, workloads)
        return batch.replace(workloads=batch.workloads + tuple(late) + tuple(workloads) + self._listing(batch, view))

    def _late(self, batch: Batch, workloads: list[Workload]) -> list[Workload]:
        """The workloads of exited processes that have a share this tick (energy released late), as they
        were when the driver last listed them."""
        exited = self._exited
        by_pid = {w.pid: w for w in workloads if w.pid is not None}
        exited.update(
            batch.time.monotonic_s,
            {(p.pid, p.device_id): by_pid[p.pid] for p in batch.gpu_processes if p.pid in by_pid},
        )
        if exited.dropped > self._exited_dropped_logged:
            self._exited_dropped_logged = exited.dropped
            self.ctx.telemetry.log.log(
                logging.WARNING,
                "exited",
                f"processor {self.component_id}: {exited.dropped} exited process(es) forgotten before keep_exited "
                f"({self.config.max_exited} remembered); energy released for them later misses their pod: "
                "raise max_exited",
            )
        return exited.late(batch.time, batch.shares, batch.gpu_processes) if len(exited) else []

    def _learn_cgroup_uids(self, workloads: list[Workload], view: PodView) -> None:
        """A process named by its container id under a cgroup UID the API does not know is in a static pod:
        its series are keyed by the cgroup's UID, so the pod is listed under that UID too."""
        for w in workloads:
            if w.pid is None or w.pod_uid is None or w.pod_name is None or w.pod_uid in view.by_uid:
                continue
            pod = view.by_name.get((w.pod_namespace or "", w.pod_name))
            if pod is not None and self._cgroup_uids.get(pod.uid) != w.pod_uid:
                self._cgroup_uids[pod.uid] = w.pod_uid
                self._listed = (None, ())

    def _listing(self, batch: Batch, view: PodView) -> tuple[Workload, ...]:
        """The pods that exist on the node, from the API cache once it has listed, else from this tick's
        allocations; none when neither can say."""
        if view.synced:
            if self._listed[0] is not view:
                live = {uid for uid, pod in view.by_uid.items() if pod.deleted_at_s is None}
                self._cgroup_uids = {uid: other for uid, other in self._cgroup_uids.items() if uid in live}
                self._listed = (view, tuple(from_api(batch.time, view, self._cgroup_uids)))
            return self._listed[1]
        if "allocations" in batch.present:
            return tuple(from_allocations(batch.time, batch.allocations))
        return ()


factory = Factory.of(
    K8sProcessor,
    type="k8s",
    kind="processor",
    config_model=K8sConfig,
    description="Pod, namespace and container of each GPU process: cgroup, Kubernetes API (this node), pod-resources.",
    stability="development",
    provides=frozenset({"workloads"}),
)
