"""Writes a random-weight GGUF of Llama-3.2-1B's shape, for benchmarks at a
realistic size: hidden 2048, 16 layers, 32 heads over 8 KV heads, FFN 8192,
with the default model's tokenizer (vocabulary 49152) and chat template.
Other shapes, by --arch:

- qwen3: Qwen3-1.7B's shape: 28 layers, 16 heads of 128 over 8 KV heads,
  FFN 6144, an RMSNorm per query and key head.
- phi3: Phi-4-mini's layout at 1B size: hidden 2048, 16 layers, 16 heads
  of 128 over 8 KV heads, FFN 8192; q/k/v fused in attn_qkv and gate/up in
  ffn_up; rotary on 96 of each head's 128 dimensions (0.75), LongRoPE
  factor tensors of 48 (short ones, long ones rising to 32x), context
  131072 over an original 4096.
- gemma3: Gemma-3-1B's shape: hidden 1152, 26 layers, 4 heads of 256 over
  1 KV head, FFN 6912 (GeGLU), q/k norms and norms after attention and the
  FFN, a 512-token sliding window on five layers of six, rope base 1e6
  (global layers) and 1e4 (local ones). Its norms are stored as 1 + w, as
  llama.cpp's converter writes them, so ones here too.
- qwen35: Qwen3.5-0.8B's text shape (GGUF arch `qwen35`): hidden 1024, 24
  layers, every 4th gated full attention (8 query heads of 256, each with
  its output gate, over 2 KV heads; q/k norms; RoPE on a quarter of each
  head, base 1e7, interleaved sections 11/11/10), the other 18 gated
  DeltaNet linear attention (16 key heads of 128 and 16 value heads of
  128, a 4-tap causal conv, a z-gated RMSNorm), FFN 3584 (SwiGLU), context
  262144. Not written here but by llama.cpp's own converter: transformers
  (5.x, with qwen3_5) makes a random Qwen3_5ForCausalLM of that shape,
  its initialisation as for the tiny test fixture (linear and conv weights
  N(0, 0.02), the 1 + w norms at 1, dt_bias 1, A_log = log U(0.01, 16)),
  and `convert_hf_to_gguf.py --no-mtp --outtype f16` from the llama.cpp
  source given by --llama-cpp converts it, its vocabulary step replaced by
  a copy of --tokenizer-from's tokenizer keys. llama.cpp checks the
  hidden size and layer count (24 layers at 1024 is its "0.8B"); the head
  counts and sizes, FFN width, rope base and sections are Qwen3.5-0.8B's
  published config.json as recalled, not checked against the file here;
  the vocabulary is the default model's 49152, not Qwen's 248320, so the
  embedding is a fifth of the real one's. Needs torch and transformers
  and about 3 GB of disk in the temporary directory.
- gemma4: Gemma 4 E2B's text shape (GGUF arch `gemma4`): hidden 1536, 35
  layers, 8 query heads over 1 KV head, heads of 256 on the sliding-window
  layers (a 512-token window, rope base 1e4) and of 512 on every fifth,
  global one (proportional RoPE on a quarter of each head, base 1e6),
  FFN 6144 (GeGLU), doubled on the last 20 layers, which reuse the K/V of
  layers 13 and 14; per-layer inputs 256 wide; a final logit soft cap of
  30; context 131072. Made as qwen35 is, by transformers (a random
  Gemma4ForCausalLM in bf16, linear weights N(0, 0.02), norms and layer
  scalars 1) and llama.cpp's converter (`--outtype f16`). The vocabulary
  (and the per-layer inputs' table) is --tokenizer-from's, 49152 for the
  default model's, not Gemma's 262144: the embeddings are a fifth of the
  real ones'. Needs torch and transformers and about 10 GB of disk in the
  temporary directory, 9 GB of memory.
- qwen3moe: Qwen3-30B-A3B's exact shape (GGUF arch `qwen3moe`), written
  straight to llama.cpp's Q4_K_M block types, with no f16 file between
  (that would be ~61 GB): hidden 2048, 48 layers, 32 query heads of 128
  over 4 KV heads, q/k norms, 128 experts of FFN 768 with 8 used per
  token (ffn_gate_exps/ffn_up_exps/ffn_down_exps, a router ffn_gate_inp in
  F32), rope base 1e6, context 40960, an untied output, vocabulary 151936
  (the copied tokens padded with normal `[PAD{i}]` ones to Qwen's size, as
  llama.cpp needs as many tokens as embedding rows; normal, so that each
  generated one has text and a streamed benchmark sees every token). Types as llama.cpp's
  Q4_K_M picks them for this model: Q4_K for attn_q/k/output, gate/up
  experts and token_embd, Q6_K for output and, on the layers of
  llama.cpp's use_more_bits (i < n/8, i >= 7n/8, (i - n/8) % 3 == 2; 24
  of 48), attn_v and ffn_down_exps, Q4_K on the others; F32 norms and
  router. The blocks are random bytes but for their f16 scales (d, dmin;
  Q6_K's int8 sub-scales 8..16), set so weights come out about 0.02 in
  size; written tensor by tensor, one tensor in memory at a time (17.28
  GiB, 30.53B parameters; 33 s and 0.4 GB of memory on 2 cores here).
  --out is the Q4_K_M file itself; --llama-quantize does not apply.

- gpt-oss: gpt-oss-20b's exact shape (GGUF arch `gpt-oss`) in the block
  types of llama.cpp's MXFP4 release file, written directly as qwen3moe
  is: hidden 2880, 24 layers, 64 query heads of 64 over 8 KV heads with
  biases on q/k/v/o and a sink per head, the even layers within a
  128-token window, YaRN (factor 32 from 4096, base 150000), 32 experts
  of FFN 2880 with 4 used per token, in MXFP4 with F32 biases, a biased
  F32 router, vocabulary 201088 (padded as qwen3moe's), untied output.
  The other matrices are Q8_0 (as llama-quantize's MXFP4_MOE makes them).
  MXFP4 blocks are random nibbles under exponent 2^-7, so weights are
  about 0.02 in size; Q8_0 blocks random int8 with d = 0.02 / 74. About
  12 GiB (20.9B parameters).

The output matrix is tied to the embeddings but for qwen3moe and gpt-oss.

    pip install gguf==0.17.1 numpy
    python3 scripts/make_random_gguf.py --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf \
        --out /tmp/llama1b-F16.gguf [--arch ARCH] [--llama-quantize PATH --types Q4_K_M,Q4_0]
    # qwen35 and gemma4 also need llama.cpp's source (convert_hf_to_gguf.py and gguf-py):
    python3 scripts/make_random_gguf.py --arch qwen35 --llama-cpp LLAMA_CPP_SRC \
        --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/qwen35-F16.gguf ...
    # qwen3moe is written as Q4_K_M directly (~17 GiB), gpt-oss as MXFP4 (~12 GiB):
    python3 scripts/make_random_gguf.py --arch qwen3moe \
        --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf --out /work/big/qwen3moe-30b-a3b-Q4_K_M.gguf

The weights are N(0, 0.02) in f16 (norms are 1; qwen3moe's blocks are
random but of about that size), so the model says nothing useful; only its shape and block types matter. With --llama-quantize each
type is written beside the f16 file as llama.cpp's own llama-quantize makes
it (e.g. /tmp/llama1b-Q4_K_M.gguf).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np

# (hidden, layers, heads, KV heads, head size, FFN) per architecture.
SHAPES = {
    "llama": (2048, 16, 32, 8, 64, 8192),
    "qwen3": (2048, 28, 16, 8, 128, 6144),
    "phi3": (2048, 16, 16, 8, 128, 8192),
    "gemma3": (1152, 26, 4, 1, 256, 6912),
}
# rotary dimensions, rope base, RMSNorm epsilon, context per architecture.
ROPE = {
    "llama": (64, 500000.0, 1e-5, 8192),
    "qwen3": (128, 1000000.0, 1e-6, 8192),
    "phi3": (96, 10000.0, 1e-5, 131072),
    "gemma3": (256, 1000000.0, 1e-6, 32768),
}
PHI3_ORIGINAL_CONTEXT = 4096
GEMMA3_WINDOW = 512
# Qwen3-30B-A3B's config, as llama.cpp's converter writes it (GGUF arch qwen3moe).
QWEN3MOE = dict(
    hidden=2048,
    layers=48,
    heads=32,
    kv_heads=4,
    head_dim=128,
    ffn=6144,
    experts=128,
    experts_used=8,
    expert_ffn=768,
    vocab=151936,
    rope_base=1000000.0,
    eps=1e-6,
    context=40960,
)
# Qwen3.5-0.8B's text config, as Qwen3_5TextConfig takes it.
QWEN35 = dict(
    hidden_size=1024,
    num_hidden_layers=24,
    intermediate_size=3584,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    full_attention_interval=4,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=16,
    linear_key_head_dim=128,
    linear_num_value_heads=16,
    linear_value_head_dim=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=262144,
    tie_word_embeddings=True,
    initializer_range=0.02,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)
# Gemma 4 E2B's text config (its published shape), vocabulary aside.
GEMMA4 = dict(
    hidden_size=1536,
    num_hidden_layers=35,
    intermediate_size=6144,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    hidden_size_per_layer_input=256,
    num_kv_shared_layers=20,
    use_double_wide_mlp=True,
    sliding_window=512,
    final_logit_softcapping=30.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    initializer_range=0.02,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0},
    },
)
# Run in a child python, so that the converter's own gguf-py (which knows
# qwen35) is the one imported; it calls copy_tokenizer below in place of
# the converter's vocabulary step.
CONVERT = """
import sys
llama_cpp, here, hf_dir, out, tokenizer_from, arch = sys.argv[1:7]
sys.path[:0] = [llama_cpp, llama_cpp + "/gguf-py", here]
import convert_hf_to_gguf
from conversion import gemma, qwen
import make_random_gguf

copy = lambda self: make_random_gguf.copy_tokenizer(self.gguf_writer, tokenizer_from)
qwen.Qwen3_5TextModel.set_vocab = copy
gemma.Gemma4Model.set_vocab = copy
extra = ["--no-mtp"] if arch == "qwen35" else []
sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", "f16", *extra,
            "--model-name", "random-" + arch]
convert_hf_to_gguf.main()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer.* keys are copied")
    ap.add_argument("--out", required=True, help="the f16 GGUF to write (qwen3moe: the Q4_K_M one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-quantize", help="llama.cpp's llama-quantize, to make --types")
    ap.add_argument("--types", default="Q4_K_M,Q4_0")
    ap.add_argument("--arch", choices=sorted([*SHAPES, "qwen35", "gemma4", "qwen3moe", "gpt-oss"]),
                    default="llama")
    ap.add_argument("--llama-cpp", help="llama.cpp's source (convert_hf_to_gguf.py, gguf-py); --arch qwen35 and gemma4")
    args = ap.parse_args()
    if args.arch in ("qwen3moe", "gpt-oss") and args.llama_quantize:
        raise SystemExit(f"--arch {args.arch} is written quantized directly; --llama-quantize does not apply")
    if args.arch in ("qwen35", "gemma4"):
        write_converted(args)
    elif args.arch == "qwen3moe":
        write_qwen3moe(args)
    elif args.arch == "gpt-oss":
        write_gpt_oss(args)
    else:
        write_direct(args)
    print(f"wrote {args.out}")
    if args.llama_quantize:
        quantize(args)


def write_direct(args) -> None:
    """Writes the GGUF tensor by tensor (the SHAPES architectures)."""
    hidden, layers, heads, kv_heads, head_dim, ffn = SHAPES[args.arch]
    rope_dims, rope_base, eps, context = ROPE[args.arch]

    src = gguf.GGUFReader(args.tokenizer_from)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(args.out, args.arch)
    # llama.cpp gives Phi-3's SentencePiece tokens special attributes when
    # the name holds "phi3" or "phi-3", and fails on a BPE vocabulary then.
    w.add_name("random-phi-4-mini" if args.arch == "phi3" else f"random-{args.arch}")
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    if args.arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(PHI3_ORIGINAL_CONTEXT)
        # Phi-4-mini's: sqrt(1 + ln(131072 / 4096) / ln(4096)).
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(context / PHI3_ORIGINAL_CONTEXT) / np.log(PHI3_ORIGINAL_CONTEXT))))
    if args.arch == "gemma3":
        w.add_sliding_window(GEMMA3_WINDOW)
        w.add_float32("gemma3.rope.freq_base_swa", 10000.0)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in src.fields.items():
        if name.startswith("tokenizer."):
            copy_field(w, name, field)

    rng = np.random.default_rng(args.seed)

    def rand(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", rand(vocab, hidden))
    if args.arch == "phi3":
        half = rope_dims // 2
        w.add_tensor("rope_factors_short.weight", np.ones(half, dtype=np.float32))
        w.add_tensor("rope_factors_long.weight", np.geomspace(1.0, 32.0, half).astype(np.float32))
    qk_norms = args.arch in ("qwen3", "gemma3")
    for i in range(layers):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", ones)
        if args.arch == "phi3":
            w.add_tensor(f"{p}.attn_qkv.weight", rand((heads + 2 * kv_heads) * head_dim, hidden))
        else:
            w.add_tensor(f"{p}.attn_q.weight", rand(heads * head_dim, hidden))
            w.add_tensor(f"{p}.attn_k.weight", rand(kv_heads * head_dim, hidden))
            w.add_tensor(f"{p}.attn_v.weight", rand(kv_heads * head_dim, hidden))
        if qk_norms:
            w.add_tensor(f"{p}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            w.add_tensor(f"{p}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(f"{p}.attn_output.weight", rand(hidden, heads * head_dim))
        if args.arch == "gemma3":
            w.add_tensor(f"{p}.post_attention_norm.weight", ones)
        w.add_tensor(f"{p}.ffn_norm.weight", ones)
        if args.arch == "phi3":
            # gate rows first, then up, as llama.cpp's converter stacks them.
            w.add_tensor(f"{p}.ffn_up.weight", rand(2 * ffn, hidden))
        else:
            w.add_tensor(f"{p}.ffn_gate.weight", rand(ffn, hidden))
            w.add_tensor(f"{p}.ffn_up.weight", rand(ffn, hidden))
        w.add_tensor(f"{p}.ffn_down.weight", rand(hidden, ffn))
        if args.arch == "gemma3":
            w.add_tensor(f"{p}.post_ffw_norm.weight", ones)
    w.add_tensor("output_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


def write_converted(args) -> None:
    """A random Qwen3.5 or Gemma 4 checkpoint by transformers, converted by
    llama.cpp."""
    if not args.llama_cpp:
        raise SystemExit(f"--arch {args.arch} needs --llama-cpp (llama.cpp's source, with convert_hf_to_gguf.py)")
    import torch
    import transformers

    vocab = len(gguf.GGUFReader(args.tokenizer_from).fields["tokenizer.ggml.tokens"].data)
    torch.manual_seed(args.seed)
    if args.arch == "qwen35":
        config = transformers.Qwen3_5TextConfig(vocab_size=vocab, **QWEN35)
        model = transformers.Qwen3_5ForCausalLM(config)
    else:
        # bf16, so that 2.3B parameters take 4.6 GB in memory and on disk.
        torch.set_default_dtype(torch.bfloat16)
        config = transformers.Gemma4TextConfig(vocab_size=vocab, vocab_size_per_layer_input=vocab, **GEMMA4)
        model = transformers.Gemma4ForCausalLM(config)
    with tempfile.TemporaryDirectory() as hf_dir:
        model.save_pretrained(hf_dir)
        del model
        if args.arch == "gemma4":
            # The converter trims the embeddings to the tokenizer.json's
            # vocabulary: give it one of the copied tokens.
            tokens = gguf.GGUFReader(args.tokenizer_from).fields["tokenizer.ggml.tokens"]
            words = [bytes(tokens.parts[i]).decode("utf-8") for i in tokens.data]
            with open(os.path.join(hf_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump({"model": {"vocab": {w: i for i, w in enumerate(words)}}, "added_tokens": []}, f)
        here = os.path.dirname(os.path.abspath(__file__))
        done = subprocess.run([sys.executable, "-c", CONVERT, args.llama_cpp, here, hf_dir, args.out,
                               args.tokenizer_from, args.arch])
        if done.returncode != 0:
            raise SystemExit("convert_hf_to_gguf.py failed")


def write_qwen3moe(args) -> None:
    """Qwen3-30B-A3B's shape in Q4_K_M's block types, random blocks written
    tensor by tensor, with no f16 intermediate."""
    c = QWEN3MOE
    hidden, layers, head_dim, vocab = c["hidden"], c["layers"], c["head_dim"], c["vocab"]
    q4, q6 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K

    def more_bits(i: int) -> bool:
        # llama.cpp's use_more_bits: which layers Q4_K_M gives Q6_K attn_v and ffn_down.
        n = layers
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    # (name, numpy shape, block type or None for F32), in file order.
    specs = [("token_embd.weight", (vocab, hidden), q4)]
    for i in range(layers):
        p = f"blk.{i}"
        big = q6 if more_bits(i) else q4
        specs += [
            (f"{p}.attn_norm.weight", (hidden,), None),
            (f"{p}.attn_q.weight", (c["heads"] * head_dim, hidden), q4),
            (f"{p}.attn_k.weight", (c["kv_heads"] * head_dim, hidden), q4),
            (f"{p}.attn_v.weight", (c["kv_heads"] * head_dim, hidden), big),
            (f"{p}.attn_q_norm.weight", (head_dim,), None),
            (f"{p}.attn_k_norm.weight", (head_dim,), None),
            (f"{p}.attn_output.weight", (hidden, c["heads"] * head_dim), q4),
            (f"{p}.ffn_norm.weight", (hidden,), None),
            (f"{p}.ffn_gate_inp.weight", (c["experts"], hidden), None),
            (f"{p}.ffn_gate_exps.weight", (c["experts"], c["expert_ffn"], hidden), q4),
            (f"{p}.ffn_up_exps.weight", (c["experts"], c["expert_ffn"], hidden), q4),
            (f"{p}.ffn_down_exps.weight", (c["experts"], hidden, c["expert_ffn"]), big),
        ]
    specs += [("output_norm.weight", (hidden,), None), ("output.weight", (vocab, hidden), q6)]

    w = gguf.GGUFWriter(args.out, "qwen3moe")
    w.add_name("random-qwen3moe-30b-a3b")
    w.add_block_count(layers)
    w.add_context_length(c["context"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_expert_count(c["experts"])
    w.add_expert_used_count(c["experts_used"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_expert_feed_forward_length(c["expert_ffn"])
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(w, args.tokenizer_from, pad_to=vocab)
    # The F32 tensors are ones (norms) but for the router.
    write_random(w, specs, args.seed, lambda name: name.endswith("ffn_gate_inp.weight"))


def write_random(w: "gguf.GGUFWriter", specs, seed: int, drawn) -> None:
    """Writes the tensors of `specs` ((name, numpy shape, block type or None
    for F32), in file order) after `w`'s metadata: random blocks
    (`random_blocks`), and F32 tensors drawn N(0, 0.02) where `drawn(name)`,
    else ones. One tensor in memory at a time."""
    for name, shape, qtype in specs:
        if qtype is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, qtype in specs:
        if qtype is not None:
            data = random_blocks(rng, shape, qtype)
        elif drawn(name):
            data = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        else:
            data = np.ones(shape, dtype=np.float32)
        w.write_tensor_data(data)
    w.close()


GPT_OSS = dict(hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, experts=32,
               experts_used=4, expert_ffn=2880, vocab=201088, rope_base=150000.0, eps=1e-5,
               context=131072, window=128)


def write_gpt_oss(args) -> None:
    """gpt-oss-20b's shape in the block types of llama.cpp's MXFP4 file,
    random blocks written tensor by tensor."""
    c = GPT_OSS
    hidden, layers, hd, vocab, e, ff = (c["hidden"], c["layers"], c["head_dim"], c["vocab"],
                                       c["experts"], c["expert_ffn"])
    q8, mx = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    q_dim, kv_dim = c["heads"] * hd, c["kv_heads"] * hd
    specs = [("token_embd.weight", (vocab, hidden), q8)]
    for i in range(layers):
        p = f"blk.{i}"
        specs += [
            (f"{p}.attn_norm.weight", (hidden,), None),
            (f"{p}.attn_q.weight", (q_dim, hidden), q8),
            (f"{p}.attn_q.bias", (q_dim,), None),
            (f"{p}.attn_k.weight", (kv_dim, hidden), q8),
            (f"{p}.attn_k.bias", (kv_dim,), None),
            (f"{p}.attn_v.weight", (kv_dim, hidden), q8),
            (f"{p}.attn_v.bias", (kv_dim,), None),
            (f"{p}.attn_output.weight", (hidden, q_dim), q8),
            (f"{p}.attn_output.bias", (hidden,), None),
            (f"{p}.attn_sinks.weight", (c["heads"],), None),
            (f"{p}.post_attention_norm.weight", (hidden,), None),
            (f"{p}.ffn_gate_inp.weight", (e, hidden), None),
            (f"{p}.ffn_gate_inp.bias", (e,), None),
            (f"{p}.ffn_gate_exps.weight", (e, ff, hidden), mx),
            (f"{p}.ffn_gate_exps.bias", (e, ff), None),
            (f"{p}.ffn_up_exps.weight", (e, ff, hidden), mx),
            (f"{p}.ffn_up_exps.bias", (e, ff), None),
            (f"{p}.ffn_down_exps.weight", (e, hidden, ff), mx),
            (f"{p}.ffn_down_exps.bias", (e, hidden), None),
        ]
    specs += [("output_norm.weight", (hidden,), None), ("output.weight", (vocab, hidden), q8)]

    w = gguf.GGUFWriter(args.out, "gpt-oss")
    w.add_name("random-gpt-oss-20b")
    w.add_block_count(layers)
    w.add_context_length(c["context"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(c["rope_base"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_sliding_window(c["window"])
    w.add_expert_count(e)
    w.add_expert_used_count(c["experts_used"])
    w.add_expert_feed_forward_length(ff)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(w, args.tokenizer_from, pad_to=vocab)
    # The F32 tensors are drawn (biases, sinks, router) but for the norms.
    write_random(w, specs, args.seed, lambda name: not name.endswith("norm.weight"))


def random_blocks(rng, shape, qtype) -> np.ndarray:
    """Random Q4_K, Q6_K, Q8_0 or MXFP4 blocks for a tensor of (numpy) shape, as bytes
    shaped as gguf-py's quant_shape_to_byte_shape: random quants and
    sub-scales, f16 scales set so the weights are about N(0, 0.02) in size
    (measured with gguf-py's dequantize: std 258 * d for Q4_K with
    dmin = 7.5 d, 227 * d for Q6_K with int8 sub-scales in 8..16)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
    data = rng.integers(0, 256, size=int(np.prod(byte_shape)), dtype=np.uint8)
    blocks = data.reshape(-1, size)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        # d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 of 4-bit quants.
        d = 0.02 / 258
        blocks[:, 0:4] = np.frombuffer(np.array([d, 7.5 * d], dtype="<f2").tobytes(), dtype=np.uint8)
    elif qtype == gguf.GGMLQuantizationType.Q6_K:
        # ql (128), qh (64), 16 int8 scales, d (f16).
        blocks[:, 192:208] = rng.integers(8, 17, size=(len(blocks), 16), dtype=np.uint8)
        blocks[:, 208:210] = np.frombuffer(np.array([0.02 / 227], dtype="<f2").tobytes(), dtype=np.uint8)
    elif qtype == gguf.GGMLQuantizationType.Q8_0:
        # d (f16), 32 int8 quants (std 74 when uniform).
        blocks[:, 0:2] = np.frombuffer(np.array([0.02 / 74], dtype="<f2").tobytes(), dtype=np.uint8)
    elif qtype == gguf.GGMLQuantizationType.MXFP4:
        # An E8M0 exponent, 16 bytes of nibbles (mean |E2M1| 1.125 doubled).
        blocks[:, 0] = 120
    else:
        raise ValueError(f"{qtype.name} blocks not written")
    return data.reshape(byte_shape)


def quantize(args) -> None:
    """Writes each of --types beside the f16 file with llama-quantize."""
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(args.llama_quantize))
    for t in args.types.split(","):
        out = args.out.replace("F16", t) if "F16" in args.out else f"{args.out}.{t}.gguf"
        done = subprocess.run([args.llama_quantize, args.out, out, t], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"llama-quantize {t} failed:\n{done.stderr}")
        print(f"wrote {out}")


def copy_tokenizer(w: "gguf.GGUFWriter", path: str, pad_to: int | None = None) -> None:
    """Copies every tokenizer.* key of the GGUF at path; with pad_to, the
    token list is padded to that many with `[PAD{i}]` tokens, as llama.cpp's
    converter pads Qwen's vocabulary to its embedding rows, but normal
    rather than unused: a random model generates them, and a server streams
    no text for an unused token, which a load generator would then not
    see."""
    fields = gguf.GGUFReader(path).fields
    for name, field in fields.items():
        if not name.startswith("tokenizer."):
            continue
        if pad_to is not None and name == "tokenizer.ggml.tokens":
            tokens = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            if len(tokens) > pad_to:
                raise SystemExit(f"{path} has {len(tokens)} tokens, more than {pad_to}")
            w.add_token_list(tokens + [f"[PAD{i}]" for i in range(len(tokens), pad_to)])
        elif pad_to is not None and name == "tokenizer.ggml.token_type":
            types = [int(field.parts[i][0]) for i in field.data]
            w.add_token_types(types + [int(gguf.TokenType.NORMAL)] * (pad_to - len(types)))
        else:
            copy_field(w, name, field)


def copy_field(w: "gguf.GGUFWriter", name: str, field) -> None:
    """Copies one metadata key with its type (strings, numbers, arrays)."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        item = field.types[1]
        values = [field.parts[i] for i in field.data]
        if item == gguf.GGUFValueType.STRING:
            w.add_array(name, [bytes(v).decode("utf-8", errors="surrogateescape") for v in values])
        else:
            w.add_array(name, [v.tolist()[0] for v in values])
        return
    value = field.parts[field.data[0]]
    if kind == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(value).decode("utf-8"))
    elif kind == gguf.GGUFValueType.BOOL:
        w.add_bool(name, bool(value[0]))
    elif kind in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.UINT64, gguf.GGUFValueType.INT32):
        w.add_uint32(name, int(value[0]))
    elif kind == gguf.GGUFValueType.FLOAT32:
        w.add_float32(name, float(value[0]))
    else:
        raise SystemExit(f"{name}: metadata type {kind} not copied")


if __name__ == "__main__":
    main()
