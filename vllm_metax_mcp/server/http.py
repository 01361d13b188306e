"""Streamable HTTP on a chosen address: Host and Origin checked on every bind, a bearer token when given.

Without a token only 127.0.0.1, ::1 or localhost may be bound — decided on the parsed address,
so `127.1`, `127.000.000.001`, `0:0:0:0:0:0:0:1` and `[::1]` are those addresses and
`127.0.0.2` or `0x7f000002` is not — and the server binds exactly the address it checked. The
SDK's DNS-rebinding protection (Host and Origin headers) is turned on for every bind, not only
for the three spellings it recognises by default: loopback names with any port, the bound
address, and the operator's `--allowed-host` values.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket
from dataclasses import dataclass

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_HOST_TEXT = re.compile(r"^[0-9A-Za-z._:%\[\]-]+$")
_ALLOWED_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z._-]+)(?::[0-9]{1,5})?$")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class BindRefused(ValueError):
    """A bind the server refuses before starting (a usage error)."""


@dataclass(frozen=True)
class Bind:
    address: str
    """What uvicorn binds: an address literal (or, with a token, a name the operator gave)."""
    loopback: bool
    """Exactly 127.0.0.1, ::1 or localhost."""
    security: TransportSecuritySettings


def parse_address(text: str) -> Address | None:
    """An IP address in any spelling the socket layer would accept for it, or None for a name."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if ":" in bare:
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))  # 127.1, 0x7f.0.0.1, 2130706433, 0177.0.0.1
    except OSError:
        return None


def _exact_loopback(address: Address) -> bool:
    return address in (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


def _host_header(address: Address) -> str:
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def _resolve_localhost(port: int) -> str:
    """What `localhost` resolves to here, refused unless every answer is 127.0.0.1 or ::1."""
    try:
        answers = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise BindRefused(f"localhost does not resolve here ({exc.strerror or exc}); pass --host 127.0.0.1.") from None
    addresses = [ipaddress.ip_address(str(answer[4][0]).split("%", 1)[0]) for answer in answers]
    if not addresses or not all(_exact_loopback(a) for a in addresses):
        raise BindRefused("localhost resolves to an address other than 127.0.0.1 or ::1 here; pass --host 127.0.0.1.")
    return addresses[0].compressed


def resolve_bind(host: str, port: int, token: str | None, allowed_hosts: list[str] | None = None) -> Bind:
    """Decide what to bind and which Host/Origin headers to accept; BindRefused says why not."""
    if not host or not _HOST_TEXT.match(host):
        raise BindRefused(f"--host {host!r} is not an address or host name.")
    extra = list(allowed_hosts or [])
    for value in extra:
        if not _ALLOWED_HOST.match(value):
            raise BindRefused(f"--allowed-host {value!r} is not HOST or HOST:PORT.")
    address = parse_address(host)
    name = host.rstrip(".").lower() if address is None else None
    hosts = [f"{h}:*" for h in LOOPBACK_HOSTS]
    if name == "localhost":
        literal, loopback = _resolve_localhost(port), True
    elif address is not None:
        if getattr(address, "scope_id", None):
            loopback = False
        else:
            loopback = _exact_loopback(address)
        literal = str(address)
        if not address.is_unspecified and not loopback:
            hosts.append(f"{_host_header(address)}:{port}")
    else:
        literal, loopback = host, False
        hosts.append(f"{name}:{port}")
    if not loopback and not token:
        shown = f" (that is {address.compressed})" if address is not None and address.compressed != host else ""
        raise BindRefused(
            f"refusing to bind {host}{shown} without --auth-token: only 127.0.0.1, ::1 or localhost may be bound "
            "without a token; pass --auth-token to bind anything else."
        )
    if address is not None and address.is_unspecified and not extra:
        raise BindRefused(
            f"binding {host} listens on every address, and requests must name this server in their Host header: "
            "pass --allowed-host HOST[:PORT] (repeatable) with the name or address clients use."
        )
    for value in extra:
        hosts.extend([value] if re.search(r":[0-9]+$", value) and not value.endswith("]") else [value, f"{value}:*"])
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )
    return Bind(literal, loopback, security)


class BearerToken:
    """Refuse every HTTP request whose Authorization header does not carry the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            supplied = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(supplied, self.expected):
                await send(
                    {"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]}
                )
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await self.app(scope, receive, send)


def serve_http(server: MCPServer, bind: Bind, port: int, token: str | None) -> None:
    import uvicorn

    app: ASGIApp = server.streamable_http_app(host=bind.address, transport_security=bind.security)
    if token:
        app = BearerToken(app, token)
    # log_config=None: uvicorn's records go through the server's own logging (no tracebacks without --debug)
    uvicorn.run(app, host=bind.address, port=port, log_level="warning", log_config=None)
