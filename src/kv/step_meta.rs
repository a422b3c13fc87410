//! A step's metadata, packed once and uploaded once.
//!
//! Every layer of a forward pass needs the same facts about the flat batch:
//! token ids, positions, the KV slot each new row is written to, the slots
//! each sequence reads back, its causal mask, and the rows that want logits.
//! Built per layer and per sequence they would cost a host-to-device upload
//! each (about a thousand small copies a step at 32 streams and 16 layers on
//! a GPU); here they are packed into one `u32` buffer (and one `f32` buffer
//! of masks, when a prompt chunk needs one) and every use is a view into it.
//! On the CPU the host kernels read the same slices directly, and the
//! gather slots and masks only the tensor path needs are not built.

use candle_core::{Device, Result, Tensor};

use super::batch::{FlatBatch, SeqSlice};
use crate::kv::cache::KvCache;
use crate::kv::FREED;

/// What the step's attention reads besides its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// Nothing: the host kernel walks the block tables itself.
    Host,
    /// Each sequence's slots and masks, for the candle-op fallback.
    Gather,
    /// Sequence descriptors and block tables, for the CUDA kernel.
    Kernel,
}

/// Where each section of the packed buffer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sections {
    tokens: usize,
    positions: usize,
    slots: usize,
    /// The sliding-window pool's slot of each new row, where the batch has
    /// tables there (and a reader other than the host kernel).
    window_slots: Option<usize>,
    logit_rows: usize,
    /// What [`Reads`] asks for: the gathers, or the kernel's sections.
    reads: usize,
    kernel: Option<KernelSections>,
    end: usize,
}

/// Where the CUDA kernel's sections lie in the packed buffer (absolute
/// offsets, as the kernel reads them; `paged_attention.cu` has the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSections {
    /// [`SEQ_FIELDS`] per sequence: start row, rows, first position, and
    /// the offsets of its block table and of its sliding-window table (the
    /// block table's again where it has none).
    pub seqs: usize,
    /// Each row's sequence.
    pub row_seq: usize,
    /// The end of the positions each row attends to
    /// ([`SeqSlice::visible_end`]).
    pub row_end: usize,
    pub slots: usize,
    pub window_slots: usize,
}

/// Fields of a sequence's descriptor in [`KernelSections::seqs`].
pub const SEQ_FIELDS: usize = 5;
/// Which descriptor field holds the block table for a layer.
pub const TABLE_FIELD: usize = 3;
pub const WINDOW_TABLE_FIELD: usize = 4;

/// Where one sequence's views start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeqViews {
    /// Its slots for positions `0..context_len`, within the gather section.
    gather: usize,
    /// The same in the sliding-window layers' pool, where it has a table
    /// there (positions that left the window read any valid slot: the mask
    /// hides them).
    window_gather: Option<usize>,
    /// Its `[len, context_len]` mask within the mask buffer; none for a
    /// decode row, which sees every cached position.
    mask: Option<usize>,
    /// The same for sliding-window layers; none where the window holds its
    /// whole context (the causal mask then serves).
    window_mask: Option<usize>,
}

/// The step's packed metadata on the host, kept by the runner from step to
/// step: each step refills the same vectors, so a steady load allocates
/// none of them again (the upload itself still lands in a fresh device
/// buffer; fixed device addresses are CUDA graphs' business).
#[derive(Debug, Default)]
pub struct MetaBuffers {
    host: Vec<u32>,
    views: Vec<SeqViews>,
    masks: Vec<f32>,
}

impl MetaBuffers {
    /// Packs `batch` for `cache` and uploads it to `device`: one copy, plus
    /// one for the masks if any.
    /// `window`: the model's sliding window, if some layers have one;
    /// `kernel`: whether a tensor pool is read by the CUDA kernel (else by
    /// the candle-op fallback), as attention decides (`attention::step_meta`).
    pub fn pack<'a>(
        &'a mut self,
        batch: &'a FlatBatch,
        cache: &KvCache,
        window: Option<usize>,
        device: &Device,
        kernel: bool,
    ) -> Result<StepMeta<'a>> {
        let reads = match cache.on_host() {
            true => Reads::Host,
            false if kernel => Reads::Kernel,
            false => Reads::Gather,
        };
        let block_size = cache.layout().block_size;
        let at = pack(batch, block_size, reads, window, self);
        let packed = Tensor::new(self.host.as_slice(), device)?;
        let masks = match self.masks.len() {
            0 => None,
            n => Some(Tensor::from_slice(&self.masks, n, device)?),
        };
        Ok(StepMeta {
            batch,
            host: &self.host,
            at,
            views: &self.views,
            packed,
            masks,
        })
    }
}

/// One step's metadata: views into the packed buffer, on the host and on
/// the model's device.
pub struct StepMeta<'a> {
    batch: &'a FlatBatch,
    host: &'a [u32],
    at: Sections,
    views: &'a [SeqViews],
    /// `host` on the model's device.
    packed: Tensor,
    masks: Option<Tensor>,
}

impl<'a> StepMeta<'a> {
    /// The batch it was packed from.
    pub fn batch(&self) -> &'a FlatBatch {
        self.batch
    }

    pub fn seqs(&self) -> &[SeqSlice] {
        &self.batch.seqs
    }

    pub fn num_tokens(&self) -> usize {
        self.batch.tokens.len()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.host[self.at.tokens..self.at.positions]
    }

    pub fn positions(&self) -> &[u32] {
        &self.host[self.at.positions..self.at.slots]
    }

    pub fn num_logit_rows(&self) -> usize {
        self.at.reads - self.at.logit_rows
    }

    /// The packed buffer on the device and where the CUDA kernel's sections
    /// lie in it, where the step was packed for that kernel.
    pub fn kernel(&self) -> Option<(&Tensor, KernelSections)> {
        self.at.kernel.map(|k| (&self.packed, k))
    }

    fn view(&self, from: usize, len: usize) -> Result<Tensor> {
        self.packed.narrow(0, from, len)
    }

    pub fn tokens_t(&self) -> Result<Tensor> {
        self.view(self.at.tokens, self.num_tokens())
    }

    pub fn positions_t(&self) -> Result<Tensor> {
        self.view(self.at.positions, self.num_tokens())
    }

    /// The pool slot each new row's K/V goes to, in row order: in the
    /// sliding-window layers' pool for those (`windowed`), where the batch
    /// has tables there.
    pub fn slots_t(&self, windowed: bool) -> Result<Tensor> {
        match (windowed, self.at.window_slots) {
            (true, Some(at)) => self.view(at, self.num_tokens()),
            _ => self.view(self.at.slots, self.num_tokens()),
        }
    }

    /// [`FlatBatch::logit_rows`] on the device.
    pub fn logit_rows_t(&self) -> Result<Tensor> {
        self.view(self.at.logit_rows, self.num_logit_rows())
    }

    /// Sequence `i`'s slots for positions `0..context_len`, to gather its
    /// keys and values (a pool read by candle ops only).
    pub fn gather_t(&self, i: usize, windowed: bool) -> Result<Tensor> {
        let Some(v) = self.views.get(i) else {
            candle_core::bail!("no gather slots for sequence {i}: the pool is on the host");
        };
        let at = match (windowed, v.window_gather) {
            (true, Some(at)) => at,
            _ => v.gather,
        };
        self.view(self.at.reads + at, self.batch.seqs[i].context_len())
    }

    /// Sequence `i`'s causal mask, `[1, len, context_len]` (0 where a row
    /// may look, -inf past its own position, and for a sliding-window layer
    /// (`windowed`) before its window); `None` where a row sees every cached
    /// position.
    pub fn mask_t(&self, i: usize, windowed: bool) -> Result<Option<Tensor>> {
        let view = self.views.get(i);
        let at = match windowed {
            true => view.and_then(|v| v.window_mask.or(v.mask)),
            false => view.and_then(|v| v.mask),
        };
        let (Some(at), Some(masks)) = (at, &self.masks) else {
            return Ok(None);
        };
        let s = &self.batch.seqs[i];
        let len = s.len * s.context_len();
        Ok(Some(masks.narrow(0, at, len)?.reshape((
            1,
            s.len,
            s.context_len(),
        ))?))
    }
}

/// The slot of position `pos` in a sequence cached in `table`.
fn slot(table: &[u32], block_size: usize, pos: usize) -> u32 {
    table[pos / block_size] * block_size as u32 + (pos % block_size) as u32
}

/// The slot of position `p` in a sequence's sliding-window table. A
/// position whose window block was freed reads block 0: it lies before the
/// window, so the mask (or the kernel's range) hides it.
fn window_slot(s: &SeqSlice, block_size: usize, p: usize) -> u32 {
    match s.table(true)[p / block_size] {
        FREED => 0,
        _ => slot(s.table(true), block_size, p),
    }
}

/// Refills `bufs` with the packed `u32` buffer and, for [`Reads::Gather`],
/// each sequence's gather slots and the masks of its prompt chunks;
/// returns the buffer's sections.
fn pack(
    batch: &FlatBatch,
    block_size: usize,
    reads: Reads,
    window: Option<usize>,
    bufs: &mut MetaBuffers,
) -> Sections {
    let t = batch.tokens.len();
    let windowed = reads != Reads::Host && batch.seqs.iter().any(|s| !s.window_table.is_empty());
    let MetaBuffers { host, views, masks } = bufs;
    host.clear();
    views.clear();
    masks.clear();
    host.extend_from_slice(&batch.tokens);
    host.extend_from_slice(&batch.positions);
    for s in &batch.seqs {
        host.extend((s.first_pos..s.context_len()).map(|p| slot(&s.block_table, block_size, p)));
    }
    let window_slots = windowed.then(|| {
        let at = host.len();
        for s in &batch.seqs {
            host.extend((s.first_pos..s.context_len()).map(|p| window_slot(s, block_size, p)));
        }
        at
    });
    let logit_rows = host.len();
    host.extend_from_slice(&batch.logit_rows());
    let mut at = Sections {
        tokens: 0,
        positions: t,
        slots: 2 * t,
        window_slots,
        logit_rows,
        reads: host.len(),
        kernel: None,
        end: 0,
    };
    match reads {
        Reads::Host => {}
        Reads::Kernel => at.kernel = Some(pack_kernel(batch, host, &at)),
        Reads::Gather => pack_gathers(batch, block_size, window, host, views, masks, at.reads),
    }
    at.end = host.len();
    at
}

/// The CUDA kernel's sections: descriptors, each row's sequence, then the
/// block tables (freed window blocks as block 0, outside every row's range).
fn pack_kernel(batch: &FlatBatch, host: &mut Vec<u32>, at: &Sections) -> KernelSections {
    let seqs = host.len();
    let tables = seqs + SEQ_FIELDS * batch.seqs.len() + 2 * batch.tokens.len();
    let mut table_at = tables;
    for s in &batch.seqs {
        let window_at = table_at + s.block_table.len();
        let own_window = !s.window_table.is_empty();
        host.extend([
            s.start as u32,
            s.len as u32,
            s.first_pos as u32,
            table_at as u32,
            match own_window {
                true => window_at as u32,
                false => table_at as u32,
            },
        ]);
        table_at = window_at + s.window_table.len();
    }
    let row_seq = host.len();
    for (i, s) in batch.seqs.iter().enumerate() {
        host.extend(std::iter::repeat_n(i as u32, s.len));
    }
    let row_end = host.len();
    for s in &batch.seqs {
        host.extend((s.first_pos..s.context_len()).map(|p| s.visible_end(p) as u32));
    }
    for s in &batch.seqs {
        host.extend_from_slice(&s.block_table);
        host.extend(
            s.window_table
                .iter()
                .map(|&b| if b == FREED { 0 } else { b }),
        );
    }
    debug_assert_eq!(host.len(), table_at);
    KernelSections {
        seqs,
        row_seq,
        row_end,
        slots: at.slots,
        window_slots: at.window_slots.unwrap_or(at.slots),
    }
}

/// Each sequence's gather slots (in both pools where it has a window
/// table) and its masks, for the candle-op fallback.
fn pack_gathers(
    batch: &FlatBatch,
    block_size: usize,
    window: Option<usize>,
    host: &mut Vec<u32>,
    views: &mut Vec<SeqViews>,
    masks: &mut Vec<f32>,
    reads: usize,
) {
    let windowed = batch.seqs.iter().any(|s| !s.window_table.is_empty());
    for s in &batch.seqs {
        let gather = host.len() - reads;
        host.extend((0..s.context_len()).map(|p| slot(&s.block_table, block_size, p)));
        let window_gather = windowed.then(|| {
            let from = host.len() - reads;
            host.extend((0..s.context_len()).map(|p| window_slot(s, block_size, p)));
            from
        });
        // Row i sits at position first_pos + i and sees keys from `lowest`
        // to its visible end.
        let mut push_mask = |lowest: &dyn Fn(usize) -> usize| {
            let from = masks.len();
            for i in 0..s.len {
                let pos = s.first_pos + i;
                let seen = lowest(pos)..s.visible_end(pos);
                masks.extend((0..s.context_len()).map(|j| match seen.contains(&j) {
                    true => 0.0,
                    false => f32::NEG_INFINITY,
                }));
            }
            from
        };
        let mask = (s.len > 1).then(|| push_mask(&|_| 0));
        let window_mask = window
            .filter(|&w| s.context_len() > w)
            .map(|w| push_mask(&|pos| (pos + 1).saturating_sub(w)));
        views.push(SeqViews {
            gather,
            window_gather,
            mask,
            window_mask,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::batch::LogitRows;
    use crate::kv::cache::{KvDtype, KvLayout};

    /// An 8-block pool of `block_size`-token blocks, on the host or not.
    fn cache(block_size: usize, host: bool) -> KvCache {
        let layout = KvLayout {
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 4,
            block_size,
            num_blocks: 8,
            dtype: KvDtype::F32,
            window_kv: None,
        };
        KvCache::new(layout, &Device::Cpu, !host).unwrap()
    }

    /// A decode row at position 9 of a sequence in blocks [5, 2, 7], and a
    /// 3-token prompt chunk at positions 4..7 in blocks [1, 3], 4-token
    /// blocks.
    fn batch() -> FlatBatch {
        let mut b = FlatBatch::default();
        let seq0: Vec<u32> = (100..110).collect();
        b.push(&seq0, 9..10, vec![5, 2, 7], LogitRows::Last);
        let seq1: Vec<u32> = (200..207).collect();
        b.push(&seq1, 4..7, vec![1, 3], LogitRows::All);
        b
    }

    fn to_vec(t: Tensor) -> Vec<u32> {
        t.to_vec1::<u32>().unwrap()
    }

    #[test]
    fn sections_hold_the_batch() {
        let b = batch();
        let mut bufs = MetaBuffers::default();
        let m = bufs
            .pack(&b, &cache(4, false), None, &Device::Cpu, false)
            .unwrap();
        assert_eq!(m.tokens(), &[109, 204, 205, 206]);
        assert_eq!(m.positions(), &[9, 4, 5, 6]);
        // Position 9 is block 2 (id 7), offset 1; 4..7 are block 1 (id 3).
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![29, 12, 13, 14]);
        assert_eq!(to_vec(m.logit_rows_t().unwrap()), vec![0, 1, 2, 3]);
        assert_eq!(to_vec(m.tokens_t().unwrap()), m.tokens());
        assert_eq!(to_vec(m.positions_t().unwrap()), m.positions());
    }

    #[test]
    fn each_sequence_gathers_its_whole_context() {
        let b = batch();
        let mut bufs = MetaBuffers::default();
        let m = bufs
            .pack(&b, &cache(4, false), None, &Device::Cpu, false)
            .unwrap();
        let want0: Vec<u32> = [20, 21, 22, 23, 8, 9, 10, 11, 28, 29].into();
        assert_eq!(to_vec(m.gather_t(0, false).unwrap()), want0);
        assert_eq!(
            to_vec(m.gather_t(1, false).unwrap()),
            vec![4, 5, 6, 7, 12, 13, 14]
        );
    }

    #[test]
    fn only_prompt_chunks_carry_a_causal_mask() {
        let b = batch();
        let mut bufs = MetaBuffers::default();
        let m = bufs
            .pack(&b, &cache(4, false), None, &Device::Cpu, false)
            .unwrap();
        assert!(m.mask_t(0, false).unwrap().is_none());
        let mask = m.mask_t(1, false).unwrap().unwrap();
        assert_eq!(mask.dims(), &[1, 3, 7]);
        let rows = mask.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
        for (i, row) in rows.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                // Row i is at position 4 + i.
                assert_eq!(x == 0.0, j <= 4 + i, "row {i} key {j}: {x}");
            }
        }
    }

    #[test]
    fn a_batch_of_decode_rows_uploads_no_masks() {
        let mut b = FlatBatch::default();
        for i in 0..3u32 {
            let toks: Vec<u32> = (0..5).collect();
            b.push(&toks, 4..5, vec![i], LogitRows::Last);
        }
        let mut bufs = MetaBuffers::default();
        let m = bufs
            .pack(&b, &cache(8, false), None, &Device::Cpu, false)
            .unwrap();
        assert!(m.masks.is_none());
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![4, 12, 20]);
        assert_eq!(m.host.len(), 3 * 3 + 3 + 3 * 5);
    }

    /// The runner's buffers serve step after step: a decode step packed
    /// after a prompt chunk keeps none of the chunk's gathers or masks.
    #[test]
    fn reused_buffers_hold_only_the_latest_step() {
        let mut bufs = MetaBuffers::default();
        let chunk = batch();
        let pool = cache(4, false);
        let m = bufs.pack(&chunk, &pool, None, &Device::Cpu, false).unwrap();
        assert!(m.mask_t(1, false).unwrap().is_some());
        let mut decode = FlatBatch::default();
        let toks: Vec<u32> = (0..3).collect();
        decode.push(&toks, 2..3, vec![6], LogitRows::Last);
        let m = bufs
            .pack(&decode, &pool, None, &Device::Cpu, false)
            .unwrap();
        assert!(m.masks.is_none() && m.views.len() == 1);
        assert_eq!(m.tokens(), &[2]);
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![26]);
        assert_eq!(to_vec(m.gather_t(0, false).unwrap()), vec![24, 25, 26]);
        assert_eq!(m.host.len(), 3 + 1 + 3);
    }

    /// Sliding-window layers: their own slots and gathers from the window
    /// tables, freed positions reading slot 0, and masks that also hide
    /// what lies before each row's window (a decode row too, once its
    /// context outgrows the window).
    #[test]
    fn window_tables_get_their_own_slots_gathers_and_masks() {
        let mut b = batch();
        b.seqs[0].window_table = vec![FREED, 4, 6];
        b.seqs[1].window_table = vec![0, 1];
        let mut bufs = MetaBuffers::default();
        let m = bufs
            .pack(&b, &cache(4, false), Some(3), &Device::Cpu, false)
            .unwrap();
        assert_eq!(to_vec(m.slots_t(true).unwrap()), vec![25, 4, 5, 6]);
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![29, 12, 13, 14]);
        let want0: Vec<u32> = [0, 0, 0, 0, 16, 17, 18, 19, 24, 25].into();
        assert_eq!(to_vec(m.gather_t(0, true).unwrap()), want0);
        assert_eq!(
            to_vec(m.gather_t(1, true).unwrap()),
            vec![0, 1, 2, 3, 4, 5, 6]
        );
        let decode = m.mask_t(0, true).unwrap().unwrap();
        let row = decode.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Position 9 with a window of 3 sees 7..=9.
        let seen: Vec<usize> = (0..10).filter(|&j| row[j] == 0.0).collect();
        assert_eq!(seen, vec![7, 8, 9]);
        assert!(m.mask_t(0, false).unwrap().is_none());
        let chunk = m.mask_t(1, true).unwrap().unwrap().squeeze(0).unwrap();
        for (i, row) in chunk.to_vec2::<f32>().unwrap().iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                let pos = 4 + i;
                assert_eq!(x == 0.0, j <= pos && j + 3 > pos, "row {i} key {j}: {x}");
            }
        }
    }

    /// The kernel's sections, read the way `paged_attention.cu` reads them:
    /// each row finds its sequence, its position and, through the table
    /// the layer picks, the slot of every key it may see.
    #[test]
    fn the_kernel_finds_every_rows_keys_through_its_sections() {
        let mut b = batch();
        b.seqs[0].window_table = vec![FREED, 4, 6];
        b.seqs[1].window_table = vec![0, 1];
        // The chunk's positions 4 and 5 see each other.
        b.seqs[1].seen_whole = std::iter::once(4..6).collect();
        let mut bufs = MetaBuffers::default();
        let at = pack(&b, 4, Reads::Kernel, Some(3), &mut bufs);
        assert!(bufs.views.is_empty() && bufs.masks.is_empty());
        let host = &bufs.host;
        let k = at.kernel.unwrap();
        assert_eq!(at.end, host.len());
        // Sections as the accessors see them.
        assert_eq!(&host[k.slots..k.slots + 4], &[29, 12, 13, 14]);
        assert_eq!(&host[k.window_slots..k.window_slots + 4], &[25, 4, 5, 6]);
        assert_eq!(&host[k.row_seq..k.row_seq + 4], &[0, 1, 1, 1]);
        assert_eq!(&host[k.row_end..k.row_end + 4], &[10, 6, 6, 7]);
        // Keys of row r in the layer reading `field`, by the kernel's rule.
        let keys = |r: usize, field: usize, window: usize| -> Vec<u32> {
            let seq = &host[k.seqs + SEQ_FIELDS * host[k.row_seq + r] as usize..];
            let pos = seq[2] as usize + r - seq[0] as usize;
            let table = &host[seq[field] as usize..];
            let lo = (pos + 1).saturating_sub(window);
            (lo..host[k.row_end + r] as usize)
                .map(|j| table[j / 4] * 4 + (j % 4) as u32)
                .collect()
        };
        // Global layers: the decode row (position 9, blocks [5, 2, 7]) sees
        // all ten; the chunk's last row (position 6, blocks [1, 3]) seven.
        let want0: Vec<u32> = [20, 21, 22, 23, 8, 9, 10, 11, 28, 29].into();
        assert_eq!(keys(0, TABLE_FIELD, usize::MAX), want0);
        assert_eq!(
            keys(3, TABLE_FIELD, usize::MAX),
            vec![4, 5, 6, 7, 12, 13, 14]
        );
        // Window layers (3 positions): the window tables, never the freed
        // block.
        assert_eq!(keys(0, WINDOW_TABLE_FIELD, 3), vec![19, 24, 25]);
        assert_eq!(keys(1, WINDOW_TABLE_FIELD, 3), vec![2, 3, 4, 5]);
        // A sequence without a window table reads its block table there.
        let b = batch();
        let at = pack(&b, 4, Reads::Kernel, None, &mut bufs);
        let host = &bufs.host;
        let k = at.kernel.unwrap();
        for s in 0..2 {
            let seq = &host[k.seqs + SEQ_FIELDS * s..];
            assert_eq!(seq[TABLE_FIELD], seq[WINDOW_TABLE_FIELD]);
        }
        assert_eq!(k.window_slots, k.slots);
    }

    #[test]
    fn a_host_pool_gets_no_gather_slots_or_masks() {
        let b = batch();
        let mut bufs = MetaBuffers::default();
        let m = bufs
            .pack(&b, &cache(4, true), None, &Device::Cpu, false)
            .unwrap();
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![29, 12, 13, 14]);
        assert_eq!(m.host.len(), 3 * 4 + 4);
        assert!(m.masks.is_none() && m.gather_t(0, false).is_err());
    }
}
