"""The server fuzzed from its own OpenAPI description: Schemathesis (its `st` command, as users run it) against
a live `python -m engine serve` process on a tiny random model with a tiny random LoRA adapter.

Every operation in /openapi.json gets examples, coverage (boundary values) and random bodies, valid and not:
no 5xx, every status code and content type the description declares, every JSON body (errors included, in
OpenAI's {"error": {...}} shape) valid against it, and every schema-invalid body refused with a 4xx. The
description names the served model and adapter, so requests reach them; the adapter routes get the
adapter's real folder (a Schemathesis config), so it is unloaded and loaded again. Schemathesis reports no
warning (it warns when the API refuses most requests its schema allows), and every request the schema
allows that got a 400 was refused by one of the checks the description lists as beyond JSON schema
(request_schemas.RUNTIME_CHECKS). Afterwards the server is healthy and no cache page is referenced.
"""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from engine.server.openapi import openapi_spec
from engine.server.request_schemas import RUNTIME_CHECKS, ModelFacts
from engine.server.requests import CHAT_FIELDS, COMPLETION_FIELDS
from tests.server_support import metric
from tools.processes import free_port, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
ST = Path(sys.executable).parent / "st"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "negative_data_rejection")
pytestmark = pytest.mark.timeout(400)


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def adapter(tiny_llama_folder, tmp_path_factory):
    from tests.engine.test_lora import write_peft_adapter

    return write_peft_adapter(tiny_llama_folder, tmp_path_factory.mktemp("fuzz-lora") / "ada", seed=5)


def no_model_folders(empty: Path) -> dict:
    """The environment with the Hugging Face and Ollama model folders pointed at an empty one: the pool finds
    no model of this machine's, so the description's ids are the test's and no fuzzed request loads a big one."""
    import os

    return {**os.environ, "HF_HUB_CACHE": str(empty), "OLLAMA_MODELS": str(empty)}


@pytest.fixture(scope="module")
def serve(tiny_llama_folder, adapter, tmp_path_factory):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(tiny_llama_folder),
                             "--port", str(port), "--threads", "1", "--cache-tokens", "1024",
                             "--default-max-tokens", "8", "--lora", f"ada={adapter}"], cwd=ROOT,
                            stdout=subprocess.PIPE, env=no_model_folders(tmp_path_factory.mktemp("no-models")),
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)
        yield url
    finally:
        stop(proc)
    log = proc.stdout.read()
    # aiohttp logs its own parser's refusals (a NUL in a header: a 400) with a traceback; none may be ours
    assert f'File "{ROOT / "engine"}' not in log and "generation failed" not in log, log[-4000:]


def test_the_description_covers_every_request_field_and_every_route(serve, tiny_llama_folder):
    status, raw = get(serve + "/openapi.json")
    spec = json.loads(raw)
    assert status == 200 and spec["openapi"].startswith("3.") and spec["servers"] == [{"url": serve}]
    schemas = spec["components"]["schemas"]
    assert set(schemas["ChatCompletionRequest"]["properties"]) == CHAT_FIELDS
    assert set(schemas["CompletionRequest"]["properties"]) == COMPLETION_FIELDS
    assert {"/health", "/v1/models", "/v1/models/{model}", "/v1/chat/completions", "/v1/completions", "/metrics",
            "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/pagedeck/pages"} <= set(spec["paths"])
    model = schemas["ChatCompletionRequest"]["properties"]["model"]["anyOf"][0]
    assert model["enum"] == ["llama", "ada"]  # what the server serves now, generated at run time
    assert spec["paths"]["/v1/models/{model}"]["get"]["parameters"][0]["schema"] == {"enum": ["llama", "ada"]}
    from engine import Tokenizer

    context = json.loads(get(serve + "/v1/models")[1])["data"][0]["max_model_len"]
    facts = [ModelFacts(("llama", "ada"), Tokenizer.load(tiny_llama_folder).vocab_size, context)]
    assert spec == json.loads(json.dumps(openapi_spec(serve, facts)))


def schemathesis_config(adapter: Path) -> str:
    """The adapter routes' test data: load the served adapter's real folder (a random path is a 404) as
    "ada-copy" and unload that name, so each round of fuzzing loads it once and unloads it once (the other
    tries are "already loaded" and "not found"). Both routes sit out the coverage phase, which would not
    take these values (it would load the adapter as "0")."""
    return ('[[operations]]\ninclude-path-regex = "^/v1/(un)?load_lora_adapter$"\nphases.coverage.enabled = false\n'
            f'parameters = {{ "body.lora_name" = "ada-copy", "body.lora_path" = {json.dumps(str(adapter))} }}\n')


def off_the_schema_400s(spec: dict, har: dict) -> tuple[list, int, int]:
    """Generation requests the schema allows that got a 400 not listed in RUNTIME_CHECKS, and how many
    schema-valid generation requests there were and were served (2xx)."""
    validators = {path: jsonschema.Draft202012Validator(
        {**spec, "$ref": f"#/components/schemas/{name}"}) for path, name in
        (("/v1/chat/completions", "ChatCompletionRequest"), ("/v1/completions", "CompletionRequest"))}
    drift, valid, served = [], 0, 0
    for entry in har["log"]["entries"]:
        path = "/" + entry["request"]["url"].split("/", 3)[3]
        text = entry["request"].get("postData", {}).get("text")
        if path not in validators or text is None:
            continue
        try:
            body = json.loads(text)
        except ValueError:
            continue
        if not validators[path].is_valid(body):
            continue
        valid += 1
        status = entry["response"]["status"]
        served += 200 <= status < 300
        if status == 400:
            error = json.loads(entry["response"]["content"]["text"])["error"]
            if error["code"] not in RUNTIME_CHECKS:
                drift.append((path, body, error))
    return drift, valid, served


def test_schemathesis_finds_no_server_error_and_no_response_off_the_description(serve, adapter, tmp_path):
    (tmp_path / "schemathesis.toml").write_text(schemathesis_config(adapter))
    spec = json.loads(get(serve + "/openapi.json")[1])
    out = subprocess.run(
        [str(ST), "run", serve + "/openapi.json", "--checks", CHECKS, "--phases", "examples,coverage,fuzzing",
         "--max-examples", "60", "--workers", "1", "--seed", "1", "--no-shrink",  # no --max-time: one round, seeded
         "--request-timeout", "60", "--suppress-health-check", "all", "--report", "har",
         "--report-har-path", str(tmp_path / "run.har")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    summary = out.stdout[out.stdout.rfind("SUMMARY"):]
    # Schemathesis' own data generation can hit a CPython recursion error on free-form objects; that is an
    # error of the tool ("while generating"), not a finding: any failed check or other error still fails.
    tool_errors = summary.count("Runtime Error") and out.stdout.count("while generating")
    assert out.returncode == 0 or ("Failures:" not in summary and tool_errors), out.stdout[-8000:] + out.stderr[-2000:]
    assert " passed" in summary and "Failures:" not in summary, summary
    assert "WARNINGS" not in out.stdout, out.stdout[out.stdout.find("WARNINGS"):]
    drift, valid, served = off_the_schema_400s(spec, json.loads((tmp_path / "run.har").read_text()))
    assert not drift, drift[:5]  # a 400 the schema does not state: the two have drifted apart
    assert served >= 10 and served > valid / 2, (valid, served)  # most allowed requests reach the generator
    served_ok = [e["request"] for e in json.loads((tmp_path / "run.har").read_text())["log"]["entries"]
                 if e["response"]["status"] == 200]
    routes = {r["url"].split("/", 3)[3] for r in served_ok}
    assert {"v1/models/ada", "v1/models/llama", "v1/load_lora_adapter", "v1/unload_lora_adapter"} <= routes
    models = {json.loads(r["postData"]["text"]).get("model") for r in served_ok if "completions" in r["url"]}
    assert "ada" in models and models & {"llama", None}  # generation reached the adapter and the base model
    assert get(serve + "/health")[0] == 200
    metrics = get(serve + "/metrics")[1].decode()
    assert metric(metrics, "pagedeck:pages_referenced") == 0
    assert metric(metrics, "pagedeck:api_requests_running") == 0
    assert metric(metrics, "pagedeck:api_requests_total") > 50  # the fuzzer really generated (seeded, bounded by examples)
