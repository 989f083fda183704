"""amqp-policy-proxy: an AMQP 1.0 proxy that enforces Qpid Dispatch Router connection policy."""

__version__ = "0.1.0"
