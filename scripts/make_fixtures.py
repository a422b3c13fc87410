"""Builds the tiny random-weight Hugging Face checkpoints in tests/fixtures/.

    pip install torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0
    python3 scripts/make_fixtures.py [NAME ...]

Writes the fixture folders tests/fixtures/*-tiny/ (gpt2-tiny/, llama-tiny/,
the other dense chat models (ministral3-tiny/ as a multimodal Mistral 3), the mixtures of experts qwen3moe-tiny/,
olmoe-tiny/, mixtral-tiny/, qwen2moe-tiny/ and qwen35moe-tiny/;
tests/fixtures/README.md lists them), or only the NAMEs given, leaving the
others' bytes as they are. Each is a checkpoint as transformers saves it
(config.json, safetensors, tokenizer files, generation_config.json) plus
reference.json, what transformers computes on it:

- "inputs" / "input_texts": token ids of a few strings of different lengths;
- "logits": f32 logits at every position of each input (one plain forward);
- "greedy": 12 greedy ids per input (full forward each step, argmax, no EOS
  stop) and "greedy_min_gap", the smallest top-2 logit gap among them;
- "pooled": per input, the mean, last and first rows of the final hidden
  states (the base model's last_hidden_state, after its last norm), what
  an embedding request pools;
- "tokenizer": ids of assorted strings (tokenizer(text)["input_ids"]);
- "add_special_tokens_adds": the ids tokenizer("") gives, i.e. what the
  default add_special_tokens=True adds (checked to be all it adds);
- "chat" (all but gpt2): rendered chat prompts and their ids. The ChatML
  template is saved in tokenizer_config.json ("chat_template");
- "long" (some): a longer prompt's ids and transformers' logits at its
  last positions ("serve_context" too where RoPE changes past it).

For a mixture of experts the script also checks, with a hook on each
router, that the inputs route several tokens of one prompt to one expert
and that no routing choice is a near-tie (it prints the counts; they are
not stored).

wick's tests compare against these files and never run Python. The
tokenizers are byte-level BPE (GPT-2 style) trained here on a fixed text, as
the hub (and GPT-2's own vocabulary) is out of reach. Weights are drawn
wider than transformers' default init so logits spread and greedy choices
are not near-ties; seeds are fixed, so reruns rewrite identical files given
the same library versions.
"""

import json
import os
import pathlib
import shutil
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    GPT2Config,
    GraniteConfig,
    GraniteForCausalLM,
    GraniteMoeConfig,
    GraniteMoeForCausalLM,
    GPT2LMHeadModel,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Ministral3Config,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PixtralVisionConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
VOCAB = 512
GREEDY_STEPS = 12

TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A serving engine batches many
requests at once: each step it admits new prompts, runs one decode step for
every running sequence, samples a token per row and streams it back.
Numbers like 12345, 3.14159 and 2026-11-22 appear in logs; so do paths such
as /usr/local/bin and URLs like https://example.com/a?b=c&d=e.
Caf\u00e9 owners in the na\u00efve city of Z\u00fcrich serve cr\u00e8me br\u00fbl\u00e9e.
\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3082\u5c11\u3057\u3002 Emoji: \U0001f600 \U0001f680 \u2764\ufe0f.
def fibonacci(n):
    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
Tabs\tand  double  spaces, newlines\n\nand trailing spaces   .
Once upon a time, in a land far away, there lived a small model that
answered questions about the capital of France, which is Paris.
"""

INPUT_TEXTS = [
    "The fox",
    "A serving engine batches many requests",
    "Once upon a time, in a land far away, there lived a small model",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2) # done",
]

TOKENIZER_TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces",
    "trailing spaces   ",
    "multiple    inner   spaces",
    "line one\nline two\n\n\tindented",
    "12345 3.14159 2026-11-22",
    "Punctuation!? (brackets) [and] {braces}; 'quotes' \"double\"",
    "Caf\u00e9 na\u00efve Z\u00fcrich cr\u00e8me br\u00fbl\u00e9e",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0",
    "Emoji \U0001f600\U0001f680 and \u2764\ufe0f",
    "mixed: abc123 \u00e9\u00e8 \U0001f600 /usr/local/bin",
    "<|endoftext|>hello",
    # Special tokens for llama-tiny; plain text (byte-level BPE) for gpt2-tiny.
    "<|im_start|>user\nhi<|im_end|>",
]

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to 3: 1 2 3"},
    ],
]


def train_tokenizer(specials):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer)
    return tok


def randomize(model, std, norm_center=1.0):
    """Matrices N(0, std); norm weights norm_center + N(0, 0.1) (0 where
    the model scales by 1 + w, as Gemma's do); biases N(0, 0.1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.copy_(norm_center + 0.1 * torch.randn_like(p))


def greedy(model, ids):
    ids = list(ids)
    out, min_gap = [], float("inf")
    with torch.no_grad():
        for _ in range(GREEDY_STEPS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            min_gap = min(min_gap, float(top2[0] - top2[1]))
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids.append(nxt)
    return out, min_gap


def added_ids(tokenizer):
    """Ids that add_special_tokens=True (the default) puts around a text."""
    adds = tokenizer("")["input_ids"]
    for t in ["hello"] + TOKENIZER_TEXTS:
        with_, without = tokenizer(t)["input_ids"], tokenizer(t, add_special_tokens=False)["input_ids"]
        assert len(with_) == len(without) + len(adds), (t, with_, without)
    return adds


def reference(model, tokenizer, chat):
    adds = added_ids(tokenizer)
    inputs = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in INPUT_TEXTS]
    assert len({len(i) for i in inputs}) == len(inputs), "inputs must differ in length"
    logits, greedies, pooled, min_gap = [], [], [], float("inf")
    with torch.no_grad():
        for ids in inputs:
            logits.append(model(torch.tensor([ids])).logits[0].tolist())
            hidden = model.base_model(torch.tensor([ids])).last_hidden_state[0]
            pooled.append({"mean": hidden.mean(0).tolist(), "last": hidden[-1].tolist(),
                           "first": hidden[0].tolist()})
            g, gap = greedy(model, ids)
            greedies.append(g)
            min_gap = min(min_gap, gap)
    ref = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "input_texts": INPUT_TEXTS,
        "inputs": inputs,
        "logits": logits,
        "greedy": greedies,
        "greedy_min_gap": min_gap,
        "pooled": pooled,
        "tokenizer": [{"text": t, "ids": tokenizer(t)["input_ids"]} for t in TOKENIZER_TEXTS],
        # What tokenizer(text) adds around the text by default (BOS/EOS).
        "add_special_tokens_adds": adds,
    }
    if chat:
        ref["chat"] = []
        for messages in CHATS:
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            ref["chat"].append({"messages": messages, "prompt": prompt, "ids": ids})
    return ref


def long_prompt(model, tokenizer, length, rows):
    """A `length`-token prompt and transformers' logits at its last `rows`
    positions."""
    ids = tokenizer(TRAINING_TEXT, add_special_tokens=False)["input_ids"][:length]
    assert len(ids) == length
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -rows:].tolist()
    return {"long": {"ids": ids, "from": length - rows, "logits": logits}}


def long_context(model, tokenizer, context, rows):
    """For a model whose RoPE changes past `context` tokens: a prompt past
    it (`long_prompt`), and the context under which the other references
    (all shorter) hold."""
    return {"serve_context": context, **long_prompt(model, tokenizer, context + 32, rows)}


def check_routing(model, prompts, continuations):
    """For a mixture-of-experts model: which experts each layer's router
    picks for each token (a hook on the router). Checks that every layer
    routes 2 or more tokens of some prompt to one expert, and that at
    every position of each prompt and its continuation the k-th router
    probability beats the (k+1)-th by 1e-4 or more (the margin a kernel's
    rounding must stay within to pick the same experts). Prints per prompt
    and layer how many tokens each expert takes, and the experts of the
    prompt's last token (a decode step: k experts take it, the rest none).
    Nothing of it is stored."""
    config = model.config
    n_experts = getattr(config, "num_local_experts", None) or config.num_experts
    picks, gaps = [], []

    def hook(module, args, out):
        scores, _, indices = out
        # Gemma 4's router hands back probabilities, the others logits.
        gemma4 = hasattr(module, "per_expert_scale")
        probs = scores.float() if gemma4 else torch.softmax(scores.float(), -1)
        top = torch.topk(probs, indices.shape[-1] + 1, dim=-1).values
        picks.append(indices)
        gaps.append(float((top[:, -2] - top[:, -1]).min()))

    def router(layer):
        # Granite-MoE's block and router have names of their own, as has
        # Gemma 4's router (beside its dense MLP).
        if hasattr(layer, "block_sparse_moe"):
            return layer.block_sparse_moe.router
        if hasattr(layer, "router"):
            return layer.router
        if hasattr(layer.mlp, "router"):
            return layer.mlp.router
        return layer.mlp.gate

    handles = [router(layer).register_forward_hook(hook) for layer in model.model.layers]
    grouped = [False] * len(handles)
    print(f"{config.model_type} routing:")
    try:
        with torch.no_grad():
            for ids, more in zip(prompts, continuations):
                model(torch.tensor([ids + more]))
                prompt_picks = [p[: len(ids)] for p in picks[-len(handles):]]
                counts = [torch.bincount(p.flatten(), minlength=n_experts).tolist() for p in prompt_picks]
                last = [sorted(p[-1].tolist()) for p in prompt_picks]
                print(f"  {len(ids)}-token prompt: tokens per expert by layer {counts}; "
                      f"last token's experts {last}")
                grouped = [g or max(c) >= 2 for g, c in zip(grouped, counts)]
    finally:
        for h in handles:
            h.remove()
    assert all(grouped), "some layer never routes 2 tokens of one prompt to one expert"
    print(f"  smallest k-th vs (k+1)-th router probability gap: {min(gaps):.2e}")
    assert min(gaps) >= 1e-4, f"router near-tie {min(gaps)}"


def moe_extra(model, tokenizer):
    """A mixture-of-experts fixture's extra: its routing checked
    (`check_routing`) on the reference inputs with their greedy
    continuations and on a 96-token prompt, whose logits at the last 24
    positions it adds as `long`."""
    long = long_prompt(model, tokenizer, 96, 24)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in INPUT_TEXTS]
    continuations = [greedy(model, ids)[0] for ids in prompts]
    check_routing(model, prompts + [long["long"]["ids"]], continuations + [[]])
    return long


# Fixture names given on the command line: build only those (the others'
# bytes stay as they are); none: build them all.
ONLY = set(sys.argv[1:])


def build(name, make_model, tokenizer, chat, seed, std, extra=None, norm_center=1.0,
          edit_config=None, tweak=None, rewrite=None, load_args=None, **save_args):
    """`rewrite(model, out)` changes the saved files (the weights' form), and
    `load_args` are what transformers needs to reload them."""
    if ONLY and name not in ONLY:
        return
    out = ROOT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    model = make_model().eval()
    randomize(model, std, norm_center)
    if tweak:
        with torch.no_grad():
            tweak(model)
    ref = reference(model, tokenizer, chat)
    if extra:
        ref.update(extra(model, tokenizer))
    assert ref["greedy_min_gap"] >= 1e-3, f"{name}: greedy near-tie {ref['greedy_min_gap']}"
    model.save_pretrained(out, **save_args)
    if edit_config:
        config = json.loads((out / "config.json").read_text())
        edit_config(config)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # The chat template goes in tokenizer_config.json (as most hub
    # checkpoints have it), not transformers 5's separate chat_template.jinja.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    assert not (out / "chat_template.jinja").exists()
    (out / "reference.json").write_text(json.dumps(ref))
    if rewrite:
        rewrite(model, out)

    # The saved directory must reproduce the reference on its own.
    reloaded = type(model).from_pretrained(out, **(load_args or {})).eval()
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    if reloaded.config.model_type in ("qwen2", "qwen3_5_moe_text"):
        # For model_types qwen2 and qwen3_5_moe_text (alone of these),
        # AutoTokenizer swaps in Qwen2Tokenizer or Qwen3_5Tokenizer, which
        # replaces tokenizer.json's pre-tokenizer with Qwen's own (digits
        # one by one) whatever tokenizer_config.json says; the class it
        # names reads tokenizer.json as saved.
        tok = getattr(transformers, tok_config["tokenizer_class"]).from_pretrained(out)
    else:
        tok = AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        for ids, want in zip(ref["inputs"], ref["logits"]):
            got = reloaded(torch.tensor([ids])).logits[0]
            # Equal but for float noise: reloaded fused experts sum in
            # another order (Granite-MoE's 3e-8 apart; Gemma 4's, whose
            # scale-1 attention amplifies it, 1.3e-5).
            d = float((got - torch.tensor(want)).abs().max())
            assert d <= 5e-5, f"{name}: reloaded logits differ by {d}"
    for case in ref["tokenizer"]:
        assert tok(case["text"])["input_ids"] == case["ids"], case["text"]
    assert tok("")["input_ids"] == ref["add_special_tokens_adds"]
    assert tok_config.get("chat_template") == tokenizer.chat_template
    for case in ref.get("chat", []):
        prompt = tok.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=False)
        assert prompt == case["prompt"]
        assert tok(prompt, add_special_tokens=False)["input_ids"] == case["ids"]
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"{name}: {size / 1e6:.2f} MB, vocab {len(tokenizer)}, min greedy gap {ref['greedy_min_gap']:.4f}")


# gpt-oss's E2M1 values (the nibble's bit 3 is the sign).
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4(w):
    """`w` `[experts, out, in]` in MXFP4 as OpenAI's checkpoints hold it:
    per 32 inputs an E8M0 exponent byte (`_scales`, value 2^(s - 127),
    chosen as GGML's quantizer does: floor(log2(amax)) - 2, as 6 = 1.5 x 4
    is E2M1's largest) and 16 bytes of nibbles (`_blocks`, byte j holding
    inputs 2j (low) and 2j + 1 (high)), each the nearest E2M1 value. Returns
    blocks, scales and the values they hold."""
    e, rows, cols = w.shape
    g = w.reshape(e, rows, cols // 32, 32)
    amax = g.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.full_like(amax, -127))
    scale = torch.exp2(exp)
    nearest = (g.unsqueeze(-1) - scale[..., None, None] * FP4).abs().argmin(-1).to(torch.uint8)
    blocks = nearest[..., 0::2] | (nearest[..., 1::2] << 4)
    values = (FP4[nearest.long()] * scale[..., None]).reshape(e, rows, cols)
    return blocks.contiguous(), (exp + 127).to(torch.uint8).contiguous(), values


def gpt_oss_mxfp4(model):
    """Rounds each layer's experts to MXFP4 (their values become what the
    blocks hold, so the reference is the quantized model's), keeping the
    blocks for `gpt_oss_rewrite`."""
    model.mxfp4_blocks = {}
    for i, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        for n in ("gate_up_proj", "down_proj"):
            p = getattr(experts, n)
            # Parameters are [experts, in, out]; blocks run along the inputs.
            blocks, scales, values = mxfp4(p.data.transpose(1, 2).contiguous())
            p.copy_(values.transpose(1, 2))
            at = f"model.layers.{i}.mlp.experts.{n}"
            model.mxfp4_blocks[at + "_blocks"] = blocks
            model.mxfp4_blocks[at + "_scales"] = scales


def gpt_oss_rewrite(model, out):
    """The saved checkpoint as OpenAI's release holds it: the experts'
    matrices as MXFP4 blocks and scales, and `quantization_config` saying
    so (everything else in the checkpoint's dtype)."""
    (path,) = out.glob("*.safetensors")
    weights = {n: t for n, t in load_file(path).items()
               if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    weights.update(model.mxfp4_blocks)
    save_file(dict(sorted(weights.items())), path, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # Generation ends at <|return|>, <|endoftext|> and <|call|>, as the
    # release's generation_config.json says (not at <|end|>, after which the
    # model goes on to its next message).
    generation = json.loads((out / "generation_config.json").read_text())
    vocab = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    generation["eos_token_id"] = [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]]
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


HARMONY_TOKENS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                  "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]


def harmony_tokenizer():
    """gpt-oss's tokenizer in small: the trained vocabulary with its
    harmony special tokens, `<|return|>` as EOS, and its real chat template
    (llama.cpp's copy of openai/gpt-oss-120b's)."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(HARMONY_TOKENS),
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = (ROOT / "chat_templates" / "openai-gpt-oss-120b.jinja").read_text()
    return tok


def chat_tokenizer():
    """The chat fixtures' tokenizer: the trained vocabulary with
    `<|im_start|>` and `<|im_end|>` (EOS), and the ChatML template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = CHATML
    return tok


def main():
    gpt2_tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(["<|endoftext|>"]),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    eot = gpt2_tok.convert_tokens_to_ids("<|endoftext|>")
    build(
        "gpt2-tiny",
        lambda: GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(gpt2_tok),
                n_positions=64,
                n_embd=64,
                n_layer=2,
                n_head=4,
                activation_function="gelu_new",
                bos_token_id=eot,
                eos_token_id=eot,
            )
        ),
        gpt2_tok,
        chat=False,
        seed=1,
        std=0.15,
    )

    llama_tok = chat_tokenizer()
    bos = llama_tok.convert_tokens_to_ids("<|endoftext|>")
    eos = llama_tok.convert_tokens_to_ids("<|im_end|>")
    # What the chat fixtures share: the tokenizer and a 2-layer, 64-wide
    # shape with 4 heads over 2 KV heads.
    small = dict(
        vocab_size=len(llama_tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=bos,
        eos_token_id=eos,
    )

    def chat_fixture(name, model, config, seed, save_args=None, extra=None, norm_center=1.0,
                     drop=(), edit_config=None, **fields):
        # drop: fields of `small` the config has no use for (left out of
        # config.json rather than saved as unknown keys).
        shared = {k: v for k, v in small.items() if k not in drop}
        build(name, lambda: model(config(**{**shared, **fields})), llama_tok, chat=True,
              seed=seed, std=0.15, extra=extra, norm_center=norm_center, edit_config=edit_config,
              **(save_args or {}))

    chat_fixture(
        "llama-tiny", LlamaForCausalLM, LlamaConfig, seed=2,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        # Small shards, so the sharded layout (and its index) is exercised.
        save_args={"max_shard_size": "150KB"},
    )
    # Mistral: Llama's layers under another model_type, with a sliding
    # window (64) shorter than the positions (256): wick's context stops at
    # the window, within which the two attentions agree.
    chat_fixture(
        "mistral-tiny", MistralForCausalLM, MistralConfig, seed=5,
        sliding_window=64, rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
    )
    # Qwen3: an RMSNorm per query and key head, no biases, a tied head,
    # and a head size (32) that is not hidden / heads (16).
    chat_fixture(
        "qwen3-tiny", Qwen3ForCausalLM, Qwen3Config, seed=4,
        head_dim=32, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    )
    # SmolLM3: Llama's layers, the fourth (of 4) without RoPE.
    chat_fixture(
        "smollm3-tiny", SmolLM3ForCausalLM, SmolLM3Config, seed=6,
        num_hidden_layers=4, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=bos,
    )
    # Phi-3 in Phi-4-mini's form: fused q/k/v and gate/up, RoPE on three
    # quarters of each head (12 of 16), LongRoPE from a pretrained context
    # of 64 to 256. Its references are for a served context of 64 (short
    # factors); "long" is a prompt past 64, where the long factors apply.
    chat_fixture(
        "phi3-tiny", Phi3ForCausalLM, Phi3Config, seed=7,
        partial_rotary_factor=0.75, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, pad_token_id=bos, original_max_position_embeddings=64,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0, 1.05, 1.2, 1.5, 2.0, 3.0],
            "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
        },
        extra=lambda model, tok: long_context(model, tok, 64, 24),
    )
    # Gemma 3: scaled embeddings, (1 + w) norms before and after attention
    # and MLP, q/k norms, GeGLU, a final logit soft cap, and five local
    # layers (a 16-token window, RoPE base 1e4) before a global one (base
    # 1e6, linear scaling): the period llama.cpp assumes. The longer inputs
    # reach past the window, and "long" is six windows long.
    chat_fixture(
        "gemma3-tiny", Gemma3ForCausalLM, Gemma3TextConfig, seed=8,
        num_hidden_layers=6, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
        final_logit_softcapping=8.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=bos, norm_center=0.0,
        extra=lambda model, tok: long_prompt(model, tok, 96, 24),
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    # Qwen3.5 (text): the hybrid. Gated-DeltaNet linear-attention layers
    # (a causal depthwise conv over q/k/v, the gated delta rule, a
    # z-gated RMSNorm; 2 key heads of 16 serving 4 value heads of 16)
    # around two gated full-attention layers (q/k norms, an output gate,
    # RoPE on a quarter of each 32-wide head). Its (1 + w) norms are drawn
    # around 0; the gated norm's weights, A_log and dt_bias with them.
    # "long" is a 96-token prompt, for prefill chunks that carry the
    # recurrent state.
    qwen35_layers = dict(
        num_hidden_layers=6, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=bos, norm_center=0.0,
        layer_types=["linear_attention", "linear_attention", "full_attention",
                     "linear_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
    )
    chat_fixture(
        "qwen35-tiny", Qwen3_5ForCausalLM, Qwen3_5TextConfig, seed=9, **qwen35_layers,
        extra=lambda model, tok: long_prompt(model, tok, 96, 24),
    )
    # Qwen2: q/k/v biases, a tied head. The weights are those of
    # gguf-tiny's Qwen2 (make_gguf_fixtures.make_qwen2: same shape, same
    # seed), here with Llama's tokenizer and ChatML template.
    chat_fixture(
        "qwen2-tiny", Qwen2ForCausalLM, Qwen2Config, seed=3,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    )
    # Ministral 3 as its checkpoints come: the multimodal Mistral 3 (a
    # Pixtral vision tower, here 1 layer, which wick does not read) around
    # a Ministral 3 language model: Mistral's layers, YaRN from a
    # pretrained context of 32 to 256 (factor 8, an attention factor from
    # mscale / mscale_all_dim of 1 / 0.5) and Llama 4's query temperature
    # 1 + 0.1 ln(1 + ⌊pos / 32⌋). The longer inputs and "long" (96 tokens)
    # reach past 32 and 64.
    chat_fixture(
        "ministral3-tiny",
        lambda text: Mistral3ForConditionalGeneration(Mistral3Config(
            text_config=text.to_dict(),
            vision_config=PixtralVisionConfig(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, head_dim=16, image_size=64, patch_size=16,
            ).to_dict(),
            image_token_index=len(llama_tok) - 1, tie_word_embeddings=False,
        )),
        Ministral3Config, seed=31,
        head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
            "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 0.5, "llama_4_scaling_beta": 0.1,
        },
        extra=lambda model, tok: long_prompt(model, tok, 96, 24),
    )
    # Granite: Llama's layers with IBM's four multipliers: embeddings
    # times 12, the attention's scale 1/32 (not 1/√16), each block's output
    # times 0.22 before it joins the residual, and logits divided by 4.
    granite = dict(
        embedding_multiplier=12.0, attention_multiplier=1 / 32, residual_multiplier=0.22,
        logits_scaling=4.0, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=bos,
    )
    chat_fixture("granite-tiny", GraniteForCausalLM, GraniteConfig, seed=41, **granite)
    # Gemma 4 (text), which norms by w (not 1 + w) and attends at scale 1
    # with a weightless RMSNorm on V; its full-attention layers have heads
    # of their own size (32; the sliding ones 16) and "proportional" RoPE
    # (a quarter of each head's pairs rotate, at base 1e6, the rest stay).
    # Each layer's output is scaled by its layer_scalar (a buffer, which
    # `randomize` leaves alone, so set here). Two shapes:
    # - gemma4-tiny, E2B's: the hub's multimodal checkpoint (model_type
    #   gemma4, no vision or audio tower), per-layer input embeddings (8
    #   wide per layer), the last 3 layers reusing K/V of the last sliding
    #   (1) and full (2) layer before them, their MLPs twice as wide; its
    #   config.json as the hub writes it (global_head_dim, not the
    #   per_layer_config transformers saves).
    # - gemma4-keqv-tiny, 31B's: the text checkpoint (gemma4_text), the full
    #   layers' V their K projection (attention_k_eq_v) over 1 KV head, no
    #   per-layer inputs, no sharing; its config as transformers saves it.
    # The longer inputs and "long" (96 tokens) reach past the 16 window.
    def gemma4(text, wrap):
        def make():
            model = wrap(text)
            layers = (model.model.language_model if hasattr(model.model, "language_model")
                      else model.model).layers
            with torch.no_grad():
                for i, layer in enumerate(layers):
                    layer.layer_scalar.fill_(0.9 - 0.05 * i)
            return model
        return make

    def hub_config(config):
        text = config["text_config"]
        del text["per_layer_config"]
        text["global_head_dim"] = 32

    gemma4_text = dict(
        small, num_hidden_layers=6, head_dim=16, global_head_dim=32, sliding_window=16,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=bos,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
    )
    build(
        "gemma4-tiny",
        gemma4(Gemma4TextConfig(**gemma4_text, hidden_size_per_layer_input=8,
                                vocab_size_per_layer_input=len(llama_tok), num_kv_shared_layers=3,
                                use_double_wide_mlp=True),
               lambda t: Gemma4ForConditionalGeneration(
                   Gemma4Config(text_config=t.to_dict(), vision_config=None, audio_config=None))),
        llama_tok, chat=True, seed=51, std=0.15, edit_config=hub_config,
        extra=lambda model, tok: long_prompt(model, tok, 96, 24),
    )
    build(
        "gemma4-keqv-tiny",
        gemma4(Gemma4TextConfig(**gemma4_text, hidden_size_per_layer_input=0,
                                attention_k_eq_v=True, num_global_key_value_heads=1),
               Gemma4ForCausalLM),
        llama_tok, chat=True, seed=52, std=0.15,
        extra=lambda model, tok: long_prompt(model, tok, 96, 24),
    )
    # Gemma 4's mixture of experts (26B-A4B's features on gemma4-keqv-tiny's
    # layers): beside each layer's dense MLP, 8 GeGLU experts of 32, the
    # top 2 by a softmax over a router that RMS-norms the residual stream
    # and scales it per channel, renormalised and then scaled per expert;
    # the two outputs normed and summed. Router scales and expert scales
    # are drawn around 1 with the other 1-D weights; the router's matrix 16
    # times wider than the others, since its input is scaled by
    # hidden^-1/2 and near-equal experts would leave near-ties.
    build(
        "gemma4moe-tiny",
        gemma4(Gemma4TextConfig(**gemma4_text, hidden_size_per_layer_input=0,
                                attention_k_eq_v=True, num_global_key_value_heads=1,
                                enable_moe_block=True, num_experts=8, top_k_experts=2,
                                moe_intermediate_size=32),
               Gemma4ForCausalLM),
        llama_tok, chat=True, seed=54, std=0.15, extra=moe_extra,
        tweak=lambda model: [layer.router.proj.weight.mul_(16.0) for layer in model.model.layers],
    )
    # gpt-oss as OpenAI's release holds it: 4 layers, 64 wide, 4 heads of
    # 16 over 2 KV heads, biases on q/k/v/o, a learned sink per head (drawn
    # N(0, 1)), the even layers attending within a 4-token window, YaRN
    # (factor 32 from 4096, unrounded as gpt-oss sets it, so cos and sin
    # scale by 1.35); each MLP 4 experts of 64 with biases, the top 2 by
    # biased router logits, softmax over those 2, and the clamped SwiGLU.
    # The experts' matrices are MXFP4 in the checkpoint (`*_blocks`,
    # `*_scales`, `quantization_config`), their values rounded to it before
    # the reference is taken. The tokenizer has harmony's special tokens and
    # the real template, whose prompts carry the day's date, so no chat
    # references are stored.
    harmony = harmony_tokenizer()
    build(
        "gpt-oss-tiny",
        lambda: GptOssForCausalLM(GptOssConfig(
            vocab_size=len(harmony), hidden_size=64, intermediate_size=64, head_dim=16,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
            max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 4096},
            bos_token_id=harmony.bos_token_id, eos_token_id=harmony.eos_token_id,
            pad_token_id=harmony.pad_token_id,
        )),
        harmony, chat=False, seed=63, std=0.15, extra=moe_extra,
        tweak=lambda model: ([layer.self_attn.sinks.normal_() for layer in model.model.layers],
                             gpt_oss_mxfp4(model)),
        rewrite=gpt_oss_rewrite,
        load_args={"quantization_config": transformers.Mxfp4Config(dequantize=True)},
    )
    # Mixtures of experts: every layer's MLP is 8 SwiGLU experts of 32, of
    # which a softmax router picks 2 per token. The inputs route several
    # tokens to one expert (`check_routing`); "long" is a 96-token prompt.
    # Qwen3-MoE: Qwen3's attention (q/k norms per head, heads of 32), the
    # 2 picked probabilities renormalised to sum to 1, an untied head.
    chat_fixture(
        "qwen3moe-tiny", Qwen3MoeForCausalLM, Qwen3MoeConfig, seed=13,
        head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        extra=moe_extra,
    )
    # OLMoE: q/k norms over the whole q and k projections (64 each), the
    # picked probabilities used as they are (not renormalised). 4 KV heads,
    # as OLMoE has: llama.cpp's OLMoE takes the k norm to be as wide as q.
    chat_fixture(
        "olmoe-tiny", OlmoeForCausalLM, OlmoeConfig, seed=24, num_key_value_heads=4,
        num_experts=8, num_experts_per_tok=2, intermediate_size=32, norm_topk_prob=False,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=bos,
        extra=moe_extra,
    )
    # Mixtral: Llama's attention, the picked probabilities renormalised,
    # no sliding window.
    chat_fixture(
        "mixtral-tiny", MixtralForCausalLM, MixtralConfig, seed=13,
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=None,
        rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        extra=moe_extra,
    )
    # Granite-MoE: Granite's layers and multipliers, each MLP 8 experts
    # whose gate and up matrices transformers keeps fused
    # (`input_linear` `[8, 64, 64]`), a softmax over the top 2 router
    # logits (the same as renormalising the top 2 probabilities).
    chat_fixture(
        "granitemoe-tiny", GraniteMoeForCausalLM, GraniteMoeConfig, seed=42,
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, **granite,
        extra=moe_extra,
    )
    # Qwen2-MoE: Qwen2's attention (q/k/v biases), the picked
    # probabilities not renormalised, plus a shared SwiGLU expert of 64
    # that every token takes, scaled by sigmoid(shared_expert_gate . x).
    chat_fixture(
        "qwen2moe-tiny", Qwen2MoeForCausalLM, Qwen2MoeConfig, seed=18,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], qkv_bias=True, use_sliding_window=False,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        extra=moe_extra,
    )
    # Qwen3.5-MoE (text): qwen35-tiny's layers (the same 6: gated-DeltaNet
    # linear attention and two gated full-attention layers, (1 + w) norms
    # drawn around 0, tied head) with Qwen2-MoE's mixture in every one: 8
    # experts of 32, the 2 picked probabilities renormalised, and a shared
    # SwiGLU expert of 64 scaled by sigmoid(shared_expert_gate . x). The
    # config has no dense intermediate_size, so `small`'s is left out.
    chat_fixture(
        "qwen35moe-tiny", Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, seed=101,
        **qwen35_layers, drop=("intermediate_size",),
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        extra=moe_extra,
    )


if __name__ == "__main__":
    main()
