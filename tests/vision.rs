//! Images against transformers: image files decoded and preprocessed
//! (`tests/fixtures/images`), and the vision tower and projector of a
//! Gemma 3 with images (`tests/fixtures/gemma3vl-tiny`) on the same pixel
//! values; both written by `scripts/make_vision_fixtures.py`.

mod common;

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use wick::kv::cache::{KvCache, KvLayout};
use wick::media::decode::{decode, ImageError, ImageLimits};
use wick::media::preprocess::ImageProcessor;
use wick::models::linear::WeightFormat;
use wick::models::llama::Llama;
use wick::models::siglip::{Gemma3Projector, SiglipConfig, SiglipVision, TowerMath};
use wick::models::{FlatBatch, LogitRows, Model};
use wick::quant::bf16::tiles_available;

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
    let tower = SiglipVision::from_checkpoint(vision.clone(), &vb, TowerMath::Native).unwrap();
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

/// Runs image `i` of `pixels` through `tower` `rows` patches at a time, as
/// the engine does between steps; returns its output and the calls taken.
fn tower_in_chunks(
    tower: &SiglipVision,
    pixels: &Tensor,
    i: usize,
    rows: usize,
) -> (Tensor, usize) {
    let mut run = tower.begin(&pixels.get(i).unwrap()).unwrap();
    for calls in 1.. {
        if let Some(out) = tower.advance(&mut run, rows).unwrap() {
            return (out, calls);
        }
    }
    unreachable!()
}

/// The tower run a few patches at a time (chunks that do and do not
/// divide the patches, and one patch) matches transformers as the whole
/// does: each layer's keys are complete before any patch attends.
#[test]
fn the_tower_in_chunks_matches_transformers() {
    let Gemma3Fixture {
        config,
        reference,
        tower,
        ..
    } = gemma3_fixture();
    let vision: SiglipConfig = serde_json::from_value(config["vision_config"].clone()).unwrap();
    let (patches, layers) = (vision.patches_per_side().pow(2), vision.num_hidden_layers);
    let pixels = tensor(&reference["pixel_values"]);
    let want = tensor(&reference["vision_tower"]);
    for rows in [1, 3, patches / 2, patches] {
        for i in 0..pixels.dim(0).unwrap() {
            let (got, calls) = tower_in_chunks(&tower, &pixels, i, rows);
            let diff = max_diff(&got, &want.get(i).unwrap());
            assert!(diff < 1e-4, "{rows} patches a call, image {i}: {diff}");
            // Two stages a layer, each over every patch.
            assert_eq!(calls, 2 * layers * patches.div_ceil(rows), "{rows} a call");
        }
    }
    let wrong = pixels.get(0).unwrap().narrow(2, 0, 16).unwrap();
    assert!(
        tower.begin(&wrong).is_err(),
        "a wrong image size is refused"
    );
}

/// The tower with its products in bf16 on AMX tiles (as a 16-bit tower
/// runs on a CPU that has them) stays within bf16's rounding of
/// transformers' f32 output: each product's inputs rounded to 8
/// significant bits, through every layer.
#[test]
fn the_tower_on_bf16_tiles_stays_near_transformers() {
    if !tiles_available() {
        eprintln!("no AMX bf16 tiles here: the tower runs in f32 only");
        return;
    }
    let Gemma3Fixture {
        config,
        reference,
        vb,
        ..
    } = gemma3_fixture();
    let vision: SiglipConfig = serde_json::from_value(config["vision_config"].clone()).unwrap();
    let tower = SiglipVision::from_checkpoint(vision, &vb, TowerMath::Bf16Tiles).unwrap();
    let pixels = tensor(&reference["pixel_values"]);
    let want = tensor(&reference["vision_tower"]);
    let got = tower.forward(&pixels).unwrap();
    let size = want
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let diff = max_diff(&got, &want);
    eprintln!("bf16 tiles: {diff} from transformers' (outputs up to {size})");
    assert!(
        diff < 1e-2 * size,
        "{diff} from transformers' (outputs up to {size})"
    );
    // A few patches at a time, as the engine runs it, likewise.
    let (got, _) = tower_in_chunks(&tower, &pixels, 1, 5);
    let diff = max_diff(&got, &want.get(1).unwrap());
    assert!(
        diff < 1e-2 * size,
        "in chunks: {diff} (outputs up to {size})"
    );
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

/// An engine of 4-token blocks running `model` with `encoder`, in steps of
/// at most `chunk` tokens, its K/V in `kv` (else the model's own dtype).
fn vision_engine(
    model: Box<dyn Model>,
    eos: Vec<u32>,
    encoder: wick::models::vision::VisionEncoder,
    chunk: usize,
    kv: Option<wick::kv::cache::KvDtype>,
) -> wick::engine::Engine {
    let cfg = wick::engine::EngineConfig {
        block_size: 4,
        max_num_batched_tokens: chunk,
        kv_cache_bytes: 4 << 20,
        kv_dtype: kv,
        ..Default::default()
    };
    wick::engine::Engine::new(model, eos, &cfg)
        .unwrap()
        .with_vision(encoder)
}

/// Each prompt token's logprob in `scored` is within `nats` of the one
/// transformers' `logits` give it (token j + 1 is scored with the logits
/// at position j).
fn assert_prompt_logprobs(
    scored: &[wick::sampling::sampler::SampledToken],
    ids: &[u32],
    logits: &[Vec<f32>],
    nats: f32,
    what: &str,
) {
    for (pos, row) in logits.iter().enumerate().take(ids.len() - 1) {
        let next = ids[pos + 1] as usize;
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
        let got = scored[pos].logprob.unwrap();
        let d = (got - (row[next] - lse)).abs();
        assert!(
            d < nats,
            "{what}, position {pos}: logprob {got}, {d} from transformers'"
        );
    }
}

/// transformers' reference chat with images (`gemma3vl-tiny`'s `chat`).
fn reference_chat() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3vl-tiny");
    let text = std::fs::read_to_string(path.join("reference.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["chat"].clone()
}

/// The files of `dir` (under `tests/fixtures`) named `names`.
fn fixture_files(dir: &str, names: &[String]) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir);
    names.iter().map(|n| dir.join(n)).collect()
}

/// The reference chat's messages as a client sends them, its images
/// (`files`, in order) as data URLs; greedy, 8 tokens.
fn chat_request(
    chat: &serde_json::Value,
    files: &[std::path::PathBuf],
) -> wick::server::protocol::ChatCompletionRequest {
    use base64::Engine as _;

    let mut files = files.iter();
    let mut messages = chat["messages"].clone();
    for m in messages.as_array_mut().unwrap() {
        for part in m["content"].as_array_mut().into_iter().flatten() {
            if part["type"] == "image" {
                let bytes = std::fs::read(files.next().unwrap()).unwrap();
                let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                let url = format!("data:image/png;base64,{b64}");
                *part = serde_json::json!({"type": "image_url", "image_url": {"url": url}});
            }
        }
    }
    let body = serde_json::json!({"messages": messages, "max_tokens": 8, "temperature": 0});
    serde_json::from_value(body).unwrap()
}

/// What chat validation needs of a loaded model that takes images.
fn chat_context<'a>(
    loaded: &'a wick::load::loader::LoadedModel,
    spec: &'a wick::models::vision::ImageSpec,
) -> wick::server::validation::ModelContext<'a> {
    let info = loaded.model.info();
    wick::server::validation::ModelContext {
        name: "gemma3vl-tiny",
        aliases: &[],
        vocab_size: info.vocab_size,
        max_context: info.max_context,
        max_seq_tokens: 1 << 20,
        max_choices: 4,
        tokenizer: &loaded.tokenizer,
        chat_template: loaded.chat_template.as_ref(),
        constraints: None,
        images: Some(spec),
        image_budget: Default::default(),
        fetched: &wick::media::fetch::NOTHING_FETCHED,
    }
}

/// A Gemma 3 with images served as a chat client sends them: two PNGs as
/// data URLs in one message go through chat validation (the template's
/// parts, each marker expanded as transformers' processor expands it, the
/// images decoded and preprocessed) to transformers' prompt ids and pixel
/// values, and through the engine (the images encoded in the step that
/// prefills them, in chunks that never cut an image) to transformers'
/// logprob at every prompt position and its greedy continuation.
///
/// Sent again, the prompt comes from the prefix cache (the fixture's
/// layers all attend through a sliding window, so from the window pool's
/// cached blocks), images and all, to the same continuation scored as
/// computed; with the images swapped, only what comes before the first
/// image does.
#[test]
fn chat_with_images_matches_transformers() {
    use wick::engine::sequence::FinishReason;
    use wick::load::loader::{load, LoadOptions};
    use wick::sampling::params::SamplingParams;
    use wick::server::validation::validate_chat;

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let chat = reference_chat();
    let image_names: Vec<String> = serde_json::from_value(chat["images"].clone()).unwrap();
    let request = |names: &[String]| chat_request(&chat, &fixture_files("images", names));
    let want_ids: Vec<u32> = serde_json::from_value(chat["input_ids"].clone()).unwrap();
    let want_logits = tensor(&chat["logits"]).to_vec2::<f32>().unwrap();
    let want_pixels = tensor(&chat["pixel_values"])
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let greedy: Vec<u32> = serde_json::from_value(chat["greedy"].clone()).unwrap();

    // Chunk sizes, and whether the prompt is sent again.
    for (chunk, again) in [(512, false), (16, false), (16, true)] {
        let dir = root.join("gemma3vl-tiny");
        let mut loaded = load(&dir, &LoadOptions::default(), &Device::Cpu).unwrap();
        let encoder = loaded
            .vision
            .take()
            .expect("the checkpoint's vision encoder");
        let spec = encoder.spec().clone();
        let ctx = chat_context(&loaded, &spec);
        let prompt = validate_chat(&request(&image_names), &ctx).unwrap().prompts[0].clone();
        assert_eq!(prompt.tokens, want_ids, "prompt ids");
        assert_eq!(prompt.media.len(), 2);
        let pixels: Vec<f32> = prompt
            .media
            .iter()
            .flat_map(|m| m.pixels.values.iter().copied())
            .collect();
        assert_eq!(pixels.len(), want_pixels.len());
        let diff = pixels
            .iter()
            .zip(&want_pixels)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-6, "pixel values {diff} from transformers'");
        let swapped = validate_chat(
            &request(&[image_names[1].clone(), image_names[0].clone()]),
            &ctx,
        )
        .unwrap()
        .prompts[0]
            .clone();
        assert_eq!(swapped.tokens, prompt.tokens, "the same text");

        let eos = loaded.tokenizer.eos_ids().to_vec();
        let mut engine = vision_engine(loaded.model, eos, encoder, chunk, None);
        let params = SamplingParams {
            max_tokens: greedy.len(),
            temperature: 0.0,
            ignore_eos: true,
            // Scoring the prompt needs every row computed: none cached.
            prompt_logprobs: (!again).then_some(1),
            logprobs: Some(0),
            ..Default::default()
        };
        let mut run = |prompt: &wick::engine::prompt::Prompt| {
            let id = engine.add_request(prompt.clone(), params.clone()).unwrap();
            let (mut scored, mut cached, mut tokens) = (Vec::new(), None, Vec::new());
            while engine.has_work() {
                for ev in engine.step().into_iter().filter(|e| e.seq == id) {
                    if let Some(t) = ev.token {
                        if tokens.is_empty() {
                            scored = ev.prompt_logprobs;
                            cached = ev.cached_prompt_tokens;
                        }
                        tokens.push(t);
                    }
                    assert!(
                        !matches!(ev.finish, Some(FinishReason::Error(_))),
                        "{:?}",
                        ev.finish
                    );
                }
            }
            (scored, cached.unwrap_or(0), tokens)
        };
        let (scored, cached, tokens) = run(&prompt);
        assert_eq!(cached, 0);
        let ids = |tokens: &[wick::sampling::sampler::SampledToken]| -> Vec<u32> {
            tokens.iter().map(|t| t.id).collect()
        };
        assert_eq!(
            ids(&tokens),
            greedy,
            "chunks of {chunk}: greedy continuation"
        );
        if !again {
            let what = format!("chunks of {chunk}");
            assert_prompt_logprobs(&scored, &want_ids, &want_logits, 1e-4, &what);
            continue;
        }
        let (again, cached, repeat) = run(&prompt);
        assert!(
            cached > prompt.media[1].start,
            "cached {cached}, the second image at {}",
            prompt.media[1].start
        );
        assert_eq!(ids(&repeat), ids(&tokens), "from the prefix cache");
        assert!(scored.is_empty() && again.is_empty());
        let d = repeat
            .iter()
            .zip(&tokens)
            .map(|(a, b)| (a.logprob.unwrap() - b.logprob.unwrap()).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-5, "from the prefix cache: logprobs {d} apart");
        let first_image = prompt.media[0].start;
        let (_, cached, _) = run(&swapped);
        assert!(
            cached <= first_image,
            "swapped images: {cached} cached, the first image at {first_image}"
        );
    }
}

/// Gemma 3 from llama.cpp's files, as users download it: the text GGUF
/// with its projector file (`--mmproj`), both written by llama.cpp's
/// converter from `gemma3vl-tiny` (F32 with an F32 projector file, and
/// Q8_0 with an F16 one). Each pair takes the reference chat, two PNGs as
/// data URLs, to transformers' prompt ids, and scores every position near
/// transformers' logprob. Against `llama-server --mmproj` on the same
/// files and the same chat with its images at the tower's size (so that
/// llama.cpp's own resize filter plays no part): the tokens it chose score
/// near its own log-probabilities, and wick's greedy reply is its reply
/// up to a near tie.
#[test]
fn gguf_with_mmproj_matches_transformers_and_llama_server() {
    use wick::engine::prompt::Prompt;
    use wick::engine::sequence::FinishReason;
    use wick::kv::cache::KvDtype;
    use wick::load::loader::{load, LoadOptions, Projector};
    use wick::sampling::params::SamplingParams;
    use wick::server::validation::validate_chat;

    // Each file's pair is this close to both references. The converter
    // stores the projection matrix F16 in both projector files (8e-5 from
    // transformers in F32); Q8_0's weights and f16 K/V add their rounding
    // (1.2e-2 from transformers, 6e-3 from llama.cpp, here).
    const F32_NATS: f32 = 5e-4;
    const Q8_0_NATS: f32 = 2.5e-2;
    // A greedy pick may differ where llama.cpp's two best were this close.
    const TIE_NATS: f32 = 0.4;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-tiny");
    let chat = reference_chat();
    let names: Vec<String> = serde_json::from_value(chat["images"].clone()).unwrap();
    let want_ids: Vec<u32> = serde_json::from_value(chat["input_ids"].clone()).unwrap();
    let want_logits = tensor(&chat["logits"]).to_vec2::<f32>().unwrap();
    let llama: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("gemma3vl-llama-cpp.json")).unwrap(),
    )
    .unwrap();
    let squares: Vec<String> = serde_json::from_value(llama["images"].clone()).unwrap();

    // K/V as llama-server held them: f32 for F32, its default f16 for Q8_0.
    let pairs = [
        ("f32", "f32", KvDtype::F32, F32_NATS),
        ("q8_0", "f16", KvDtype::F16, Q8_0_NATS),
    ];
    for (text, projector, kv, nats) in pairs {
        let options = LoadOptions {
            mmproj: Some(Projector::Named(
                dir.join(format!("mmproj-gemma3vl-{projector}.gguf")),
            )),
            ..Default::default()
        };
        let file = dir.join(format!("gemma3vl-{text}.gguf"));
        let mut loaded = load(&file, &options, &Device::Cpu).unwrap();
        let encoder = loaded.vision.take().expect("the projector file's encoder");
        let spec = encoder.spec().clone();
        let ctx = chat_context(&loaded, &spec);
        let validate =
            |files: Vec<std::path::PathBuf>| validate_chat(&chat_request(&chat, &files), &ctx);
        let prompt = validate(fixture_files("images", &names)).unwrap().prompts[0].clone();
        assert_eq!(prompt.tokens, want_ids, "{text}: prompt ids");
        let square = validate(fixture_files("gguf-tiny", &squares))
            .unwrap()
            .prompts[0]
            .clone();
        let theirs = &llama[text];
        assert_eq!(
            theirs["prompt_tokens"],
            want_ids.len(),
            "{text}: llama.cpp's prompt"
        );
        let their_tokens: Vec<u32> = serde_json::from_value(theirs["tokens"].clone()).unwrap();
        // Each step's top candidates by llama.cpp: (id, logprob), best first.
        let their_top: Vec<Vec<(u32, f32)>> =
            serde_json::from_value(theirs["top"].clone()).unwrap();

        let eos = loaded.tokenizer.eos_ids().to_vec();
        let mut engine = vision_engine(loaded.model, eos, encoder, 512, Some(kv));
        let mut run = |prompt: Prompt, max_tokens: usize| {
            let params = SamplingParams {
                max_tokens,
                temperature: 0.0,
                ignore_eos: true,
                prompt_logprobs: Some(1),
                ..Default::default()
            };
            let id = engine.add_request(prompt, params).unwrap();
            let (mut scored, mut tokens) = (Vec::new(), Vec::new());
            while engine.has_work() {
                for ev in engine.step().into_iter().filter(|e| e.seq == id) {
                    assert!(
                        !matches!(ev.finish, Some(FinishReason::Error(_))),
                        "{:?}",
                        ev.finish
                    );
                    if let Some(t) = ev.token {
                        if tokens.is_empty() {
                            scored = ev.prompt_logprobs;
                        }
                        tokens.push(t.id);
                    }
                }
            }
            (scored, tokens)
        };

        let (scored, _) = run(prompt, 1);
        assert_prompt_logprobs(&scored, &want_ids, &want_logits, nats, text);

        // llama.cpp's reply, scored by teacher forcing.
        let (_, greedy) = run(square.clone(), their_tokens.len());
        let forced = Prompt {
            tokens: [want_ids.clone(), their_tokens.clone()].concat(),
            ..square
        };
        let (scored, _) = run(forced, 1);
        for (k, (&token, top)) in their_tokens.iter().zip(&their_top).enumerate() {
            let got = scored[want_ids.len() - 1 + k].logprob.unwrap();
            let (best, logprob) = top[0];
            assert_eq!(best, token, "{text}: llama.cpp's step {k}");
            let d = (got - logprob).abs();
            assert!(
                d < nats,
                "{text}, step {k}: logprob {got} of llama.cpp's token {token}, its own {logprob}"
            );
        }
        if let Some(k) = greedy.iter().zip(&their_tokens).position(|(a, b)| a != b) {
            let theirs_for_ours = their_top[k].iter().find(|(t, _)| *t == greedy[k]);
            let close = theirs_for_ours.is_some_and(|(_, lp)| their_top[k][0].1 - lp < TIE_NATS);
            assert!(
                close,
                "{text}: step {k}, wick chose {} where llama.cpp chose {} ({:?})",
                greedy[k], their_tokens[k], their_top[k]
            );
        }
    }
}

/// A projector file that does not fit the model is refused when the model
/// loads, saying why: a file that is no projector, a projector whose
/// embeddings are another width than the model's, a model without Gemma
/// 3's image tokens, and `--mmproj` beside a checkpoint directory.
#[test]
fn mismatched_projector_files_are_refused() {
    use wick::load::loader::{load, LoadOptions, Projector};

    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let gguf = fixtures.join("gguf-tiny");
    let with = |model: &Path, mmproj: &Path| {
        let options = LoadOptions {
            mmproj: Some(Projector::Named(mmproj.to_path_buf())),
            ..Default::default()
        };
        match load(model, &options, &Device::Cpu) {
            Ok(_) => panic!("{} took {}", model.display(), mmproj.display()),
            Err(e) => format!("{e:#}"),
        }
    };
    let text = gguf.join("gemma3vl-f32.gguf");
    let projector = gguf.join("mmproj-gemma3vl-f32.gguf");
    for (model, mmproj, says) in [
        (&text, &text, "is not a vision projector file"),
        (
            &gguf.join("qwen3moe-256-q4_k_m.gguf"),
            &projector,
            "the two files are not a pair",
        ),
        (
            &gguf.join("qwen3-f32.gguf"),
            &projector,
            "vocabulary has no <start_of_image>",
        ),
        (
            &fixtures.join("gemma3vl-tiny"),
            &projector,
            "goes with a GGUF model",
        ),
    ] {
        let e = with(model, mmproj);
        assert!(e.contains(says), "{}: {e}", model.display());
    }
}

/// Hostile images over HTTP, each refused with a 400 naming the part and
/// saying why, while the server keeps serving: a PNG claiming 50,000 x
/// 50,000 pixels, a JPEG cut in half, a data URL of text, 100 images in
/// one message, an http URL (media fetching is off), a `detail` the
/// model cannot honour, and an image in an assistant turn.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_images_are_refused_and_the_server_keeps_serving() {
    use base64::Engine as _;
    use serde_json::{json, Value};

    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemma3vl-tiny");
    let server = common::Server::start(&["--model", model]);
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images");
    let url = |name: &str, kind: &str| {
        let bytes = std::fs::read(images.join(name)).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
        format!("data:{kind};base64,{b64}")
    };
    let part = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    let ask = |parts: Vec<Value>| {
        let mut content = vec![json!({"type": "text", "text": "What is this?"})];
        content.extend(parts);
        json!({"messages": [{"role": "user", "content": content}], "max_tokens": 2})
    };
    let good = url("rgb.png", "image/png");
    let cases = [
        (
            ask(vec![part(&url("bomb.png", "image/png"))]),
            "messages[0].content[1].image_url",
            "50000 x 50000 pixels",
        ),
        (
            ask(vec![part(&url("truncated.jpg", "image/jpeg"))]),
            "messages[0].content[1].image_url",
            "cannot be decoded",
        ),
        (
            ask(vec![part("data:text/plain;base64,aGVsbG8=")]),
            "messages[0].content[1].image_url",
            "not an image",
        ),
        (
            ask(vec![part("data:image/png;base64,aGVsbG8=")]),
            "messages[0].content[1].image_url",
            "not an image",
        ),
        (
            ask(vec![part(&good); 100]),
            "messages[0].content[9].image_url",
            "at most 8",
        ),
        (
            ask(vec![part("http://169.254.169.254/latest/meta-data")]),
            "messages[0].content[1].image_url",
            "not enabled",
        ),
        (
            ask(vec![
                json!({"type": "image_url", "image_url": {"url": good, "detail": "low"}}),
            ]),
            "messages[0].content[1].image_url.detail",
            "low",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": [part(&good)]},
                                {"role": "user", "content": "and?"}], "max_tokens": 2}),
            "messages[1].content[0].type",
            "user messages",
        ),
        (
            ask(vec![
                json!({"type": "text", "text": "<start_of_image>"}),
                part(&good),
            ]),
            "messages",
            "image markers",
        ),
    ];
    for (body, param, says) in cases {
        let (status, reply) = common::post(&server, "/v1/chat/completions", body).await;
        common::assert_error(status, &reply, 400, Some(param));
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{param}: {message}");
    }
    let (status, reply) =
        common::post(&server, "/v1/chat/completions", ask(vec![part(&good)])).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["usage"]["completion_tokens"], 2);
}

/// A prompt may hold more images than the runner keeps encoded past their
/// prompts (32): those a running prompt still waits for are never dropped,
/// so a prompt of 33 different images is answered.
#[test]
fn a_step_may_hold_more_images_than_are_kept() {
    use wick::engine::prompt::{MediaSpan, Pixels, Prompt};
    use wick::engine::sequence::FinishReason;
    use wick::load::loader::{load, LoadOptions};
    use wick::sampling::params::SamplingParams;

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3vl-tiny");
    let loaded = load(&dir, &LoadOptions::default(), &Device::Cpu).unwrap();
    let encoder = loaded.vision.unwrap();
    let spec = encoder.spec().clone();
    let (w, h) = (
        spec.processor.width as usize,
        spec.processor.height as usize,
    );
    let boi = loaded.tokenizer.token_to_id(&spec.marker).unwrap();
    let eoi = loaded.tokenizer.token_to_id("<end_of_image>").unwrap();
    let mut prompt = Prompt::from(vec![loaded.tokenizer.bos_id().unwrap()]);
    for i in 0..33 {
        prompt.tokens.push(boi);
        let pixels = Pixels::new(vec![i as f32 / 33.0; 3 * w * h], h, w);
        prompt.media.push(MediaSpan {
            start: prompt.tokens.len(),
            len: spec.tokens,
            hash: pixels.content_hash(),
            pixels,
        });
        prompt
            .tokens
            .extend(std::iter::repeat_n(spec.token, spec.tokens));
        prompt.tokens.push(eoi);
    }
    let eos = loaded.tokenizer.eos_ids().to_vec();
    let mut engine = vision_engine(loaded.model, eos, encoder, 512, None);
    let params = SamplingParams {
        max_tokens: 1,
        ..Default::default()
    };
    engine.add_request(prompt, params).unwrap();
    let mut finish = None;
    while engine.has_work() {
        for ev in engine.step() {
            finish = ev.finish.or(finish);
        }
    }
    assert_eq!(finish, Some(FinishReason::Length));
}

/// Image URLs read where the operator allows them, on a server of
/// llama.cpp's files (`--model` a Q8_0 GGUF, `--mmproj` its F16 projector
/// file): an `http` URL on an allowed host (directly, and through a
/// redirect on the same host) and a `file:` URL under the allowed
/// directory are answered as the same image inline is; a redirect to
/// another host, a host not allowed, a file outside the directory, a 404,
/// a body over the byte cap and a server too slow for the deadline are
/// each a 400 naming the part, and the server keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn image_urls_are_read_only_where_allowed() {
    use axum::http::header::LOCATION;
    use axum::response::IntoResponse;
    use base64::Engine as _;
    use serde_json::{json, Value};

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let images = root.join("tests/fixtures/images").canonicalize().unwrap();
    let png = std::fs::read(images.join("rgb.png")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = png.clone();
    let site = axum::Router::new()
        .route(
            "/rgb.png",
            axum::routing::get(
                move || async move { ([("content-type", "image/png")], served.clone()) },
            ),
        )
        .route(
            "/moved",
            axum::routing::get(|| async {
                (axum::http::StatusCode::FOUND, [(LOCATION, "/rgb.png")])
            }),
        )
        .route(
            "/elsewhere",
            axum::routing::get(move || async move {
                let to = format!("http://localhost:{port}/rgb.png");
                (axum::http::StatusCode::FOUND, [(LOCATION, to)]).into_response()
            }),
        )
        .route(
            "/huge.png",
            axum::routing::get(|| async { vec![0u8; (8 << 20) + 1] }),
        )
        .route(
            "/slow.png",
            axum::routing::get(|| async {
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                "late"
            }),
        );
    tokio::spawn(async move { axum::serve(listener, site).await });

    let gguf = root.join("tests/fixtures/gguf-tiny");
    let server = common::Server::start(&[
        "--model",
        gguf.join("gemma3vl-q8_0.gguf").to_str().unwrap(),
        "--mmproj",
        gguf.join("mmproj-gemma3vl-f16.gguf").to_str().unwrap(),
        "--allowed-media-domains",
        "127.0.0.1",
        "--allowed-local-media-path",
        images.to_str().unwrap(),
        "--media-fetch-timeout-secs",
        "2",
    ]);
    let ask = |url: &str| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url}}]}],
            "max_tokens": 4, "temperature": 0, "logprobs": true})
    };
    let answer = |reply: &Value| {
        (
            reply["usage"]["prompt_tokens"].clone(),
            reply["choices"][0]["logprobs"]["content"].clone(),
        )
    };
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let (status, inline) = common::post(
        &server,
        "/v1/chat/completions",
        ask(&format!("data:image/png;base64,{b64}")),
    )
    .await;
    assert_eq!(status, 200, "{inline}");
    let site = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let file = |path: &Path| format!("file://{}", path.display());
    for url in [
        site("/rgb.png"),
        site("/moved"),
        file(&images.join("rgb.png")),
    ] {
        let (status, reply) = common::post(&server, "/v1/chat/completions", ask(&url)).await;
        assert_eq!(status, 200, "{url}: {reply}");
        assert_eq!(answer(&reply), answer(&inline), "{url}");
    }

    let cases = [
        (site("/elsewhere"), "redirects to another host"),
        (format!("http://localhost:{port}/rgb.png"), "\"localhost\""),
        (site("/missing.png"), "HTTP 404"),
        (site("/huge.png"), "over the limit of 8388608 bytes"),
        (site("/slow.png"), "timed out"),
        (file(&images.join("../README.md")), "is not under"),
        (format!("{}/nothing.png", file(&images)), "cannot be read"),
    ];
    for (url, says) in cases {
        let (status, reply) = common::post(&server, "/v1/chat/completions", ask(&url)).await;
        common::assert_error(
            status,
            &reply,
            400,
            Some("messages[0].content[1].image_url"),
        );
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{url}: {message}");
    }

    // Anthropic's url source is read the same way.
    let body = json!({"max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "url", "url": site("/rgb.png")}}]}]});
    let (status, reply) = common::post(&server, "/v1/messages", body).await;
    assert_eq!(status, 200, "{reply}");
    // Anthropic's input_tokens leaves out what the prefix cache supplied.
    let usage = &reply["usage"];
    let input = usage["input_tokens"].as_u64().unwrap();
    let cached = usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input + cached, inline["usage"]["prompt_tokens"]);
}

/// The engine's encoder queue with no time to spare (each call's deadline
/// already past) takes one chunk a call: an image is ready after its
/// chunks of two stages of every tower layer, an image no prompt waits for any more is
/// dropped part way, and one the tower refuses fails alone, the next
/// encoding in the same call.
#[test]
fn images_encode_a_chunk_at_a_time_and_fail_alone() {
    use std::time::Instant;
    use wick::engine::image_features::ImageFeatures;
    use wick::engine::prompt::Pixels;
    use wick::load::loader::{load, LoadOptions};

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3vl-tiny");
    let loaded = load(&dir, &LoadOptions::default(), &Device::Cpu).unwrap();
    let encoder = loaded.vision.unwrap();
    let (w, h) = (
        encoder.spec().processor.width as usize,
        encoder.spec().processor.height as usize,
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vision: SiglipConfig = serde_json::from_value(config["vision_config"].clone()).unwrap();
    // Two stages a layer, each over every patch, 5 patches a call.
    let per_image = 2 * vision.num_hidden_layers * vision.patches_per_side().pow(2).div_ceil(5);
    let image = |v: f32| {
        let pixels = Pixels::new(vec![v; 3 * w * h], h, w);
        (pixels.content_hash(), pixels)
    };
    let (a, b) = (image(0.25), image(-0.5));
    let mut features = ImageFeatures::new(encoder);
    let mut calls = 0;
    while !features.has(a.0) {
        let failed = features.encode(std::slice::from_ref(&a), Instant::now(), 5, &Device::Cpu);
        assert!(failed.is_empty(), "{failed:?}");
        calls += 1;
        assert!(calls <= per_image, "{calls} calls");
    }
    assert_eq!(calls, per_image, "a chunk a call");
    // b begun, then no longer wanted: dropped; wanted again, it starts over.
    features.encode(std::slice::from_ref(&b), Instant::now(), 5, &Device::Cpu);
    features.encode(&[], Instant::now(), 5, &Device::Cpu);
    for _ in 1..per_image {
        features.encode(std::slice::from_ref(&b), Instant::now(), 5, &Device::Cpu);
    }
    assert!(!features.has(b.0), "dropped part way, so not done yet");
    features.encode(std::slice::from_ref(&b), Instant::now(), 5, &Device::Cpu);
    assert!(features.has(b.0));
    // An image of the wrong size fails; the next is begun in its place.
    let wrong = Pixels::new(vec![0.0; 3 * w * (h / 2)], h / 2, w);
    let c = image(0.75);
    let wanted = [(wrong.content_hash(), wrong), c.clone()];
    let failed = features.encode(&wanted, Instant::now(), 5, &Device::Cpu);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, wanted[0].0);
    assert!(failed[0].1.contains("not"), "{}", failed[0].1);
    for _ in 1..per_image {
        features.encode(&wanted[1..], Instant::now(), 5, &Device::Cpu);
    }
    assert!(features.has(c.0) && features.has(a.0));
}
