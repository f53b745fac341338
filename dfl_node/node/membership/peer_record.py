"""One peer as the peer table (:mod:`.peers`) holds it: the record of what its Hellos said and whether it lives, apart
from the table that keeps, confirms and forgets them, so that what the node's views (``/status``) and the
membership read of a peer does not bring the table's bookkeeping with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dfl_node.algorithms.plan import NodeProfile
from dfl_node.peering.messages import Progress
from dfl_node.records.peers import PeerInfo


@dataclass
class Peer:
    id: str
    address: str
    http_port: int
    boot_id: str
    algorithm: str
    last_seen: float  # wall clock, for people
    heard_at: float  # the loop's clock: how long it has been silent
    status_url: str = ""
    model: str = ""
    num_samples: int = 0
    work_s: float = 0.0  # seconds of computation its last role took, as it says (0: unknown)
    relay: str = ""  # the member it is reached through, as it says ("": directly)
    direct: bool = False  # a member dialed it back, as it says: it may dial others back, and relay them
    alive: bool = True
    progress: Progress | None = None  # where it stood at its last reply to our Hello
    holding_since: float | None = None  # wall clock: since when its replies say it holds the token (its epoch)

    def info(self) -> PeerInfo:
        return PeerInfo(id=self.id, address=self.address, http_port=self.http_port or None,
                        status_url=self.status_url or None, last_seen=self.last_seen, alive=self.alive,
                        algorithm=self.algorithm, model=self.model or None, work_s=self.work_s or None,
                        relay=self.relay or None)

    def profile(self) -> NodeProfile:
        return NodeProfile(self.id, self.model, self.num_samples)
