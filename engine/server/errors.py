"""ApiError: a request the server refuses, in OpenAI's error shape so every OpenAI client reports it well.

OpenAI answers `{"error": {"message", "type", "param", "code"}}`; its Python client turns the status
into BadRequestError (400), AuthenticationError (401), NotFoundError (404), InternalServerError (5xx)
and shows the message, so the message names the field and the problem.
"""
from __future__ import annotations

from typing import Any

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)
