"""OpenAI completion and chat-completion handling on the engine: validate, queue, stream back."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid

import msgspec
from aiohttp import web

from kvroute.engine.core.work import SamplingParams
from kvroute.engine.service.llm_engine import LLMEngine, Output, RequestHandle
from kvroute.engine.service.logprob_format import LogprobFormatter
from kvroute.engine.service.openai_format import ResponseFormat, usage
from kvroute.engine.service.output import OutputProcessor
from kvroute.engine.service.unsupported import refuse_unsupported
from kvroute.engine.transfer.kv_transfer import TransferHandle, tail_hash
from kvroute.router.contract.errors import BadRequest, ContextTooLong, Forbidden, KVRouteError, NotFound, Overloaded
from kvroute.router.contract.http import (
    SSE_DONE,
    json_response,
    parse_json,
    prepare_client,
    read_body,
    sse_error,
    sse_line,
    write_client,
)
from kvroute.router.contract.limits import Limits, check_prompt_chars, check_token_ids
from kvroute.router.contract.openai_request import CompletionRequest, parse_request
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tokenize_pool import TokenizePool
from kvroute.router.contract.tokenizer import Tokenizer

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
INSTANCE_HEADER = "x-kvroute-instance"

log = logging.getLogger(__name__)


class CompletionService:
    def __init__(self, engine: LLMEngine, tokenizer: Tokenizer, model_name: str,
                 adapters: tuple[str, ...] = ()) -> None:
        config = engine.config
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.adapters = adapters  # LoRA adapters served (--lora-modules): a request's `model` may name one
        self.max_model_len = engine.runner.info.max_model_len
        self.vocab_size = engine.runner.info.vocab_size
        limits = config.server.limits
        self.limits = Limits.derive(self.max_model_len, self.vocab_size, limits.max_prompt_chars, limits.max_body_bytes)
        self.pool = TokenizePool(limits.tokenize_workers, limits.tokenize_queue)
        self.pool_tokens = engine.block_manager.num_blocks * engine.block_manager.block_size
        self.headers = {INSTANCE_HEADER: engine.config.server.instance}

    def check_model(self, model: str | None) -> str | None:
        """The LoRA adapter `model` names (None: the base model, or no model given); 404 for another name."""
        if model is None or model == self.model_name:
            return None
        if model in self.adapters:
            return model
        served = f"{self.model_name!r}" + (f" and its adapters {', '.join(map(repr, self.adapters))}"
                                            if self.adapters else "")
        raise NotFound(f"model {model!r} does not exist; this engine serves {served}",
                       param="model", code="model_not_found")

    async def prompt_ids(self, req: CompletionRequest) -> list[int]:
        """Token ids, checked against the limits before and after tokenizing (off the loop when long)."""
        chars = check_prompt_chars(req, self.limits)
        try:
            if req.prompt_ids is not None:  # given, or a router's tokenization forwarded with the request
                ids = list(req.prompt_ids)
            elif req.messages is not None:
                ids = await self.pool.run(self.tokenizer.encode_chat, list(req.messages), chars=chars)
            else:
                ids = await self.pool.run(self.tokenizer.encode, req.prompt, chars=chars)
        except ValueError as e:
            raise BadRequest(str(e), param="messages" if req.messages is not None else "prompt") from None
        check_token_ids(ids, self.limits)
        return ids

    def sampling(self, req: CompletionRequest, num_prompt: int) -> SamplingParams:
        limit = self.max_model_len
        if num_prompt >= limit:
            raise ContextTooLong(f"prompt has {num_prompt} tokens; this model's context is {limit} tokens",
                                 param="prompt")
        if num_prompt + 1 > self.pool_tokens:
            raise ContextTooLong(f"prompt has {num_prompt} tokens; the KV cache pool holds {self.pool_tokens}",
                                 param="prompt")
        max_tokens = req.max_tokens
        if max_tokens is None:
            max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if req.kind == "completion" else limit - num_prompt
        if num_prompt + max_tokens > limit:
            raise ContextTooLong(
                f"prompt ({num_prompt} tokens) plus max_tokens ({max_tokens}) exceeds this model's context "
                f"of {limit} tokens", param="max_tokens")
        bad = [t for t, _ in req.logit_bias if t >= self.vocab_size]
        if bad:
            raise BadRequest(f"logit_bias token id {bad[0]} is out of the vocabulary (size {self.vocab_size})",
                             param="logit_bias")
        return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                              ignore_eos=req.ignore_eos, stop=req.stop, top_k=req.top_k, min_p=req.min_p,
                              presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                              repetition_penalty=req.repetition_penalty, logit_bias=req.logit_bias,
                              logprobs=req.logprobs)

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        if self.engine.draining:
            raise Overloaded("this engine is draining and takes no new requests; retry on another instance",
                             retry_after=1, code="draining")
        body = parse_json(await read_body(request, self.limits.max_body_bytes))
        refuse_unsupported(body)
        req = parse_request(body, kind)
        adapter = self.check_model(req.model)
        kv = req.kv_transfer_params or {}
        transfer = self._authorize_transfer(kv, request.remote)  # before any work: 403 for clients
        prompt_ids = await self.prompt_ids(req)
        sampling = self.sampling(req, len(prompt_ids))
        request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        seed = hash_seed(self.model_name, req.cache_salt, adapter)  # the router's "seeded" key rule
        processor = OutputProcessor(self.tokenizer, sampling.stop, prompt_ids)
        first_text = None
        if isinstance(transfer, str):  # a granted prefill for a remote decode: `transfer` is our address
            sampling = dataclasses.replace(sampling, max_tokens=1)
            req = msgspec.structs.replace(req, stream=False)
            handle = self.engine.add_request(request_id, prompt_ids, sampling, seed, pin_kv=True, adapter=adapter)
            handle.seq.transfer_address = transfer
        elif transfer is not None and self._binds(transfer, prompt_ids, seed, request_id):
            handle = self.engine.add_remote_request(request_id, prompt_ids, sampling, seed, transfer, adapter)
            first_text = processor.add(transfer.first_token)  # already sent to the client by the router
        else:
            handle = self.engine.add_request(request_id, prompt_ids, sampling, seed, adapter=adapter)
        fmt = ResponseFormat(kind, request_id, adapter or self.model_name, include_usage=req.include_usage)
        logprobs = LogprobFormatter(self.tokenizer, kind) if req.logprobs is not None else None
        try:
            if req.stream:
                return await self._stream(request, handle, fmt, processor, logprobs, role_sent=first_text is not None,
                                          continuous_usage=req.include_usage and req.continuous_usage)
            return await self._full(handle, fmt, processor, logprobs, first_text or "")
        finally:
            if not handle.finished:
                self.engine.abort(request_id)

    def _binds(self, transfer: TransferHandle, prompt_ids: list[int], seed: int, request_id: str) -> bool:
        """A verified handle fills only the prompt it was issued for: its full blocks and its partial last
        block (engine/transfer/kv_transfer.py). A replayed or re-targeted one is not used: the request
        is computed here, first token included, and nothing of the handle's K/V is written."""
        if transfer.num_tokens != len(prompt_ids):
            raise BadRequest(f"the transfer handle covers {transfer.num_tokens} prompt tokens but this prompt "
                             f"has {len(prompt_ids)}", param="kv_transfer_params")
        bs = self.engine.block_manager.block_size
        if len(transfer.block_hashes) != transfer.num_tokens // bs:
            return True  # hashed with another block size: the link handshake refuses it, with the reason
        unbound = transfer.binds(prompt_ids, bs, seed)
        if unbound is None:
            return True
        log.warning("KV transfer handle for %s not used (%s): computing it here", request_id, unbound)
        self.engine.metrics.kv_pull_failures.labels("HandleMismatch").inc()
        return False

    def _authorize_transfer(self, kv: dict, remote: str | None) -> str | TransferHandle | None:
        """None for a plain request; for a verified grant the address to name in the handle; for a
        verified handle the handle. Anything unverifiable is a 403 (router/contract/kv_auth.py)."""
        if not kv:
            return None
        auth = self.engine.auth
        try:
            if kv.get("do_remote_decode"):
                address = auth.check_grant(kv.get("grant"), remote)
                self._check_role(("prefill", "both"), "do_remote_decode")
                return address
            if kv.get("do_remote_prefill"):
                transfer = TransferHandle.from_dict(kv.get("handle"))
                auth.check_handle(transfer.signed_fields(), transfer.address, transfer.expires, transfer.signature)
                self._check_role(("decode", "both"), "do_remote_prefill")
                return transfer
        except PermissionError as e:
            self.engine.metrics.rejected.labels("kv_transfer_refused").inc()
            raise Forbidden(str(e), param="kv_transfer_params", code="kv_transfer_refused") from None
        raise BadRequest("kv_transfer_params must set do_remote_decode or do_remote_prefill",
                         param="kv_transfer_params")

    def _check_role(self, roles: tuple[str, ...], what: str) -> None:
        role = self.engine.role
        if role not in roles:
            raise BadRequest(f"kv_transfer_params.{what} needs an engine of role {' or '.join(roles)}; "
                             f"this one is {role!r}", param="kv_transfer_params")

    def _transfer_params(self, handle: RequestHandle) -> dict | None:
        seq = self.engine.pinned.get(handle.seq.request_id)
        if seq is None:
            return None
        server, bs = self.engine.config.server, self.engine.block_manager.block_size
        full = tuple(seq.block_hashes[: seq.num_prompt // bs])
        tail = tail_hash(seq.token_ids[: seq.num_prompt], bs, seq.hash_seed, full[-1] if full else None)
        transfer = TransferHandle(cluster_id=server.cluster, address=seq.transfer_address, request_id=seq.request_id,
                                  block_hashes=full, num_tokens=seq.num_prompt, first_token=seq.output_ids[0],
                                  cached_tokens=seq.num_cached, expires=round(time.time() + server.kv_pin_ttl_s, 3),
                                  tail_hash=tail)
        seq.transfer_signature = self.engine.auth.sign_handle(transfer.signed_fields())
        transfer = dataclasses.replace(transfer, signature=seq.transfer_signature)
        return {"do_remote_prefill": True, "handle": transfer.to_dict()}

    async def _outputs(self, handle: RequestHandle, processor: OutputProcessor):
        """Yield (text delta, finish reason or None, the token's logprobs or ()) until the request ends."""
        while True:
            out: Output = await handle.queue.get()
            if out.error:
                raise out.error_type(out.error)
            delta = processor.add(out.token_id) if out.token_id is not None else ""
            lps = (out.logprobs,) if out.logprobs is not None else ()
            if processor.stopped:
                self.engine.abort(handle.seq.request_id, "stop")
                yield delta + processor.finish(), "stop", lps
                return
            if out.finished:
                yield delta + processor.finish(), out.finish_reason, lps
                return
            yield delta, None, lps

    def _usage(self, handle: RequestHandle, processor: OutputProcessor) -> dict:
        return usage(handle.seq.num_prompt, processor.num_tokens, handle.num_cached, handle.seq.cached_by_tier)

    async def _full(self, handle: RequestHandle, fmt: ResponseFormat, processor: OutputProcessor,
                    logprobs: LogprobFormatter | None, first_text: str = "") -> web.Response:
        parts, reason, entries = [first_text], None, []
        async for delta, finish, lps in self._outputs(handle, processor):
            parts.append(delta)
            entries.extend(lps)
            reason = finish  # the last output's finish reason is the answer's
        body = fmt.full("".join(parts), reason, self._usage(handle, processor),
                        logprobs.format(entries) if logprobs else None)
        transfer = self._transfer_params(handle)
        if transfer is not None:
            body["kv_transfer_params"] = transfer
        return json_response(body, headers=self.headers)

    async def _stream(self, request: web.Request, handle: RequestHandle, fmt: ResponseFormat,
                      processor: OutputProcessor, logprobs: LogprobFormatter | None, role_sent: bool = False,
                      continuous_usage: bool = False) -> web.StreamResponse:
        """Headers go out with the first token: a failure before it is a plain HTTP error."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **self.headers})
        first = fmt.kind == "chat" and not role_sent  # the role chunk goes out with the first token, as vLLM does
        try:
            async for delta, reason, lps in self._outputs(handle, processor):
                if not resp.prepared:
                    await prepare_client(resp, request)
                live = self._usage(handle, processor) if continuous_usage else None
                if first:
                    await write_client(resp, sse_line(fmt.chunk("", first=True, usage_=live)))
                    first = False
                if reason is not None or delta or (lps and logprobs):
                    await write_client(resp, sse_line(fmt.chunk(delta, reason, live,
                                                        logprobs=logprobs.format(lps) if logprobs else None)))
            if fmt.include_usage:
                await write_client(resp, sse_line(fmt.usage_chunk(self._usage(handle, processor))))
        except KVRouteError as e:
            if not resp.prepared:
                raise
            await write_client(resp, sse_error(e))
        if not resp.prepared:
            await prepare_client(resp, request)
        await write_client(resp, SSE_DONE)
        await write_client(resp)
        return resp
