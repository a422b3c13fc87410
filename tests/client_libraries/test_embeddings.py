"""langchain's OpenAIEmbeddings against wick's /v1/embeddings on the default
model. `check_embedding_ctx_length=False` sends the texts as text (its
default tokenizes them with tiktoken, OpenAI's vocabulary, whose ids mean
nothing to another model; vLLM's docs give the same advice).

Run by tests/client_libraries.rs with WICK_BASE_URL pointing at a started
`wick serve` on the default model.
"""
import math
import os

from langchain_openai import OpenAIEmbeddings

BASE = os.environ["WICK_BASE_URL"] + "/v1"
# SmolLM2-135M's hidden size.
HIDDEN = 576


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_openai_embeddings_are_unit_vectors_that_rank_similar_texts_first():
    emb = OpenAIEmbeddings(
        base_url=BASE, api_key="sk-unused", model="SmolLM2-135M-Instruct.Q4_1",
        check_embedding_ctx_length=False, max_retries=0,
    )
    docs = emb.embed_documents([
        "The cat sat on the mat.",
        "A cat was sitting on a mat.",
        "Quarterly tax filings are due in April.",
    ])
    query = emb.embed_query("The cat sat on the mat.")
    assert len(docs) == 3 and all(len(v) == HIDDEN for v in docs + [query])
    for v in docs + [query]:
        assert abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-3
    # The same text, embedded alone or in a batch, is the same vector.
    assert cosine(query, docs[0]) > 0.999
    assert cosine(docs[0], docs[1]) > cosine(docs[0], docs[2])
