//! Images against transformers: image files decoded and preprocessed
//! (`tests/fixtures/images`), and the vision tower and projector of a
//! Gemma 3 with images (`tests/fixtures/gemma3vl-tiny`) on the same pixel
//! values; both written by `scripts/make_vision_fixtures.py`.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use wick::kv::cache::{KvCache, KvLayout};
use wick::media::decode::{decode, ImageError, ImageLimits};
use wick::media::preprocess::ImageProcessor;
use wick::models::linear::WeightFormat;
use wick::models::llama::Llama;
use wick::models::siglip::{Gemma3Projector, SiglipConfig, SiglipVision};
use wick::models::{FlatBatch, LogitRows, Model};

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

/// The tiny Gemma 3 with images: its config, transformers' reference, its
/// weights, and its vision tower and projector.
struct Gemma3Fixture {
    config_json: String,
    config: serde_json::Value,
    reference: serde_json::Value,
    vb: VarBuilder<'static>,
    tower: SiglipVision,
    projector: Gemma3Projector,
    per_image: usize,
}

fn gemma3_fixture() -> Gemma3Fixture {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3vl-tiny");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let config_json = read("config.json");
    let config: serde_json::Value = serde_json::from_str(&config_json).unwrap();
    let reference = serde_json::from_str(&read("reference.json")).unwrap();
    let vision: SiglipConfig = serde_json::from_value(config["vision_config"].clone()).unwrap();
    let text_hidden = config["text_config"]["hidden_size"].as_u64().unwrap() as usize;
    let per_image = config["mm_tokens_per_image"].as_u64().unwrap() as usize;
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
    let projector = Gemma3Projector::new(
        &vision,
        text_hidden,
        per_image,
        vb.pp("multi_modal_projector"),
    )
    .unwrap();
    Gemma3Fixture {
        config_json,
        config,
        reference,
        vb,
        tower,
        projector,
        per_image,
    }
}

#[test]
fn gemma3_vision_tower_and_projector_match_transformers() {
    let Gemma3Fixture {
        reference,
        tower,
        projector,
        ..
    } = gemma3_fixture();
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

/// Files of each format and colour mode (`tests/fixtures/images`) decoded
/// and preprocessed as Gemma 3's image processor does, against
/// transformers' pixel values for the same files: Pillow's to 1e-4 (every
/// 8-bit level the same), torchvision's (which rounds its resampling
/// weights otherwise) to one level. A JPEG's pixels may differ by the
/// decoders' two levels besides.
#[test]
fn images_are_preprocessed_as_transformers_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let processor = ImageProcessor::from_hf(&serde_json::json!({
        "size": {"height": reference["height"], "width": reference["width"]},
        "resample": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]
    }))
    .unwrap();
    let names = [
        "rgb.png",
        "tall.png",
        "rgba.png",
        "gray.png",
        "lossless.webp",
        "two_frames.gif",
        "rotated.jpg",
    ];
    for name in names {
        let want = &reference[name];
        let image = decode(
            &std::fs::read(dir.join(name)).unwrap(),
            &ImageLimits::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let size: (u32, u32) = serde_json::from_value(want["size"].clone()).unwrap();
        assert_eq!(image.dimensions(), size, "{name}: upright size");
        let got = processor.pixels(&image);
        // Lossy JPEG decodes differently by decoder: zune-jpeg here,
        // libjpeg-turbo under Pillow, up to two levels apart.
        let decoder = if name.ends_with(".jpg") {
            4.0 / 255.0
        } else {
            0.0
        };
        let level = 2.0 / 255.0;
        for (of, bound) in [
            ("pil", decoder + 1e-4),
            ("torchvision", decoder + level + 1e-4),
        ] {
            let want: Vec<f32> = serde_json::from_value(want[of].clone()).unwrap();
            assert_eq!(got.len(), want.len(), "{name}");
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff <= bound as f32, "{name}: {diff} from {of}'s");
        }
    }
}

/// A PNG claiming 50,000 x 50,000 pixels is refused on its header, and a
/// JPEG cut in half as corrupt.
#[test]
fn hostile_image_files_are_refused() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    assert_eq!(
        decode(&read("bomb.png"), &ImageLimits::default()),
        Err(ImageError::TooManyPixels {
            width: 50_000,
            height: 50_000,
            limit: ImageLimits::default().max_pixels
        })
    );
    let e = decode(&read("truncated.jpg"), &ImageLimits::default()).unwrap_err();
    assert!(matches!(e, ImageError::Corrupt(_)), "{e}");
}

/// The whole of a Gemma 3 with images against transformers: two images
/// encoded and projected by the tower, their features put in place of
/// their placeholder tokens, and each image's tokens attending to each
/// other both ways, give transformers' logits at every position of a
/// 19-token prompt (past the 16-token sliding window), whether the prompt
/// runs in one step or in two chunks, the second holding both images.
#[test]
fn gemma3_with_images_matches_transformers_logits() {
    let f = gemma3_fixture();
    let (config, reference, per_image) = (&f.config, &f.reference, f.per_image);
    let model =
        Llama::from_safetensors(&f.config_json, f.vb.clone(), WeightFormat::F32.into(), None)
            .unwrap();
    let features = f
        .projector
        .forward(
            &f.tower
                .forward(&tensor(&reference["pixel_values"]))
                .unwrap(),
        )
        .unwrap();

    let prompt: Vec<u32> = serde_json::from_value(reference["prompt"].clone()).unwrap();
    let image_token = config["image_token_index"].as_u64().unwrap() as u32;
    // Each image's run of placeholder tokens.
    let spans: Vec<std::ops::Range<usize>> = prompt
        .iter()
        .enumerate()
        .filter(|&(i, &t)| t == image_token && (i == 0 || prompt[i - 1] != image_token))
        .map(|(i, _)| i..i + per_image)
        .collect();
    assert_eq!(spans.len(), 2);
    let want = tensor(&reference["logits"]);
    let info = model.info().clone();
    for split in [0, 3] {
        let mut cache = KvCache::new(
            KvLayout {
                num_layers: info.num_layers,
                num_kv_heads: info.num_kv_heads,
                head_dim: info.head_dim,
                block_size: 4,
                num_blocks: 8,
                dtype: info.kv_dtype,
                window_kv: None,
            },
            &Device::Cpu,
            false,
        )
        .unwrap();
        let table: Vec<u32> = (0..8).rev().collect();
        let mut rows = Vec::new();
        for chunk in [0..split, split..prompt.len()] {
            if chunk.is_empty() {
                continue;
            }
            let mut batch = FlatBatch::default();
            batch.push(&prompt, chunk.clone(), table.clone(), LogitRows::All);
            for (i, span) in spans.iter().enumerate() {
                if chunk.start <= span.start && span.end <= chunk.end {
                    let image = features.get(i).unwrap();
                    batch.embeds.push((span.start - chunk.start, image));
                    batch.seqs[0].seen_whole.push(span.clone());
                }
            }
            rows.push(model.forward(&batch, &mut cache).unwrap());
        }
        let got = Tensor::cat(&rows, 0).unwrap();
        let diff = max_diff(&got, &want);
        assert!(
            diff < 1e-4,
            "split at {split}: logits {diff} from transformers'"
        );
    }
}
