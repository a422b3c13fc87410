//! Dense matrices multiplied in bf16 with f32 sums on Intel AMX's tiles
//! ([`super::amx`]): a vision tower's linear layers and attention, where
//! f32 products on the CPU's vector units were most of an image's time.
//! bf16 is what transformers and vLLM run such a tower in (Gemma 3 is
//! published in bf16, so its weights lose nothing).
//!
//! Layout: a matrix `W` (`[n, k]`, `y = x Wᵀ`) is packed once into B tiles
//! of 16 columns by 32 inputs (1 KiB): row `r` of a tile holds, for each
//! of its 16 columns, the pair of inputs `2r` and `2r + 1`. A column
//! tile's `k / 32` tiles are consecutive, so a product streams them in
//! order. Activations ([`Bf16Rows`]) are rows of bf16, which an A tile
//! loads 16 rows at a time at the row stride. Columns are padded to
//! whole column tiles (16), inputs and rows to 32, all with zeros.

use std::ops::Range;

use rayon::prelude::*;

use crate::vec_math::fast_exp;

#[cfg(target_arch = "x86_64")]
use super::amx;

/// Inputs per tile step (one 64-byte row of an A tile).
const K_STEP: usize = 32;
/// Columns of a B tile.
const TILE_COLS: usize = 16;
/// bf16 values in one tile.
const TILE_LEN: usize = 16 * K_STEP;
/// Rows and columns of one kernel call's block of the output.
pub(crate) const BLOCK: usize = 32;
/// Bytes of activation rows one thread's task keeps in L2 while it sweeps
/// every column of the matrix past them.
const TASK_BYTES: usize = 1 << 20;

/// Whether this CPU can run the products here (AMX with bf16, granted to
/// this process).
pub fn tiles_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::supported()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x` rounded to the nearest bf16 (ties to even), NaN kept a NaN.
#[inline]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        0x7fc0
    } else {
        rounded
    }
}

/// Rows of activations in bf16, `[rows padded to 32, k padded to 32]`.
pub struct Bf16Rows {
    data: Vec<u16>,
    rows: usize,
    kp: usize,
}

impl Bf16Rows {
    /// `rows` rows of zeros, `k` wide.
    pub fn zeros(rows: usize, k: usize) -> Self {
        let kp = k.div_ceil(K_STEP) * K_STEP;
        let rows = rows.div_ceil(BLOCK) * BLOCK;
        Bf16Rows {
            data: vec![0; rows * kp],
            rows,
            kp,
        }
    }

    /// `x` (`[rows, k]` f32), rounded.
    pub fn new(x: &[f32], rows: usize, k: usize) -> Self {
        let mut a = Self::zeros(rows, k);
        a.data
            .par_chunks_mut(a.kp * BLOCK)
            .zip(x.par_chunks(k * BLOCK))
            .for_each(|(dst, src)| {
                for (d, s) in dst.chunks_exact_mut(a.kp).zip(src.chunks_exact(k)) {
                    set_row(d, s);
                }
            });
        a
    }

    /// Sets row `i` to `exp((v - max) * scale)` of each of `values` (at
    /// most the row's width), rounded; the rest of the row keeps its
    /// zeros. Returns the sum of the exponentials before rounding:
    /// attention's probabilities, one pass over the scores.
    pub fn set_row_exp(&mut self, i: usize, values: &[f32], max: f32, scale: f32) -> f32 {
        const LANES: usize = 16;
        let row = &mut self.data[i * self.kp..(i + 1) * self.kp];
        let mut acc = [0f32; LANES];
        let chunks = values.chunks_exact(LANES);
        let rest = chunks.remainder();
        for (src, dst) in chunks.zip(row.chunks_exact_mut(LANES)) {
            for ((a, d), &v) in acc.iter_mut().zip(dst).zip(src) {
                let e = fast_exp((v - max) * scale);
                *a += e;
                *d = bf16_bits(e);
            }
        }
        let at = values.len() - rest.len();
        let mut sum: f32 = acc.iter().sum();
        for (d, &v) in row[at..].iter_mut().zip(rest) {
            let e = fast_exp((v - max) * scale);
            sum += e;
            *d = bf16_bits(e);
        }
        sum
    }
}

fn set_row(dst: &mut [u16], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_bits(s);
    }
}

/// A `[n, k]` matrix in bf16 B tiles (the module's layout).
pub struct Bf16Matrix {
    n: usize,
    k: usize,
    /// Columns padded to a whole tile.
    np: usize,
    /// Tile steps along the inputs.
    kb: usize,
    tiles: Vec<u16>,
}

impl Bf16Matrix {
    /// `w` (`[n, k]` f32, row-major) packed, where [`tiles_available`].
    pub fn new(w: &[f32], n: usize, k: usize) -> Option<Self> {
        tiles_available().then(|| Self::pack(n, k, |col, i| w[col * k + i]))
    }

    /// The matrix whose column `c` is column `c` of `w` (`[k, n]`,
    /// row-major: attention's values, each key an input), where
    /// [`tiles_available`].
    pub fn from_transposed(w: &[f32], k: usize, n: usize) -> Option<Self> {
        tiles_available().then(|| Self::pack(n, k, |col, i| w[i * n + col]))
    }

    /// Packs the matrix whose entry at output `col`, input `i` is
    /// `at(col, i)`.
    fn pack(n: usize, k: usize, at: impl Fn(usize, usize) -> f32 + Sync) -> Self {
        let np = n.div_ceil(TILE_COLS) * TILE_COLS;
        let kb = k.div_ceil(K_STEP);
        let mut tiles = vec![0u16; np / TILE_COLS * kb * TILE_LEN];
        tiles
            .par_chunks_mut(kb * TILE_LEN)
            .enumerate()
            .for_each(|(j, column_tile)| {
                for (p, tile) in column_tile.chunks_exact_mut(TILE_LEN).enumerate() {
                    for c in 0..TILE_COLS {
                        let col = j * TILE_COLS + c;
                        if col >= n {
                            break;
                        }
                        for i in p * K_STEP..((p + 1) * K_STEP).min(k) {
                            let (r, e) = ((i % K_STEP) / 2, i % 2);
                            tile[r * 2 * TILE_COLS + 2 * c + e] = bf16_bits(at(col, i));
                        }
                    }
                }
            });
        Bf16Matrix {
            n,
            k,
            np,
            kb,
            tiles,
        }
    }

    /// Outputs per row.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inputs per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output columns with padding: the row stride of [`Self::product_rows`].
    pub fn padded_n(&self) -> usize {
        self.np
    }

    /// `x Wᵀ` for `x` of `[m, k]` f32, as `[m, n]` f32, over the rayon
    /// pool: each task takes as many rows as fit [`TASK_BYTES`], but no
    /// more than keep every thread busy (a tower run a chunk at a time has
    /// few rows), and sweeps every column past them.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let a = Bf16Rows::new(x, m, self.k);
        let row_bytes = a.kp * 2;
        let per_thread = m.div_ceil(rayon::current_num_threads()).div_ceil(BLOCK) * BLOCK;
        let task_rows =
            ((TASK_BYTES / row_bytes / BLOCK).clamp(1, 8) * BLOCK).min(per_thread.max(BLOCK));
        let mut out = vec![0f32; a.rows * self.np];
        out.par_chunks_mut(task_rows * self.np)
            .enumerate()
            .for_each(|(t, chunk)| {
                let first = t * task_rows;
                self.product_rows(&a, first..first + chunk.len() / self.np, chunk);
            });
        if self.np == self.n {
            out.truncate(m * self.n);
            return out;
        }
        out.chunks_exact(self.np)
            .take(m)
            .flat_map(|row| &row[..self.n])
            .copied()
            .collect()
    }

    /// Rows `rows` (whole blocks) of `a Wᵀ` into `out`, `[rows, padded_n]`
    /// f32, on this thread.
    pub fn product_rows(&self, a: &Bf16Rows, rows: Range<usize>, out: &mut [f32]) {
        assert!(
            a.kp == self.kb * K_STEP
                && rows.start.is_multiple_of(BLOCK)
                && rows.end.is_multiple_of(BLOCK)
                && rows.end <= a.rows
                && out.len() >= rows.len() * self.np,
            "bf16 product: {} x {} rows {rows:?} into {} against {} x {}",
            a.rows,
            a.kp,
            out.len(),
            self.np,
            self.kb * K_STEP
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a matrix exists only where `amx::supported()`. The assert
        // above keeps every block inside its buffers: `a` holds rows
        // `rows` of `kb` steps at stride `kp`; each column tile's `kb`
        // tiles lie inside `tiles` (a pair only where a second exists);
        // `out` holds `rows.len()` rows of `np`. The configuration is
        // released before this returns.
        unsafe {
            amx::configure();
            let column_tile = |j: usize| self.tiles.as_ptr().add(j * self.kb * TILE_LEN);
            let (a_stride, c_stride) = (a.kp * 2, self.np * 4);
            for j in (0..self.np / TILE_COLS).step_by(2) {
                let (b0, pair) = (column_tile(j), j + 1 < self.np / TILE_COLS);
                for i in rows.clone().step_by(BLOCK) {
                    let a = a.data.as_ptr().add(i * a.kp);
                    let c = out
                        .as_mut_ptr()
                        .add((i - rows.start) * self.np + j * TILE_COLS);
                    match pair {
                        true => {
                            let b1 = column_tile(j + 1);
                            amx::block_32x32(a, a_stride, b0, b1, self.kb, c, c_stride)
                        }
                        false => amx::block_32x16(a, a_stride, b0, self.kb, c, c_stride),
                    }
                }
            }
            amx::release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        // A small LCG: signs and magnitudes over a few orders.
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    fn bf16(x: f32) -> f64 {
        half::bf16::from_bits(bf16_bits(x)).to_f64()
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        for x in [1.0f32, -2.5, 1e-3, 2.7182817, 65504.0, f32::INFINITY, 0.0] {
            assert_eq!(bf16_bits(x), half::bf16::from_f32(x).to_bits(), "{x}");
        }
        // Halfway cases: 1 + 2^-8 rounds down to 1, 1 + 3 * 2^-8 up.
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(half::bf16::from_bits(bf16_bits(f32::NAN)).is_nan());
    }

    /// Every entry lands where the layout says, padding zero, for shapes
    /// that are and are not whole tiles (checked on any CPU).
    #[test]
    fn packing_follows_the_tile_layout() {
        for (n, k) in [(5, 7), (32, 32), (48, 70), (33, 96)] {
            let w = values(n * k, 7);
            let m = Bf16Matrix::pack(n, k, |col, i| w[col * k + i]);
            assert_eq!(m.np % TILE_COLS, 0);
            for j in 0..m.np / TILE_COLS {
                for p in 0..m.kb {
                    let tile = &m.tiles[(j * m.kb + p) * TILE_LEN..][..TILE_LEN];
                    for (at, &bits) in tile.iter().enumerate() {
                        let (r, c, e) = (at / 32, (at % 32) / 2, at % 2);
                        let (col, i) = (j * TILE_COLS + c, p * K_STEP + 2 * r + e);
                        let want = if col < n && i < k {
                            bf16_bits(w[col * k + i])
                        } else {
                            0
                        };
                        assert_eq!(bits, want, "{n} x {k}: column {col}, input {i}");
                    }
                }
            }
            // The same matrix given as its transpose packs the same.
            let wt: Vec<f32> = (0..k * n).map(|x| w[(x % n) * k + x / n]).collect();
            let t = Bf16Matrix::pack(n, k, |col, i| wt[i * n + col]);
            assert_eq!(t.tiles, m.tiles, "{n} x {k} from its transpose");
        }
    }

    /// Against f64 sums of the same bf16-rounded inputs, for shapes that
    /// are and are not whole blocks; only where this CPU has the tiles.
    #[test]
    fn products_match_f64_sums_of_the_rounded_inputs() {
        if !tiles_available() {
            eprintln!("no AMX bf16 tiles here: the products are not run");
            return;
        }
        for (m, n, k) in [
            (1, 16, 32),
            (5, 40, 70),
            (64, 64, 64),
            (70, 33, 300),
            (300, 96, 72),
        ] {
            let x = values(m * k, 3);
            let w = values(n * k, 11);
            let wt: Vec<f32> = (0..k * n).map(|x| w[(x % n) * k + x / n]).collect();
            let products = [
                Bf16Matrix::new(&w, n, k).unwrap().matmul(&x, m),
                Bf16Matrix::from_transposed(&wt, k, n)
                    .unwrap()
                    .matmul(&x, m),
            ];
            for got in products {
                assert_eq!(got.len(), m * n);
                for r in 0..m {
                    for c in 0..n {
                        let terms = (0..k).map(|i| bf16(x[r * k + i]) * bf16(w[c * k + i]));
                        let want: f64 = terms.clone().sum();
                        let size: f64 = terms.map(f64::abs).sum();
                        let d = (got[r * n + c] as f64 - want).abs();
                        assert!(
                            d <= 1e-6 * size.max(1.0),
                            "{m} x {n} x {k} [{r}, {c}]: {} vs {want}",
                            got[r * n + c]
                        );
                    }
                }
            }
        }
    }
}
