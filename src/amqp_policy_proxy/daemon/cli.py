"""The ``amqp-policy-proxy`` command line: ``run``, ``check``, ``explain``, ``report``, ``demo``.

Exit codes: 0 ok, 1 runtime failure, 2 bad configuration or usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime

from .. import __version__
from .config import (
    ConfigError,
    DaemonConfig,
    ListenerConfig,
    UpstreamConfig,
    load_daemon_config,
    parse_address,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="amqp-policy-proxy",
        description="AMQP 1.0 proxy enforcing Qpid Dispatch Router connection policy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the proxy")
    run.add_argument("--config", help="daemon config file (TOML)")
    run.add_argument("--listen", action="append", default=[], metavar="HOST:PORT")
    run.add_argument("--upstream", action="append", default=[], metavar="HOST:PORT")
    run.add_argument("--policy", metavar="PATH", help="policy file or directory")
    run.add_argument("--metrics", metavar="HOST:PORT")
    run.add_argument("--event-log", metavar="DIR")
    run.add_argument("--max-connections", type=int, metavar="N")
    run.add_argument("--default-vhost", metavar="NAME")

    check = sub.add_parser("check", help="validate a config or policy and print every issue")
    g = check.add_mutually_exclusive_group(required=True)
    g.add_argument("--config", help="daemon config file (TOML); its policy is checked too")
    g.add_argument("--policy", metavar="PATH")

    explain = sub.add_parser("explain", help="show the admission decision and the rule behind it")
    explain.add_argument("--policy", required=True, metavar="PATH")
    explain.add_argument("--user", required=True)
    explain.add_argument("--host", required=True, metavar="IP")
    explain.add_argument("--vhost")
    explain.add_argument("--address")
    explain.add_argument("--role", choices=["sender", "receiver"])
    explain.add_argument("--qos", type=int, choices=[0, 1, 2], default=1,
                         help="link QoS for topic permissions (0 settled, 1 at least once, "
                              "2 rcv-settle-mode second); default 1")
    explain.add_argument("--subject", metavar="DN",
                         help="TLS client certificate subject (RFC 4514) for DDS grants")
    explain.add_argument("--at", metavar="ISO8601",
                         help="time of the check for DDS validity windows (default now; "
                              "without a UTC offset: UTC)")
    explain.add_argument("--delivery-address", metavar="ADDRESS",
                         help="with --role receiver: a message's address, to show the "
                              "per-delivery decision and durable rewrite")
    explain.add_argument("--enable-vhost-name-patterns", action="store_true")
    explain.add_argument("--default-vhost", default="$default")

    report = sub.add_parser("report", help="Spark capacity reports from the event log")
    report.add_argument("kind", choices=["capacity"])
    report.add_argument("args", nargs=argparse.REMAINDER)

    demo = sub.add_parser("demo", help="embedded broker + proxy + demo clients")
    demo.add_argument("--keep-running", action="store_true",
                      help="leave the proxy and broker up after the demo clients finish")
    return parser


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    """Build the daemon config: the file (if any), then flags override it.

    Raises:
        ConfigError: invalid file or flags.
    """
    config = load_daemon_config(args.config) if args.config else DaemonConfig()
    issues: list[str] = []
    try:
        if args.listen:
            config = replace(config, listeners=tuple(
                ListenerConfig(parse_address(a)) for a in args.listen))
        if args.upstream:
            config = replace(config, upstreams=tuple(
                UpstreamConfig(parse_address(a)) for a in args.upstream))
        if args.metrics:
            config = replace(config, metrics_address=parse_address(args.metrics))
    except ValueError as exc:
        issues.append(f"command line: {exc}")
    if args.policy:
        config = replace(config, policy_path=args.policy)
    if args.event_log:
        config = replace(config, event_log_dir=args.event_log)
    settings = config.policy
    if args.max_connections is not None:
        if args.max_connections < 0:
            issues.append("command line: --max-connections must be >= 0")
        settings = replace(settings, max_connections=args.max_connections)
    if args.default_vhost is not None:
        settings = replace(settings, default_vhost=args.default_vhost)
    config = replace(config, policy=settings)
    if not config.listeners:
        issues.append("no listener: give --listen HOST:PORT or [[listener]] in the config")
    if not config.upstreams:
        issues.append("no upstream: give --upstream HOST:PORT or [[upstream]] in the config")
    if not config.policy_path:
        issues.append("no policy: give --policy PATH or [policy] path in the config")
    if issues:
        raise ConfigError(issues)
    return config


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: start the daemon and serve until SIGTERM/SIGINT."""
    from ..policy.errors import PolicyError
    from .app import run_daemon
    from .loop import run

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(f"error: {issue}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return run(run_daemon(config))
    except PolicyError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    except ConfigError as exc:  # TLS files that do not load
        for issue in exc.issues:
            print(f"error: {issue}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def cmd_check(args: argparse.Namespace) -> int:
    """``check``: load the config and/or policy, print every issue, exit 2 on errors."""
    from ..policy.errors import PolicyError, format_issues
    from ..policy.load import load_policy
    from ..policy.model import PolicySettings
    from .resolver import system_resolver

    settings = PolicySettings()
    policy_path = args.policy
    if args.config:
        try:
            config = load_daemon_config(args.config)
        except ConfigError as exc:
            for issue in exc.issues:
                print(f"error: {issue}")
            return EXIT_CONFIG
        settings = config.policy
        policy_path = config.policy_path
        if not policy_path:
            print(f"error: {args.config}: policy.path: missing")
            return EXIT_CONFIG
        from .app import Daemon

        try:  # ExecReload runs this before SIGHUP: TLS files are reloaded too
            Daemon(config).build_tls_contexts()
        except ConfigError as exc:
            for issue in exc.issues:
                print(f"error: {issue}")
            return EXIT_CONFIG
    try:
        policy = load_policy(policy_path, settings, resolver=system_resolver)
    except PolicyError as exc:
        print(format_issues(exc.issues))
        return EXIT_CONFIG
    except OSError as exc:
        print(f"error: {policy_path}: {exc.strerror or exc}")
        return EXIT_CONFIG
    if policy.warnings:
        print(format_issues(policy.warnings))
    names = ", ".join(sorted(policy.vhosts)) or "(none)"
    print(f"ok: {len(policy.vhosts)} vhost(s): {names}; digest {policy.digest}")
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    """``explain``: print the decision for a user/host (and address) and the rule behind it."""
    from ..policy.errors import PolicyError, format_issues
    from ..policy.explain import explain
    from ..policy.load import load_policy
    from ..policy.model import PolicySettings
    from .resolver import system_resolver

    settings = PolicySettings(enable_vhost_name_patterns=args.enable_vhost_name_patterns,
                              default_vhost=args.default_vhost)
    try:
        policy = load_policy(args.policy, settings, resolver=system_resolver)
    except PolicyError as exc:
        print(format_issues(exc.issues))
        return EXIT_CONFIG
    if (args.address is None) != (args.role is None):
        print("error: --address and --role go together")
        return EXIT_CONFIG
    if args.delivery_address is not None and args.role != "receiver":
        print("error: --delivery-address needs --address and --role receiver")
        return EXIT_CONFIG
    if args.at is None:
        wall_now = time.time()
    else:
        try:
            when = datetime.fromisoformat(args.at)
        except ValueError:
            print(f"error: --at {args.at!r} is not an ISO 8601 time (e.g. 2025-06-01T12:00:00Z)")
            return EXIT_CONFIG
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        wall_now = when.timestamp()
    result = explain(policy, user=args.user, host=args.host, vhost=args.vhost,
                     address=args.address, role=args.role, qos=args.qos, subject=args.subject,
                     wall_now=wall_now, delivery_address=args.delivery_address)
    print(result.render())
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """``report capacity ...``: delegate to the Spark job's own argument parser."""
    try:
        from ..spark_reports.jobs.capacity import main as capacity_main
    except ImportError as exc:
        print(f"error: Spark reports need the 'spark' extra (pyspark): {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return int(capacity_main(args.args))


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: embedded broker, the proxy with the example policy, demo clients."""
    from ..demo.run import main as demo_main

    return int(demo_main(keep_running=args.keep_running))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_CONFIG if exc.code not in (0, None) else EXIT_OK
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handlers = {
        "run": cmd_run,
        "check": cmd_check,
        "explain": cmd_explain,
        "report": cmd_report,
        "demo": cmd_demo,
    }
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
