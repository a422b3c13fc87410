//! The vision tower and projector of a Gemma 3 with images
//! (`tests/fixtures/gemma3vl-tiny`, written by
//! `scripts/make_vision_fixtures.py`) against transformers' f32 outputs on
//! the same pixel values.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use wick::models::siglip::{Gemma3Projector, SiglipConfig, SiglipVision};

/// `{"shape": [...], "values": [...]}` from the reference.
fn tensor(v: &serde_json::Value) -> Tensor {
    let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
    let values: Vec<f32> = serde_json::from_value(v["values"].clone()).unwrap();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn gemma3_vision_tower_and_projector_match_transformers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3vl-tiny");
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    };
    let (config, reference) = (read("config.json"), read("reference.json"));
    let vision: SiglipConfig = serde_json::from_value(config["vision_config"].clone()).unwrap();
    let text_hidden = config["text_config"]["hidden_size"].as_u64().unwrap() as usize;
    let tokens = config["mm_tokens_per_image"].as_u64().unwrap() as usize;
    // SAFETY: the fixture is not modified while mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap();
    let tower = SiglipVision::from_checkpoint(vision.clone(), &vb).unwrap();
    let projector =
        Gemma3Projector::new(&vision, text_hidden, tokens, vb.pp("multi_modal_projector")).unwrap();
    let pixels = tensor(&reference["pixel_values"]);
    let patches = tower.forward(&pixels).unwrap();
    let want = tensor(&reference["vision_tower"]);
    let diff = max_diff(&patches, &want);
    assert!(diff < 1e-4, "tower output {diff} from transformers'");
    let projected = projector.forward(&patches).unwrap();
    let diff = max_diff(&projected, &tensor(&reference["projected"]));
    assert!(diff < 1e-4, "projected features {diff} from transformers'");
    // Images are encoded alone: the second image's patches do not depend on
    // the first's.
    let second = tower.forward(&pixels.narrow(0, 1, 1).unwrap()).unwrap();
    let diff = max_diff(&second, &want.narrow(0, 1, 1).unwrap());
    assert!(diff < 1e-4, "one image alone {diff} from transformers'");
    // A wrong image size is refused, not cropped.
    let small = pixels.narrow(3, 0, 16).unwrap();
    assert!(tower.forward(&small).is_err());
}
