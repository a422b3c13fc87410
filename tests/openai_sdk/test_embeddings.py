"""wick's /v1/embeddings through the official `openai` Python SDK.

Run by tests/openai_sdk.rs against a started `wick serve` (WICK_BASE_URL,
WICK_API_KEY).
"""
import math
import os

import openai

BASE = os.environ["WICK_BASE_URL"] + "/v1"
KEY = os.environ["WICK_API_KEY"]


def test_embeddings_create():
    client = openai.OpenAI(base_url=BASE, api_key=KEY)
    model = client.models.list().data[0].id
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Bond yields rose again."]
    # The SDK asks for base64 by default and decodes it itself.
    resp = client.embeddings.create(model=model, input=texts)
    vectors = [d.embedding for d in resp.data]
    assert [d.index for d in resp.data] == [0, 1, 2]
    assert all(len(v) == len(vectors[0]) > 0 for v in vectors)
    for v in vectors:
        assert math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-4)
    cos = lambda a, b: sum(x * y for x, y in zip(a, b))
    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2])
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0
    floats = client.embeddings.create(model=model, input=texts[0], encoding_format="float")
    assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, vectors[0])) < 1e-6
