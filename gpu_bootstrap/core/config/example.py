"""The config's JSON Schema (for editors and docs/) and the commented example `init` writes."""
from __future__ import annotations

import json

from gpu_bootstrap.core.config.model import Config

__all__ = ["EXAMPLE", "SCHEMA_FILE", "SCHEMA_ID", "example", "json_schema", "section_example"]


SCHEMA_FILE = "gpu-bootstrap.schema.json"
SCHEMA_ID = "urn:gpu-bootstrap:config"  # an identifier, never fetched


def json_schema(model: type[Config] = Config) -> dict:
    """The JSON Schema of gpu-bootstrap.yaml, generated from the models (every key, type, default and description),
    for editors (`# yaml-language-server: $schema=...`, which `init` writes) and docs/. `nodes` is also a label
    selector (a string), which the model takes before validation."""
    schema = model.model_json_schema(by_alias=True)
    nodes = schema["properties"]["nodes"]
    schema["properties"]["nodes"] = {"description": nodes.get("description", ""), "title": "Nodes",
                                     "anyOf": [{k: v for k, v in nodes.items() if k not in ("description", "title")},
                                               {"type": "string", "description": "a label selector"}]}
    for name, prop in schema["properties"].items():  # a top-level section left empty (all commented out) is null
        if "$ref" in prop:
            prop = dict(prop)
            schema["properties"][name] = {"anyOf": [{"$ref": prop.pop("$ref")}, {"type": "null"}], **prop}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


EXAMPLE = """\
# gpu-bootstrap configuration. Every section except `nodes` is optional; the values shown are the defaults.
# Environment variables GPU_BOOTSTRAP_KUBECONFIG, GPU_BOOTSTRAP_CONTEXT and GPU_BOOTSTRAP_SSH_{USER,PORT,
# IDENTITY_FILE,KNOWN_HOSTS,HOST_KEY_POLICY} override the matching keys; command-line flags override both.

cluster:
  # kubeconfig: ~/.kube/config      # default: $KUBECONFIG, then ~/.kube/config
  # context: prod                   # default: the kubeconfig's current context

ssh:                                # how to reach the GPU nodes (preflight checks)
  user: root                        # not root? gpu-bootstrap uses `sudo -n`
  port: 22
  identity_file: ~/.ssh/id_ed25519
  known_hosts: ~/.ssh/known_hosts
  host_key_policy: strict           # strict | accept-new (records unknown keys, never accepts a changed one)

nodes:                              # the GPU nodes, by Kubernetes node name
  - name: node5
    address: 10.0.0.15              # SSH address (default: the name); port, user, identity_file may be overridden
  - name: node6
    address: 10.0.0.16

node_prep:                          # taint and label the GPU nodes so that ordinary pods stay off them
  taint: {key: nvidia.com/gpu, value: present, effect: NoSchedule}   # null: no taint
  gpu_present_label: true           # nvidia.com/gpu.present=true
  labels: {}                        # extra labels, e.g. {team: ml}

scheduler:                          # a second kube-scheduler that packs GPU pods onto as few nodes as possible
  name: gpu-binpack-scheduler       # GPU pods set spec.schedulerName to this
  # Scoring: left out, the profile measured best for your cluster's kube-scheduler (docs/steps/binpack-scheduler.md,
  # "Choosing the scoring"); setting any of these makes the profile yours (the others then take the values shown, 1.35's).
  # strategy: RequestedToCapacityRatio   # or MostAllocated
  # resource_weights: {nvidia.com/gpu: 100}   # GPU only: cpu/memory weights cost packing (docs/steps/binpack-scheduler.md)
  # shape: [{utilization: 0, score: 0}, {utilization: 50, score: 1}, {utilization: 100, score: 10}]
  # fit_weight: 3
  # balanced_allocation_weight: 1   # 0: NodeResourcesBalancedAllocation off
  # balanced_allocation_resources: [cpu, memory, nvidia.com/gpu]   # keeps cpu/memory in step with the GPUs
  # percentage_of_nodes_to_score: 100   # left out: every node up to 1,500 nodes, kube-scheduler's adaptive share above
  replicas: 2                       # leader-elected; `gpu-bootstrap simulate` shows what a profile buys

gpu_operator:                       # the NVIDIA gpu-operator, with values derived from what preflight found
  enabled: true
  chart: gpu-operator               # or a local .tgz / directory for air-gapped clusters
  repository: https://helm.ngc.nvidia.com/nvidia
  # version: v26.7.0                # default: the newest release NVIDIA validated for the cluster's version
  release: gpu-operator
  namespace: gpu-operator
  driver_management: auto           # auto | operator | host | per-node
  runtime_integration: auto         # auto | toolkit-env | nri
  sharing:
    mode: none                      # none | time-slicing | mig
  wait_timeout: 900                 # seconds to wait for the operands on every GPU node
  skip_version_check: false         # true: install outside NVIDIA's validated Kubernetes range
  adopt: false                      # true: take over a release of this name that gpu-bootstrap did not install
  values: {}                        # your helm values, applied last

validate:                           # run NVIDIA's CUDA vector-add sample on the GPU nodes, then clean up
  enabled: true
  # image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0   # default: the image catalogue (by digest where known)
  nodes: all                        # all | sample | a number
  namespace: gpu-bootstrap
  timeout: 300

admission:                          # keep GPU pods on the bin-packing scheduler (docs/steps/admission.md)
  enabled: true
  engine: opa                       # opa: OPA webhook + (>= 1.30) an in-process backstop policy | vap: policies only
  mode: mutate                      # mutate: set spec.schedulerName on GPU pods | enforce: reject them, naming the field
  exempt_namespaces: []             # left alone besides kube-system, the scheduler's and OPA's own (the only opt-out)
  override_other_schedulers: false  # false: a GPU pod naming another scheduler (e.g. volcano) is left alone
  opa:
    # image: openpolicyagent/opa:1.16.2   # default: the image catalogue, by digest (1.16.2: the patch release after kube-mgmt's 1.16.1 pin)
    replicas: 2
    namespace: gpu-bootstrap-admission
  certificates: generated           # generated (a CA of our own, kept only in a Secret) | cert-manager
  rotate_before_days: 30

monitoring:                         # who uses which GPU: Prometheus, the DCGM exporter's metrics, dashboards, alerts
  enabled: true
  mode: auto                        # install | attach | auto (attach to a Prometheus Operator you already run)
  chart: kube-prometheus-stack      # install mode; or a local .tgz / directory for air-gapped clusters
  repository: https://prometheus-community.github.io/helm-charts
  # version: 88.5.3                 # default: the newest release whose kubeVersion admits the cluster
  release: kube-prometheus-stack
  namespace: monitoring             # the stack's namespace, and where the dashboards and alerts go
  retention: 15d                    # how long Prometheus keeps data
  storage: null                     # e.g. {size: 50Gi, storage_class: fast}; null keeps data in an emptyDir
  grafana:
    enabled: true
  # prometheus: monitoring/k8s      # attach mode: which Prometheus object, when the cluster runs several
  scrape_interval: 15s              # how often the DCGM exporter is scraped
  wait_timeout: 600
  skip_version_check: false
  values: {}                        # your helm values for kube-prometheus-stack, applied last

registry:                           # air-gapped clusters (docs/air-gapped.md); `gpu-bootstrap images` lists
  mirror: null                      # what to copy. e.g. registry.example.com:5000/mirror: every image comes from there
  pull_secret: null                 # a docker-registry Secret (you create it in each namespace) pods pull with
preflight:                          # where node facts come from (docs/steps/preflight.md)
  via: auto                         # ssh | cluster (a read-only probe pod per node, no keys) | auto: ssh when the
                                    # config has an `ssh` section or a node an `address`, else cluster
  # image: busybox:1.37.0           # the cluster probe's image (default: the image catalogue, by digest)
  timeout: 120                      # seconds; a node whose probe did not finish by then is unknown

pools: []                           # autoscaled GPU pools (Karpenter >= 1.0 on EKS; docs/steps/gpu-pools.md)
# - name: gpu                       # a NodePool and an EC2NodeClass of this name; nodes get node_prep's taint/labels
#   role: KarpenterNodeRole-my-cluster   # the nodes' IAM role
#   discovery_tag: my-cluster       # subnets and security groups tagged karpenter.sh/discovery=<this>
#   ami_family: al2023              # al2023 (EKS NVIDIA AMI) | bottlerocket (its NVIDIA variant)
#   requirements: {gpu_count: 1, instance_families: [g6], gpu_names: [], capacity_types: [on-demand]}
#   limits: {nvidia.com/gpu: 8}     # required: the most GPUs the pool may hold
#   disruption: {consolidate_after: 10m, budgets: [{nodes: "10%"}]}   # only empty nodes are removed
#   expire_after: 720h
"""


COMMENT_AT = 36  # the column the example's comments start at


def section_example(key: str, model, comment: str) -> str:
    """A section a step brings itself, as `init` writes it: every key with its default and its description."""
    def line(text: str, note: str) -> str:
        return f"{text:<{COMMENT_AT - 1}} # {note}" if note else text
    defaults = model().model_dump(mode="json", by_alias=True)
    lines = [line(f"{key}:", comment)]
    for name, field in model.model_fields.items():
        shown = field.alias or name
        lines.append(line(f"  {shown}: {json.dumps(defaults[shown])}", field.description or ""))
    return "\n".join(lines) + "\n"


def example(added: list[str] = ()) -> str:
    """`init`'s commented example: the built-in sections, then the sections steps bring themselves (`added`, each
    as section_example() writes it or as its step declares it)."""
    return EXAMPLE + "".join("\n" + block for block in added)
