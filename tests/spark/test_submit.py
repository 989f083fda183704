"""The capacity job as ``spark-submit`` runs it on a cluster: a real standalone Spark cluster.

A master and a worker (two cores) are started on 127.0.0.1 from pyspark's own ``spark-class``;
the job file is submitted in client mode straight from the checkout, as docs/spark-reports.md
tells operators to. The executors' Python is the system interpreter, which does not have this
project installed: the what-if replay can only run there if the job shipped its package to
the executors itself. The answers must be those of the in-process run (test_job).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.test_job import check_csv_answers, end_to_end_argv
from tests.support.ports import free_port

JOB = (Path(__file__).resolve().parents[2] / "src" / "amqp_policy_proxy" / "spark_reports"
       / "jobs" / "capacity.py")
#: The executors' interpreter: same Python version as the driver (PySpark requires it), but
#: without the project (or pyarrow) installed.
BARE_PYTHON = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}",
                           path="/usr/bin")
#: Servers started here stop by themselves after this long, whatever happens to the test.
SERVER_LIFETIME_S = 300
#: JVM options of every JVM here: a run this short spends more CPU compiling with C2 than
#: the compiled code saves.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _bare_python_lacks_project() -> bool:
    if BARE_PYTHON is None:
        return False
    probe = subprocess.run([BARE_PYTHON, "-c", "import amqp_policy_proxy"], capture_output=True,
                           env={"PATH": "/usr/bin:/bin"})
    return probe.returncode != 0


pytestmark = pytest.mark.skipif(
    not _bare_python_lacks_project(),
    reason=f"needs /usr/bin/python{sys.version_info.major}.{sys.version_info.minor} "
           "without amqp_policy_proxy installed")


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
        return json.load(r)


class Cluster:
    """A running standalone cluster: its master URL and its web UI's JSON port."""

    def __init__(self, url: str, ui_port: int, logs: Path) -> None:
        self.url, self.ui_port, self.logs = url, ui_port, logs

    def state(self) -> dict:
        """The master's JSON status (workers, active and completed applications)."""
        return _master_state(self.ui_port)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and one worker (2 cores, 1 GiB) on 127.0.0.1, up until the module ends."""
    home = _spark_home()
    tmp = tmp_path_factory.mktemp("standalone")
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(tmp / "logs"), SPARK_WORKER_DIR=str(tmp / "work"),
               SPARK_DAEMON_MEMORY="256m", SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS)
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(home / "bin" / "spark-class")
    procs = []
    with open(tmp / "master.log", "wb") as mlog, open(tmp / "worker.log", "wb") as wlog:
        procs.append(subprocess.Popen(
            ["timeout", str(SERVER_LIFETIME_S), spark_class,
             "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui_port)],
            env=env, stdout=mlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            ["timeout", str(SERVER_LIFETIME_S), spark_class,
             "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", "2", "--memory", "1g", "--webui-port", str(worker_ui),
             "--work-dir", str(tmp / "work"), url],
            env=env, stdout=wlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                workers = _master_state(ui_port).get("workers", [])
                if any(w.get("state") == "ALIVE" for w in workers):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail("standalone cluster did not come up:\n"
                            + (tmp / "master.log").read_text()[-2000:]
                            + (tmp / "worker.log").read_text()[-2000:])
            time.sleep(0.5)
        yield Cluster(url, ui_port, tmp)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_spark_submit_client_mode_on_a_standalone_cluster(cluster, fixtures, tmp_path):
    """spark-submit of the job file: exit 0, the work ran on the cluster, same answers."""
    argv, out = end_to_end_argv(tmp_path, fixtures)
    env = dict(os.environ, SPARK_HOME=str(_spark_home()), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=BARE_PYTHON, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    cmd = [str(_spark_home() / "bin" / "spark-submit"), "--master", cluster.url,
           "--deploy-mode", "client", "--driver-memory", "1g", "--executor-memory", "512m",
           "--driver-java-options", JAVA_OPTS,
           "--conf", f"spark.executor.extraJavaOptions={JAVA_OPTS}",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
           str(JOB), *argv]
    run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=240)
    # Spark logs every stage at INFO on stderr: show the rest (the job's error, tracebacks).
    (tmp_path / "submit.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, "\n".join(
        line for line in run.stderr.splitlines() if " INFO " not in line)[-6000:]

    # spark-submit passes the Python driver's output (its log) on to its own stdout.
    assert f"capacity report written to {out}" in run.stdout
    assert "WARNING amqp_policy_proxy.spark_reports.capacity: 3 records of the event log " \
        "skipped" in run.stdout
    apps = cluster.state()["completedapps"]
    assert [a["name"] for a in apps] == ["amqp-policy-proxy capacity report"]
    # Executors ran on the worker (the app's work directory holds their logs).
    assert list((cluster.logs / "work").glob("app-*/*/stderr")), "no executor ran"

    check_csv_answers(out)
    assert (out / "report.html").is_file() and not (out / "_work").exists()
