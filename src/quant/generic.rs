//! Portable kernel (any CPU); same arithmetic as the SIMD paths. Loops run
//! across the tile's 16 rows so compilers can vectorize them on any target.

use super::formats::{Geometry, Layout, QK_K};
use super::{TileJob, QK, TILE};

/// Activation rows sharing one unpack of each weight block.
const ROWS: usize = 8;

pub(crate) fn tile<L: Layout>(job: &TileJob) {
    if L::SCALES.is_super() {
        return tile_super::<L>(job);
    }
    let geom = Geometry::of::<L>();
    let acts = job.acts;
    let mut w = [[0u8; TILE]; QK];
    let (mut s, mut m) = ([0f32; TILE], [0f32; TILE]);
    for rows in row_blocks(job) {
        let mut acc = [[0f32; TILE]; ROWS];
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            for r in 0..TILE {
                let sub = geom.decode_row(blk, 0, r);
                for (w, &q) in w.iter_mut().zip(&sub.q) {
                    w[r] = q;
                }
                (s[r], m[r]) = (sub.s[0], sub.m[0]);
            }
            for (acc, i) in acc.iter_mut().zip(rows.clone()) {
                let x = &acts.row(i)[b * QK..(b + 1) * QK];
                let [dx, sx] = acts.row_scales(i)[b];
                let isum = dot(&w, x);
                for r in 0..TILE {
                    acc[r] += s[r] * (isum[r] as f32 * dx);
                    acc[r] += m[r] * sx;
                }
            }
        }
        for (acc, i) in acc.iter().zip(rows) {
            job.out.write(i, acc);
        }
    }
}

/// Super layouts (K-quants) against activations with one scale per 256:
/// per row and block, `Σ sc q x` and `Σ mn Σx` are integers, scaled by
/// `d dx` and `e dx` once.
fn tile_super<L: Layout>(job: &TileJob) {
    let geom = Geometry::of::<L>();
    let acts = job.acts;
    let mut w = [[0u8; TILE]; QK_K];
    let (mut sc, mut mn) = ([[0i32; TILE]; QK_K / 16], [[0i32; TILE]; QK_K / 16]);
    let (mut d, mut e) = ([0f32; TILE], [0f32; TILE]);
    for rows in row_blocks(job) {
        let mut acc = [[0f32; TILE]; ROWS];
        for (b, blk) in job.tile.chunks_exact(L::BLOCK_BYTES).enumerate() {
            for r in 0..TILE {
                let row = geom.super_row(blk, r);
                (d[r], e[r]) = (row.d, row.e);
                for h in 0..QK_K / 16 {
                    (sc[h][r], mn[h][r]) = (row.sc[h] as i32, row.mn[h] as i32);
                }
                for j in 0..L::SUBS {
                    for (w, &q) in w[QK * j..].iter_mut().zip(&geom.quants_row(blk, j, r)) {
                        w[r] = q;
                    }
                }
            }
            for (acc, i) in acc.iter_mut().zip(rows.clone()) {
                let x = &acts.row(i)[b * QK_K..(b + 1) * QK_K];
                let xs = &acts.row_supers(i)[b];
                let (mut idot, mut imin) = ([0i32; TILE], [0i32; TILE]);
                for h in 0..QK_K / 16 {
                    let isum = dot(&w[16 * h..16 * (h + 1)], &x[16 * h..16 * (h + 1)]);
                    for r in 0..TILE {
                        idot[r] += sc[h][r] * isum[r];
                        imin[r] += mn[h][r] * xs.sums16[h] as i32;
                    }
                }
                for r in 0..TILE {
                    acc[r] += d[r] * (idot[r] as f32 * xs.d);
                    acc[r] += e[r] * (imin[r] as f32 * xs.d);
                }
            }
        }
        for (acc, i) in acc.iter().zip(rows) {
            job.out.write(i, acc);
        }
    }
}

/// The job's activation rows, `ROWS` at a time.
fn row_blocks(job: &TileJob) -> impl Iterator<Item = std::ops::Range<usize>> {
    let end = job.rows.end;
    job.rows
        .clone()
        .step_by(ROWS)
        .map(move |i| i..(i + ROWS).min(end))
}

/// `Σ_t w[t][r] x[t]` for each of the tile's rows.
fn dot(w: &[[u8; TILE]], x: &[i8]) -> [i32; TILE] {
    let mut isum = [0i32; TILE];
    for (w, &x) in w.iter().zip(x) {
        for (s, &w) in isum.iter_mut().zip(w) {
            *s += w as i32 * x as i32;
        }
    }
    isum
}
