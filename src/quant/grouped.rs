//! Many independent products in one parallel call: a mixture-of-experts
//! layer's active experts, each over the rows routed to it (llama.cpp's
//! `mul_mat_id`, vLLM's fused MoE on the CPU).
//!
//! A decode step routes one row to each of a few experts, so each product
//! alone is too small to split over the cores without paying a wake-up per
//! expert. Here every product's tiles are cut into chunks, the chunks of all
//! products are listed in order, and the threads split that one list as
//! [`Split`] splits one matrix's tiles: one fan-out per layer, each core
//! streaming a contiguous run of expert weights, and an expert that got no
//! rows costs nothing, since it is not in the list.

use std::ops::Range;

use super::act::{ActBlocks, QuantActs};
use super::{
    fan_out, OutPtr, QuantMatrix, Split, M_BLOCK, PAR_CHUNK_MACS, PAR_MIN_MACS,
    PAR_MIN_MACS_OUTSIDE, TILE,
};

/// One product of a grouped call: `out[m, n] = x[m, k] · Wᵀ`.
pub struct GroupedJob<'a> {
    pub matrix: &'a QuantMatrix,
    /// `m x k` activations, row-major.
    pub x: &'a [f32],
    /// `m x n` outputs, every one written.
    pub out: &'a mut [f32],
}

impl GroupedJob<'_> {
    fn rows(&self) -> usize {
        self.x.len() / self.matrix.k()
    }
}

/// Runs every job's product, the jobs' tiles shared out over rayon's
/// threads together. Each matrix runs on its own kernel
/// ([`QuantMatrix::with_kernel`]).
///
/// Panics if a job's `x` is not whole rows of its matrix's `k`, or its
/// `out` is not those rows times `n`.
pub fn matmul_grouped(jobs: &mut [GroupedJob]) {
    for j in jobs.iter() {
        let (k, n) = (j.matrix.k(), j.matrix.n());
        assert!(
            j.x.len().is_multiple_of(k),
            "grouped matmul: x is not rows of {k}"
        );
        assert_eq!(
            j.out.len(),
            j.rows() * n,
            "grouped matmul: out is not {} x {n}",
            j.rows()
        );
    }
    let macs: usize = jobs
        .iter()
        .map(|j| j.rows() * j.matrix.n() * j.matrix.k())
        .sum();
    let threads = rayon::current_num_threads();
    let in_pool = rayon::current_thread_index().is_some();
    if threads > 1 && !in_pool && macs >= PAR_MIN_MACS_OUTSIDE {
        return rayon::scope(|_| matmul_grouped(jobs));
    }
    let parallel = threads > 1 && in_pool && macs >= PAR_MIN_MACS;
    let acts: Vec<QuantActs> = jobs
        .iter()
        .map(|j| {
            let mut acts = QuantActs::default();
            let blocks = match j.matrix.geom.scales.is_super() {
                true => ActBlocks::B256,
                false => ActBlocks::B32,
            };
            acts.quantize(j.x, j.rows(), j.matrix.k(), blocks, j.matrix.isa, false);
            acts
        })
        .collect();
    // Each job's tiles in chunks of about PAR_CHUNK_MACS, in job order.
    let chunks: Vec<(usize, Range<usize>)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| j.rows() > 0)
        .flat_map(|(i, j)| {
            let (m, tiles) = (j.rows().min(M_BLOCK), j.matrix.n().div_ceil(TILE));
            let chunk = match parallel {
                true => (PAR_CHUNK_MACS / (m * TILE * j.matrix.k())).clamp(1, tiles),
                false => tiles,
            };
            (0..tiles)
                .step_by(chunk)
                .map(move |t| (i, t..(t + chunk).min(tiles)))
        })
        .collect();
    let matrices: Vec<&QuantMatrix> = jobs.iter().map(|j| j.matrix).collect();
    let outs: Vec<OutPtr> = jobs
        .iter_mut()
        .map(|j| OutPtr(j.out.as_mut_ptr()))
        .collect();
    let run = |c: usize| {
        let (i, tiles) = &chunks[c];
        let m = matrices[*i];
        // Chunks of one job are disjoint tiles, so their output columns are
        // too (`OutPtr`'s contract).
        m.run_tiles(m.isa, &acts[*i], tiles.clone(), outs[*i]);
    };
    if parallel {
        let split = Split::new(chunks.len(), threads, 1);
        fan_out(0, threads, &|t| split.run(t, |r| r.for_each(run)));
    } else {
        (0..chunks.len()).for_each(run);
    }
}
