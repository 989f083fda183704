"""Remote-host classification (QDR ``remoteHosts``) on netaddr (sans-IO)."""
