"""The daemon's shell: the process, its sockets, signals, clocks and systemd; the asyncio relay
that feeds the sans-IO core (``core/``) bytes and ``now`` and carries out its commands.

Not the only package that does I/O: ``eventlog/`` writes files, ``metrics/`` serves and reads
Prometheus text, ``fleet/`` talks to Redis and ``resolver.py`` to DNS; each of them is called
from here, never from the core.
"""
