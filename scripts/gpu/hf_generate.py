#!/usr/bin/env python3
"""transformers' own `generate` on a checkpoint, at static batch sizes: the baseline
beside wick's streaming figures (same shape, same dtype, same token counts).

usage: hf_generate.py MODEL_DIR [--batch 32 128] [--prompt-tokens 128] [--max-tokens 128]
                      [--dtype bfloat16] [--label L] [--table FILE]

Every row of a batch has the same prompt length, so there is no padding, and exactly
--max-tokens new tokens (min_new_tokens), as wick's runs use ignore_eos. Output tok/s is
batch * max-tokens over the whole call, prefill included, like wick's whole-run figure."""
import argparse
import sys
import time

import torch
from transformers import LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--label", default="")
    ap.add_argument("--table")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = LlamaForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype))
    m = m.to(dev).eval()
    vocab = m.config.vocab_size

    def gen(batch, new):
        x = torch.randint(100, vocab - 100, (batch, args.prompt_tokens), device=dev)
        out = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                         min_new_tokens=new, do_sample=False, pad_token_id=m.config.eos_token_id)
        assert out.shape[1] == args.prompt_tokens + new

    with torch.no_grad():
        gen(2, 4)  # warm-up: CUDA context, cuBLAS handles, kernel loading
        for b in args.batch:
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            gen(b, args.max_tokens)
            if dev == "cuda":
                torch.cuda.synchronize()
            tok_s = b * args.max_tokens / (time.perf_counter() - t)
            print(f"transformers generate {args.label} {args.dtype} batch {b}: "
                  f"{tok_s:.1f} output tok/s", flush=True)
            if args.table:
                with open(args.table, "a") as f:
                    f.write(f"transformers generate {args.label} {args.dtype}, static batch "
                            f"{b}, {args.prompt_tokens} in/{args.max_tokens} out\t"
                            f"{tok_s:.1f} tok/s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
