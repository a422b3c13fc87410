#!/usr/bin/env python3
"""Random-weight Llama checkpoints (HF safetensors, bf16, written by transformers) for
checks where no real weights can be fetched, and transformers' answers on them.

usage: make_models.py OUT TOKENIZER_DIR NAME...    (NAME: s135, l1b, l8b)

Writes OUT/NAME/ (the checkpoint, with TOKENIZER_DIR's tokenizer*.json) and
OUT/NAME.ref.json: a fixed 96-token prompt, its log-probs under transformers in fp32 and
in bf16, and 32 greedy tokens after its first 32 tokens in each dtype (with the fp32
ones' log-probs), from the checkpoint as saved.

Weights are scaled so the model is not flat: each linear has std 1/sqrt(fan_in) and the
head gives logits of std ~3 (next-token entropy ~6 nats on s135, against 10.8 for a
uniform guess). A wrong RoPE theta then moves s135's prompt log-probs by up to ~4 nats,
and one changed early token moves later ones by ~1 nat on average; in a flat model
(transformers' own init) both move by 1e-3. The writers into the residual stream are
not damped: with a tied head a small residual stream lets each token's own embedding
win, and greedy decoding repeats one token.

Runs on CUDA when there is one, else on the CPU (slow past s135)."""
import json
import math
import os
import shutil
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# The shapes of SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B. The vocabulary is the
# tokenizer's (SmolLM2's, 49152), so every id the models emit can be decoded.
SHAPES = {
    "s135": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0,
                 tie_word_embeddings=True),
    "l1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                tie_word_embeddings=True),
    "l8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                tie_word_embeddings=False),
}
PROMPT_LEN, PREFIX, GREEDY = 96, 32, 32
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def config(name, tok_dir):
    tok_cfg = json.load(open(os.path.join(tok_dir, "config.json")))
    return LlamaConfig(**SHAPES[name], vocab_size=tok_cfg["vocab_size"],
                       bos_token_id=tok_cfg.get("bos_token_id", 1),
                       eos_token_id=tok_cfg.get("eos_token_id", 2),
                       max_position_embeddings=8192, rms_norm_eps=1e-5, hidden_act="silu",
                       attention_bias=False, mlp_bias=False)


@torch.no_grad()
def randomize(m, cfg):
    torch.manual_seed(1234)
    h = cfg.hidden_size
    for n, p in m.named_parameters():
        if n.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        elif "embed_tokens" in n:
            # A tied embedding is also the head; the first norm rescales it anyway.
            p.normal_(0, 3.0 / math.sqrt(h) if cfg.tie_word_embeddings else 1.0)
        elif "lm_head" in n:
            p.normal_(0, 3.0 / math.sqrt(h))
        else:
            p.normal_(0, 1.0 / math.sqrt(p.shape[1]))


@torch.no_grad()
def reference(d, cfg):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(100, cfg.vocab_size - 100, (PROMPT_LEN,), generator=g).tolist()
    ref = {"ids": ids, "prefix": PREFIX}
    x = torch.tensor([ids], device=DEV)
    for dt in ("float32", "bfloat16"):
        # Loaded back as any user would: converting the model in memory instead would
        # also round its RoPE frequencies to bf16 and move log-probs by ~0.1.
        m = LlamaForCausalLM.from_pretrained(d, dtype=getattr(torch, dt)).to(DEV).eval()
        lp = torch.log_softmax(m(x).logits.float()[0], -1)
        # Position i's log-prob comes from the logits at i - 1; the first has none.
        ref[f"prompt_lp_{dt}"] = [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]
        out = m.generate(x[:, :PREFIX], max_new_tokens=GREEDY, min_new_tokens=GREEDY,
                         do_sample=False, pad_token_id=cfg.eos_token_id)
        ref[f"greedy_{dt}"] = out[0, PREFIX:].tolist()
        if dt == "float32":
            # The greedy tokens' own log-probs, to check a server's decode steps against.
            lp = torch.log_softmax(m(out).logits.float()[0], -1)
            ref["greedy_lp_float32"] = [lp[i - 1, out[0, i]].item()
                                        for i in range(PREFIX, out.shape[1])]
        del m
    return ref


def main():
    if len(sys.argv) < 4 or not set(sys.argv[3:]) <= set(SHAPES):
        sys.exit(__doc__)
    out, tok_dir = sys.argv[1], sys.argv[2]
    for name in sys.argv[3:]:
        t = time.time()
        cfg = config(name, tok_dir)
        with torch.device(DEV):
            m = LlamaForCausalLM(cfg).eval()
        randomize(m, cfg)
        d = os.path.join(out, name)
        m.to(torch.bfloat16).save_pretrained(d)
        del m
        for f in os.listdir(tok_dir):
            if f.startswith("tokenizer") or f == "special_tokens_map.json":
                shutil.copy(os.path.join(tok_dir, f), d)
        ref = reference(d, cfg)
        ref["name"] = name
        with open(os.path.join(out, f"{name}.ref.json"), "w") as f:
            json.dump(ref, f)
        if DEV == "cuda":
            torch.cuda.empty_cache()
        print(f"{name}: written to {d} on {DEV} in {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main()
