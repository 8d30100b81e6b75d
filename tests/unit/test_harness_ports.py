"""The harness's port choice: xdist workers run servers side by side, and a port two
of them chose (or one chose twice) fails a broker's bind seconds later."""

from __future__ import annotations

import pytest

from harness import process


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(process, "_handed_out", set())
    return monkeypatch


def test_each_xdist_worker_chooses_from_a_slice_of_its_own(fresh):
    fresh.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        fresh.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(process._port_range()))
        assert process.free_port() in slices[-1]
    assert not (slices[0] & slices[1]) and not (slices[1] & slices[2]) and not (slices[0] & slices[2])
    low, _ = process._ephemeral_ports()
    assert all(port < low for chosen in slices for port in chosen)


def test_a_process_never_chooses_a_port_twice(fresh):
    fresh.delenv("PYTEST_XDIST_WORKER", raising=False)
    fresh.setattr(process, "_port_range", lambda: range(20_000, 20_050))
    chosen = [process.free_port() for _ in range(20)]
    assert len(set(chosen)) == 20
