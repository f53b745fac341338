"""Algorithms as transport-agnostic protocols of roles (design §1): plan a round, what a sender
transmits, what a receiver does with it, and what goes back. No I/O in this package."""
