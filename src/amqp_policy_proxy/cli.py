"""The top of the house: the ``amqp-policy-proxy`` command line: ``run``, ``check``, ``explain``,
``report``, ``demo``, and the operator's commands on a running daemon (through its admin
socket, :mod:`.admin_client`): ``connections list|close``, ``vhost pause|resume``, ``status``.

Exit codes: 0 ok (``explain``: allowed), 1 runtime failure (admin commands: the daemon cannot
be reached, or no connection has the given id), 2 bad configuration or usage (also: a listener,
the metrics port or the admin socket cannot bind; a request the daemon refuses), 3
``explain``: denied.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from . import __version__
from .daemon.settings import (
    DEFAULT_ADMIN_SOCKET,
    LEDGER_FAILURE_MODES,
    LOG_FORMATS,
    LOG_LEVELS,
    ConfigError,
    DaemonConfig,
    parse_address,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_DENY = 3
"""``explain``: the decision is a denial."""


def _address_arg(text: str) -> str:
    """argparse type: a valid ``HOST:PORT`` (kept as text; the schema parses it again)."""
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _network_arg(text: str) -> str:
    """argparse type: a CIDR network or one address (kept as text; the schema parses it)."""
    try:
        ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _ip_arg(text: str) -> str:
    """argparse type: an IP address as the socket layer reports it (``[v6]``, zone allowed)."""
    bare = text.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IP address (give the client's numeric address, e.g. "
            "10.1.2.3 or ::1)") from None
    return text


def _rate_arg(text: str) -> float:
    """argparse type: closes per second, a positive number."""
    try:
        rate = float(text)
    except ValueError:
        rate = float("nan")
    if not rate > 0 or rate == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of closes per "
                                         "second")
    return rate


#: Seconds between two progress reads of a paced close.
PROGRESS_INTERVAL = 0.25


def _logging_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--log-level``/``--log-format``, accepted before and after the subcommand."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default=default,
                        help="debug, info, warning or error (default: [logging] level, "
                             "else info)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=default,
                        help="text (one escaped line per record) or json (one object per "
                             "line); default: [logging] format, else text")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="amqp-policy-proxy",
        description="AMQP 1.0 proxy enforcing Qpid Dispatch Router connection policy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _logging_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, **kwargs)
        _logging_options(sp, top=False)
        return sp

    run = add("run", help="run the proxy",
              description="Run the proxy until SIGTERM/SIGINT (drain) and reload on SIGHUP. "
                          "Flags override the config file. Exit 2: invalid configuration or "
                          "an address that cannot be bound.")
    run.add_argument("--config", help="daemon config file (TOML)")
    run.add_argument("--listen", action="append", default=[], metavar="HOST:PORT",
                     type=_address_arg, help="replaces every [[listener]]")
    run.add_argument("--proxy-protocol-from", action="append", default=[], metavar="CIDR",
                     type=_network_arg,
                     help="a load balancer's network (repeatable): every --listen then "
                          "requires a PROXY protocol header from it and refuses other peers")
    run.add_argument("--upstream", action="append", default=[], metavar="HOST:PORT",
                     type=_address_arg, help="replaces every [[upstream]]")
    run.add_argument("--policy", metavar="PATH", help="policy file or directory")
    run.add_argument("--metrics", metavar="HOST:PORT", type=_address_arg)
    run.add_argument("--event-log", metavar="DIR")
    run.add_argument("--max-connections", type=int, metavar="N")
    run.add_argument("--default-vhost", metavar="NAME")
    run.add_argument("--admin-socket", metavar="PATH",
                     help="serve the admin interface on this unix socket ([admin] socket)")
    run.add_argument("--ledger", metavar="URL",
                     help="share connection counts with the fleet in Redis: redis://HOST:PORT/DB,"
                          " rediss://..., unix:///path/redis.sock, or auto (a private "
                          "redis-server); replaces [ledger] url")
    run.add_argument("--proxy-id", metavar="ID",
                     help="this proxy's name in the ledger (default: host name and first "
                          "listener port)")
    run.add_argument("--ledger-failure-mode", choices=LEDGER_FAILURE_MODES,
                     help="what admission does while the ledger is unreachable or slow")
    run.add_argument("--workers", type=int, metavar="N",
                     help="N processes sharing the listeners (N > 1 needs a ledger)")

    check = add("check", help="validate a config or policy and print every issue",
                description="Validate the daemon config (types, keys, the files it names) "
                            "or a policy and print every issue. Exit 0 valid, 2 invalid.")
    g = check.add_mutually_exclusive_group(required=True)
    g.add_argument("--config", help="daemon config file (TOML); its policy is checked too")
    g.add_argument("--policy", metavar="PATH")
    check.add_argument("--allow-empty", action="store_true",
                       help="accept a policy that defines no vhost (everyone is denied)")
    check.add_argument("--as-user", metavar="NAME",
                       help="also check that user NAME can read (and write) every file the "
                            "config or policy names, as the service will; default with "
                            "--config when run as root: the service user amqp-policy-proxy, "
                            "if it exists (--as-user root: as root only)")
    check.add_argument("--no-bind-test", action="store_true",
                       help="do not try to bind the listener and metrics addresses (the "
                            "unit's ExecReload: the running daemon holds them)")

    explain = add("explain", help="show the admission decision and the rule behind it",
                  description="Explain whether USER connecting from HOST (and, with --address "
                              "and --role, its link) is allowed, naming the rule of each step. "
                              "Exit 0: allowed, 3: denied, 2: usage or policy error.")
    pg = explain.add_mutually_exclusive_group(required=True)
    pg.add_argument("--policy", metavar="PATH", help="policy file or directory")
    pg.add_argument("--config", metavar="FILE",
                    help="daemon config (TOML): its [policy] path and settings are used")
    explain.add_argument("--user", help="the authenticated user (required unless --token)")
    explain.add_argument("--token", metavar="FILE",
                         help="a JWT (OAuth 2.0 access token) in FILE ('-': stdin): show its "
                              "claims, the [token_auth] mapping to the user and groups, the "
                              "token's validity and the decision for its identity (needs "
                              "--config with [token_auth])")
    explain.add_argument("--host", required=True, metavar="IP", type=_ip_arg,
                         help="the client's IP address")
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
    explain.add_argument("--enable-vhost-name-patterns", action="store_true", default=None,
                         help="default: the config's, else off")
    explain.add_argument("--default-vhost", help="default: the config's, else $default")
    explain.add_argument("--json", action="store_true",
                         help="print the decision as one JSON object")

    report = add("report", help="Spark capacity reports from the event log; compact: its "
                                "closed hours to Parquet")
    report.add_argument("kind", choices=["capacity", "compact"])
    report.add_argument("args", nargs=argparse.REMAINDER)

    def admin_options(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--admin-socket", metavar="PATH",
                        help="the daemon's admin socket (default: [admin] socket of --config, "
                             f"else {DEFAULT_ADMIN_SOCKET})")
        sp.add_argument("--config", metavar="FILE",
                        help="daemon config whose [admin] socket to use (default: "
                             "/etc/amqp-policy-proxy/config.toml when readable)")
        sp.add_argument("--json", action="store_true", help="print one JSON document")

    conns = add("connections", help="list or close the live connections of a running daemon")
    conns_sub = conns.add_subparsers(dest="action", required=True)
    clist = conns_sub.add_parser(
        "list", help="the admitted connections",
        description="List the admitted connections: id, vhost, group, user, remote host (and "
                    "balancer), listener, upstream, TLS subject, age, bytes and transfers each "
                    "way, sessions, senders, receivers, last activity. Filters combine.")
    for key in ("vhost", "user", "host", "group"):
        clist.add_argument(f"--{key}", metavar=key[0].upper())
    admin_options(clist)
    cclose = conns_sub.add_parser(
        "close", help="close connections (Close amqp:connection:forced with the reason)",
        description="Close the admitted connections with this id, user, vhost or client host: "
                    "each client gets Close amqp:connection:forced with the reason, the router "
                    "side is closed cleanly and the counts are released. Prints how many were "
                    "closed. Exit 1 when no connection has the given --id.")
    which = cclose.add_mutually_exclusive_group(required=True)
    which.add_argument("--id")
    which.add_argument("--user", metavar="U")
    which.add_argument("--vhost", metavar="V")
    which.add_argument("--host", metavar="H", help="the client's IP address")
    cclose.add_argument("--reason", metavar="TEXT",
                        help="the Close description the clients get (default: closed by an "
                             "operator)")
    cclose.add_argument("--rate", metavar="N", type=_rate_arg,
                        help="close N connections per second, each at a random moment of its "
                             "1/N slot, instead of all at once (a mass disconnect must not "
                             "become a reconnect storm); progress on the terminal")
    admin_options(cclose)

    ban = add("ban", help="refuse a user or a client address at the Open and close its "
                          "connections",
              description="Ban a user (by the name the upstream authenticates; padding is "
                          "trimmed) or a client address or CIDR network: new connections "
                          "are refused at the Open with QDR's connection denial (reason "
                          "banned) and the open ones are closed at once (Close "
                          "amqp:connection:forced with the reason). With a [ledger] the ban "
                          "is the whole fleet's and outlives a restart. Without --for it "
                          "lasts until unban.")
    ban_sub = ban.add_subparsers(dest="kind", required=True)
    for kind, metavar, text in (("user", "NAME", "the user name"),
                                ("host", "ADDRESS|CIDR", "an IP address or a CIDR network")):
        bp = ban_sub.add_parser(kind, help=f"ban {text}")
        bp.add_argument("value", metavar=metavar, help=text)
        bp.add_argument("--for", dest="duration", metavar="DURATION",
                        help="how long: seconds, or e.g. 90s, 15m, 1h30m, 7d (default: until "
                             "unban)")
        bp.add_argument("--reason", metavar="TEXT",
                        help="why (in bans list, the audit trail and the Close the clients "
                             "get)")
        admin_options(bp)
    unban = add("unban", help="lift a ban (an operator's or a quarantine's)")
    unban_sub = unban.add_subparsers(dest="kind", required=True)
    for kind, metavar in (("user", "NAME"), ("host", "ADDRESS|CIDR")):
        up = unban_sub.add_parser(kind, help=f"lift the ban of a {kind}")
        up.add_argument("value", metavar=metavar)
        admin_options(up)
    bans = add("bans", help="the bans in force")
    bans_sub = bans.add_subparsers(dest="action", required=True)
    blist = bans_sub.add_parser("list", help="the bans in force: kind, value, source, expiry, "
                                             "reason",
                                description="List the bans in force (an operator's or a "
                                            "quarantine's), users first.")
    admin_options(blist)

    vhost = add("vhost", help="pause or resume new connections to a vhost")
    vhost_sub = vhost.add_subparsers(dest="action", required=True)
    for action, text in (("pause", "deny new connections to V (QDR's connection denial, "
                                   "reason vhost_paused); existing ones stay. Lasts until "
                                   "resume or a restart (a reload keeps it)"),
                         ("resume", "let new connections to V be decided by the policy again")):
        vp = vhost_sub.add_parser(action, help=text, description=text[:1].upper() + text[1:]
                                  + ".")
        vp.add_argument("name", metavar="V", help="the vhost name")
        admin_options(vp)

    status = add("status", help="version, uptime, policy, listeners, upstreams, counts",
                 description="The running daemon at a glance: version, uptime, policy digest "
                             "and load time, listeners, upstreams with health, ledger mode, "
                             "connections per vhost, paused vhosts, workers.")
    admin_options(status)

    demo = add("demo", help="embedded broker + proxy + demo clients")
    demo.add_argument("--keep-running", action="store_true",
                      help="leave the proxy and broker up until Ctrl-C after the demo clients "
                           "finish, to connect your own client")
    return parser


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    """Build the daemon config: the file (if any) with the flags laid over it, one schema.

    Raises:
        ConfigError: invalid file or flags (every problem).
    """
    overrides: dict[str, tuple[str, Any]] = {}
    if args.proxy_protocol_from and not args.listen:
        raise ConfigError(["command line: --proxy-protocol-from: applies to the --listen "
                           "addresses; give --listen too, or set proxy_protocol and "
                           "proxy_protocol_from in the [[listener]] tables"])
    if args.listen:
        proxied = ({"proxy_protocol": True, "proxy_protocol_from": args.proxy_protocol_from}
                   if args.proxy_protocol_from else {})
        overrides["listener"] = ("--listen", [{"address": a, **proxied} for a in args.listen])
    if args.upstream:
        overrides["upstream"] = ("--upstream", [{"address": a} for a in args.upstream])
    if args.policy:
        overrides["policy.path"] = ("--policy", os.path.abspath(args.policy))
    if args.metrics:
        overrides["metrics.address"] = ("--metrics", args.metrics)
    if args.event_log:
        overrides["event_log.directory"] = ("--event-log", os.path.abspath(args.event_log))
    if args.max_connections is not None:
        overrides["policy.max_connections"] = ("--max-connections", args.max_connections)
    if args.default_vhost is not None:
        overrides["policy.default_vhost"] = ("--default-vhost", args.default_vhost)
    if args.admin_socket:
        overrides["admin.socket"] = ("--admin-socket", os.path.abspath(args.admin_socket))
    if args.ledger is not None:
        overrides["ledger.url"] = ("--ledger", args.ledger)
    if args.proxy_id is not None:
        overrides["ledger.proxy_id"] = ("--proxy-id", args.proxy_id)
    if args.ledger_failure_mode is not None:
        overrides["ledger.failure_mode"] = ("--ledger-failure-mode", args.ledger_failure_mode)
    if args.workers is not None:
        overrides["daemon.workers"] = ("--workers", args.workers)
    from .daemon.config import config_from_sources  # the schema: pydantic

    return config_from_sources(args.config, overrides=overrides)


def _print_issues(issues: list[str], file: Any = None) -> None:
    for issue in issues:
        print(f"error: {issue}", file=file or sys.stdout)


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: start the daemon and serve until SIGTERM/SIGINT."""
    from .daemon.config_child import validate_apart
    from .daemon.loop import run
    from .daemon.run import run_daemon
    from .daemon.workers import run_supervisor, worker_config
    from .policy.errors import PolicyError

    try:
        # in a child: the daemon never loads the schema library (about 10 MiB at rest)
        config = validate_apart(config_from_args, args)
    except ConfigError as exc:
        _print_issues(exc.issues, sys.stderr)
        return EXIT_CONFIG
    _setup_logging(args, config)
    as_worker = worker_config(config)
    try:
        if as_worker is None and config.workers > 1:
            # the parent: workers run this same command line (see daemon/workers.py)
            return run(run_supervisor(config, list(args.argv)))
        return run(run_daemon(as_worker or config))
    except PolicyError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    except ConfigError as exc:  # TLS files that do not load, an address that cannot bind
        _print_issues(exc.issues, sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def cmd_check(args: argparse.Namespace) -> int:
    """``check``: load the config and/or policy, print every issue, exit 2 on errors.

    With a config: the schema and the files it names (as ``run`` checks them), the TLS files,
    the policy, and a bind test of the listener and metrics addresses (unless
    ``--no-bind-test``). Run as root, or with ``--as-user NAME``, the file checks run first in a
    child process that has become the service user (daemon/preflight.py), so a file only root
    can read is an error here, not at the first start.
    """
    from .daemon.preflight import run_as, service_user

    try:  # by default only a daemon config is checked as the service user
        user = service_user(args.as_user) if args.config or args.as_user else None
    except LookupError as exc:
        print(f"error: --as-user: {exc}")
        return EXIT_CONFIG
    if user is None:
        return _check(args, bind_test=not args.no_bind_test)
    try:
        status = run_as(user, lambda: _check(args, bind_test=False, report=False))
    except PermissionError as exc:
        print(f"error: --as-user: {exc.strerror}")
        return EXIT_CONFIG
    if status != EXIT_OK:
        print(f"error: the checks above ran as user {user.pw_name}, as the service will "
              f"(--as-user); give that user access to the files named")
        return status
    return _check(args, bind_test=not args.no_bind_test, checked_as=user.pw_name)


def _check(args: argparse.Namespace, *, bind_test: bool, report: bool = True,
           checked_as: str | None = None) -> int:
    """The checks of ``check`` as this process's user: print every issue, and with ``report``
    the ``ok:`` line (naming ``checked_as`` when the files were also checked as that user) and
    the policy's warnings and shadow lines. Returns the exit status (0 or 2)."""
    from .daemon.config import load_daemon_config
    from .daemon.preflight import bind_test as try_binds
    from .policy.errors import PolicyError, format_issues
    from .policy.load import load_policy
    from .policy.model import PolicySettings
    from .resolver import system_resolver

    settings = PolicySettings()
    policy_path = args.policy
    allow_empty = args.allow_empty
    if args.config:
        try:  # the same schema and file checks as `run`
            config = load_daemon_config(args.config)
        except ConfigError as exc:
            _print_issues(exc.issues)
            return EXIT_CONFIG
        settings = config.policy
        policy_path = config.policy_path
        allow_empty = allow_empty or config.allow_empty_policy
        from .daemon.tls import build_contexts

        try:  # ExecReload runs this before SIGHUP: TLS files are reloaded too
            build_contexts(config)
        except ConfigError as exc:
            _print_issues(exc.issues)
            return EXIT_CONFIG
        if bind_test and (problems := try_binds(config)):
            _print_issues(problems)
            return EXIT_CONFIG
    try:
        policy = load_policy(policy_path, settings, resolver=system_resolver,
                             allow_empty=allow_empty)
    except PolicyError as exc:
        print(format_issues(exc.issues))
        return EXIT_CONFIG
    except OSError as exc:
        print(f"error: {exc.filename or policy_path}: {exc.strerror or exc}")
        return EXIT_CONFIG
    if not report:
        return EXIT_OK
    if policy.warnings:
        print(format_issues(policy.warnings))
    names = ", ".join(sorted(policy.vhosts)) or "(none)"
    as_user = f"; files checked as user {checked_as}" if checked_as else ""
    print(f"ok: {len(policy.vhosts)} vhost(s): {names}; digest {policy.digest}{as_user}")
    for line in shadow_lines(policy):
        print(line)
    return EXIT_OK


def shadow_lines(policy: Any) -> list[str]:
    """What ``check`` says about shadow mode: one line per vhost with anything in shadow
    (its would-be denials are allowed, logged ``SHADOW DENY`` and counted)."""
    out = []
    for vhost, enforcement, groups in policy.shadowed():
        shown = ", ".join(f"'{g}'" for g in groups) or "none"
        out.append(f"shadow: vhost '{vhost}' (enforcement {enforcement}); groups in shadow: "
                   f"{shown}")
    return out


def cmd_explain(args: argparse.Namespace) -> int:
    """``explain``: print the decision for a user/host (and address) and the rule behind it."""
    from .daemon.config import load_daemon_config
    from .policy.errors import PolicyError, format_issues
    from .policy.explain import explain
    from .policy.load import load_policy
    from .policy.model import PolicySettings
    from .resolver import system_resolver

    settings = PolicySettings()
    policy_path = args.policy
    allow_empty = True  # explaining a deny-everything policy is still useful
    if args.config:
        try:  # TLS and event-log files are not needed to explain a decision
            config = load_daemon_config(args.config, check_files=False)
        except ConfigError as exc:
            _print_issues(exc.issues)
            return EXIT_CONFIG
        settings, policy_path = config.policy, config.policy_path
    if args.enable_vhost_name_patterns is not None:
        settings = replace(settings, enable_vhost_name_patterns=True)
    if args.default_vhost is not None:
        settings = replace(settings, default_vhost=args.default_vhost)
    try:
        policy = load_policy(policy_path, settings, resolver=system_resolver,
                             allow_empty=allow_empty)
    except PolicyError as exc:
        print(format_issues(exc.issues))
        return EXIT_CONFIG
    if (args.address is None) != (args.role is None):
        print("error: --address and --role go together")
        return EXIT_CONFIG
    if args.token is not None:
        return _explain_token(args, policy, config if args.config else None)
    if args.user is None:
        print("error: --user (or --token FILE) is required")
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
    if args.json:
        print(json.dumps({
            "allowed": result.allowed, "reason": result.reason, "steps": list(result.lines),
            "user": args.user, "host": args.host, "vhost": args.vhost,
            "address": args.address, "role": args.role, "policy_digest": policy.digest,
            "enforcement": str(result.enforcement),
        }, indent=2))
    else:
        print(result.render())
    return EXIT_OK if result.allowed else EXIT_DENY


def _explain_token(args: argparse.Namespace, policy: Any, config: Any) -> int:
    """``explain --token FILE``: the token's header and claims, whether the proxy accepts it
    now (against the ``[token_auth]`` JWKS: the file, or one fetch of the URL), the user and
    groups its claims give, then the decision for that identity as ``explain --user`` shows
    it (with the token's group where a ``[[token_auth.groups]]`` rule decides the vhost).
    Exit 0 accepted and allowed, 3 refused or denied, 2 usage or configuration error."""
    import pathlib

    from .core.tokenauth import token_open_decision
    from .policy.decisions import OpenAllowed
    from .policy.explain import explain
    from .tokens.claims import identity_from_token, mapping_issues
    from .tokens.errors import TokenRejected
    from .tokens.jwks import JwksError, parse_jwks, read_jwks_file
    from .tokens.validate import unverified_header, validate_token

    auth = None if config is None else config.token_auth
    if auth is None:
        print("error: --token needs --config FILE with a [token_auth] table")
        return EXIT_CONFIG
    try:
        raw = (sys.stdin.read() if args.token == "-"
               else pathlib.Path(args.token).read_text(encoding="ascii")).strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        print(f"error: --token {args.token}: cannot read: {why}")
        return EXIT_CONFIG
    try:
        if auth.jwks_file is not None:
            keys = read_jwks_file(auth.jwks_file, algorithms=auth.algorithms,
                                  max_bytes=auth.jwks_max_bytes)
        else:
            import urllib.request

            with urllib.request.urlopen(auth.jwks_url,  # noqa: S310 (https, or loopback http)
                                        timeout=auth.jwks_fetch_timeout_seconds) as response:
                keys = parse_jwks(response.read(auth.jwks_max_bytes + 1),
                                  algorithms=auth.algorithms, max_bytes=auth.jwks_max_bytes,
                                  source=auth.jwks_url)
    except (JwksError, OSError) as exc:
        print(f"error: the [token_auth] JWKS: {exc}")
        return EXIT_CONFIG
    out: dict[str, Any] = {"policy_digest": policy.digest,
                           "token_authority": auth.token_authority}
    lines: list[str] = []
    try:
        header = dict(unverified_header(raw, auth.max_token_bytes))
    except TokenRejected as exc:
        header = {}
        lines.append(f"token: REFUSED ({exc.reason.value}): {exc.detail}")
        out.update(accepted=False, reason=exc.reason.value)
    if header:
        lines.append(f"header: alg {header.get('alg')!s}, kid {header.get('kid')!s}")
        out["header"] = header
    verdict = None
    if "accepted" not in out:
        try:
            verdict = validate_token(raw, auth, keys, time.time())
        except TokenRejected as exc:
            lines.append(f"token: REFUSED ({exc.reason.value}): {exc.detail}")
            out.update(accepted=False, reason=exc.reason.value)
    if verdict is None:
        out["lines"] = lines
        print(json.dumps(out, indent=2, default=str) if args.json else "\n".join(lines))
        return EXIT_DENY
    claims = dict(verdict.claims)
    identity = identity_from_token(verdict, auth)
    left = verdict.expires_at - time.time()
    lines.append(f"token: accepted (issuer {verdict.issuer}, {verdict.algorithm}, key "
                 f"{verdict.kid}); expires in {left:.0f} s (+{auth.expiry_grace_seconds:g} s "
                 "grace): the connection is closed then unless renewed")
    lines.append("claims: " + json.dumps(claims, sort_keys=True, default=str))
    lines.append(f"user: '{identity.user}' (claim {auth.identity_claim})")
    lines.append("scopes: " + (", ".join(sorted(identity.scopes)) or "(none)")
                 + (f" (prefix '{auth.scope_prefix}' removed)" if auth.scope_prefix else ""))
    for vhost_name, group in identity.groups.items():
        lines.append(f"mapping: vhost '{vhost_name}' -> group '{group}' (scope "
                     f"'{identity.matched[vhost_name]}')")
    if not identity.groups:
        lines.append("mapping: no [[token_auth.groups]] rule matches: the policy's own users "
                     "lists, '*' and $default apply")
    lines.extend(f"mapping issue: {issue}" for issue in mapping_issues(auth, policy))
    decision = token_open_decision(policy, hostname=args.vhost, identity=identity,
                                   remote_host=args.host)
    explained = policy
    if isinstance(decision, OpenAllowed) and decision.vhost.hostname in identity.groups:
        # the token's group, as if the policy listed the user in it (for the link checks)
        vhost = replace(decision.vhost, user_groups={
            **decision.vhost.user_groups, identity.user: decision.group.name})
        explained = replace(policy, vhosts={**policy.vhosts, vhost.hostname: vhost})
    result = explain(explained, user=identity.user, host=args.host, vhost=args.vhost,
                     address=args.address, role=args.role, qos=args.qos, subject=args.subject,
                     wall_now=time.time(), delivery_address=args.delivery_address)
    lines.append(f"open: {'ALLOW' if isinstance(decision, OpenAllowed) else 'DENY'}: "
                 f"{decision.rule}")
    allowed = isinstance(decision, OpenAllowed) and result.allowed
    rendered, steps = result.render(), list(result.lines)
    if explained is not policy and decision.vhost is not None:  # where the group came from
        listed = f"group: user '{identity.user}' is listed in the users of group"
        vhost_name = decision.vhost.hostname
        mapped = (f"group: '{identity.groups[vhost_name]}' from the token (scope "
                  f"'{identity.matched[vhost_name]}', [[token_auth.groups]])")
        rendered = "\n".join(mapped if line.startswith(listed) else line
                              for line in rendered.split("\n"))
        steps = [mapped if line.startswith(listed) else line for line in steps]
    if args.json:
        out.update(accepted=True, user=identity.user, expires_at=verdict.expires_at,
                   claims=claims, scopes=sorted(identity.scopes), groups=dict(identity.groups),
                   allowed=allowed, open_rule=decision.rule, steps=steps, lines=lines)
        print(json.dumps(out, indent=2, default=str))
    else:
        print("\n".join(lines))
        print(rendered)
    return EXIT_OK if allowed else EXIT_DENY


def cmd_report(args: argparse.Namespace) -> int:
    """``report capacity ...`` / ``report compact ...``: delegate to the Spark job's own
    argument parser."""
    try:
        if args.kind == "compact":
            from .spark_reports.jobs.compact import main as job_main
        else:
            from .spark_reports.jobs.capacity import main as job_main
    except ImportError as exc:
        print(f"error: Spark reports need the 'spark' extra (pyspark): {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return int(job_main(args.args))


def _admin(args: argparse.Namespace) -> Any:
    """The admin client for ``args`` (raises ConfigError for a bad ``--config``)."""
    from .admin_client import AdminClient, socket_path

    return AdminClient(socket_path(args.admin_socket, args.config))


def _admin_call(args: argparse.Namespace, call: Any) -> tuple[int, Any]:
    """Run ``call(client)``; ``(exit code, answer or None)``, errors printed to stderr."""
    from .admin_client import AdminClientError

    try:
        return EXIT_OK, call(_admin(args))
    except ConfigError as exc:
        _print_issues(exc.issues, sys.stderr)
        return EXIT_CONFIG, None
    except AdminClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        refused = exc.status is not None and exc.status not in (404,) and exc.status < 500
        return (EXIT_CONFIG if refused else EXIT_FAILURE), None


def cmd_connections(args: argparse.Namespace) -> int:
    """``connections list|close``: through the running daemon's admin socket."""
    if args.action == "close" and args.rate is not None:
        return _close_paced(args)
    if args.action == "list":
        code, rows = _admin_call(args, lambda c: c.connections(
            vhost=args.vhost, user=args.user, host=args.host, group=args.group))
        if rows is not None:
            print(json.dumps(rows, indent=2) if args.json else render_connections(rows))
        return code
    code, result = _admin_call(args, lambda c: c.close(
        reason=args.reason, id=args.id, user=args.user, vhost=args.vhost, host=args.host))
    if result is not None:
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            n = result["closed"]
            ids = ", ".join(result["ids"])
            print(f"closed {n} connection{'' if n == 1 else 's'}" + (f": {ids}" if ids else ""))
    return code


def _close_paced(args: argparse.Namespace) -> int:
    """``connections close ... --rate N``: start the paced close, then follow its progress
    (a line rewritten in place on a terminal, else one line a second) until it is done."""
    code, result = _admin_call(args, lambda c: c.close(
        reason=args.reason, rate=args.rate, id=args.id, user=args.user, vhost=args.vhost,
        host=args.host))
    if result is None:
        return code
    if args.json:
        print(json.dumps(result, indent=2))
        return code
    n, job = result["closing"], result["job"]
    print(f"closing {n} connection{'' if n == 1 else 's'} at {args.rate:g}/s (about "
          f"{result['eta_seconds']:.1f} s), job {job}", file=sys.stderr)
    tty = sys.stderr.isatty()
    last_line = -1.0
    began = time.monotonic()
    while True:
        code, progress = _admin_call(args, lambda c: c.close_progress(job))
        if progress is None:
            return code
        line = (f"{progress['closed']}/{progress['total']} closed"
                + (f", {progress['skipped']} gone meanwhile" if progress["skipped"] else "")
                + f", {progress['eta_seconds']:.1f} s left")
        now = time.monotonic()
        if tty:
            print(f"\r{line}\x1b[K", end="", file=sys.stderr, flush=True)
        elif now - last_line >= 1.0 or progress["done"]:
            print(line, file=sys.stderr)
            last_line = now
        if progress["done"]:
            break
        time.sleep(PROGRESS_INTERVAL)
    if tty:
        print(file=sys.stderr)
    print(f"closed {progress['closed']} connection{'' if progress['closed'] == 1 else 's'} in "
          f"{progress['elapsed_seconds']:.1f} s at {args.rate:g}/s"
          + (f" ({progress['skipped']} had gone meanwhile)" if progress["skipped"] else "")
          + f" (the command waited {time.monotonic() - began:.1f} s)")
    return EXIT_OK


def cmd_ban(args: argparse.Namespace) -> int:
    """``ban user|host V [--for D] [--reason T]``: through the daemon's admin socket."""
    code, result = _admin_call(args, lambda c: c.ban(args.kind, args.value,
                                                     args.duration, args.reason))
    if result is not None:
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            closed = result["closed"]
            until = (f"until {result['expires_at']}" if result["expires_at"]
                     else "until unban")
            fleet = {True: "; shared with the fleet", False: "; NOT yet shared with the fleet "
                     "(the store is unreachable: it will be when it is back)",
                     None: ""}[result["stored"]]
            print(f"{result['kind']} {result['value']} banned {until}"
                  + (" (replacing the ban in force)" if result["replaced"] else "")
                  + f"; {len(closed)} connection{'' if len(closed) == 1 else 's'} closed"
                  + (f": {', '.join(closed)}" if closed else "") + fleet)
    return code


def cmd_unban(args: argparse.Namespace) -> int:
    """``unban user|host V``: through the daemon's admin socket."""
    code, result = _admin_call(args, lambda c: c.unban(args.kind, args.value))
    if result is not None:
        if args.json:
            print(json.dumps(result, indent=2))
        elif result["lifted"]:
            print(f"{result['kind']} {result['value']} unbanned")
        else:
            print(f"{result['kind']} {result['value']} was not banned")
    return code


def cmd_bans(args: argparse.Namespace) -> int:
    """``bans list``: through the daemon's admin socket."""
    code, rows = _admin_call(args, lambda c: c.bans())
    if rows is not None:
        print(json.dumps(rows, indent=2) if args.json else render_bans(rows))
    return code


def render_bans(rows: list[dict[str, Any]]) -> str:
    """``bans list`` as a table (one line per ban, then a count)."""
    table = [["KIND", "VALUE", "SOURCE", "EXPIRES", "LEFT", "REASON"]]
    for row in rows:
        left = row.get("expires_in_seconds")
        table.append([row["kind"], row["value"], row["source"], row["expires_at"] or "never",
                      "-" if left is None else _duration(float(left)), row["reason"]])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in table]
    lines.append(f"{len(rows)} ban{'' if len(rows) == 1 else 's'}")
    return "\n".join(lines)


def cmd_vhost(args: argparse.Namespace) -> int:
    """``vhost pause|resume V``: through the running daemon's admin socket."""
    code, result = _admin_call(
        args, lambda c: c.pause(args.name) if args.action == "pause" else c.resume(args.name))
    if result is not None:
        if args.json:
            print(json.dumps(result, indent=2))
        elif result["paused"]:
            again = "" if result["changed"] else " (it was paused already)"
            print(f"vhost '{result['vhost']}' paused{again}: new connections are denied, "
                  "existing ones stay; until resume or a restart")
        else:
            again = "" if result["changed"] else " (it was not paused)"
            print(f"vhost '{result['vhost']}' resumed{again}")
    return code


def cmd_status(args: argparse.Namespace) -> int:
    """``status``: through the running daemon's admin socket."""
    code, status = _admin_call(args, lambda c: c.status())
    if status is not None:
        print(json.dumps(status, indent=2) if args.json else render_status(status))
    return code


#: Columns of ``connections list`` (key, heading), in order.
_COLUMNS = (
    ("id", "ID"), ("vhost", "VHOST"), ("group", "GROUP"), ("user", "USER"),
    ("remote_host", "REMOTE_HOST"), ("balancer", "BALANCER"), ("listener", "LISTENER"),
    ("upstream", "UPSTREAM"), ("age_seconds", "AGE"), ("bytes_in", "BYTES_IN"),
    ("bytes_out", "BYTES_OUT"), ("transfers_in", "XFERS_IN"), ("transfers_out", "XFERS_OUT"),
    ("sessions", "SESS"), ("senders", "SND"), ("receivers", "RCV"),
    ("idle_seconds", "IDLE"), ("tls_subject", "TLS_SUBJECT"),
)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def render_connections(rows: list[dict[str, Any]]) -> str:
    """``connections list`` as a table (one line per connection, then a count)."""
    table = [[heading for _, heading in _COLUMNS]]
    for row in rows:
        cells = []
        for key, _ in _COLUMNS:
            value = row.get(key)
            if key in ("age_seconds", "idle_seconds") and value is not None:
                cells.append(_duration(float(value)))
            else:
                cells.append("-" if value is None or value == "" else str(value))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in table]
    lines.append(f"{len(rows)} connection{'' if len(rows) == 1 else 's'}")
    return "\n".join(lines)


def _render_last_reload(last: dict[str, Any] | None) -> str:
    """The ``last reload`` line of ``status``."""
    if last is None:
        return "last reload: none since the start"
    if last["result"] == "ok":
        return f"last reload: ok at {last['at']}"
    return (f"last reload: FAILED at {last['at']}, the policy above still runs: "
            + "; ".join(last["issues"]))


def render_status(status: dict[str, Any]) -> str:
    """``status`` for a person (``--json`` prints the whole document)."""
    policy = status["policy"]
    shadow = "; ".join(
        f"vhost '{s['vhost']}' ({s['enforcement']}), groups in shadow: "
        f"{', '.join(s['groups']) or 'none'}" for s in policy["shadow"]) or "none"
    listeners = ", ".join(f"{x['address']}{' (amqps)' if x['tls'] else ''}"
                          for x in status["listeners"]) or "none"
    upstreams = "; ".join(
        f"{u['address']}{' (tls)' if u['tls'] else ''} "
        + ("not probed yet" if u.get("state") == "unknown"
           else "up" if u["healthy"]
           else f"DOWN ({u['consecutive_failures']} failed probes or connects)")
        for u in status["upstreams"])
    counts = status["connections"]
    per_vhost = ", ".join(f"{v} {n}" for v, n in sorted(counts["per_vhost"].items())) or "none"
    ledger = status["ledger"]
    return "\n".join([
        f"amqp-policy-proxy {status['version']} (pid {status['pid']}), up "
        f"{_duration(status['uptime_seconds'])} since {status['started_at']}"
        + ("; DRAINING" if status["draining"] else "") + f"; workers {status['workers']}",
        f"policy {policy['digest']}: {len(policy['vhosts'])} vhost(s), loaded "
        f"{policy['loaded_at']}",
        _render_last_reload(policy.get("last_reload")),
        f"shadow mode: {shadow}",
        f"listeners: {listeners}",
        f"upstreams: {upstreams}",
        f"ledger: {ledger['mode']}; {counts['admitted']} admitted, {ledger['transports']} "
        f"transports of max {ledger['max_connections']}",
        f"connections per vhost: {per_vhost}",
        f"paused vhosts: {', '.join(status['paused_vhosts']) or 'none'}",
        *(f"worker {w['worker']} (pid {w['pid']}): {w['connections']} admitted, ledger "
          f"{w['ledger_mode']}, up {_duration(w['uptime_seconds'] or 0)}"
          for w in status.get("per_worker", ())),
    ])


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo``: embedded broker, the proxy with the example policy, demo clients."""
    from .demo.run import main as demo_main

    return int(demo_main(keep_running=args.keep_running))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_CONFIG if exc.code not in (0, None) else EXIT_OK
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.command != "run":  # `run` sets up logging once its config is read
        _setup_logging(args, None)
    handlers = {
        "run": cmd_run,
        "check": cmd_check,
        "explain": cmd_explain,
        "report": cmd_report,
        "demo": cmd_demo,
        "connections": cmd_connections,
        "vhost": cmd_vhost,
        "ban": cmd_ban,
        "unban": cmd_unban,
        "bans": cmd_bans,
        "status": cmd_status,
    }
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return EXIT_FAILURE


def _setup_logging(args: argparse.Namespace, config: DaemonConfig | None) -> None:
    """Flags first, then the config's ``[logging]``, then info/text."""
    from .daemon.logs import configure_logging

    level = args.log_level or (config.log_level if config else "info")
    fmt = args.log_format or (config.log_format if config else "text")
    configure_logging(level, fmt)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
