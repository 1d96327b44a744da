"""`gpufleet check` reports the Nomad TLS material that does not renew, 30 days ahead, with the
controlled clock of tests/clusters/test_dated_toil.py (GPUFLEET_TODAY). Clusters are copies of
the example written to a temporary directory."""

from __future__ import annotations

import re

import pytest

import clusters
from review.checks import expiry_warnings


def warnings_for(write_cluster, mutate, today, monkeypatch) -> list[str]:
    path = write_cluster("prod-nomad", mutate)
    monkeypatch.setenv("GPUFLEET_TODAY", today)
    return expiry_warnings((clusters.load(path),), path.parent)


def dated(certificates: str, expires: str):
    def mutate(d: dict) -> None:
        d["nomad"]["tls"] = {"certificates": certificates, "static_expires": expires}
    return mutate


@pytest.mark.parametrize(("today", "warned"), [("2027-10-20", False), ("2027-10-22", True), ("2027-12-01", True)])
def test_static_certificates_are_reported_30_days_before_they_expire(write_cluster, monkeypatch, today, warned):
    lines = warnings_for(write_cluster, dated("static", "2027-11-20"), today, monkeypatch)
    assert bool(lines) is warned
    if warned:
        (line,) = lines
        assert re.match(r"warning: .*prod-nomad\.yaml:\d+: nomad\.tls\.static_expires: the agents', operators' and Prometheus' Nomad"
                        r" certificates (expire in|expired) \d+ day\(s\)", line), line
        assert "set certificates: vault-pki" in line and "\n" not in line


def test_vault_pki_agents_renew_so_only_the_bootstrap_certificates_are_reported(write_cluster, monkeypatch):
    (line,) = warnings_for(write_cluster, dated("vault-pki", "2027-11-20"), "2027-11-01", monkeypatch)
    assert "the operators' and Prometheus' Nomad certificates (agents renew theirs) expire in 19 day(s)" in line


def test_an_unrecorded_expiry_is_reported_every_time(write_cluster, monkeypatch):
    def unrecorded(d: dict) -> None:
        d["nomad"].pop("tls", None)
    (line,) = warnings_for(write_cluster, unrecorded, "2026-12-04", monkeypatch)
    assert re.search(r"prod-nomad\.yaml:\d+: nomad: the agents'.* do not renew and the file does not say when they expire", line), line
    assert "set nomad.tls.static_expires" in line
