"""Testbeds that run real ``dfl-node`` daemons side by side (network namespaces, no Docker needed)."""
