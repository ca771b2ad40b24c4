"""The EKS versions the chart is validated against: derived from AWS's release calendar and today's date, and
a failure when the calendar we carry is too old to name every version EKS supports today."""

from __future__ import annotations

import datetime
import os

import kubernetes_validate

from tests.kubernetes.chart import EKS_CALENDAR, EKS_CALENDAR_READ, EKS_VERSIONS, eks_versions

TODAY = datetime.datetime.now(datetime.timezone.utc).date()


def test_a_version_leaves_the_list_on_its_end_of_extended_support() -> None:
    # 1.31's extended support ends 2026-11-26 (the calendar's row): in the list the day before, out on the day.
    assert "1.31" in eks_versions(datetime.date(2026, 11, 25))
    assert "1.31" not in eks_versions(datetime.date(2026, 11, 26))
    assert eks_versions(EKS_CALENDAR_READ) == ("1.32", "1.33", "1.34", "1.35", "1.36")
    assert EKS_VERSIONS == eks_versions(TODAY)


def test_the_calendar_still_names_every_supported_version() -> None:
    """AWS offers at least three versions in standard support at any time ("Amazon EKS version FAQs"). When
    fewer than three of the calendar's versions are in standard support today, a newer version has probably
    been released that the calendar lacks. One missing release is tolerated (EKS releases about every four
    months), so a calendar read on EKS_CALENDAR_READ stays green until its second-newest version leaves
    standard support; with two missing, read AWS's calendar again and add them (docs/kubernetes.md)."""
    standard = [v for v, (end, _) in EKS_CALENDAR.items() if TODAY < end]
    assert len(standard) >= 2, (
        f"EKS_CALENDAR (read {EKS_CALENDAR_READ}) has only {standard} in standard support on {TODAY}: "
        "EKS has released a newer version; update tests/kubernetes/chart.py and docs/kubernetes.md from "
        "https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html#kubernetes-release-calendar")
    assert len(EKS_VERSIONS) >= 3


def test_kubernetes_validate_has_a_strict_schema_for_every_version() -> None:
    schemas = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    missing = [v for v in EKS_VERSIONS if not os.path.isdir(os.path.join(schemas, f"v{v}.0-local-strict"))]
    assert not missing, f"kubernetes-validate lacks strict schemas for {missing}: raise its pin in the Makefile"
