"""RemoteClient: the HTTP side of chatting with any OpenAI-compatible server (vLLM, SGLang, llama-server,
another pagedeck): models, streamed chat completions, /metrics, and vLLM's runtime LoRA API.

Qt-free and torch-free (aiohttp only), so it runs in the app's qasync loop and in plain asyncio tests.
Every failure surfaces as RemoteError with a sentence a user can act on (server down, wrong key, unknown
model), never as a raw aiohttp exception.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

import aiohttp

CONNECT_TIMEOUT_S = 10


class RemoteError(Exception):
    """A remote request failed; `status` is the HTTP status (None when the server could not be reached)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def normalise_url(url: str) -> str:
    """The server root from what a user types: 'localhost:8000', 'http://h:8000/v1/' -> 'http://h:8000'."""
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("the server URL is empty")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"only http:// and https:// servers are supported, got {url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_message(status: int, body: str) -> str:
    """OpenAI's {"error": {"message"}} (or vLLM's/llama-server's variants) -> one line."""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        message = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
        if message is None and isinstance(data, dict):
            message = data.get("detail") or data.get("message")
    except (json.JSONDecodeError, AttributeError):
        message = None
    text = str(message or body.strip() or "no details")
    hint = {401: " (wrong or missing API key)", 404: " (not found on the server)"}.get(status, "")
    return f"HTTP {status}{hint}: {text[:500]}"


class RemoteClient:
    def __init__(self, url: str, api_key: str | None = None):
        self.root = normalise_url(url)
        self.api_key = api_key or None
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(
                total=None, connect=CONNECT_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[str, str]:
        """(text, content type) of a successful request; RemoteError otherwise."""
        try:
            async with self._http().request(method, self.root + path, json=body,
                                            timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise RemoteError(_error_message(resp.status, text), resp.status)
                return text, resp.headers.get("Content-Type", "")
        except aiohttp.ClientError as exc:
            raise RemoteError(f"cannot reach {self.root}: {exc}") from None
        except TimeoutError:
            raise RemoteError(f"{self.root}{path} did not answer within {timeout:.0f} s") from None

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        text, _ = await self._request(method, path, body)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise RemoteError(f"{self.root}{path} did not answer JSON: {text[:200]!r}") from None

    # ---- models and adapters ---------------------------------------------------------------------
    async def models(self) -> list[dict]:
        data = await self._json("GET", "/v1/models")
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not entries:
            raise RemoteError(f"{self.root}/v1/models lists no model")
        return entries

    async def load_adapter(self, name: str, path: str) -> str:
        text, _ = await self._request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        return text

    async def unload_adapter(self, name: str) -> str:
        text, _ = await self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        return text

    # ---- monitoring ------------------------------------------------------------------------------
    async def metrics_text(self) -> str:
        text, _ = await self._request("GET", "/metrics", timeout=10)
        return text

    async def pages(self) -> dict | None:
        """A pagedeck server's page map (None from servers that have none)."""
        try:
            return await self._json("GET", "/pagedeck/pages")
        except RemoteError as exc:
            if exc.status in (404, 405):
                return None
            raise

    # ---- generation ------------------------------------------------------------------------------
    async def stream_chat(self, body: dict) -> AsyncIterator[dict]:
        """POST a streamed chat completion; yields each SSE event's JSON object until [DONE]."""
        try:
            async with self._http().post(self.root + "/v1/chat/completions", json={**body, "stream": True}) as resp:
                if resp.status >= 400:
                    raise RemoteError(_error_message(resp.status, await resp.text()), resp.status)
                async for raw in resp.content:
                    line = raw.decode("utf-8", errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if isinstance(event, dict) and "error" in event and "choices" not in event:
                        err = event["error"]
                        raise RemoteError(f"the server stopped the reply: "
                                          f"{err.get('message', err) if isinstance(err, dict) else err}")
                    yield event
        except aiohttp.ClientError as exc:
            raise RemoteError(f"cannot reach {self.root}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise RemoteError(f"the server sent a malformed stream event: {exc}") from None
