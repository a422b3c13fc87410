"""wick's `/v1/messages` under the official `anthropic` SDK: a chat, a
stream (text deltas and the final message the SDK assembles from the
events), a tool round trip (a forced call, its result sent back, a text
answer), a streamed call, count_tokens, and errors raised as the SDK's
exception classes.

Run by tests/client_libraries.rs with WICK_BASE_URL pointing at a started
`wick serve --api-key WICK_API_KEY` on the default model, so every call
goes through the key check with the `x-api-key` header the SDK sends.

The SDK no longer declares `temperature` (current Claude models take
none); older clients send it, and so do these tests, through `extra_body`,
for greedy replies that a stream can be compared with.
"""
import json
import os
import urllib.request

import anthropic
import pytest

BASE = os.environ["WICK_BASE_URL"]
KEY = os.environ["WICK_API_KEY"]
GREEDY = {"temperature": 0}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client():
    return anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def model():
    req = urllib.request.Request(BASE + "/v1/models", headers={"x-api-key": KEY})
    with urllib.request.urlopen(req) as r:
        return json.load(r)["data"][0]["id"]


def chat(model):
    return dict(
        model=model,
        max_tokens=40,
        extra_body=GREEDY,
        system="You are a helpful assistant.",
        messages=[{"role": "user", "content": "Write one sentence about the sea."}],
    )


def test_chat(client, model):
    m = client.messages.create(**chat(model))
    assert isinstance(m, anthropic.types.Message)
    assert m.id.startswith("msg_") and m.role == "assistant" and m.model == model
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens > 10
    assert 1 <= m.usage.output_tokens <= 40


def test_stream(client, model):
    whole = client.messages.create(**chat(model))
    with client.messages.stream(**chat(model)) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) > 1
    assert "".join(texts) == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequence(client, model):
    text = client.messages.create(**chat(model)).content[0].text
    stop = next(w for w in text.split()[2:] if len(w) > 3 and text.find(w) > 0)
    m = client.messages.create(**chat(model), stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[: text.find(stop)]


def test_tool_round_trip(client, model):
    m = client.messages.create(
        model=model,
        max_tokens=60,
        extra_body=GREEDY,
        messages=[QUESTION],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert m.stop_reason == "tool_use"
    (call,) = m.content
    assert isinstance(call, anthropic.types.ToolUseBlock)
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    assert set(call.input) == {"city"} and isinstance(call.input["city"], str)
    # The reply goes back as the SDK returned it, with the tool's result.
    answer = client.messages.create(
        model=model,
        max_tokens=30,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            QUESTION,
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "21 C and sunny"}],
            },
        ],
    )
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")


def test_streamed_tool_call(client, model):
    args = dict(
        model=model,
        max_tokens=60,
        extra_body=GREEDY,
        messages=[QUESTION],
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in events
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == whole.content[0].input


def test_count_tokens(client, model):
    m = client.messages.create(**chat(model))
    args = chat(model)
    del args["max_tokens"], args["extra_body"]
    counted = client.messages.count_tokens(**args)
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_errors(client, model):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=model, max_tokens=5, messages=[{"role": "user", "content": [image]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].type" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="not-a-served-model", max_tokens=5, messages=[QUESTION])
    wrong = anthropic.Anthropic(base_url=BASE, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=model, max_tokens=5, messages=[QUESTION])
