"""Streamable HTTP on a chosen address, behind a bearer token when one is given."""

from __future__ import annotations

import hmac

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send


class BearerToken:
    """Refuse every HTTP request whose Authorization header does not carry the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            supplied = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(supplied, self.expected):
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await self.app(scope, receive, send)


def serve_http(server: MCPServer, host: str, port: int, token: str | None) -> None:
    app: ASGIApp = server.streamable_http_app(host=host)
    if token:
        app = BearerToken(app, token)
    uvicorn.run(app, host=host, port=port, log_level="warning")
