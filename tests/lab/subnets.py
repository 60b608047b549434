"""The one place that hands out the lab's /24s of 10.213.0.0/16 (the range its guard route keeps on
this machine: netlab.ensure_guard_route).

A `Lab` (netlab) takes the lowest /24 below FIRST_FIXED that no address of this machine uses, at
run time under its allocation lock, so Labs never clash. A mini-cluster (cluster.Cluster,
slurm.SlurmCluster) has a fixed /24 its nodes' ssh_config and Slurm's node list are written with:
each user of one (a test module, a benchmark) has its own here, so any two of them can run at
once; a cluster started with a /24 another live cluster holds fails at once, naming it.

    Cluster(8, subnet=subnets.subnet("fanout"))
"""

from __future__ import annotations

NET_PREFIX = "10.213"

# user -> the third byte of its /24 (one user, one /24; a user starts its clusters one at a time)
FIXED: dict[str, int] = {
    "cluster": 244,  # Cluster() / SlurmCluster() with no user named (by hand)
    "lab_pair": 245,  # tests/e2e/test_lab.py, two Slurm clusters at once: the second
    "lab_pair_first": 246,  # ... and the first
    "lab_fresh": 247,  # tests/e2e/test_lab_fresh.py
    "fanplan_slurm": 248,  # tests/e2e/test_fanplan.py, the Slurm plan
    "fanplan": 249,  # tests/e2e/test_fanplan.py, the clush plan
    "fanout": 250,  # tests/e2e/test_fanout.py
    "fanout_tree": 251,  # tests/e2e/test_fanout_tree.py
    "fanout_slurm": 252,  # tests/e2e/test_fanout_slurm.py
    "lab_teardown": 253,  # tests/e2e/test_lab_teardown.py
    "bench_fanout": 254,  # benchmarks/fanout.py
}
FIRST_FIXED = min(FIXED.values())  # a Lab's slots are 1 .. FIRST_FIXED - 1

if len(set(FIXED.values())) != len(FIXED) or not all(0 < v < 255 for v in FIXED.values()):
    raise AssertionError(f"tests/lab/subnets.py: each user needs a /24 of its own: {FIXED}")


def subnet(user: str) -> str:
    """`10.213.X`, the /24 of `user` (a key of FIXED)."""
    if user not in FIXED:
        raise KeyError(f"{user!r} has no /24 in tests/lab/subnets.py: add it to FIXED")
    return f"{NET_PREFIX}.{FIXED[user]}"
