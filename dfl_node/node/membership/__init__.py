"""Who is in the fleet: the peer table, SWIM's probes and piggybacked gossip, the Hello handshake, compatibility and
refusals at Hello, joins, and whether peers can dial this node (reach)."""
