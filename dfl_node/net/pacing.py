"""A node's caps on its model transfers (``--max-upload``, ``--max-download``): every chunk it sends waits on its
upload bucket and every chunk it receives on its download bucket (:class:`~dfl_node.rates.TokenBucket`), whichever
peer the transfer is with — a receiver that reads slower slows its sender, through gRPC's flow control. Membership
and round RPCs are not held: they are small, and a cap that delayed a probe would have the node suspected."""

from __future__ import annotations

from dataclasses import dataclass

from dfl_node.peering.resume import MIN_CHUNK
from dfl_node.rates import TokenBucket

EVEN_S = 0.25  # a capped transfer's chunks take at most this long at the cap: the pace stays even


@dataclass(frozen=True)
class Pacing:
    """The caps of one node (None: none that way)."""

    upload: TokenBucket | None = None
    download: TokenBucket | None = None

    @classmethod
    def of(cls, max_upload: float, max_download: float) -> Pacing:
        """Caps in bytes/s (0: none)."""
        return cls(TokenBucket(max_upload) if max_upload else None, TokenBucket(max_download) if max_download else None)

    def chunk(self, most: int) -> int:
        """The chunk a capped node sends (at most ``most`` bytes): one its upload cap lets through in ``EVEN_S``."""
        if self.upload is None:
            return most
        return max(MIN_CHUNK, min(most, int(self.upload.rate * EVEN_S)))

    async def sent(self, nbytes: int) -> None:
        """Until ``nbytes`` more may leave (at once without an upload cap)."""
        if self.upload is not None:
            await self.upload.take(nbytes)

    async def received(self, nbytes: int) -> None:
        """Until ``nbytes`` more may be read (at once without a download cap)."""
        if self.download is not None:
            await self.download.take(nbytes)


NO_PACING = Pacing()
