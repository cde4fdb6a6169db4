"""A Kubernetes API emulator for tests, proved against the real kubectl, helm and Python client.

    with Emulator(gpu_nodes=["g1", "g2"]) as emu:
        emu.write_kubeconfig(tmp_path / "kubeconfig")
        ...  # run real clients; inspect emu.get(...), emu.requests; break things with emu.faults.add(...)

Run it on its own with `python -m tests.kubeapi serve --kubeconfig PATH`.
"""
from .emulator import Emulator
from .faults import Fault
from .util import ApiError

__all__ = ["Emulator", "Fault", "ApiError"]
