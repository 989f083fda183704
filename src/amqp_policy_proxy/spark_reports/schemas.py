"""Explicit Spark schemas for the event log and the report tables. Imports pyspark.

Built from :mod:`amqp_policy_proxy.eventlog.schema`, the one module shared with the daemon, so
a field added there appears here without a second list to keep in step. Never infer the schema
from the data: inference reads every file twice and guesses types from whatever records happen
to be present (a week with no ``connection_closed`` would lose ``bytes_in``).

Types follow ``eventlog.schema`` literally: ``ts`` and ``opened_ts`` are read as strings and
converted by ``events.prepare_events`` (a ``try_cast``, measured faster than letting the JSON
reader parse timestamps; a value that does not parse becomes null and the record is ignored).
``dt`` and ``hour`` are the partition columns of the layout ``DIR/dt=YYYY-MM-DD/hour=HH/``; with a
flat directory of files they are simply null.
"""

from __future__ import annotations

from pyspark.sql import types as T

from amqp_policy_proxy.eventlog import schema as ev

#: Partition columns of the event log layout.
PARTITION_FIELDS: tuple[str, ...] = ("dt", "hour")

_TYPES: dict[str, T.DataType] = {
    "int": T.IntegerType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "array<string>": T.ArrayType(T.StringType()),
}


def spark_type(json_type: str) -> T.DataType:
    """Return the Spark type of an event log field type.

    Args:
        json_type: the type name from ``eventlog.schema`` (``int``, ``long``, ``double``,
            ``string``, ``array<string>``).

    Returns:
        The Spark ``DataType``.

    Raises:
        KeyError: for a type name this module does not know (a schema change to handle here).
    """
    return _TYPES[json_type]


def event_log_schema(partitions: bool = True) -> T.StructType:
    """Return the explicit read schema of the event log, version ``SCHEMA_VERSION``.

    Args:
        partitions: append the partition columns ``dt`` (date) and ``hour`` (int), so that
            partition discovery uses these types and filters on them prune directories.

    Returns:
        A ``StructType`` with every field of ``eventlog.schema.ALL_FIELDS`` in its order, all
        nullable.
    """
    fields = [T.StructField(n, spark_type(t), True) for n, t in ev.ALL_FIELDS.items()]
    if partitions:
        fields += [T.StructField("dt", T.DateType(), True),
                   T.StructField("hour", T.IntegerType(), True)]
    return T.StructType(fields)


def _struct(*cols: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t, True) for n, t in cols])


_S, _L, _I, _D, _TS = T.StringType(), T.LongType(), T.IntegerType(), T.DoubleType(), \
    T.TimestampType()

#: ``DIR/concurrency/``: one row per (scope, vhost, key).
CONCURRENCY = _struct(("scope", _S), ("vhost", _S), ("key", _S), ("peak", _L), ("p50", _L),
                      ("p95", _L), ("p99", _L), ("peak_ts", _TS))
#: ``DIR/headroom/``.
HEADROOM = _struct(("scope", _S), ("vhost", _S), ("key", _S), ("limit", _L), ("peak", _L),
                   ("utilisation", _D))
#: ``DIR/denials/``.
DENIALS = _struct(("vhost", _S), ("reason", _S), ("window_start", _TS), ("count", _L))
#: ``DIR/recommendations.csv``; ``change`` is ``lower``, ``raise``, ``keep`` or null (no
#: configured value): ``lower`` marks a recommendation below the configured limit.
RECOMMENDATIONS = _struct(("vhost", _S), ("group", _S), ("setting", _S), ("current", _L),
                          ("recommended", _L), ("change", _S))
#: ``DIR/whatif/``.
WHATIF = _struct(("vhost", _S), ("scope", _S), ("key", _S), ("would_deny", _L))
#: Extra table ``DIR/timeline/``: per vhost and group and grid bucket, the maximum concurrency.
TIMELINE = _struct(("scope", _S), ("vhost", _S), ("key", _S), ("window_start", _TS),
                   ("concurrent", _L))
#: Extra table ``DIR/top_denied/``.
TOP_DENIED = _struct(("scope", _S), ("vhost", _S), ("key", _S), ("count", _L),
                     ("top_reason", _S))
#: Extra table ``DIR/traffic/``.
TRAFFIC = _struct(("vhost", _S), ("group", _S), ("connections", _L), ("bytes_in", _L),
                  ("bytes_out", _L), ("transfers_in", _L), ("transfers_out", _L),
                  ("duration_p50", _D), ("duration_p95", _D), ("duration_p99", _D),
                  ("duration_max", _D))
#: Extra table ``DIR/durations/``: connection duration histogram.
DURATIONS = _struct(("vhost", _S), ("le_seconds", _D), ("label", _S), ("count", _L))
#: Extra table ``DIR/churn/``: opens and closes per vhost and minute.
CHURN = _struct(("vhost", _S), ("window_start", _TS), ("opens", _L), ("closes", _L))
#: ``DIR/admin_actions.csv``: the operators' changes through the admin interface.
ADMIN_ACTIONS = _struct(("ts", _TS), ("action", _S), ("vhost", _S), ("selector", _S),
                        ("targets", T.ArrayType(_S)), ("count", _L), ("result", _S),
                        ("uid", _L), ("pid", _L), ("peer", _S), ("description", _S))
#: The ``admin`` JSON column of prepared events (an ``admin_action`` record's own fields).
ADMIN_JSON = T.StructType([T.StructField(n, spark_type(t), True)
                           for n, t in ev.EVENT_FIELDS[ev.ADMIN_ACTION].items()])
