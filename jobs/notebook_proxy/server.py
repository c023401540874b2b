"""The notebook proxy (``manage.py notebook_proxy``): serves ``/notebooks/<job>/...`` to browsers
and forwards each request, and each WebSocket (the kernels' channels), through the node's tunnel
to the job's notebook server (:mod:`jobs.notebook_proxy.tunnel`). HTTP is parsed by h11, on both
sides; after a 101 the bytes are relayed as they come.

Who gets through: a browser that brings a ticket from the job page (``?colony_ticket=``, see
:mod:`jobs.services.notebooks`) is answered with a cookie scoped to that job's path and sent on
without the ticket; a request with a valid cookie for the job is forwarded, with its
``Authorization`` replaced by the server's token and the cookie taken out; anything else gets a
page saying to open the notebook from the dashboard. A request that changes something, or opens
a WebSocket, from a page of another origin is refused (the cookie is also ``SameSite=Lax``).
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from urllib.parse import parse_qsl, urlencode, urlsplit

import h11
import redis
from django.conf import settings

from jobs.notebook_proxy.tunnel import Tunnel, TunnelClosed
from jobs.services import notebook_tokens, notebooks
from jobs.services.commands import command_key

log = logging.getLogger(__name__)

PATH_RE = re.compile(r"^/notebooks/([1-9][0-9]{0,17})(/.*)?$")
MAX_HEAD_BYTES = 64 * 1024
READ_BYTES = 64 * 1024
# Never forwarded either way: this hop's framing and connection handling, and the browser's own
# credentials (the token replaces them).
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade",
              b"proxy-authorization", b"proxy-authenticate"}
SAFE_METHODS = {b"GET", b"HEAD", b"OPTIONS"}
ANSWER_WAIT_S = 60.0  # for the head of the server's answer: past it, the node or server is not answering


class Proxy:
    """``key_of(node)``: the node's tunnel key (None when agents do not authenticate)."""

    def __init__(self, client, key_of, *, secure_cookies: bool = False, dashboard_url: str = ""):
        self.client, self.key_of = client, key_of
        self.secure_cookies, self.dashboard_url = secure_cookies, dashboard_url.rstrip("/")
        self.forwarded = 0
        self.refused = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            while True:
                event = await _next_event(conn, reader)
                if not isinstance(event, h11.Request):
                    break
                if not await self._serve(conn, event, reader, writer):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _write(writer, conn, _page(exc.error_status_hint, "Bad request", str(exc)))
        except (ConnectionError, asyncio.IncompleteReadError, h11.LocalProtocolError):
            pass
        finally:
            writer.close()

    async def _serve(self, conn, request: h11.Request, reader, writer) -> bool:
        """Answer one request; False when the connection must end after it."""
        target = urlsplit(request.target.decode("ascii", "replace"))
        match = PATH_RE.match(target.path)
        if match is None:
            await _drain(conn, reader)
            return await _write(writer, conn, _page(404, "Not found", "Notebooks are served under /notebooks/<job>/."))
        job_id = int(match.group(1))
        query = parse_qsl(target.query, keep_blank_values=True)
        ticket = next((value for name, value in query if name == notebooks.TICKET_PARAM), None)
        if ticket is not None:
            await _drain(conn, reader)
            return await self._trade(conn, writer, job_id, ticket, target.path, query)
        grant = self._cookie_grant(request, job_id)
        if grant is None:
            self.refused += 1
            await _drain(conn, reader)
            return await _write(writer, conn, self._open_from_dashboard(job_id, 403))
        if not _same_origin(request):
            self.refused += 1
            await _drain(conn, reader)
            return await _write(writer, conn, _page(403, "Refused", "A page of another site may not use this "
                                                                    "notebook."))
        return await self._forward(conn, request, reader, writer, grant)

    async def _trade(self, conn, writer, job_id: int, ticket: str, path: str, query: list) -> bool:
        """A valid ticket -> the job's cookie and the same address without the ticket."""
        grant = notebooks.open_ticket(ticket, job_id)
        if grant is None:
            self.refused += 1
            return await _write(writer, conn, self._open_from_dashboard(job_id, 403, expired=True))
        rest = urlencode([(name, value) for name, value in query if name != notebooks.TICKET_PARAM])
        cookie = (f"{notebooks.cookie_name(job_id)}={notebooks.cookie_for(grant)}; "
                  f"Path=/notebooks/{job_id}/; Max-Age={notebooks.COOKIE_S}; HttpOnly; SameSite=Lax"
                  + ("; Secure" if self.secure_cookies else ""))
        location = path + (f"?{rest}" if rest else "")
        return await _write(writer, conn, (303, [("Location", location), ("Set-Cookie", cookie),
                                                 ("Cache-Control", "no-store")], b""))

    def _cookie_grant(self, request: h11.Request, job_id: int):
        # Split by hand: http.cookies gives up on a whole header for one value it dislikes, and
        # Jupyter's own cookies travel in the same header.
        name = notebooks.cookie_name(job_id).encode()
        for header, value in request.headers:
            if header != b"cookie":
                continue
            for part in value.split(b";"):
                key, _, content = part.strip().partition(b"=")
                if key == name:
                    return notebooks.open_cookie(content.decode("latin-1").strip('"'), job_id)
        return None

    def _open_from_dashboard(self, job_id: int, status: int, expired: bool = False):
        link = f"{self.dashboard_url}/jobs/{job_id}/"
        why = "This link has expired or is not valid." if expired else "You are not signed in to this notebook."
        return _page(status, "Open it from the dashboard",
                     f"{why} Open the notebook from <a href=\"{html.escape(link)}\">job {job_id}'s page</a> "
                     "(Open notebook): only the job's owner may.", raw=True)

    async def _forward(self, conn, request: h11.Request, reader, writer, grant) -> bool:
        upstream = h11.Connection(h11.CLIENT)
        tunnel = Tunnel(self.client, grant.node, grant.job_id, grant.launch_id, self.key_of(grant.node))
        upgrade = _wants_upgrade(request)
        headers = _upstream_headers(request.headers, grant.job_id, notebook_tokens.token(grant.launch_id), upgrade)
        try:
            await tunnel.open()
            await tunnel.send(upstream.send(h11.Request(method=request.method, target=request.target,
                                                        headers=headers)))
            while True:  # the request's body, as it comes
                event = await _next_event(conn, reader)
                if isinstance(event, h11.Data):
                    await tunnel.send(upstream.send(h11.Data(data=bytes(event.data))))
                elif isinstance(event, h11.EndOfMessage):
                    await tunnel.send(upstream.send(h11.EndOfMessage()))
                    break
                else:
                    return False
            self.forwarded += 1
            return await self._answer(conn, upstream, tunnel, reader, writer)
        except (TunnelClosed, redis.RedisError) as exc:
            if conn.our_state is h11.SEND_RESPONSE:
                await _drain(conn, reader)
                return await _write(writer, conn, _unavailable(tunnel.error or str(exc)))
            return False
        finally:
            await tunnel.close()

    async def _answer(self, conn, upstream, tunnel: Tunnel, reader, writer) -> bool:
        """Relay the server's response (and, after a 101, the WebSocket's bytes both ways)."""
        while True:
            try:
                event = upstream.next_event()
            except h11.RemoteProtocolError:  # the server's side ended mid-answer, or sent no HTTP
                event = h11.ConnectionClosed()
            if event is h11.NEED_DATA:
                waiting = conn.our_state is h11.SEND_RESPONSE
                try:
                    data = await (asyncio.wait_for(tunnel.recv(), ANSWER_WAIT_S) if waiting else tunnel.recv())
                except asyncio.TimeoutError:
                    return await _write(writer, conn, _page(504, "Notebook not answering", (
                        f"Node {tunnel.node} did not answer for {ANSWER_WAIT_S:.0f} s. Try again from the job page.")))
                upstream.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                if event.status_code != 101:
                    continue  # a 100 Continue is this hop's business
                writer.write(conn.send(h11.InformationalResponse(
                    status_code=101, headers=_downstream_headers(event.headers, tunnel.job_id, upgrade=True),
                    reason=event.reason)))
                await _relay(reader, writer, tunnel, conn.trailing_data[0], upstream.trailing_data[0])
                return False
            if isinstance(event, h11.Response):
                writer.write(conn.send(h11.Response(status_code=event.status_code, reason=event.reason,
                                                    headers=_downstream_headers(event.headers, tunnel.job_id))))
            elif isinstance(event, h11.Data):
                writer.write(conn.send(h11.Data(data=bytes(event.data))))
                await writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                return True
            else:  # closed before a whole answer
                if conn.our_state is h11.SEND_RESPONSE:
                    return await _write(writer, conn, _unavailable(tunnel.error))
                return False


def _wants_upgrade(request: h11.Request) -> bool:
    values = {name: value.lower() for name, value in request.headers}
    return b"upgrade" in values.get(b"connection", b"") and values.get(b"upgrade") == b"websocket"


def _colony_cookies() -> set[bytes]:
    """The dashboard's cookies. Browsers scope cookies by host, not port: the dashboard's session
    reaches this proxy too, and must never reach a notebook server (the job's own code)."""
    return {name.encode() for name in (settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME,
                                        settings.LANGUAGE_COOKIE_NAME, "messages")}


def _upstream_headers(headers, job_id: int, token: str, upgrade: bool) -> list[tuple[bytes, bytes]]:
    withheld = _colony_cookies()
    out = []
    for name, value in headers:
        if name in HOP_BY_HOP or name == b"authorization":
            continue
        if name == b"cookie":
            kept = [part for part in value.split(b";")
                    if not _is_colony_cookie(part.strip().split(b"=", 1)[0], withheld)]
            if not kept:
                continue
            value = b";".join(kept).strip()
        out.append((name, value))
    out.append((b"authorization", f"token {token}".encode()))
    out += [(b"connection", b"Upgrade"), (b"upgrade", b"websocket")] if upgrade else [(b"connection", b"close")]
    return out


def _is_colony_cookie(name: bytes, withheld: set[bytes]) -> bool:
    return name in withheld or name.startswith(notebooks.COOKIE_PREFIX.encode())


def _downstream_headers(headers, job_id: int, upgrade: bool = False) -> list[tuple[bytes, bytes]]:
    out = [(name, value) for name, value in headers if name not in HOP_BY_HOP and name != b"transfer-encoding"
           and (name != b"set-cookie" or _cookie_stays_in_job(value, job_id))]
    return out + [(b"connection", b"Upgrade"), (b"upgrade", b"websocket")] if upgrade else out


def _cookie_stays_in_job(set_cookie: bytes, job_id: int) -> bool:
    """A notebook server (the job's own code) may set cookies for its own path only: none for the
    dashboard (same host, so the same cookie jar), none for another job's notebook, none of
    Colony's names and none for another domain."""
    name_value, *attributes = set_cookie.split(b";")
    name = name_value.strip().split(b"=", 1)[0]
    if not name or _is_colony_cookie(name, _colony_cookies()):
        return False
    path = None
    for attribute in attributes:
        key, _, value = attribute.strip().partition(b"=")
        key = key.strip().lower()
        if key == b"domain":
            return False
        if key == b"path":
            path = value.strip().decode("latin-1")
    own = f"/notebooks/{job_id}/"
    return path is not None and (path == own.rstrip("/") or path.startswith(own))


def _same_origin(request: h11.Request) -> bool:
    """True unless the request changes something or opens a WebSocket from a page of another origin."""
    values = dict(request.headers)
    if request.method in SAFE_METHODS and not _wants_upgrade(request):
        return True
    origin = values.get(b"origin")
    if origin is None:
        return values.get(b"sec-fetch-site", b"same-origin") in (b"same-origin", b"none")
    return urlsplit(origin.decode("latin-1")).netloc.lower() == values.get(b"host", b"").decode("latin-1").lower()


async def _relay(reader, writer, tunnel: Tunnel, from_browser: bytes, from_server: bytes) -> None:
    """The bytes of an upgraded connection, both ways, until either side ends."""
    if from_server:
        writer.write(from_server)
    if from_browser:
        await tunnel.send(from_browser)

    async def down():
        while data := await tunnel.recv():
            writer.write(data)
            await writer.drain()

    async def up():
        while data := await reader.read(READ_BYTES):
            await tunnel.send(data)

    tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader):
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(READ_BYTES))


async def _drain(conn: h11.Connection, reader) -> None:
    """Read the rest of a request we answer without forwarding (its body, if any)."""
    while conn.their_state is h11.SEND_BODY:
        if not isinstance(await _next_event(conn, reader), h11.Data):
            break


async def _write(writer, conn: h11.Connection, answer) -> bool:
    status, headers, body = answer
    writer.write(conn.send(h11.Response(status_code=status, headers=[*headers, ("Content-Length", str(len(body)))])))
    if body:
        writer.write(conn.send(h11.Data(data=body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
    return True


def _page(status: int, title: str, text: str, raw: bool = False, refresh: int | None = None):
    body = text if raw else html.escape(text)
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    page = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>{meta}</head>"
            f"<body style='font-family:sans-serif;margin:3em'><h1>{html.escape(title)}</h1><p>{body}</p></body></html>")
    headers = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")]
    return status, headers, page.encode()


def _unavailable(why: str | None):
    """The server did not answer: starting (retry shortly), or gone."""
    why = why or "the notebook server closed the connection"
    return _page(503, "Notebook not available", f"{why[:1].upper()}{why[1:]}. This page tries again every 3 s.",
                 refresh=3)


async def serve(host: str, port: int, *, ready=None) -> None:
    """Serve until cancelled. ``ready(address)`` is called once it listens."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5, socket_timeout=30,
                                          health_check_interval=30)
    proxy = Proxy(client, command_key, secure_cookies=settings.SESSION_COOKIE_SECURE,
                  dashboard_url=settings.COLONY_PUBLIC_URL)
    server = await asyncio.start_server(proxy.handle, host, port, limit=READ_BYTES)
    if ready is not None:
        ready(server.sockets[0].getsockname())
    async with server:
        await server.serve_forever()
