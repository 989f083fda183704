"""spark_reports.schemas: the explicit event-log schema follows the daemon's contract."""

from __future__ import annotations

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports import schemas


def test_event_log_schema_follows_the_contract():
    s = schemas.event_log_schema()
    assert s.fieldNames() == [*ev.ALL_FIELDS, "dt", "hour"]
    assert s["ts"].dataType.typeName() == "string"
    assert s["bytes_in"].dataType.typeName() == "long"
    assert s["dt"].dataType.typeName() == "date"
    assert schemas.event_log_schema(partitions=False).fieldNames() == list(ev.ALL_FIELDS)
