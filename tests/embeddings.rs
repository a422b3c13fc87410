//! `POST /v1/embeddings` on the default model over HTTP: vectors of the
//! model's hidden size, unit length, the same for a text and its token ids,
//! base64 the same bytes as floats, similar sentences closer than unrelated
//! ones, and bad requests refused in OpenAI's error shape. The values
//! themselves are checked against transformers in `tests/hf_models.rs`.

mod common;

use base64::Engine as _;
use serde_json::{json, Value};

use common::{assert_error, post, Server};

fn vectors(resp: &Value) -> Vec<Vec<f32>> {
    resp["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "embedding");
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn embeddings_over_http() {
    let server = Server::start(&[]);
    let texts = [
        "The cat sat on the mat.",
        "A cat was sitting on the mat.",
        "Stock markets fell sharply after the interest rate decision.",
    ];
    let (status, resp) = post(&server, "/v1/embeddings", json!({"input": texts})).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["object"], "list");
    let v = vectors(&resp);
    assert_eq!(v.len(), 3);
    // SmolLM2-135M's hidden size.
    for x in &v {
        assert_eq!(x.len(), 576);
        assert!((dot(x, x) - 1.0).abs() < 1e-4, "not unit length");
    }
    let (similar, unrelated) = (dot(&v[0], &v[1]), dot(&v[0], &v[2]));
    assert!(
        similar > unrelated,
        "cosine {similar} (similar) vs {unrelated} (unrelated)"
    );
    let tokens = resp["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 10 && resp["usage"]["total_tokens"] == tokens);

    // The same text as token ids, and as base64: the same vector.
    let (_, tok) = post(&server, "/tokenize", json!({"prompt": texts[0]})).await;
    let (status, by_ids) = post(&server, "/v1/embeddings", json!({"input": tok["tokens"]})).await;
    assert_eq!(status, 200, "{by_ids}");
    let diff = vectors(&by_ids)[0]
        .iter()
        .zip(&v[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-5, "token ids gave another vector ({diff})");
    let body = json!({"input": texts[0], "encoding_format": "base64"});
    let (status, b64) = post(&server, "/v1/embeddings", body).await;
    assert_eq!(status, 200, "{b64}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, vectors(&resp)[0]);

    for (body, param) in [
        (json!({"input": "x", "dimensions": 64}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": []}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": "x", "pooling": "max"}), "pooling"),
    ] {
        let (status, err) = post(&server, "/v1/embeddings", body.clone()).await;
        assert_error(status, &err, 400, Some(param));
    }
    let (status, err) = post(
        &server,
        "/v1/embeddings",
        json!({"input": "x", "model": "nope"}),
    )
    .await;
    assert_eq!(status, 404, "{err}");
    // The server still serves generation afterwards.
    let (status, _) = post(
        &server,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
}
