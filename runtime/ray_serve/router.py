"""`PrefixAffinityRouter`: Serve's request router for the server replicas, cache-aware.

A request goes to the replica that served the longest prefix of its prompt (that
replica's radix cache likely still holds the prefix's KV), unless that replica has more
than `imbalance` requests in flight beyond the least busy candidate: then, as for a prompt
no replica has seen, to the least busy one. The prompt is the `prefix_key` of the
`ForwardRequest` (the request body's prompt or messages). State is per router (each
ingress replica routes with its own map). Each routing pass serves the request it was
started for (no FIFO hand-off to another request, which would place that one by this
one's prompt).
"""

from __future__ import annotations

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from runtime.ray_serve.prefix_map import PrefixMap


def _prompt(pending: PendingRequest | None) -> str:
    if pending is None or not pending.args:
        return ""
    return getattr(pending.args[0], "prefix_key", "") or ""


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, imbalance: int = 16, block_chars: int = 64,
                         capacity: int = 65536) -> None:
        self._imbalance = imbalance
        self._prefixes = PrefixMap(block_chars, capacity)

    def _load(self, replica: RunningReplica) -> int:
        return self.replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        """Ranks: the replicas holding the longest prefix (when not too busy), then all
        candidates (Serve takes the least busy of a rank that accepts the request)."""
        if not candidate_replicas:
            return []
        text = _prompt(pending_request)
        depth, holders = self._prefixes.match(
            text, (r.replica_id.unique_id for r in candidate_replicas))
        if depth:
            best = [r for r in candidate_replicas if r.replica_id.unique_id in holders]
            least = min(self._load(r) for r in candidate_replicas)
            if min(self._load(r) for r in best) - least <= self._imbalance:
                return [best, candidate_replicas]
        return [candidate_replicas]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        text = _prompt(pending_request)
        if text:
            self._prefixes.insert(text, replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.curr_replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self._prefixes.remove(replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._prefixes.remove(replica_id.unique_id)
