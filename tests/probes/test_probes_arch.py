"""NVIDIA's compatibility rules, as arch.py states them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rbprobes import arch


@pytest.mark.parametrize(
    "code, device, runs",
    [
        # plain SASS: same major, equal or higher minor
        ("sm_90", "9.0", True),
        ("sm_90", "8.0", False),
        ("sm_90", "10.0", False),
        ("sm_80", "8.6", True),
        ("sm_86", "8.0", False),
        ("sm_100", "10.3", True),
        ("sm_120", "12.1", True),
        ("sm_120", "10.3", False),
        ("sm_103", "10.0", False),
        # arch-specific SASS: exactly that capability
        ("sm_100a", "10.0", True),
        ("sm_100a", "10.3", False),
        ("sm_90a", "9.0", True),
        ("sm_90a", "10.0", False),
        # family SASS: same major, equal or higher minor (sm_100f: 10.0 and 10.3)
        ("sm_100f", "10.0", True),
        ("sm_100f", "10.3", True),
        ("sm_103f", "10.3", True),
        ("sm_103f", "10.0", False),
        ("sm_100f", "12.0", False),
        ("sm_120f", "12.1", True),
        # PTX: forward to any later device; `a` PTX exact; `f` PTX within the family
        ("compute_100", "10.3", True),
        ("compute_100", "12.0", True),
        ("compute_100", "9.0", False),
        ("compute_90", "10.3", True),
        ("compute_100a", "10.3", False),
        ("compute_100a", "10.0", True),
        ("compute_100f", "10.3", True),
        ("compute_100f", "12.0", False),
    ],
)
def test_rules(code, device, runs):
    assert arch.name_runs_on(code, arch.parse_capability(device)) is runs


def test_ptx_version_must_be_accepted_by_the_driver():
    assert arch.runs_on("ptx", 100, "", (10, 3), (9, 0), (9, 0))
    assert not arch.runs_on("ptx", 100, "", (10, 3), (9, 0), (8, 8))
    assert arch.runs_on("ptx", 100, "", (10, 3), (9, 0), None)  # unknown driver: not held
    assert arch.runs_on("sass", 100, "", (10, 3), (9, 0), (8, 0))  # SASS has no PTX version


@pytest.mark.parametrize(
    "text, cap",
    [
        ("sm_103", (10, 3)),
        ("10.3", (10, 3)),
        ("sm_90", (9, 0)),
        ("sm_100a", (10, 0)),
        ("SM_120", (12, 0)),
    ],
)
def test_parse_target(text, cap):
    assert arch.parse_target(text) == cap


@pytest.mark.parametrize("text", ["sm103", "compute_90", "10", "sm_1", "gfx90a", ""])
def test_parse_target_rejects(text):
    with pytest.raises(ValueError):
        arch.parse_target(text)


numbers = st.sampled_from([50, 60, 61, 70, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121])
devices = st.sampled_from(
    [(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)]
)


@given(numbers, devices)
def test_suffixes_only_narrow(number, device):
    """`a` code runs on a subset of where `f` code runs, which runs wherever plain SASS does;
    plain PTX runs wherever plain SASS does."""
    a = arch.runs_on("sass", number, "a", device)
    f = arch.runs_on("sass", number, "f", device)
    plain = arch.runs_on("sass", number, "", device)
    assert (not a or f) and (not f or plain)
    assert not plain or arch.runs_on("ptx", number, "", device)
    assert arch.runs_on("ptx", number, "a", device) == a
