"""Prometheus export: an observer of core events plus scrape-time collectors."""
