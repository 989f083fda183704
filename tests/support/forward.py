"""A loopback TCP forwarder that connects onward from a chosen source address.

proton clients cannot bind their local address; to show ``remoteHosts`` rules with clients on
127.0.0.2 or ::1, the test client connects to this forwarder, which opens the onward connection
bound to the requested source address and relays bytes both ways.
"""

from __future__ import annotations

import socket
import threading


class SourceBoundForwarder:
    """Listen on 127.0.0.1:port; forward each connection to ``target`` from ``source`` IP."""

    def __init__(self, target: tuple[str, int], source: str) -> None:
        """Create the forwarder (not started)."""
        self.target = target
        self.source = source
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(64)
        self.port = self._lsock.getsockname()[1]
        self._stop = False
        self._threads: list[threading.Thread] = []

    def start(self) -> SourceBoundForwarder:
        """Start accepting in a daemon thread."""
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            family = socket.AF_INET6 if ":" in self.source else socket.AF_INET
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.bind((self.source, 0))
                upstream.connect(self.target)
            except OSError:
                client.close()
                upstream.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                t.start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Stop accepting (existing pipes end with their sockets)."""
        self._stop = True
        self._lsock.close()
