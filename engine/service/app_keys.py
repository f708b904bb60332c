"""The engine app's keys (aiohttp AppKey): what the server puts in its app for the handlers to find."""

from __future__ import annotations

from aiohttp import web

from engine.core.config import EngineConfig
from engine.service.drain import Drain
from engine.service.event_publisher import RedisEventPublisher
from engine.service.llm_engine import LLMEngine
from engine.service.metrics import EngineMetrics
from engine.service.registration import Registration
from engine.service.serving import CompletionService
from engine.service.zmq_publisher import ZmqEventPublisher
from router.contract.tokenizer import Tokenizer

CONFIG = web.AppKey("config", EngineConfig)
ENGINE = web.AppKey("engine", LLMEngine)
DRAIN = web.AppKey("drain", Drain)
REGISTRATION = web.AppKey("registration", Registration)
SERVICE = web.AppKey("service", CompletionService)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
METRICS = web.AppKey("metrics", EngineMetrics)
ZMQ_PUBLISHER = web.AppKey("zmq_publisher", ZmqEventPublisher)
REDIS_PUBLISHER = web.AppKey("redis_publisher", RedisEventPublisher)
