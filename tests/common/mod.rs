//! Shared helpers for the integration tests: the real default model, fetched
//! through the same code path `wick` itself uses.
#![allow(dead_code)]

use std::path::PathBuf;

use candle_core::Device;
use wick::engine::{Engine, EngineConfig};
use wick::loader::{load, LoadedModel};
use wick::models::linear::WeightFormat;

pub fn model_path() -> PathBuf {
    wick::model_fetch::default_model_path().expect("fetching the default model")
}

pub fn load_default(format: WeightFormat) -> LoadedModel {
    load(&model_path(), format, &Device::Cpu).expect("loading the default model")
}

pub fn engine(cfg: &EngineConfig) -> (Engine, wick::tokenizer::Tokenizer) {
    let loaded = load_default(WeightFormat::Native);
    let eos = loaded.tokenizer.eos_ids().to_vec();
    (
        Engine::new(loaded.model, eos, cfg).expect("engine"),
        loaded.tokenizer,
    )
}

pub fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference")
}
