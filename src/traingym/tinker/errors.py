"""The refusal every route answers with: an HTTP status and a message naming the problem."""

from __future__ import annotations


class ApiError(Exception):
    """A refused request: HTTP status and a message naming the problem and the fix."""

    def __init__(self, status: int, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error"
                          if self.status < 500 else "server_error", "code": self.code}}


def not_found(what: str, key: str) -> ApiError:
    return ApiError(404, f"no {what} {key!r} on this server", "not_found")
