"""Errors shared by engine and router. HTTP status codes are chosen at the edge (router/contract/http.py).

    KVRouteError
     ├── BadRequest            malformed body, wrong types, limits exceeded
     │    ├── ContextTooLong   prompt (+ max_tokens) beyond the model's context or KV pool
     │    ├── PayloadTooLarge  body beyond --max-body-bytes (413), refused before it is read
     │    └── RequestTimeout   the body stalled past --body-timeout-s (408, the connection closed)
     ├── Unauthorized          missing or wrong API key
     ├── Forbidden             a field the caller may not set (unverified kv_transfer_params)
     ├── NotFound              unknown model or route
     ├── Overloaded            queue or in-flight limit reached (carries retry_after)
     └── Unavailable           no healthy instance / upstream failed before the first byte
"""

from __future__ import annotations


class KVRouteError(Exception):
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_dict(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(KVRouteError):
    type = "invalid_request_error"
    code = "invalid_request"


class ContextTooLong(BadRequest):
    code = "context_length_exceeded"


class PayloadTooLarge(BadRequest):
    code = "request_too_large"


class RequestTimeout(BadRequest):
    code = "request_timeout"


class Unauthorized(KVRouteError):
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(KVRouteError):
    type = "permission_error"
    code = "forbidden"


class NotFound(KVRouteError):
    type = "not_found_error"
    code = "not_found"


class Conflict(KVRouteError):
    type = "invalid_request_error"
    code = "conflict"


class Overloaded(KVRouteError):
    type = "overloaded_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0, too_many: bool = False, **kw) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.too_many = too_many  # 429 (client should slow down) rather than 503


class Unavailable(KVRouteError):
    type = "service_unavailable"
    code = "unavailable"
