"""spark_reports.common: the report window and its grid."""

from __future__ import annotations

import pytest

from tests.spark.golden import window


def test_report_window():
    w = window("10:00:30", "10:05")
    assert (w.buckets, w.last_bucket - w.first_bucket) == (5, 4)  # partial first bucket counts
    with pytest.raises(ValueError):
        window("10:05", "10:00")
