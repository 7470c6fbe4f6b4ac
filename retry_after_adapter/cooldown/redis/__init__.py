"""The Redis store: what every worker of every host shares, one Lua script per
operation (Redis, Valkey, Redis Cluster).

- ``store``: :class:`RedisCooldownStore` and its listing (``status``, ``clear``);
- ``wire``: the scripts (the ``lua`` folder), their arguments and their replies, and
  the keys a scope's records live under;
- ``feed``: the change feed, a pub/sub channel that tells each process's near copy
  which scopes changed.
"""

from .store import RedisCooldownStore

__all__ = ["RedisCooldownStore"]
