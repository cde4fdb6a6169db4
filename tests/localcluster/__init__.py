"""A real Kubernetes control plane for the tests, on this machine, without containers (scripts/local-cluster).

cluster.py starts and stops it (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK); nodes.py says
what its fake nodes look like; agent.py runs real processes for the pods whose image it knows and plays the
gpu-operator's controller; pki.py makes its certificates; rest.py is the plumbing's own small client.
What it cannot prove: anything about GPUs, drivers, container images or kubelets (KWOK fakes the nodes).
"""
