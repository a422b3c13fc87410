//! Opens a model (a GGUF file or a Hugging Face checkpoint directory) and
//! builds everything the engine and the front end need from it: the model,
//! its tokenizer and its chat template.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device};

use crate::load::gguf_split::{self, SplitReader};
use crate::load::load_progress::LoadProgress;
use crate::load::{gguf_header, hf_dir, mmproj};
use crate::models::linear::{WeightFormat, WeightSpec};
use crate::models::registry::{self, FromGguf, ReadSeek};
use crate::models::vision::VisionEncoder;
use crate::models::{gguf_architecture, Gguf, Model};
use crate::quant::Kernel;
use crate::text::chat_template::ChatTemplate;
use crate::text::tokenizer::Tokenizer;

pub struct LoadedModel {
    pub model: Box<dyn Model>,
    /// The model's image encoder, where its checkpoint has one.
    pub vision: Option<VisionEncoder>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The name clients use for it: the file stem, directory name or hub repo id.
    pub name: String,
}

/// Dtype of safetensors weights (`--dtype`); GGUF weights follow `--weights`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    #[default]
    F32,
    F16,
    Bf16,
}

impl From<WeightDtype> for DType {
    fn from(d: WeightDtype) -> DType {
        match d {
            WeightDtype::F32 => DType::F32,
            WeightDtype::F16 => DType::F16,
            WeightDtype::Bf16 => DType::BF16,
        }
    }
}

/// Everything about a load besides the path and device.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub weights: WeightFormat,
    /// The CPU kernels for weights on wick's own.
    pub kernel: Kernel,
    pub dtype: WeightDtype,
    /// A Jinja chat template file to use instead of (or in the absence of)
    /// the model's own.
    pub chat_template: Option<PathBuf>,
    /// The context the server will serve (`--max-model-len`), when less
    /// than the model's: smaller RoPE tables, and Phi-3's LongRoPE factors
    /// depend on it.
    pub context: Option<usize>,
    /// A llama.cpp vision projector file for a GGUF model.
    pub mmproj: Option<Projector>,
}

/// Where a GGUF model's vision projector file comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projector {
    /// Named by `--mmproj`: one that does not fit is an error.
    Named(PathBuf),
    /// Found beside a hub model: one that does not fit is passed over
    /// (text only), saying so.
    Found(PathBuf),
}

impl From<WeightFormat> for LoadOptions {
    fn from(weights: WeightFormat) -> Self {
        LoadOptions {
            weights,
            ..Default::default()
        }
    }
}

impl LoadOptions {
    fn spec(&self) -> WeightSpec {
        WeightSpec {
            format: self.weights,
            kernel: self.kernel,
        }
    }
}

/// `cpu`, or `cuda` / `cuda:N` when built with the `cuda` feature.
pub fn device(name: &str) -> anyhow::Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        cuda if cuda.starts_with("cuda") => {
            let ordinal = cuda
                .strip_prefix("cuda:")
                .map(str::parse)
                .transpose()
                .context("bad CUDA device ordinal")?
                .unwrap_or(0);
            if !cfg!(feature = "cuda") {
                bail!("this wick was built without CUDA; rebuild with `cargo build --release --features cuda`");
            }
            // cudarc's error is a Debug dump (`DriverError(CUDA_ERROR_NO_DEVICE, ...)`);
            // say what it means instead.
            Device::new_cuda(ordinal).map_err(|e| {
                anyhow::anyhow!(
                    "cannot open CUDA device {ordinal}: {}",
                    cuda_error_name(&e.to_string())
                )
            })
        }
        other => bail!("unknown device {other:?}; use cpu or cuda[:N]"),
    }
}

/// The driver's error code out of candle's CUDA error text, with a hint for
/// the common case of a machine without a GPU.
fn cuda_error_name(text: &str) -> String {
    match text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("CUDA_ERROR_"))
    {
        Some("CUDA_ERROR_NO_DEVICE") => "no CUDA-capable GPU found (CUDA_ERROR_NO_DEVICE)".into(),
        Some(code) => code.into(),
        None => text.lines().next().unwrap_or(text).into(),
    }
}

/// A GGUF file, or the parts of a split one read as one file
/// ([`gguf_split`]), with a reader for its tensors.
fn open_gguf(path: &Path) -> anyhow::Result<(Gguf, Box<dyn ReadSeek>)> {
    let Some(parts) = gguf_split::parts(path)? else {
        let (gguf, reader) = open_one_gguf(path)?;
        return Ok((gguf, Box::new(reader)));
    };
    let mut headers = Vec::with_capacity(parts.len());
    let mut files = Vec::with_capacity(parts.len());
    for part in &parts {
        headers.push(open_one_gguf(part)?.0);
        files.push(File::open(part).with_context(|| format!("cannot open {}", part.display()))?);
    }
    let reader = SplitReader::new(files)?;
    let starts: Vec<u64> = (0..parts.len()).map(|k| reader.start(k)).collect();
    let mut headers = headers.into_iter();
    let first = headers.next().context("a split GGUF with no parts")?;
    Ok((
        Gguf::merge(first, headers.collect(), &starts),
        Box::new(reader),
    ))
}

fn open_one_gguf(path: &Path) -> anyhow::Result<(Gguf, BufReader<File>)> {
    let file =
        File::open(path).with_context(|| format!("cannot open model file {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let e = match gguf_file::Content::read(&mut reader) {
        Ok(content) => return Ok((content.into(), reader)),
        Err(e) => e,
    };
    let reopen = || File::open(path).ok().map(BufReader::new);
    // candle refuses MXFP4 (gpt-oss's experts): it reads the header with
    // those tensors masked, and wick reads their blocks itself.
    if let Some((header, names)) = reopen().and_then(|mut f| gguf_header::mask_mxfp4(&mut f)) {
        if let Ok(content) = gguf_file::Content::read(&mut std::io::Cursor::new(header)) {
            return Ok((Gguf::with_mxfp4(content, &names), reader));
        }
    }
    // candle names neither the tensor nor the type it cannot read.
    match reopen().and_then(|mut f| gguf_header::unreadable_tensor(&mut f)) {
        Some(why) => bail!("{}: {why}", path.display()),
        None => Err(anyhow::Error::new(e)
            .context(format!("{} is not a readable GGUF file", path.display()))),
    }
}

/// A GGUF file's header (its metadata and tensors), as the loader reads it.
pub fn read_gguf_header(path: &Path) -> anyhow::Result<Gguf> {
    Ok(open_gguf(path)?.0)
}

/// A GGUF file whose architecture wick runs, and the constructor for it.
pub(crate) fn open_model_gguf(path: &Path) -> anyhow::Result<(Gguf, Box<dyn ReadSeek>, FromGguf)> {
    let (content, reader) = open_gguf(path)?;
    let arch = gguf_architecture(&content);
    let Some(build) = registry::gguf(arch) else {
        bail!(
            "GGUF architecture {arch:?} is not supported; wick runs {} files",
            registry::gguf_supported()
        );
    };
    Ok((content, reader, build))
}

/// Just the tokenizer, without loading any weights.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    if path.is_dir() {
        return Ok(hf_dir::load_tokenizer(path)?.0);
    }
    Tokenizer::from_gguf(&open_gguf(path)?.0)
        .context("building the tokenizer from the GGUF metadata")
}

/// Loads a GGUF file, or the Hugging Face checkpoint in a directory.
pub fn load(path: &Path, options: &LoadOptions, device: &Device) -> anyhow::Result<LoadedModel> {
    let mut loaded = match path.is_dir() {
        true => load_hf(path, options, device)?,
        false => load_gguf(path, options, device)?,
    };
    release_freed_memory();
    if let Some(file) = &options.chat_template {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading chat template {}", file.display()))?;
        loaded.chat_template = Some(hf_dir::template_for(&loaded.tokenizer, text)?);
    }
    Ok(loaded)
}

/// Reading and repacking the weights frees about as much memory as the
/// model holds; `wick` tunes the allocator to keep freed memory for the
/// next step's buffers, which would keep those pages resident for good.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn load_hf(dir: &Path, options: &LoadOptions, device: &Device) -> anyhow::Result<LoadedModel> {
    if let Some(Projector::Named(_)) = options.mmproj {
        bail!(
            "--mmproj goes with a GGUF model; the checkpoint {} has its own vision tower, if any",
            dir.display()
        );
    }
    let (tokenizer, chat_template) = hf_dir::load_tokenizer(dir)?;
    let (model, vision) = hf_dir::load_model(
        dir,
        options.spec(),
        options.dtype.into(),
        options.context,
        device,
        &tokenizer,
    )?;
    Ok(LoadedModel {
        model,
        vision,
        tokenizer,
        chat_template,
        name: hf_dir::model_name(dir),
    })
}

fn load_gguf(path: &Path, options: &LoadOptions, device: &Device) -> anyhow::Result<LoadedModel> {
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string();
    let (content, reader, build) = open_model_gguf(path)?;
    let tokenizer =
        Tokenizer::from_gguf(&content).context("building the tokenizer from the GGUF metadata")?;
    let chat_template = match content.metadata.get("tokenizer.chat_template") {
        Some(t) => {
            let token = |key: &str| {
                content
                    .metadata
                    .get(key)
                    .and_then(|v| v.to_u32().ok())
                    .and_then(|id| tokenizer.id_to_token(id))
                    .unwrap_or_default()
            };
            Some(ChatTemplate::new(
                t.to_string()?.clone(),
                token("tokenizer.ggml.bos_token_id"),
                token("tokenizer.ggml.eos_token_id"),
            )?)
        }
        None => None,
    };
    let bytes = content.tensor_bytes();
    let mut reader = LoadProgress::new(reader, bytes, content.tensor_count());
    let model = build(
        &content,
        &mut reader,
        options.spec(),
        options.context,
        device,
    )
    .context("loading the model weights")?;
    let vision = match &options.mmproj {
        Some(Projector::Named(file) | Projector::Found(file)) => {
            let key = format!("{}.embedding_length", gguf_architecture(&content));
            let width = content
                .metadata
                .get(&key)
                .and_then(|v| v.to_u32().ok())
                .with_context(|| format!("{}: no {key}", path.display()))?;
            match mmproj::load(file, width as usize, &tokenizer, options.weights, device) {
                Ok(encoder) => Some(encoder),
                Err(e) if matches!(options.mmproj, Some(Projector::Found(_))) => {
                    eprintln!("wick: the repo's vision projector is not used: {e:#}");
                    None
                }
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    Ok(LoadedModel {
        model,
        vision,
        tokenizer,
        chat_template,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_errors_read_as_their_driver_code() {
        let no_gpu =
            r#"DriverError(CUDA_ERROR_NO_DEVICE, "<Failure when calling cuGetErrorString()>")"#;
        assert_eq!(
            cuda_error_name(no_gpu),
            "no CUDA-capable GPU found (CUDA_ERROR_NO_DEVICE)"
        );
        assert_eq!(
            cuda_error_name("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(cuda_error_name("first\nsecond"), "first");
    }

    #[test]
    fn unknown_devices_are_refused_by_name() {
        let err = device("tpu").unwrap_err().to_string();
        assert!(err.contains("\"tpu\""), "{err}");
        assert!(device("cuda:x").is_err());
    }
}
