"""The tests' redis-server: the one `kvroute bench --tiers` starts too (loadgen/local_redis.py)."""

from loadgen.local_redis import RedisServer, find_redis_server, free_port

__all__ = ["RedisServer", "find_redis_server", "free_port"]
