"""Agent libraries with `tool_choice` auto on the default model, whose chat
template (SmolLM2's) has no tool-call format: wick serves them in its
generic format (docs/api.md, tools), where they used to get a 400.

- langchain `bind_tools`: an answer in text, and a history with an
  AIMessage's call and its ToolMessage result taken back;
- pydantic-ai: a function tool beside a structured output, run to a
  validated object;
- openai-agents on its chat-completions model: an Agent with one function
  tool, run to a final answer.

The 135M model rarely chooses a call on its own, so these assert the
protocol (each library's parse of wick's replies), not the model's choice.

Run by tests/client_libraries.rs with WICK_BASE_URL pointing at a started
`wick serve` on the default model.
"""
import json
import os

import openai
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from agents import ModelSettings
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = "sk-unused"


def model_id():
    return openai.OpenAI(base_url=BASE, api_key=KEY).models.list().data[0].id


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny, 24 C"


def test_langchain_bind_tools_answers_and_takes_tool_messages_back():
    llm = ChatOpenAI(
        base_url=BASE, api_key=KEY, model=model_id(), temperature=0, max_tokens=40,
        max_retries=0,
    ).bind_tools([get_weather])
    reply = llm.invoke("Say hello to me.")
    assert isinstance(reply.content, str) and reply.content.strip(), reply
    assert reply.tool_calls == [], reply

    history = [
        HumanMessage("What is the weather in Paris?"),
        AIMessage(
            content="",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}],
        ),
        ToolMessage(content="sunny, 24 C", tool_call_id="call_1"),
    ]
    reply = llm.invoke(history)
    # Text, or calls valid against the tool's schema.
    assert reply.content or reply.tool_calls, reply
    for call in reply.tool_calls:
        assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str), call


class City(BaseModel):
    name: str
    country: str


def test_pydantic_ai_tool_and_structured_output():
    model = OpenAIChatModel(model_id(), provider=OpenAIProvider(base_url=BASE, api_key=KEY))
    agent = PydanticAgent(
        model, output_type=City, model_settings={"temperature": 0, "max_tokens": 60}
    )

    @agent.tool_plain
    def population(city: str) -> int:
        """The population of a city."""
        return 2_100_000

    result = agent.run_sync("Paris is in France. Give me data about Paris.")
    assert isinstance(result.output, City), result.output
    assert result.output.name and result.output.country, result.output


def test_openai_agents_chat_completions_path_reaches_a_final_answer():
    client = openai.AsyncOpenAI(base_url=BASE, api_key=KEY)

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return "sunny, 24 C"

    agent = Agent(
        name="assistant",
        instructions="You are a helpful assistant.",
        tools=[weather],
        model=OpenAIChatCompletionsModel(model=model_id(), openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=60),
    )
    result = Runner.run_sync(
        agent, "Say hello to me.", max_turns=4,
        run_config=RunConfig(tracing_disabled=True),
    )
    assert isinstance(result.final_output, str) and result.final_output.strip(), json.dumps(
        [str(i) for i in result.new_items]
    )
