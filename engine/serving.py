"""OpenAI completion and chat-completion handling on the engine: validate, queue, stream back."""

from __future__ import annotations

import dataclasses
import uuid

from aiohttp import web

from engine.kv_transfer import TransferHandle
from engine.llm_engine import LLMEngine, Output, RequestHandle
from engine.openai_format import ResponseFormat, usage
from engine.output import OutputProcessor
from engine.work import SamplingParams
from router.errors import BadRequest, ContextTooLong, KVRouteError, NotFound
from router.http import SSE_DONE, json_response, read_json, sse_error, sse_line
from router.openai_request import CompletionRequest, parse_request
from router.protocol import hash_seed
from router.tokenizer import Tokenizer

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
INSTANCE_HEADER = "x-kvroute-instance"


class CompletionService:
    def __init__(self, engine: LLMEngine, tokenizer: Tokenizer, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = engine.runner.info.max_model_len
        self.vocab_size = engine.runner.info.vocab_size
        self.pool_tokens = engine.block_manager.num_blocks * engine.block_manager.block_size
        self.headers = {INSTANCE_HEADER: engine.config.instance}

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise NotFound(f"model {model!r} does not exist; this engine serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def prompt_ids(self, req: CompletionRequest) -> list[int]:
        try:
            if req.messages is not None:
                return self.tokenizer.encode_chat(list(req.messages))
            if req.prompt is not None:
                return self.tokenizer.encode(req.prompt)
        except ValueError as e:
            raise BadRequest(str(e), param="messages" if req.messages is not None else "prompt") from None
        ids = list(req.prompt_ids or ())
        if max(ids) >= self.vocab_size:
            raise BadRequest(f"token id {max(ids)} is out of the vocabulary (size {self.vocab_size})", param="prompt")
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
        return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                              ignore_eos=req.ignore_eos, stop=req.stop)

    async def handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        req = parse_request(await read_json(request), kind)
        self.check_model(req.model)
        prompt_ids = self.prompt_ids(req)
        sampling = self.sampling(req, len(prompt_ids))
        request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        seed = hash_seed(self.model_name, req.cache_salt)
        kv = req.kv_transfer_params or {}
        processor = OutputProcessor(self.tokenizer, sampling.stop, prompt_ids)
        first_text = None
        if kv.get("do_remote_decode"):
            self._check_role(("prefill", "both"), "do_remote_decode")
            sampling = dataclasses.replace(sampling, max_tokens=1)
            req = dataclasses.replace(req, stream=False)
            handle = self.engine.add_request(request_id, prompt_ids, sampling, seed, pin_kv=True)
        elif kv.get("do_remote_prefill"):
            self._check_role(("decode", "both"), "do_remote_prefill")
            transfer = TransferHandle.from_dict(kv.get("handle"))
            if transfer.num_tokens != len(prompt_ids):
                raise BadRequest(f"the transfer handle covers {transfer.num_tokens} prompt tokens but this prompt "
                                 f"has {len(prompt_ids)}", param="kv_transfer_params")
            handle = self.engine.add_remote_request(request_id, prompt_ids, sampling, seed, transfer)
            first_text = processor.add(transfer.first_token)  # already sent to the client by the router
        else:
            handle = self.engine.add_request(request_id, prompt_ids, sampling, seed)
        fmt = ResponseFormat(kind, request_id, self.model_name)
        try:
            if req.stream:
                return await self._stream(request, handle, fmt, processor, role_sent=first_text is not None)
            return await self._full(handle, fmt, processor, first_text or "")
        finally:
            if not handle.finished:
                self.engine.abort(request_id)

    def _check_role(self, roles: tuple[str, ...], what: str) -> None:
        role = self.engine.config.role
        if role not in roles:
            raise BadRequest(f"kv_transfer_params.{what} needs an engine of role {' or '.join(roles)}; "
                             f"this one is {role!r}", param="kv_transfer_params")

    def _transfer_params(self, handle: RequestHandle) -> dict | None:
        seq = self.engine.pinned.get(handle.seq.request_id)
        if seq is None:
            return None
        config = self.engine.config
        transfer = TransferHandle(config.cluster, "", seq.request_id, tuple(seq.block_hashes[: seq.num_prompt //
                                  self.engine.block_manager.block_size]), seq.num_prompt, seq.output_ids[0],
                                  seq.num_cached)
        return {"do_remote_prefill": True, "handle": transfer.to_dict()}

    async def _outputs(self, handle: RequestHandle, processor: OutputProcessor):
        """Yield (text delta, finish reason or None) until the request ends."""
        while True:
            out: Output = await handle.queue.get()
            if out.error:
                raise out.error_type(out.error)
            delta = processor.add(out.token_id) if out.token_id is not None else ""
            if processor.stopped:
                self.engine.abort(handle.seq.request_id)
                yield delta + processor.finish(), "stop"
                return
            if out.finished:
                yield delta + processor.finish(), out.finish_reason
                return
            yield delta, None

    def _usage(self, handle: RequestHandle, processor: OutputProcessor) -> dict:
        return usage(handle.seq.num_prompt, processor.num_tokens, handle.num_cached, handle.seq.cached_by_tier)

    async def _full(self, handle: RequestHandle, fmt: ResponseFormat, processor: OutputProcessor,
                    first_text: str = "") -> web.Response:
        parts, reason = [first_text], None
        async for delta, reason in self._outputs(handle, processor):
            parts.append(delta)
        body = fmt.full("".join(parts), reason, self._usage(handle, processor))
        transfer = self._transfer_params(handle)
        if transfer is not None:
            body["kv_transfer_params"] = transfer
        return json_response(body, headers=self.headers)

    async def _stream(self, request: web.Request, handle: RequestHandle, fmt: ResponseFormat,
                      processor: OutputProcessor, role_sent: bool = False) -> web.StreamResponse:
        """Headers go out with the first token: a failure before it is a plain HTTP error."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **self.headers})
        first = fmt.kind == "chat" and not role_sent  # the role chunk goes out with the first token, as vLLM does
        try:
            async for delta, reason in self._outputs(handle, processor):
                if not resp.prepared:
                    await resp.prepare(request)
                if first:
                    await resp.write(sse_line(fmt.chunk("", first=True)))
                    first = False
                if reason is not None:
                    await resp.write(sse_line(fmt.chunk(delta, reason, self._usage(handle, processor))))
                elif delta:
                    await resp.write(sse_line(fmt.chunk(delta)))
        except KVRouteError as e:
            if not resp.prepared:
                raise
            await resp.write(sse_error(e))
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp
