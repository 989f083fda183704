"""PySpark capacity reports over the event log. Never imported by the daemon."""
