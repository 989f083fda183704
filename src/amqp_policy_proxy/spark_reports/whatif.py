"""Whether the executors can run the what-if replay with ``mapInArrow``. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon. The exact what-if itself is
:mod:`.replay`: it replays the log through the daemon's own decision code, with
``mapInArrow`` when the executors' Python has pyarrow (:func:`workers_have_pyarrow`) and the
RDD API otherwise (same answers, slower). Driver-side work: once per application, a probe
of the workers' pyarrow.
"""

from __future__ import annotations

import os
import shutil
import sys

from pyspark.sql import SparkSession

#: Per Spark application id: whether its Python workers can import pyarrow.
_WORKERS_PYARROW: dict[str, bool] = {}


def _import_pyarrow(_: object) -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def workers_have_pyarrow(spark: SparkSession) -> bool:
    """Return whether the executors' Python workers can import pyarrow (for ``mapInArrow``).

    The driver having pyarrow says nothing about the executors: under spark-submit their
    Python is ``PYSPARK_PYTHON`` on other machines. A local run whose workers run this very
    interpreter is answered without a job; otherwise one small job (one task per default
    parallelism slot, at most 64) imports pyarrow on the workers, once per application.

    Args:
        spark: the session whose executors run the replay.

    Returns:
        True when the driver and every probed worker import pyarrow; False sends the what-if
        replay down the RDD path (same answers, slower).
    """
    if not _import_pyarrow(None):
        return False
    sc = spark.sparkContext
    app = sc.applicationId
    known = _WORKERS_PYARROW.get(app)
    if known is None:
        if _workers_run_this_python(sc.master or "", sc.getConf().get("spark.pyspark.python")):
            known = True
        else:
            n = max(1, min(sc.defaultParallelism, 64))
            known = all(sc.parallelize(range(n), n).map(_import_pyarrow).collect())
        _WORKERS_PYARROW[app] = known
    return known


def _workers_run_this_python(master: str, conf_python: str | None) -> bool:
    # Local executors start PYSPARK_PYTHON (the conf wins over the environment); it is this
    # interpreter when it names the same file, compared unresolved: a venv's python is a
    # symlink to a base interpreter that does not have the venv's packages.
    if not master.startswith("local"):
        return False
    named = conf_python or os.environ.get("PYSPARK_PYTHON")
    found = shutil.which(named) if named else None
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)
