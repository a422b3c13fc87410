"""Builds the tiny random-weight vision-language checkpoints in
tests/fixtures/ (tests/fixtures/README.md lists them).

    pip install torch==2.15.0 transformers==5.23.0 safetensors==0.8.0 pillow==13.0.0
    pip install --no-deps torchvision==0.29.2
    python3 scripts/make_vision_fixtures.py

- `gemma3vl-tiny/`: Gemma 3 with images (`Gemma3ForConditionalGeneration`):
  a SigLIP vision tower (2 layers, 32 wide, 2 heads, 32 x 32 images in
  8 x 8 patches, so 16 patches), its projector (the 4 x 4 patch grid
  average-pooled to 2 x 2 = 4 tokens an image, an RMSNorm scaling by
  1 + w, a projection to the text width) and a tiny Gemma 3 text model
  (2 layers, 64 wide). `reference.json` holds what transformers computes
  in f32 for two images (random pixel values in [-1, 1], the range the
  image processor's rescale and normalisation give): the tower's output
  (after its last LayerNorm), `[images, patches, 32]`, and the projected
  image features, `[images, 4, 64]`, each as shape and flat values; and
  the logits, `[19, 320]`, of a prompt holding both images (`prompt`:
  each image as begin, four image tokens, end; the image tokens marked in
  `token_type_ids`, so they attend to each other both ways). The directory
  is a servable checkpoint: a tokenizer trained here with Gemma 3's special
  tokens, a chat template in Gemma 3's turn format, the image processor's
  and processor's configs. `reference.json`'s `chat` is a conversation
  with two files of `images/` as `Gemma3Processor` makes it (text, ids,
  pixel values, logits at every position, image spans, greedy reply).

Weights are drawn wider than transformers' default init (normal, 0.2), so
that outputs spread, but the tied embeddings narrower (0.02), so that the
greedy reply does not repeat the prompt's last token; the seed is fixed,
so reruns rewrite identical files given the same library versions.
"""

import json
import os
import pathlib
import shutil
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Gemma3Config, Gemma3ForConditionalGeneration  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


# Gemma 3's turn format (the hub's template is in no registry package,
# so it is written here): the system turn folded into the first user turn,
# `model` for the assistant, and `<start_of_image>` where an image part is.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

GEMMA3_SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                   "<start_of_image>", "<end_of_image>", "<image_soft_token>"]

# A conversation with two images in one message, as a chat client sends it
# (the images are files of tests/fixtures/images).
GEMMA3_CHAT = {
    "images": ["rgb.png", "tall.png"],
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image"},
            {"type": "text", "text": "And in this one?"},
            {"type": "image"},
        ]},
    ],
}


def spans(ids, token):
    """The runs of `token` in `ids`, as [start, end)."""
    runs = []
    for i, t in enumerate(ids):
        if t == token and (i == 0 or ids[i - 1] != token):
            runs.append([i, i])
        if t == token:
            runs[-1][1] = i + 1
    return runs


EMBED_STD = 0.02


def gemma3vl(seed=53):
    from make_fixtures import train_tokenizer
    from PIL import Image
    from transformers import Gemma3Processor, PreTrainedTokenizerFast
    from transformers.models.gemma3.image_processing_pil_gemma3 import (
        Gemma3ImageProcessorPil,
    )

    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(GEMMA3_SPECIALS),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    tok.chat_template = GEMMA3_TEMPLATE
    boi, eoi, image_id = (tok.convert_tokens_to_ids(t) for t in GEMMA3_SPECIALS[5:])
    torch.manual_seed(seed)
    text = {
        "model_type": "gemma3_text",
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        # Attention scaled by head_dim ** -0.5, as Gemma 3 4B's (256 and
        # 256) is, and as llama.cpp scales every Gemma 3 but the 27B.
        "query_pre_attn_scalar": 32,
        "max_position_embeddings": 256,
        "sliding_window": 16,
        # Both layers local: llama.cpp gives Gemma 3 a global layer only
        # every sixth, so its GGUF files (gguf-tiny/gemma3vl-*) read these
        # two layers so too.
        "layer_types": ["sliding_attention", "sliding_attention"],
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
        "vision_use_head": False,
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=boi,
        eoi_token_index=eoi,
        image_token_index=image_id,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "mm_soft_emb_norm" not in name and p.dim() == 1:
                # LayerNorm weights around 1, biases around 0.
                base = 1.0 if name.endswith("weight") and "layer_norm" in name else 0.0
                p.copy_(base + 0.2 * torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                # Tied to the output: small, so that the layers' output
                # rather than the last token's own embedding decides the
                # next token (else every reply repeats its last token).
                p.copy_(EMBED_STD * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    pixels = torch.rand(2, 3, 32, 32) * 2 - 1
    # Two images in one prompt (BOS, text, begin/4 image tokens/end, ...),
    # 19 tokens: longer than the 16-token sliding window.
    image = [boi] + [image_id] * 4 + [eoi]
    prompt = [tok.bos_token_id, 10, 11] + image + [12] + image + [13, 14]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        tower = model.model.vision_tower(pixel_values=pixels).last_hidden_state
        projected = model.model.multi_modal_projector(tower)
        logits = model(
            input_ids=ids,
            pixel_values=pixels,
            token_type_ids=(ids == image_id).long(),
        ).logits[0]

    # The checkpoint as the hub lays one out: the image processor's
    # preprocessor_config.json, processor_config.json, and the tokenizer
    # with the chat template in tokenizer_config.json.
    image_processor = Gemma3ImageProcessorPil(
        size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor = Gemma3Processor(
        image_processor=image_processor, tokenizer=tok, chat_template=GEMMA3_TEMPLATE,
        image_seq_length=4,
    )
    images = [Image.open(ROOT / "images" / n).convert("RGB") for n in GEMMA3_CHAT["images"]]
    chat_text = processor.apply_chat_template(
        GEMMA3_CHAT["messages"], add_generation_prompt=True, tokenize=False
    )
    inputs = processor(text=chat_text, images=images, return_tensors="pt")
    chat_ids = inputs["input_ids"]
    with torch.no_grad():
        chat_logits = model(**inputs).logits[0]
        # Greedy continuation, and its smallest top-2 gap (a near-tie
        # decides nothing).
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    greedy = out.sequences[0, chat_ids.shape[1]:].tolist()
    gaps = [float(torch.topk(l[0], 2).values.diff().abs()) for l in out.logits]

    out_dir = ROOT / "gemma3vl-tiny"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir, save_jinja_files=False)
    image_processor.save_pretrained(out_dir)
    (out_dir / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 4, "processor_class": "Gemma3Processor"}, indent=2) + "\n"
    )
    flat = lambda t: {"shape": list(t.shape), "values": t.flatten().tolist()}  # noqa: E731
    ref = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "pixel_values": flat(pixels),
        "vision_tower": flat(tower),
        "projected": flat(projected),
        "prompt": prompt,
        "logits": flat(logits),
        "chat": {
            **GEMMA3_CHAT,
            "text": chat_text,
            "input_ids": chat_ids[0].tolist(),
            "pixel_values": flat(inputs["pixel_values"]),
            "logits": flat(chat_logits),
            "greedy": greedy,
            "greedy_text": tok.decode(greedy),
            "greedy_min_gap": min(gaps),
            # Each image's run of image tokens, [start, end).
            "image_spans": spans(chat_ids[0].tolist(), image_id),
        },
    }
    assert ref["chat"]["greedy_min_gap"] >= 1e-3, ref["chat"]["greedy_min_gap"]
    (out_dir / "reference.json").write_text(json.dumps(ref) + "\n")
    print(f"wrote {out_dir}: tower {list(tower.shape)}, projected {list(projected.shape)}, "
          f"chat {chat_ids.shape[1]} tokens, greedy {greedy} (gap {min(gaps):.4f})")


def png_bomb(path, side):
    """A PNG whose header claims `side` x `side` RGB pixels, with one
    compressed row of data: a decoder that trusts the header before
    checking its size would allocate side^2 * 3 bytes."""
    import struct
    import zlib

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\0" * (1 + 3 * side))
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", row) + chunk(b"IEND", b"")
    )


def images():
    """Small images of every format and colour mode a client may send, and
    what transformers' Gemma 3 image processors make of each, loaded as
    `transformers.image_utils.load_image` loads a file (EXIF orientation
    applied, converted to RGB). The processors resize to 26 x 30 (height x
    width, so a transposed axis shows) instead of 896 x 896, to keep the
    reference small; the method is the same at any size.

    `reference.json` holds, per image, the PIL processor's pixel values
    (`Gemma3ImageProcessorPil`) and the torchvision one's
    (`Gemma3ImageProcessor`, transformers' default when torchvision is
    installed), each `[3, 26, 30]`. The two differ by one 8-bit level in
    places: torchvision's resampling rounds its weights differently from
    Pillow's.
    """
    import io

    import numpy as np
    from PIL import Image
    from transformers.image_utils import load_image
    from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor
    from transformers.models.gemma3.image_processing_pil_gemma3 import (
        Gemma3ImageProcessorPil,
    )

    out = ROOT / "images"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(51)
    noise = lambda h, w, c: rng.integers(0, 256, (h, w, c), dtype=np.uint8)  # noqa: E731
    Image.fromarray(noise(37, 45, 3)).save(out / "rgb.png")
    Image.fromarray(noise(50, 20, 3)).save(out / "tall.png")
    Image.fromarray(noise(29, 33, 4), "RGBA").save(out / "rgba.png")
    Image.fromarray(noise(40, 17, 1)[..., 0], "L").save(out / "gray.png")
    Image.fromarray(noise(35, 35, 3)).save(out / "lossless.webp", lossless=True)
    frames = [Image.fromarray(noise(30, 40, 3)).quantize(16) for _ in range(2)]
    frames[0].save(out / "two_frames.gif", save_all=True, append_images=frames[1:])
    # A smooth picture (JPEG's case), stored on its side with EXIF
    # orientation 6: viewers, and transformers' loader, turn it upright.
    y, x = np.mgrid[0:48, 0:64]
    smooth = np.stack([x * 4, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(smooth).save(out / "rotated.jpg", quality=95, exif=exif.tobytes())
    png_bomb(out / "bomb.png", 50_000)
    buf = io.BytesIO()
    Image.fromarray(smooth).save(buf, "JPEG", quality=95)
    (out / "truncated.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])

    kw = dict(size={"height": 26, "width": 30}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    pil, tv = Gemma3ImageProcessorPil(**kw), Gemma3ImageProcessor(**kw)
    ref = {"transformers_version": transformers.__version__, "height": 26, "width": 30}
    for name in ["rgb.png", "tall.png", "rgba.png", "gray.png", "lossless.webp",
                 "two_frames.gif", "rotated.jpg"]:
        image = load_image(str(out / name))
        a = pil(images=image, return_tensors="pt")["pixel_values"][0]
        b = tv(images=image, return_tensors="pt")["pixel_values"][0]
        ref[name] = {
            "size": list(image.size),
            "pil": [round(v, 7) for v in a.flatten().tolist()],
            "torchvision": [round(v, 7) for v in b.flatten().tolist()],
        }
        print(f"{name}: {image.size}, PIL vs torchvision {(a - b).abs().max().item():.4f}")
    (out / "reference.json").write_text(json.dumps(ref) + "\n")


if __name__ == "__main__":
    images()
    gemma3vl()
