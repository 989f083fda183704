"""Sans-IO per-connection proxy state machine: bytes and ``now`` in, commands out."""
