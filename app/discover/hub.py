"""What the Hugging Face Hub offers that pagedeck can load: repositories found by a search, and each
repository's loadable files with their quantization, size, hash and a fit estimate for this machine.

Qt-free (the Discover view is a view of it). huggingface_hub's HfApi does the calls, so HF_ENDPOINT, HF_TOKEN
and a logged-in token work as in every other Hub tool; the token goes in request headers only, never in a
message or a log line. A GGUF file is one download; a Hugging Face folder (config.json + safetensors) is
offered as one entry made of the files the loader reads (configs, tokenizer, weights).
"""
from __future__ import annotations

import re
import socket
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

# llama.cpp's quantization labels as GGUF file names carry them (the last match in the name wins).
_QUANT = re.compile(r"(?i)(?<![a-z0-9])(IQ\d_[A-Z]+|I?Q\d_K(?:_[SML]|_XL)?|Q\d_[01]|TQ\d_\d|Q\d|BF16|F16|F32)"
                    r"(?![a-z0-9])")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# The files of an HF folder the loader reads; other formats (pytorch .bin, onnx, flax) are not needed.
_HF_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".tiktoken")
_HF_SKIP = ("README", ".gitattributes")
REACH_TIMEOUT = 5.0  # seconds the reachability check waits for a connection


class HubError(Exception):
    """A Hub call failed; str() says what failed and why, in words meant for the user (never a token)."""


@dataclass(frozen=True)
class HubBlob:
    """One file in a repository: its path in the repo, size and the hash the Hub publishes for it
    (sha256 for LFS files, the git blob id for small ones)."""
    name: str
    size: int
    sha256: str | None
    git_sha1: str | None = None


@dataclass
class HubModel:
    """One thing the Discover view offers: a GGUF file, or a whole HF folder (`blobs` lists its files)."""
    repo_id: str
    name: str  # the GGUF file name, or the repo's name for an HF folder
    kind: str  # "gguf" | "hf"
    quant: str
    blobs: list[HubBlob]
    revision: str  # the commit the files come from (the Hub's model info `sha`)
    problem: str | None = None  # why pagedeck cannot load it (shown greyed), None when it can
    estimate: object | None = None  # engine.estimate_download(...) (a MemoryEstimate)

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blobs)

    @property
    def fits(self) -> bool | None:
        return None if self.estimate is None else self.estimate.fits


@dataclass
class HubRepo:
    repo_id: str
    downloads: int = 0
    likes: int = 0
    kinds: list[str] = field(default_factory=list)  # "gguf" and/or "hf"


def quant_of(file_name: str) -> str:
    """The quantization a GGUF file's name states (Q4_K_M, IQ4_XS, Q8_0, F16...), or "" when it says none."""
    found = _QUANT.findall(PurePosixPath(file_name).stem)
    return found[-1].upper() if found else ""


class Hub:
    """Search and describe Hub repositories. `endpoint` defaults to HF_ENDPOINT (else huggingface.co)."""

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None) -> None:
        from huggingface_hub import HfApi

        self.api = HfApi(endpoint=endpoint, token=token)
        self.endpoint = self.api.endpoint
        self.token = token

    def search(self, query: str, limit: int = 40) -> list[HubRepo]:
        """Repositories matching `query` that hold GGUF files or safetensors weights, most downloaded first."""
        try:
            check_reachable(self.endpoint)
            found = list(self.api.list_models(search=query.strip() or None, sort="downloads", limit=limit))
        except Exception as exc:
            raise HubError(f"Searching the Hub at {self.endpoint} failed: {describe_error(exc)}") from exc
        repos = []
        for m in found:
            tags = set(m.tags or ())
            kinds = [k for k, tag in (("gguf", "gguf"), ("hf", "safetensors")) if tag in tags]
            if kinds or not tags:  # a hub that lists no tags: the files decide (files())
                repos.append(HubRepo(m.id, int(m.downloads or 0), int(m.likes or 0), kinds))
        return repos

    def files(self, repo_id: str, estimate: bool = True) -> list[HubModel]:
        """The loadable entries of a repository: every GGUF file (split files' first part stands for the
        model) and, when it has config.json and safetensors, the HF folder; with sizes, hashes and fit."""
        try:
            check_reachable(self.endpoint)
            info = self.api.model_info(repo_id, files_metadata=True)
        except Exception as exc:
            raise HubError(f"Could not list the files of {repo_id}: {describe_error(exc)}") from exc
        blobs = [HubBlob(s.rfilename, int(s.size or (s.lfs.size if s.lfs else 0) or 0),
                         s.lfs.sha256 if s.lfs else None, None if s.lfs else s.blob_id)
                 for s in info.siblings or ()]
        models = []
        for b in blobs:
            if not b.name.endswith(".gguf") or PurePosixPath(b.name).name.startswith("mmproj"):
                continue
            split = _SPLIT.search(b.name)
            if split and int(split.group(1)) > 1:
                continue
            problem = (f"it is split across {int(split.group(2))} files; pagedeck loads single-file GGUFs"
                       if split else None)
            models.append(HubModel(repo_id, b.name, "gguf", quant_of(b.name), [b], info.sha or "main", problem))
        top = [b for b in blobs if "/" not in b.name]
        names = {b.name for b in top}
        if "config.json" in names and any(n.endswith(".safetensors") for n in names):
            wanted = [b for b in top if b.name.endswith(_HF_SUFFIXES) and not b.name.startswith(_HF_SKIP)]
            params = getattr(info.safetensors, "parameters", None) or {}
            quant = max(params, key=params.get) if params else "safetensors"
            models.append(HubModel(repo_id, repo_id.split("/")[-1], "hf", quant, wanted, info.sha or "main"))
        if estimate:
            for m in models:
                m.estimate = estimate_fit(m)
        return models


def estimate_fit(model: HubModel):
    """The engine's estimate from the download's size alone (the KV cache needs the model's header, which the
    Model tab reads once the file is on disk); None when the engine cannot say."""
    try:
        from engine import estimate_download

        return estimate_download(model.size, kind=model.kind)
    except (ValueError, ImportError):
        return None


def hub_cache_dir() -> Path:
    """Where discovery looks for the Hugging Face cache (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    from engine import model_locations

    return next(folder for source, folder in model_locations() if source == "Hugging Face cache")


class Unreachable(ConnectionError):
    """Nothing answers at the endpoint's host (describe_error names the host)."""

    def __init__(self, host: str, why: OSError):
        super().__init__(why.strerror or str(why) or type(why).__name__)
        self.host = host


def check_reachable(endpoint: str) -> None:
    """Raise Unreachable at once where a connection to the endpoint's host fails: huggingface_hub retries a
    failed connection five times with growing waits (~23 s) before it gives up, which offline is only a wait.
    Skipped where a proxy carries the requests (the host may be reachable only through it)."""
    url = urlsplit(endpoint)
    proxied = url.hostname and url.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(
        url.hostname)
    if not url.hostname or proxied:
        return
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=REACH_TIMEOUT).close()
    except OSError as exc:
        raise Unreachable(url.hostname, exc) from exc


def describe_error(exc: BaseException) -> str:
    """An exception in words: the Hub's not-found errors named as such, connection failures as such."""
    from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, RepositoryNotFoundError):
        return "no such repository (404), or it is private or gated"
    if isinstance(exc, RemoteEntryNotFoundError):
        return "no such file in the repository (404)"
    if isinstance(exc, HfHubHTTPError):
        status = getattr(exc.response, "status_code", None)
        return f"the Hub answered {status}" if status else str(exc).splitlines()[0]
    detail = str(exc).splitlines()[0] if str(exc) else "no detail"
    kinds = {c.__name__ for c in type(exc).__mro__}  # httpx's classes, whichever copy huggingface_hub bundles
    if kinds & {"TimeoutException", "Timeout", "TimeoutError"}:
        return f"{_host(exc)} did not answer in time ({detail})"
    if kinds & {"ConnectError", "NetworkError", "ConnectionError"}:
        return f"cannot reach {_host(exc)}: no network, or a proxy or firewall in the way ({detail})"
    return f"{type(exc).__name__}: {detail}"


def _host(exc: BaseException) -> str:
    """The host a failed request went to, else "the Hub"."""
    if isinstance(exc, Unreachable):
        return exc.host
    try:
        return str(exc.request.url.host) or "the Hub"
    except Exception:  # no request attached (httpx raises RuntimeError), or not an httpx error
        return "the Hub"
