"""wick against the official `openai` Python SDK: a real client, sync and async.

Run by tests/openai_sdk.rs with WICK_BASE_URL pointing at a started `wick
serve` that requires the API key WICK_API_KEY.
"""
import asyncio
import json
import os

import httpx
import openai
import pytest

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = os.environ["WICK_API_KEY"]


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=BASE, api_key=KEY)


@pytest.fixture(scope="module")
def model(client):
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_models_retrieve(client, model):
    m = client.models.retrieve(model)
    assert (m.id, m.object, m.owned_by) == (model, "model", "wick")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.code == "model_not_found"


def test_a_wrong_key_is_an_authentication_error():
    wrong = openai.OpenAI(base_url=BASE, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.code == "invalid_api_key"


def test_request_ids_reach_the_response(client, model):
    raw = client.completions.with_raw_response.create(
        model=model, prompt="Hi", max_tokens=2, extra_headers={"X-Request-Id": "sdk-trace-7"}
    )
    assert raw.headers["x-request-id"] == "sdk-trace-7"
    assert raw.parse().id == "cmpl-sdk-trace-7"


def test_completion_sync(client, model):
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8


def test_completion_stream_equals_whole(client, model):
    args = dict(model=model, prompt="Water boils at", max_tokens=12, temperature=0)
    whole = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices)
    assert streamed == whole


def test_completion_n_stop_seed_logprobs(client, model):
    r = client.completions.create(
        model=model, prompt="List colours:", max_tokens=20, n=2, seed=7, temperature=0.9, logprobs=3, stop=["\n\n"]
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        assert "\n\n" not in c.text
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)
        assert all(len(t) <= 3 for t in c.logprobs.top_logprobs)
    again = client.completions.create(
        model=model, prompt="List colours:", max_tokens=20, n=2, seed=7, temperature=0.9, logprobs=3, stop=["\n\n"]
    )
    assert [c.text for c in again.choices] == [c.text for c in r.choices], "seeded requests repeat"


def test_completion_echo_scores_the_prompt(client, model):
    prompt = "The capital of France is"
    tokenized = httpx.post(
        os.environ["WICK_BASE_URL"] + "/tokenize", json={"prompt": prompt}, headers={"Authorization": f"Bearer {KEY}"}
    )
    n_prompt = len(tokenized.json()["tokens"])
    r = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == n_prompt + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_sync_and_stream(client, model):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a planet."}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2)
    assert r.choices[0].message.role == "assistant"
    text = r.choices[0].message.content
    assert text
    assert r.choices[0].logprobs.content[0].top_logprobs
    chunks = list(
        client.chat.completions.create(
            model=model, messages=msgs, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_async_client(model):
    async def run():
        client = openai.AsyncOpenAI(base_url=BASE, api_key=KEY)
        rs = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=8, temperature=0
                )
                for i in range(4)
            ]
        )
        stream = await client.completions.create(model=model, prompt="Hi", max_tokens=4, stream=True)
        pieces = [c.choices[0].text async for c in stream if c.choices]
        return rs, pieces

    rs, pieces = asyncio.run(run())
    assert all(r.choices[0].message.content for r in rs)
    assert pieces


def test_bad_request_raises(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="x", temperature=5)
    assert e.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")


def test_agent_loop_history(client, model):
    call = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
    msgs = [
        {"role": "developer", "content": "Answer with the time only."},
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "09:07"},
    ]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens > 20


def test_unsupported_fields_are_refused_by_name(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="x", suffix="!")
    assert (e.value.param, e.value.code) == ("suffix", "unsupported_parameter")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], extra_body={"guided_choice": ["a", "b"]}
        )
    assert e.value.param == "guided_choice"
    # The default model's template has no reasoning effort to set.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], reasoning_effort="low")
    assert (e.value.param, e.value.code) == ("reasoning_effort", "unsupported_parameter")
    assert "chat template has no reasoning effort" in e.value.message


def test_parse_with_a_pydantic_model(client, model):
    from typing import Literal

    import pydantic

    class Book(pydantic.BaseModel):
        title: str = pydantic.Field(max_length=40)
        year: int = pydantic.Field(ge=1400, le=2100)
        genre: Literal["novel", "poetry", "history"]

    for seed in range(3):
        r = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": "Name a book."}],
            response_format=Book,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
        )
        book = r.choices[0].message.parsed
        assert isinstance(book, Book), r
        assert 1400 <= book.year <= 2100


def test_tools_required_and_named(client, model):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 30}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]
    # Greedy: sampled at the SDK's default temperature of 1, "required" may
    # go on emitting parallel calls (or a 30-character city of multi-token
    # characters) past max_tokens, which says nothing about the server.
    for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
        r = client.chat.completions.create(
            model=model, messages=msgs, tools=tools, tool_choice=choice, max_tokens=60, temperature=0
        )
        c = r.choices[0]
        # As OpenAI: a call the request named ends as "stop".
        assert c.finish_reason == ("tool_calls" if choice == "required" else "stop")
        call = c.message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments)["city"], str)
        # The call goes back as history, with its result.
        follow = msgs + [c.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "4 C"}]
        r2 = client.chat.completions.create(model=model, messages=follow, max_tokens=4)
        assert r2.choices[0].message.role == "assistant"
