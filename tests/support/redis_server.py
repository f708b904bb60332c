"""The tests' redis-server: the one `kvroute chaos` and `kvroute bench --tiers` start too (loadgen/redis_server.py)."""

from kvroute.loadgen.redis_server import RedisServer, find_redis_server, free_port

__all__ = ["RedisServer", "find_redis_server", "free_port"]
