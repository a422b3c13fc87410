//! Portable kernel (any CPU); same arithmetic as the SIMD paths. Loops run
//! across the tile's 16 rows so compilers can vectorize them on any target.

use super::formats::{Geometry, Layout};
use super::{TileJob, QK, TILE};

/// Activation rows sharing one unpack of each weight block.
const ROWS: usize = 8;

pub(crate) fn tile<L: Layout>(job: &TileJob) {
    let geom = Geometry::of::<L>();
    let acts = job.acts;
    let mut w = [[0u8; TILE]; QK];
    let (mut s, mut m) = ([[0f32; TILE]; 2], [[0f32; TILE]; 2]);
    let mut start = job.rows.start;
    while start < job.rows.end {
        let rows = start..(start + ROWS).min(job.rows.end);
        let mut acc = [[0f32; TILE]; ROWS];
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            for j in 0..L::SUBS {
                for r in 0..TILE {
                    let sub = geom.decode_row(blk, j, r);
                    for (w, &q) in w.iter_mut().zip(&sub.q) {
                        w[r] = q;
                    }
                    for h in 0..2 {
                        (s[h][r], m[h][r]) = (sub.s[h], sub.m[h]);
                    }
                }
                let ab = b * L::SUBS + j;
                for (acc, i) in acc.iter_mut().zip(rows.clone()) {
                    let x = &acts.row(i)[ab * QK..(ab + 1) * QK];
                    let [dx, sx, sx_lo] = acts.row_scales(i)[ab];
                    let mut isum = [[0i32; TILE]; 2];
                    for (t, (w, &x)) in w.iter().zip(x).enumerate() {
                        for (s, &w) in isum[t / 16].iter_mut().zip(w) {
                            *s += w as i32 * x as i32;
                        }
                    }
                    for r in 0..TILE {
                        if L::HALVES {
                            acc[r] += s[0][r] * (isum[0][r] as f32 * dx);
                            acc[r] += s[1][r] * (isum[1][r] as f32 * dx);
                            acc[r] += m[0][r] * sx_lo;
                            acc[r] += m[1][r] * (sx - sx_lo);
                        } else {
                            acc[r] += s[0][r] * ((isum[0][r] + isum[1][r]) as f32 * dx);
                            acc[r] += m[0][r] * sx;
                        }
                    }
                }
            }
        }
        for (acc, i) in acc.iter().zip(rows.clone()) {
            job.out.write(i, acc);
        }
        start = rows.end;
    }
}
