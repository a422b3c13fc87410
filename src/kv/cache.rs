//! The paged KV pool: per layer, `num_blocks` blocks of `block_size` token
//! slots for K and for V. Which blocks a sequence owns is decided by the
//! [`crate::engine::block_manager::BlockManager`]; this file only holds the memory and
//! knows where a (block, slot) lives.
//!
//! K and V are stored as f16 for quantized (GGUF) models, as llama.cpp
//! does: half the memory and bandwidth of f32, with attention itself
//! computed in f32. Models with f32 weights keep f32 K/V, as vLLM's "auto"
//! cache dtype does, so their outputs match the reference implementation's.
//!
//! `--kv-cache-dtype int8` stores each token's head vector as int8 with one
//! f32 scale (group-wise quantization, a group being one head of one token):
//! about half the bytes of f16, and decode attention at many streams is bound
//! by reading K/V. It is a host-pool format (CPU only).
//!
//! Two storages: on the CPU the pool is a plain `Vec<f16>` of
//! `[block][kv_head]` tiles, keys transposed within a tile (see
//! `attention::host`), so the attention kernel reads one head's keys and
//! values of a block contiguously; on any
//! other device (or when forced, to test it) it is a candle tensor
//! `[num_blocks * block_size, kv_heads * head_dim]` written and gathered with
//! candle ops.

use candle_core::{DType, Device, Tensor};
use half::f16;

/// How K and V values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvDtype {
    F16,
    F32,
    /// int8 with an f32 scale per token and head.
    Int8,
}

impl KvDtype {
    /// Bytes holding one token's vector of one head.
    pub fn head_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F16 => 2 * head_dim,
            KvDtype::F32 => 4 * head_dim,
            KvDtype::Int8 => head_dim + 4,
        }
    }

    /// The candle dtype of the tensor storage; int8 has none.
    fn dtype(self) -> candle_core::Result<DType> {
        match self {
            KvDtype::F16 => Ok(DType::F16),
            KvDtype::F32 => Ok(DType::F32),
            KvDtype::Int8 => candle_core::bail!(
                "--kv-cache-dtype int8 is a CPU cache format; use f16 or f32 on this device"
            ),
        }
    }
}

/// The K/V heads one layer keeps, and their size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// Shape of the pool, fixed at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub dtype: KvDtype,
    /// The sliding-window layers' heads where they differ from the
    /// others' (Gemma 4's).
    pub window_kv: Option<KvShape>,
}

impl KvLayout {
    /// Bytes of K plus V for one block across all layers.
    pub fn bytes_per_block(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * num_layers * num_kv_heads * block_size * dtype.head_bytes(head_dim)
    }

    /// A layout using at most `budget_bytes` of memory.
    pub fn from_budget(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        dtype: KvDtype,
        budget_bytes: usize,
    ) -> Self {
        let per_block =
            Self::bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, dtype);
        KvLayout {
            num_layers,
            num_kv_heads,
            head_dim,
            block_size,
            num_blocks: budget_bytes / per_block,
            dtype,
            window_kv: None,
        }
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The heads of a sliding-window layer (`window`) or of another.
    pub fn shape(&self, window: bool) -> KvShape {
        match (window, self.window_kv) {
            (true, Some(shape)) => shape,
            _ => KvShape {
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
            },
        }
    }
}

/// Host memory of one layer's K (or V) values.
pub enum HostPool {
    F16(Vec<f16>),
    F32(Vec<f32>),
    /// Values, and one scale per `[block][kv_head][slot]`.
    Int8(Vec<i8>, Vec<f32>),
}

impl HostPool {
    fn zeros(dtype: KvDtype, len: usize, head_dim: usize) -> Self {
        match dtype {
            KvDtype::F16 => HostPool::F16(vec![f16::ZERO; len]),
            KvDtype::F32 => HostPool::F32(vec![0.0; len]),
            KvDtype::Int8 => HostPool::Int8(vec![0; len], vec![0.0; len / head_dim]),
        }
    }
}

pub enum LayerCache {
    /// `[block][kv_head]` tiles of `block_size * head_dim`, read by the CPU attention kernel.
    Host { k: HostPool, v: HostPool },
    /// `[block * block_size + slot][kv_head * head_dim]`, for candle ops on any device.
    Tensor { k: Tensor, v: Tensor },
}

pub struct KvCache {
    layout: KvLayout,
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// Allocates the whole pool up front, so memory never grows past the
    /// budget. The host layout is used on the CPU unless `force_tensor`.
    pub fn new(layout: KvLayout, device: &Device, force_tensor: bool) -> candle_core::Result<Self> {
        Self::with_window_layers(layout, &[], 0, device, force_tensor)
    }

    /// A pool whose `window_layers` (sliding-window layers) hold
    /// `window_blocks` blocks each, and the other layers `layout.num_blocks`.
    pub fn with_window_layers(
        layout: KvLayout,
        window_layers: &[usize],
        window_blocks: usize,
        device: &Device,
        force_tensor: bool,
    ) -> candle_core::Result<Self> {
        let layers = (0..layout.num_layers)
            .map(|i| {
                let window = window_layers.contains(&i);
                let num_blocks = match window {
                    true => window_blocks,
                    false => layout.num_blocks,
                };
                let heads = layout.shape(window);
                let kv_dim = heads.num_kv_heads * heads.head_dim;
                let elems = num_blocks * layout.block_size * kv_dim;
                if device.is_cpu() && !force_tensor {
                    Ok(LayerCache::Host {
                        k: HostPool::zeros(layout.dtype, elems, heads.head_dim),
                        v: HostPool::zeros(layout.dtype, elems, heads.head_dim),
                    })
                } else {
                    let shape = (num_blocks * layout.block_size, kv_dim);
                    Ok(LayerCache::Tensor {
                        k: Tensor::zeros(shape, layout.dtype.dtype()?, device)?,
                        v: Tensor::zeros(shape, layout.dtype.dtype()?, device)?,
                    })
                }
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(KvCache { layout, layers })
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Whether the CPU kernel's layout holds it (else candle ops read it).
    pub fn on_host(&self) -> bool {
        matches!(self.layers.first(), Some(LayerCache::Host { .. }))
    }

    pub fn layer_mut(&mut self, layer: usize) -> &mut LayerCache {
        &mut self.layers[layer]
    }
}
