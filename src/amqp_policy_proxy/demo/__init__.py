"""The embedded demo: an AMQP 1.0 broker on proton's reactor, the proxy and demo clients."""
