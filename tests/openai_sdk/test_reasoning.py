"""A model that thinks, through the official `openai` SDK: its thinking in
`reasoning_content` apart from its answer in `content`, whole and streamed,
and `reasoning_effort` reaching the chat template.

Run by tests/openai_sdk.rs against `wick serve --chat-template thinking.jinja`
(a template that opens a `<think>` block in the prompt, as Qwen3's does),
with WICK_BASE_URL and WICK_API_KEY as for test_openai_sdk.py. The default
model does not think by itself: earlier turns that did, sent back with
their reasoning_content, make greedy decoding think the same way.
"""
import os

import openai
import pytest

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = os.environ["WICK_API_KEY"]

SHOTS = [
    ("What is 2 + 2?", "Two plus two.", "4"),
    ("What is 3 + 3?", "Three plus three.", "6"),
    ("What is 1 + 1?", "One plus one.", "2"),
]


def conversation(question):
    msgs = []
    for q, thought, answer in SHOTS:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "reasoning_content": thought, "content": answer}]
    return msgs + [{"role": "user", "content": question}]


ARGS = dict(messages=conversation("What is 4 + 4?"), max_tokens=40, temperature=0)


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=BASE, api_key=KEY)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def reasoning(obj):
    """The field the SDK does not declare: an extra of its pydantic model."""
    return (obj.model_extra or {}).get("reasoning_content")


def test_reasoning_apart_from_the_answer(client, model):
    m = client.chat.completions.create(model=model, **ARGS).choices[0].message
    assert m.reasoning_content == reasoning(m)
    assert m.reasoning_content.strip() == "Four plus four."
    assert m.content == "8"


def test_streamed_reasoning_apart_from_the_answer(client, model):
    whole = client.chat.completions.create(model=model, **ARGS).choices[0].message
    deltas = [c.choices[0].delta for c in client.chat.completions.create(model=model, stream=True, **ARGS) if c.choices]
    assert "".join(reasoning(d) or "" for d in deltas) == whole.reasoning_content
    assert "".join(d.content or "" for d in deltas) == whole.content
    # The thinking all comes before the answer.
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert any(reasoning(d) for d in deltas[:first_answer])
    assert not any(reasoning(d) for d in deltas[first_answer:])


def test_reasoning_effort_reaches_the_template(client, model):
    # thinking.jinja closes the block in the prompt for "none": no thinking.
    m = client.chat.completions.create(model=model, reasoning_effort="none", **ARGS).choices[0].message
    assert reasoning(m) is None
    assert m.content == "8"
    m = client.chat.completions.create(model=model, reasoning_effort="high", **ARGS).choices[0].message
    assert reasoning(m).strip() == "Four plus four."
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, reasoning_effort="extreme", **ARGS)
    assert e.value.param == "reasoning_effort"
