"""The connection event log: the data contract between the daemon and the Spark reports."""
