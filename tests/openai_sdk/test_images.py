"""Images through the real clients: the `openai` SDK's chat `image_url`
parts (whole and streamed) and Responses `input_image` parts, and the
`anthropic` SDK's base64 image blocks, and a conversation's next turn
from the prefix cache, against a tiny random Gemma 3 with images
(tests/fixtures/gemma3vl-tiny). The conversation and its expected
prompt length and greedy reply are transformers' (the fixture's
reference.json, written by scripts/make_vision_fixtures.py).

Run by tests/openai_sdk.rs with WICK_BASE_URL and WICK_API_KEY as for
test_openai_sdk.py.
"""
import base64
import json
import os
import pathlib

import anthropic
import openai
import pytest

BASE = os.environ["WICK_BASE_URL"]
KEY = os.environ["WICK_API_KEY"]
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"
REFERENCE = json.loads((FIXTURES / "gemma3vl-tiny" / "reference.json").read_text())["chat"]
SYSTEM = REFERENCE["messages"][0]["content"]
TEXTS = [p["text"] for p in REFERENCE["messages"][1]["content"] if p["type"] == "text"]


def b64(name):
    return base64.b64encode((FIXTURES / "images" / name).read_bytes()).decode()


def data_url(name):
    return f"data:image/png;base64,{b64(name)}"


def chat_messages(images):
    """The reference conversation: text, an image, text, an image."""
    content = []
    for text, image in zip(TEXTS, images):
        content += [{"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": data_url(image)}}]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


ARGS = dict(max_tokens=len(REFERENCE["greedy"]), temperature=0)


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_the_model_says_it_takes_images(client, model):
    card = client.models.retrieve(model)
    assert card.input_modalities == ["text", "image"]


def test_chat_with_two_images(client, model):
    r = client.chat.completions.create(model=model, messages=chat_messages(REFERENCE["images"]), **ARGS)
    assert r.usage.prompt_tokens == len(REFERENCE["input_ids"])
    assert r.choices[0].message.content == REFERENCE["greedy_text"]


def test_chat_with_two_images_streamed(client, model):
    stream = client.chat.completions.create(
        model=model, messages=chat_messages(REFERENCE["images"]), stream=True,
        stream_options={"include_usage": True}, **ARGS)
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    assert text == REFERENCE["greedy_text"]
    assert usage.prompt_tokens == len(REFERENCE["input_ids"])


def test_responses_input_image(client, model):
    content = []
    for text, image in zip(TEXTS, REFERENCE["images"]):
        content += [{"type": "input_text", "text": text},
                    {"type": "input_image", "image_url": data_url(image), "detail": "auto"}]
    r = client.responses.create(
        model=model, instructions=SYSTEM, max_output_tokens=ARGS["max_tokens"], temperature=0,
        input=[{"role": "user", "content": content}])
    assert r.output_text == REFERENCE["greedy_text"]
    assert r.usage.input_tokens == len(REFERENCE["input_ids"])


def test_anthropic_base64_image_blocks():
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0)
    content = []
    for text, image in zip(TEXTS, REFERENCE["images"]):
        content += [{"type": "text", "text": text},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": b64(image)}}]
    model = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY).models.list().data[0].id
    # The SDK no longer declares `temperature`; older clients send it.
    r = client.messages.create(model=model, system=SYSTEM, max_tokens=ARGS["max_tokens"],
                               extra_body={"temperature": 0},
                               messages=[{"role": "user", "content": content}])
    # Anthropic's input_tokens leaves out what the cache supplied (earlier
    # tests sent the same conversation).
    usage = r.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(REFERENCE["input_ids"])
    assert "".join(b.text for b in r.content if b.type == "text") == REFERENCE["greedy_text"]


def test_a_conversation_s_next_turn_comes_from_the_prefix_cache(client, model):
    """The model's layers all attend through a sliding window, so the
    second turn's hit comes from the window pool's cached blocks. Its reply
    is the one computed in full (under a cache salt of its own, so nothing
    is shared); a conversation with the same text and the images swapped
    shares only what comes before the first image."""
    first = chat_messages(REFERENCE["images"])
    r1 = client.chat.completions.create(model=model, messages=first, **ARGS)
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "And then?"}]
    cached = client.chat.completions.create(model=model, messages=second, **ARGS)
    hit = cached.usage.prompt_tokens_details.cached_tokens
    assert len(REFERENCE["input_ids"]) // 2 < hit < cached.usage.prompt_tokens
    computed = client.chat.completions.create(
        model=model, messages=second, extra_body={"cache_salt": "computed"}, **ARGS)
    assert computed.usage.prompt_tokens_details.cached_tokens == 0
    assert cached.choices[0].message.content == computed.choices[0].message.content

    config = json.loads((FIXTURES / "gemma3vl-tiny" / "config.json").read_text())
    first_image = REFERENCE["input_ids"].index(config["image_token_index"])
    swapped = client.chat.completions.create(
        model=model, messages=chat_messages(REFERENCE["images"][::-1]), **ARGS)
    assert swapped.usage.prompt_tokens_details.cached_tokens <= first_image


def test_an_image_url_to_fetch_is_refused(client, model):
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=messages, **ARGS)
    assert e.value.body["param"] == "messages[0].content[1].image_url"
    assert "data: URL" in e.value.body["message"]
