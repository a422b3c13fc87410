"""An agent loop through the `openai` SDK on a Mistral chat template.

Mistral's templates raise "Tool call IDs should be alphanumeric strings with
length 9!" on any other id in the history, so the ids wick issues must be of
that kind for the loop's next turn to be answered. Run by tests/openai_sdk.rs
with the server started on mistralai-Mistral-Nemo-Instruct-2407.jinja.
"""
import json
import os

import openai
import pytest

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = os.environ["WICK_API_KEY"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0)


def test_two_round_trips_with_the_ids_wick_issued(client):
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "What is the weather in Oslo, then in Rome?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ["required", named]:
        r = client.chat.completions.create(
            model=model, messages=msgs, tools=TOOLS, tool_choice=choice, max_tokens=40, temperature=0
        )
        message = r.choices[0].message
        assert message.tool_calls, r
        for call in message.tool_calls:
            assert len(call.id) == 9 and call.id.isalnum(), call.id
            assert isinstance(json.loads(call.function.arguments)["city"], str)
        # As an agent framework replays it: the SDK's own message, dumped.
        msgs.append(message.model_dump())
        msgs += [{"role": "tool", "tool_call_id": c.id, "content": "4 C"} for c in message.tool_calls]
    # Both rounds' ids go back once more, and are taken.
    r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant"
