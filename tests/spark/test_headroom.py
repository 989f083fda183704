"""spark_reports.headroom: overlap.jsonl's per-proxy peaks against golden.POLICY's limits."""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

from amqp_policy_proxy.spark_reports import schemas
from amqp_policy_proxy.spark_reports.concurrency import limit_peaks
from amqp_policy_proxy.spark_reports.events import key_groups
from amqp_policy_proxy.spark_reports.headroom import headroom, recommendations
from tests.spark.golden import POLICY, policy_tables


def test_headroom_and_recommendations(spark, overlap, tmp_path):
    """Limits: v1 4, per user 3, per host 2; g2 overrides per user 1 and per host 4.

    Headroom: v1 3/4; alice 2/3, bob 1/3 (g1: vhost values); carol 1/1 (g2); host .1 2/2
    (alice, bob: g1); host .2 2/2 (carol g2 allows 4, alice g1 allows 2: the smaller).
    Recommendations, ceil(peak x 1.25): maxConnections ceil(3.75) = 4; per user for the
    vhost from alice's 2 -> 3, for g2 from carol's 1 -> 2; per host for the vhost from the
    g1 hosts (.1 and .2, both 2) -> 3, for g2 from .2 (2) -> 3.
    """
    _, sweep, conc, _ = overlap
    lt = policy_tables(spark, tmp_path, POLICY)
    peaks = limit_peaks(conc)
    pairs = key_groups(sweep.keys)
    hr = headroom(peaks, pairs, lt)
    assertSchemaEqual(hr.schema, schemas.HEADROOM)
    assertDataFrameEqual(hr, [
        Row(scope="vhost", vhost="v1", key="v1", limit=4, peak=3, utilisation=0.75),
        Row(scope="user", vhost="v1", key="alice", limit=3, peak=2, utilisation=2 / 3),
        Row(scope="user", vhost="v1", key="bob", limit=3, peak=1, utilisation=1 / 3),
        Row(scope="user", vhost="v1", key="carol", limit=1, peak=1, utilisation=1.0),
        Row(scope="remote_host", vhost="v1", key="10.0.0.1", limit=2, peak=2, utilisation=1.0),
        Row(scope="remote_host", vhost="v1", key="10.0.0.2", limit=2, peak=2, utilisation=1.0),
    ])
    rec = recommendations(peaks, pairs, lt)
    assertSchemaEqual(rec.schema, schemas.RECOMMENDATIONS)
    assertDataFrameEqual(rec, [
        Row(vhost="v1", group="", setting="maxConnections", current=4, recommended=4,
            change="keep"),
        Row(vhost="v1", group="", setting="maxConnectionsPerUser", current=3, recommended=3,
            change="keep"),
        Row(vhost="v1", group="g2", setting="maxConnectionsPerUser", current=1, recommended=2,
            change="raise"),
        Row(vhost="v1", group="", setting="maxConnectionsPerHost", current=2, recommended=3,
            change="raise"),
        # g2's per-host limit 4 is more than its peak needs: marked as lowering the limit
        Row(vhost="v1", group="g2", setting="maxConnectionsPerHost", current=4, recommended=3,
            change="lower"),
    ])
    # Without a policy: vhost rows only, no current value, so no change either.
    assertDataFrameEqual(recommendations(peaks, pairs, None), [
        Row(vhost="v1", group="", setting=s, current=None, recommended=r, change=None)
        for s, r in (("maxConnections", 4), ("maxConnectionsPerUser", 3),
                     ("maxConnectionsPerHost", 3))])
