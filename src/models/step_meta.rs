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

use super::{FlatBatch, SeqSlice};
use crate::engine::kv_cache::KvCache;
use crate::engine::window_blocks::FREED;

/// Where each section of the packed buffer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sections {
    tokens: usize,
    positions: usize,
    slots: usize,
    logit_rows: usize,
    gather: usize,
    /// Within the gather section: the sliding-window pool's slot of each
    /// new row, where the batch has tables there.
    window_slots: Option<usize>,
    end: usize,
}

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

pub struct StepMeta<'a> {
    batch: &'a FlatBatch,
    host: Vec<u32>,
    at: Sections,
    views: Vec<SeqViews>,
    /// `host` on the model's device.
    packed: Tensor,
    masks: Option<Tensor>,
}

impl<'a> StepMeta<'a> {
    /// Packs `batch` for `cache` and uploads it to `device`: one copy, plus
    /// one for the masks if any.
    /// `window`: the model's sliding window, if some layers have one.
    pub fn new(
        batch: &'a FlatBatch,
        cache: &KvCache,
        window: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let block_size = cache.layout().block_size;
        let (host, at, views, masks) = pack(batch, block_size, !cache.on_host(), window);
        let packed = Tensor::new(host.as_slice(), device)?;
        let masks = match masks.len() {
            0 => None,
            n => Some(Tensor::from_vec(masks, n, device)?),
        };
        Ok(StepMeta {
            batch,
            host,
            at,
            views,
            packed,
            masks,
        })
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
        self.at.gather - self.at.logit_rows
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
            (true, Some(at)) => self.view(self.at.gather + at, self.num_tokens()),
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
        self.view(self.at.gather + at, self.batch.seqs[i].context_len())
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

/// The packed `u32` buffer, its sections, and with `views` each sequence's
/// gather slots and the masks of its prompt chunks.
fn pack(
    batch: &FlatBatch,
    block_size: usize,
    views: bool,
    window: Option<usize>,
) -> (Vec<u32>, Sections, Vec<SeqViews>, Vec<f32>) {
    let t = batch.tokens.len();
    let rows = batch.logit_rows();
    let windowed = views && batch.seqs.iter().any(|s| !s.window_table.is_empty());
    let contexts: usize = batch.seqs.iter().map(SeqSlice::context_len).sum();
    let gather_len = match (views, windowed) {
        (false, _) => 0,
        (true, false) => contexts,
        // Each sequence's gathers in both pools, then the window slots.
        (true, true) => 2 * contexts + t,
    };
    let mut at = Sections {
        tokens: 0,
        positions: t,
        slots: 2 * t,
        logit_rows: 3 * t,
        gather: 3 * t + rows.len(),
        window_slots: None,
        end: 3 * t + rows.len() + gather_len,
    };
    let mut host = Vec::with_capacity(at.end);
    host.extend_from_slice(&batch.tokens);
    host.extend_from_slice(&batch.positions);
    for s in &batch.seqs {
        host.extend((s.first_pos..s.context_len()).map(|p| slot(&s.block_table, block_size, p)));
    }
    host.extend_from_slice(&rows);
    let mut masks = Vec::new();
    if !views {
        return (host, at, Vec::new(), masks);
    }
    let mut views = Vec::with_capacity(batch.seqs.len());
    // A position whose window block was freed reads block 0: masked out.
    let window_slot = |s: &SeqSlice, p: usize| match s.table(true)[p / block_size] {
        FREED => 0,
        _ => slot(s.table(true), block_size, p),
    };
    for s in &batch.seqs {
        let gather = host.len() - at.gather;
        host.extend((0..s.context_len()).map(|p| slot(&s.block_table, block_size, p)));
        let window_gather = windowed.then(|| {
            let from = host.len() - at.gather;
            host.extend((0..s.context_len()).map(|p| window_slot(s, p)));
            from
        });
        // Row i sits at position first_pos + i and sees keys from `lowest`
        // to first_pos + i.
        let mut push_mask = |lowest: &dyn Fn(usize) -> usize| {
            let from = masks.len();
            for i in 0..s.len {
                let seen = lowest(s.first_pos + i)..=s.first_pos + i;
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
    if windowed {
        at.window_slots = Some(host.len() - at.gather);
        for s in &batch.seqs {
            host.extend((s.first_pos..s.context_len()).map(|p| window_slot(s, p)));
        }
    }
    debug_assert_eq!(host.len(), at.end);
    (host, at, views, masks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kv_cache::{KvDtype, KvLayout};
    use crate::models::LogitRows;

    /// An 8-block pool of `block_size`-token blocks, on the host or not.
    fn cache(block_size: usize, host: bool) -> KvCache {
        let layout = KvLayout {
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 4,
            block_size,
            num_blocks: 8,
            dtype: KvDtype::F32,
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
        let m = StepMeta::new(&b, &cache(4, false), None, &Device::Cpu).unwrap();
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
        let m = StepMeta::new(&b, &cache(4, false), None, &Device::Cpu).unwrap();
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
        let m = StepMeta::new(&b, &cache(4, false), None, &Device::Cpu).unwrap();
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
        let m = StepMeta::new(&b, &cache(8, false), None, &Device::Cpu).unwrap();
        assert!(m.masks.is_none());
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![4, 12, 20]);
        assert_eq!(m.host.len(), 3 * 3 + 3 + 3 * 5);
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
        let m = StepMeta::new(&b, &cache(4, false), Some(3), &Device::Cpu).unwrap();
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

    #[test]
    fn a_host_pool_gets_no_gather_slots_or_masks() {
        let b = batch();
        let m = StepMeta::new(&b, &cache(4, true), None, &Device::Cpu).unwrap();
        assert_eq!(to_vec(m.slots_t(false).unwrap()), vec![29, 12, 13, 14]);
        assert_eq!(m.host.len(), 3 * 4 + 4);
        assert!(m.masks.is_none() && m.gather_t(0, false).is_err());
    }
}
