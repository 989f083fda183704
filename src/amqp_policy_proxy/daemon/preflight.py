"""What ``check`` tries beyond the schema: the addresses ``run`` would bind, and the files as
the service user would read them.

* :func:`bind_test` binds (and at once closes) every listener address and the metrics address
  of a config, with the socket options ``run`` uses, so that a port another process holds is
  found by ``check``, not by the first start. ``ExecReload`` of the unit passes
  ``--no-bind-test``: while the daemon runs, its own listeners hold those ports.
* :func:`service_user` and :func:`run_as` run a check in a child process that has become
  another user (its uid, gid and supplementary groups), so that ``check`` run as root reports
  a file the service user cannot read (a 0600 policy file, a 0700 directory) as the daemon will
  find it. The child drops privileges with ``setgroups``/``setgid``/``setuid`` and then runs the
  same checks, so its answers are the kernel's, ACLs included.

This is daemon-side code (it touches sockets and processes); the CLI's ``check`` calls it.
"""

from __future__ import annotations

import errno
import io
import os
import pwd
import socket
import sys
from collections.abc import Callable

from .settings import BindError, DaemonConfig

__all__ = ["SERVICE_USER", "bind_test", "run_as", "service_user"]

SERVICE_USER = "amqp-policy-proxy"
"""The user the packaged unit runs as (``User=``); ``check`` run as root checks as this user."""


def bind_test(config: DaemonConfig) -> list[str]:
    """Bind every listener address and the metrics address of ``config``, then close them.

    Every address the host name resolves to is tried (as ``run`` listens on each), with
    ``SO_REUSEADDR`` (and ``IPV6_V6ONLY`` for IPv6) as ``run`` sets them. Port 0 (any free
    port) is not tried.

    Returns:
        One ``file: key: cannot listen on ADDRESS: reason`` line per address that cannot be
        bound (e.g. "Address already in use", "Cannot assign requested address",
        "Permission denied" for a port below 1024 without ``CAP_NET_BIND_SERVICE``); ``[]``
        when all bind.
    """
    targets = [(f"listener[{i}].address", lc.address) for i, lc in enumerate(config.listeners)]
    if config.metrics_address is not None:
        targets.append(("metrics.address", config.metrics_address))
    problems = []
    for key, address in targets:
        if address.port == 0:
            continue
        try:
            _try_bind(address.host, address.port)
        except OSError as exc:
            problems.append(BindError.line(config.source, key, address, exc))
    return problems


def _try_bind(host: str, port: int) -> None:
    """Bind (and close) every address of ``host``:``port``.

    Raises:
        OSError: the first that cannot be bound (``socket.gaierror`` when ``host`` does not
            resolve).
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    for family, kind, proto, _name, sockaddr in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)


def service_user(requested: str | None) -> pwd.struct_passwd | None:
    """The user ``check`` should check the files as.

    Args:
        requested: ``--as-user``: a user name, or None for the default.

    Returns:
        The named user; by default (None) :data:`SERVICE_USER` when this process runs as root
        and that user exists, else None (check as whoever runs ``check``). None also when the
        requested user is this process's own.

    Raises:
        LookupError: ``requested`` names no user (``no such user 'NAME'``).
    """
    if requested is None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(SERVICE_USER)
        except KeyError:
            return None
    try:
        entry = pwd.getpwnam(requested)
    except KeyError:
        raise LookupError(f"no such user {requested!r}") from None
    return None if entry.pw_uid == os.geteuid() else entry


def run_as(user: pwd.struct_passwd, check: Callable[[], int]) -> int:
    """Run ``check`` in a child process that has become ``user``; return its exit status.

    The child takes ``user``'s uid, primary gid and supplementary groups (``initgroups``
    semantics) before calling ``check``. What ``check`` prints on stdout comes back through a
    pipe and is printed on this process's ``sys.stdout`` (so it is captured wherever this
    process's output is). An exception in the child is printed as one ``error:`` line and gives
    exit status 2.

    Raises:
        PermissionError: this process may not change to ``user`` (not root).
    """
    if os.geteuid() != 0:
        raise PermissionError(errno.EPERM, f"only root can check as user {user.pw_name!r}")
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the user, check, exit without running parent cleanups
        status = 2
        os.close(read_fd)
        out = io.TextIOWrapper(os.fdopen(write_fd, "wb"), encoding="utf-8", errors="replace")
        sys.stdout = out
        try:
            groups = os.getgrouplist(user.pw_name, user.pw_gid)
            os.setgroups(groups)
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            status = check()
        except BaseException as exc:  # noqa: BLE001 - the child must always exit here
            print(f"error: checking as user {user.pw_name!r}: {exc}", file=out)
        finally:
            out.flush()
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        printed = pipe.read().decode("utf-8", errors="replace")
    _, wait_status = os.waitpid(pid, 0)
    sys.stdout.write(printed)
    return os.waitstatus_to_exitcode(wait_status) if os.WIFEXITED(wait_status) else 2
