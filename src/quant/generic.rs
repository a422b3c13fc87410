//! Portable kernel (any CPU); same arithmetic as the SIMD paths. Loops run
//! across the tile's 16 rows so compilers can vectorize them on any target.

use super::{Layout, TileJob, QK, TILE};

/// Activation rows sharing one unpack of each weight block.
const ROWS: usize = 8;

pub(crate) fn tile<L: Layout>(job: &TileJob) {
    let acts = job.acts;
    let mut w = [[0u8; TILE]; QK];
    let (mut d, mut mn) = ([0f32; TILE], [0f32; TILE]);
    let mut start = job.rows.start;
    while start < job.rows.end {
        let rows = start..(start + ROWS).min(job.rows.end);
        let mut acc = [[0f32; TILE]; ROWS];
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            L::unpack(blk, &mut w, &mut d, &mut mn);
            for (acc, i) in acc.iter_mut().zip(rows.clone()) {
                let x = &acts.row(i)[b * QK..(b + 1) * QK];
                let [dx, sx] = acts.row_scales(i)[b];
                let mut isum = [0i32; TILE];
                for (w, &x) in w.iter().zip(x) {
                    for (s, &w) in isum.iter_mut().zip(w) {
                        *s += w as i32 * x as i32;
                    }
                }
                for r in 0..TILE {
                    acc[r] += d[r] * (isum[r] as f32 * dx);
                    acc[r] += mn[r] * sx;
                }
            }
        }
        for (acc, i) in acc.iter().zip(rows.clone()) {
            job.out.write(i, acc);
        }
        start = rows.end;
    }
}
