"""What `doctor --conformance`'s checks work with (app/conformance.py, app/conformance_autoscaling.py): the probe
that carries the run's context, logs what a check does and waits for what it started, and the Prometheus the
monitoring step installed or attached to."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpu_bootstrap.core.errors import ClusterError

NAMESPACE_PREFIX = "gpu-bootstrap-conformance-"
PART_OF = {"app.kubernetes.io/managed-by": "gpu-bootstrap", "app.kubernetes.io/part-of": "gpu-bootstrap-conformance"}
GPU = "nvidia.com/gpu"
# seconds a live check waits for what it started (a node launched, a gang admitted, a scrape): past kube-scheduler's
# podMaxInUnschedulablePodsDuration (5 min), after which it retries a pod it found no node for even when no event
# it listens to said a node came
WITHIN = 360.0


@dataclass
class Probe:
    """What a check works with: the run's context, its steps, its own namespace (None with read_only) and its log."""

    ctx: object
    steps: set[str]
    namespace: str | None
    read_only: bool
    within: float = WITHIN
    log: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.log.append(f"[{time.strftime('%H:%M:%S')}] {line}")

    def create(self, obj: dict) -> dict:
        obj.setdefault("metadata", {}).setdefault("labels", {}).update(PART_OF)
        made = self.ctx.kube.create(obj)
        self.say(f"created {obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}")
        return made

    def wait(self, what: str, test, interval: float = 2.0):
        """test() until it returns something true, for `within` seconds; the last answer (None: it never came)."""
        deadline = time.monotonic() + self.within
        while True:
            try:
                answer = test()
            except ClusterError as error:  # a read that failed now may answer next time
                answer = None
                self.say(f"{what}: {error.one_line()}")
            if answer or time.monotonic() > deadline:
                self.say(f"{what}: {'yes' if answer else f'not within {self.within:g} s'}")
                return answer
            time.sleep(interval)


def pause_pod(name: str, gpus: int = 0, **spec) -> dict:
    from gpu_bootstrap.core.catalogue import default
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "pause", "image": default("pause"), "resources": resources}],
                     "terminationGracePeriodSeconds": 0, **spec}}


def prometheus(probe: Probe):
    from gpu_bootstrap.steps.monitoring_prometheus import prometheus_proxy
    from gpu_bootstrap.steps.monitoring_target import decide
    return prometheus_proxy(probe.ctx, decide(probe.ctx))


def query(probe: Probe, proxy, promql: str) -> list[dict]:
    from gpu_bootstrap.steps.monitoring_prometheus import query
    return query(probe.ctx, proxy, promql)
