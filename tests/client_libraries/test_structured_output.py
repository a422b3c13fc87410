"""wick under the libraries that turn a pydantic model into a forced tool
call: instructor (TOOLS mode) and langchain (`with_structured_output`,
`method="function_calling"`).

pydantic writes the model's schema without `additionalProperties` and
without bounds; wick reads such a schema as closed (docs/api.md, structured
output), so the default model's call ends within max_tokens 256 in JSON
that holds the model's keys and no others.

Run by tests/client_libraries.rs with WICK_BASE_URL pointing at a started
`wick serve` on the default model.
"""
import json
import os

import instructor
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = "sk-unused"
PROMPT = "Tell me about the biggest city in Norway, with all its statistics."
KEYS = {"name", "country", "population"}


class City(BaseModel):
    name: str
    country: str
    population: int


def test_the_schema_leaves_additional_properties_out():
    # What makes this a test of wick's rule: pydantic says nothing of
    # other keys, so only wick keeps them out.
    schema = City.model_json_schema()
    assert "additionalProperties" not in schema
    assert set(schema["properties"]) == KEYS


@pytest.fixture(scope="module")
def model():
    models = openai.OpenAI(base_url=BASE, api_key=KEY).models.list().data
    return models[0].id


def only_the_models_keys(args):
    assert set(args) == KEYS, args
    assert abs(args["population"]) <= 2**53 - 1, args


@pytest.mark.parametrize("seed", range(3))
def test_instructor_tools_mode(model, seed):
    client = instructor.from_openai(
        openai.OpenAI(base_url=BASE, api_key=KEY), mode=instructor.Mode.TOOLS
    )
    city, completion = client.chat.completions.create_with_completion(
        model=model,
        response_model=City,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=256,
        seed=seed,
        max_retries=0,
    )
    assert isinstance(city, City)
    choice = completion.choices[0]
    # Ended, not cut off ("stop" for a named call, as on OpenAI).
    assert choice.finish_reason in ("stop", "tool_calls"), completion
    (call,) = choice.message.tool_calls
    assert call.function.name == "City"
    only_the_models_keys(json.loads(call.function.arguments))


@pytest.mark.parametrize("seed", range(3))
def test_langchain_function_calling(model, seed):
    llm = ChatOpenAI(
        base_url=BASE, api_key=KEY, model=model, max_tokens=256, seed=seed, max_retries=0
    )
    structured = llm.with_structured_output(
        City, method="function_calling", include_raw=True
    )
    out = structured.invoke(PROMPT)
    assert out["parsing_error"] is None, out
    assert isinstance(out["parsed"], City), out
    raw = out["raw"]
    assert raw.response_metadata["finish_reason"] in ("stop", "tool_calls"), raw
    assert not raw.invalid_tool_calls, raw
    (call,) = raw.tool_calls
    assert call["name"] == "City"
    only_the_models_keys(call["args"])
