"""Counting and checking of connection, session, link, frame and address limits (sans-IO)."""
