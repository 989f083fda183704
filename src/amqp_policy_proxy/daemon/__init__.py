"""The only I/O package: process, sockets, signals, clocks, systemd."""
