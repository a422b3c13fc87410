"""Builds the tiny random-weight vision-language checkpoints in
tests/fixtures/ (tests/fixtures/README.md lists them).

    pip install torch==2.15.0 transformers==5.23.0 safetensors==0.8.0
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
  image features, `[images, 4, 64]`, each as shape and flat values.

Weights are drawn wider than transformers' default init (normal, 0.2), so
that outputs spread; the seed is fixed, so reruns rewrite identical files
given the same library versions.
"""

import json
import os
import pathlib

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Gemma3Config, Gemma3ForConditionalGeneration  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def gemma3vl():
    torch.manual_seed(51)
    text = {
        "model_type": "gemma3_text",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 256,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
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
        boi_token_index=300,
        eoi_token_index=301,
        image_token_index=302,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "mm_soft_emb_norm" not in name and p.dim() == 1:
                # LayerNorm weights around 1, biases around 0.
                base = 1.0 if name.endswith("weight") and "layer_norm" in name else 0.0
                p.copy_(base + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    pixels = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        tower = model.model.vision_tower(pixel_values=pixels).last_hidden_state
        projected = model.model.multi_modal_projector(tower)
    out = ROOT / "gemma3vl-tiny"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    flat = lambda t: {"shape": list(t.shape), "values": t.flatten().tolist()}  # noqa: E731
    ref = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "pixel_values": flat(pixels),
        "vision_tower": flat(tower),
        "projected": flat(projected),
    }
    (out / "reference.json").write_text(json.dumps(ref) + "\n")
    print(f"wrote {out}: tower {list(tower.shape)}, projected {list(projected.shape)}")


if __name__ == "__main__":
    gemma3vl()
