"""The engine app's keys (aiohttp AppKey): what the server puts in its app for the handlers to find."""

from __future__ import annotations

from aiohttp import web

from kvroute.engine.config import EngineConfig
from kvroute.engine.service.drain import Drain
from kvroute.engine.service.event_publisher import RedisEventPublisher
from kvroute.engine.service.llm_engine import LLMEngine
from kvroute.engine.service.metrics import EngineMetrics
from kvroute.engine.service.registration import Registration
from kvroute.engine.service.serving import CompletionService
from kvroute.engine.service.zmq_publisher import ZmqEventPublisher
from kvroute.router.contract.tokenizer import Tokenizer

CONFIG = web.AppKey("config", EngineConfig)
ENGINE = web.AppKey("engine", LLMEngine)
DRAIN = web.AppKey("drain", Drain)
REGISTRATION = web.AppKey("registration", Registration)
SERVICE = web.AppKey("service", CompletionService)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
METRICS = web.AppKey("metrics", EngineMetrics)
ZMQ_PUBLISHER = web.AppKey("zmq_publisher", ZmqEventPublisher)
REDIS_PUBLISHER = web.AppKey("redis_publisher", RedisEventPublisher)
