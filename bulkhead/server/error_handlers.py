"""Every error the HTTP app answers, in the OpenAI error shape: a
BulkheadError with its own status, type, code and headers; a body failing
the schema as a 400 naming the field (params.schema_error); a body that is
not UTF-8 as a 400 invalid_utf8 naming the byte; any other HTTP error with
its status (not_found or http_error).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bulkhead.errors import BulkheadError, InvalidRequest
from bulkhead.server.params import schema_error


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BulkheadError)
    async def _typed(_: Request, e: BulkheadError):
        return JSONResponse(e.to_dict(), status_code=e.status, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        err = schema_error(e.errors())
        return JSONResponse(err.to_dict(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        if isinstance(e.__cause__, UnicodeDecodeError):  # FastAPI could not decode the body to parse it
            err = InvalidRequest(f"the body is not valid UTF-8: {e.__cause__.reason} at byte {e.__cause__.start}",
                                 code="invalid_utf8")
            return JSONResponse(err.to_dict(), status_code=err.status)
        err = BulkheadError(str(e.detail), code="not_found" if e.status_code == 404 else "http_error")
        err.type = "invalid_request_error" if e.status_code < 500 else "server_error"
        return JSONResponse(err.to_dict(), status_code=e.status_code)
