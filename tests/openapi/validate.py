"""Checks wick's /openapi.json with standard validators: the document
against OpenAPI 3.1's own schema (openapi-spec-validator), then real
requests and the server's real replies against it (openapi-core), every
route, streamed and whole, errors included; each event of a stream
against the schema the document names for it (jsonschema, draft 2020-12).

    python validate.py BASE_URL
"""

import json
import sys

import requests
from jsonschema import Draft202012Validator
from openapi_core import OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse
from openapi_spec_validator import validate

base = sys.argv[1]
doc = requests.get(base + "/openapi.json", timeout=30).json()
validate(doc)
api = OpenAPI.from_dict(doc)
checked = set()


def event_validator(path, method):
    media = doc["paths"][path][method]["responses"]["200"]["content"]["text/event-stream"]
    return Draft202012Validator({"$ref": media["x-wick-event"]["$ref"], "components": doc["components"]})


def call(method, path, body=None, route=None, status=200, stream=False):
    req = requests.Request(method, base + path, json=body)
    resp = requests.Session().send(req.prepare(), timeout=120)
    assert resp.status_code == status, (method, path, resp.status_code, resp.text[:500])
    oreq = RequestsOpenAPIRequest(req)
    if status < 400:
        api.validate_request(oreq)
    api.validate_response(oreq, RequestsOpenAPIResponse(resp))
    checked.add((method.lower(), route or path))
    if stream:
        validator = event_validator(route or path, method.lower())
        events = 0
        for line in resp.text.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                data = json.loads(line[5:])
                errors = sorted(validator.iter_errors(data), key=str)
                assert not errors, (path, data, [e.message for e in errors[:3]])
                events += 1
        assert events > 1, (path, resp.text[:300])
    return resp


chat = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12}
call("POST", "/v1/completions", {"prompt": "The sky is", "max_tokens": 8, "logprobs": 2})
call("POST", "/v1/completions", {"prompt": "The sky is", "max_tokens": 8, "stream": True,
                                 "stream_options": {"include_usage": True}}, stream=True)
call("POST", "/v1/chat/completions", {**chat, "n": 2, "logprobs": True, "top_logprobs": 2, "seed": 1})
call("POST", "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}},
     stream=True)
tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
call("POST", "/v1/chat/completions", {**chat, "max_tokens": 40, "tools": [tool], "tool_choice": "required"})
call("POST", "/v1/chat/completions", {**chat, "max_tokens": 40, "tools": [tool], "tool_choice": "required",
                                      "stream": True}, stream=True)
call("POST", "/v1/chat/completions", {**chat, "max_tokens": 30, "response_format": {
    "type": "json_schema", "json_schema": {"name": "c", "schema": {
        "type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}}}})
call("POST", "/v1/chat/completions", {**chat, "bogus": 1}, status=400)
call("POST", "/v1/embeddings", {"input": ["a candle", "a flame"]})
kept = call("POST", "/v1/responses", {"input": "Name a colour.", "max_output_tokens": 16}).json()
call("POST", "/v1/responses", {"input": "Name a colour.", "max_output_tokens": 16, "stream": True},
     stream=True)
call("GET", "/v1/responses/" + kept["id"], route="/v1/responses/{id}")
call("DELETE", "/v1/responses/" + kept["id"], route="/v1/responses/{id}")
call("GET", "/v1/responses/" + kept["id"], route="/v1/responses/{id}", status=404)
model = requests.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
messages = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "Name a colour."}]}
call("POST", "/v1/messages", messages)
call("POST", "/v1/messages", {**messages, "stream": True}, stream=True)
call("POST", "/v1/messages", {**messages, "max_tokens": 40, "tools": [
    {"name": "get_weather", "input_schema": tool["function"]["parameters"]}],
    "tool_choice": {"type": "any"}})
call("POST", "/v1/messages", {**messages, "max_tokens": -1}, status=400)
call("POST", "/v1/messages/count_tokens", {"model": model, "messages": messages["messages"]})
models = call("GET", "/v1/models").json()
call("GET", "/v1/models/" + models["data"][0]["id"], route="/v1/models/{id}")
call("GET", "/v1/models/nope", route="/v1/models/{id}", status=404)
call("GET", "/tokenizer_info")
ids = call("POST", "/tokenize", {"prompt": "hello world"}).json()["tokens"]
call("POST", "/detokenize", {"tokens": ids})
call("GET", "/health")
call("GET", "/metrics")
call("GET", "/openapi.json")
call("GET", "/")

listed = {(m, p) for p, item in doc["paths"].items() for m in item}
missing = listed - checked
assert not missing, f"routes never exercised: {sorted(missing)}"
print(f"ok: {len(checked)} routes")
