"""Sans-IO counters the Open decision and the daemon consult: connection counts per vhost,
user and host (``connections``), connection and message rate buckets (``rates``), bans
(``bans``) and the quarantine's denial counts (``quarantine``).

Per-frame limits (session window, message size, senders and receivers per session) are the
core's (``core/``); address rules are ``policy/addresses.py``.
"""
