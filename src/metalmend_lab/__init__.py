"""metalmend's lab and demos (the distribution metalmend-lab, lab/pyproject.toml): a real
local cluster on loopback (the upstream control plane, Redfish and IPMI BMCs, kubelet
simulators bound to each host's power, a site etcd, a provisioner) for the demos, the tests
and the benchmarks. Not part of metalmend's wheel or image: it imports metalmend, never
the other way round (tests/unit/test_import_contract.py)."""
