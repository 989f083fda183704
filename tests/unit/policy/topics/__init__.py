"""Unit tests; a package so module basenames cannot clash with other test directories."""
