"""wick's /v1/responses under real clients: the `openai` SDK's
`responses.create`, `responses.stream` and `responses.parse`, function
calls continued by `previous_response_id`, the kept responses' retrieve
and delete, and an openai-agents Agent with one function tool run to its
final answer through the Responses API (the SDK's default model).

Run by tests/client_libraries.rs with WICK_BASE_URL pointing at a started
`wick serve` on the default model under a chat template that teaches
Hermes tool calls (so the agent's turn after its call, sent without
tool_choice, may answer or call). The model is tiny: calls are forced with
tool_choice where a test needs one, and the tests check the protocol, not
the model's answers.
"""
import json
import os

import openai
import pytest
from pydantic import BaseModel

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = "sk-unused"

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def check_usage(r, most_output):
    u = r.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= most_output, u
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    assert u.input_tokens_details.cached_tokens <= u.input_tokens, u
    assert u.output_tokens_details.reasoning_tokens == 0, u


def test_create_answers_text(client, model):
    r = client.responses.create(
        model=model,
        instructions="Answer in one short sentence.",
        input="What is the capital of France?",
        max_output_tokens=24,
        temperature=0,
        metadata={"test": "create"},
        store=False,
    )
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.status in ("completed", "incomplete"), r
    assert r.model == model and r.metadata == {"test": "create"}
    assert r.instructions == "Answer in one short sentence."
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant", item
    assert item.id.startswith("msg_")
    assert r.output_text and r.output_text == item.content[0].text
    check_usage(r, 24)
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    # Not kept: store was false.
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_items_in_and_a_cut_off_reply(client, model):
    r = client.responses.create(
        model=model,
        input=[
            {"role": "developer", "content": "You are terse."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count to twenty."}]},
        ],
        max_output_tokens=5,
        temperature=0,
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 5
    assert r.output[0].status == "incomplete"


def test_stream_events(client, model):
    deltas = []
    types = []
    numbers = []
    with client.responses.stream(
        model=model,
        input="Name a city in Norway and its country.",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        for event in stream:
            types.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert numbers == list(range(len(numbers))), numbers
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ], types
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], types
    assert final.status == "completed"
    assert "".join(deltas) == final.output_text
    # text.format json_schema: the output is the schema's object.
    city = final.output_parsed
    assert isinstance(city, City), final.output_text
    assert set(json.loads(final.output_text)) == {"name", "country"}


def test_parse_json_schema(client, model):
    r = client.responses.parse(
        model=model,
        input="Tell me about Oslo.",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    )
    assert isinstance(r.output_parsed, City), r.output_text
    assert r.text.format.type == "json_schema"


def test_function_call_round_trip(client, model):
    first = client.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    )
    assert first.status == "completed", first
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather", call
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert set(json.loads(call.arguments)) == {"city"}
    assert first.tools[0].name == "get_weather"

    # The kept response answers retrieve, and continues the conversation.
    assert client.responses.retrieve(first.id).output[0].call_id == call.call_id
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 C and sunny"}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=30,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.output[0].type == "message" and second.output_text, second
    # The history was rendered: the prompt holds the first turn and the result.
    assert second.usage.input_tokens > first.usage.input_tokens

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=model, previous_response_id=first.id, input="And tomorrow?")
    assert e.value.body["param"] == "previous_response_id"


def test_streamed_function_call(client, model):
    args = []
    with client.responses.stream(
        model=model,
        input="Weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                args.append(event.delta)
            if event.type == "response.function_call_arguments.done":
                done = event
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert "".join(args) == call.arguments == done.arguments
    assert done.name == "get_weather"
    json.loads(call.arguments)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
            "input[0].content[0].type",
        ),
        ({"conversation": "conv_1"}, "conversation"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_what_wick_cannot_honour_is_refused(client, model, extra, param):
    body = {"model": model, "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**body)
    assert e.value.body["param"] == param, e.value.body


def weather_agent(model, calls):
    """An Agent with one function tool, on the SDK's default model class
    (OpenAIResponsesModel, which calls /v1/responses)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is 22 C and sunny in {city}."

    client = openai.AsyncOpenAI(base_url=BASE, api_key=KEY, max_retries=0)
    return Agent(
        name="weather",
        instructions="You answer questions about the weather. Use the tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        # The first turn must call; after the call the SDK resets
        # tool_choice, so the model may answer.
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
    )


def check_run(result, calls):
    from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

    assert calls, "the tool was never called"
    kinds = [type(i) for i in result.new_items]
    assert kinds[:2] == [ToolCallItem, ToolCallOutputItem], kinds
    assert kinds[-1] == MessageOutputItem, kinds
    assert isinstance(result.final_output, str) and result.final_output.strip(), result
    # Every model call went through /v1/responses.
    assert len(result.raw_responses) >= 2
    assert all(r.response_id and r.response_id.startswith("resp_") for r in result.raw_responses)


def test_agent_with_a_function_tool(model):
    from agents import Runner

    calls = []
    result = Runner.run_sync(weather_agent(model, calls), "What is the weather in Paris?", max_turns=6)
    check_run(result, calls)


def test_agent_streamed(model):
    import asyncio

    from agents import Runner

    async def run():
        calls = []
        result = Runner.run_streamed(weather_agent(model, calls), "What is the weather in Oslo?", max_turns=6)
        kinds = set()
        async for event in result.stream_events():
            if event.type == "raw_response_event":
                kinds.add(event.data.type)
        check_run(result, calls)
        assert {"response.created", "response.completed", "response.output_text.delta"} <= kinds, kinds
        assert "response.function_call_arguments.delta" in kinds, kinds

    asyncio.run(run())
