use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::formats::QK_K;
use super::*;

/// Every code path this CPU can run (Generic always).
fn isas() -> Vec<Isa> {
    #[allow(unused_mut)]
    let mut v = vec![Isa::Generic];
    #[cfg(target_arch = "x86_64")]
    {
        if x86::avx2_supported() {
            v.push(Isa::Avx2);
        }
        if x86::avx512_vnni_supported() {
            v.push(Isa::Avx512Vnni);
        }
    }
    v
}

fn gaussian(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-7), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

/// `m x k` Gaussian activations; with `outliers`, as a transformer's hidden
/// states have them: a few channels ~50x the rest, so most of a block's
/// quants are small and its scale is set by one value.
fn activations(rng: &mut ChaCha8Rng, m: usize, k: usize, outliers: bool) -> Vec<f32> {
    let mut x = gaussian(rng, m * k);
    if outliers {
        for row in x.chunks_exact_mut(k) {
            for c in [3, k / 2 + 7, k - 40] {
                row[c] *= 50.0;
            }
        }
    }
    x
}

/// A SIMD kernel's result against the generic one's: the same integer
/// sums, so only the float rounding of scaling and adding them differs.
fn assert_same_sums(got: &[f32], generic: &[f32], e: &Expected, what: &str) {
    for (o, (&a, &g)) in got.iter().zip(generic).enumerate() {
        let tol = 1e-6 * e.abs[o] + 1e-7;
        assert!(
            ((a - g) as f64).abs() <= tol,
            "{what} vs generic: out[{o}] {a} vs {g}"
        );
    }
}

/// Weights with per-row scale and offset, so Q4_1 minima are far from zero
/// and a dropped min term or scale shows up.
fn weights(rng: &mut ChaCha8Rng, n: usize, k: usize) -> Vec<f32> {
    let mut w = gaussian(rng, n * k);
    for row in w.chunks_exact_mut(k) {
        let (scale, offset) = (
            0.02 + rng.random::<f32>() * 0.1,
            rng.random::<f32>() * 0.1 - 0.05,
        );
        row.iter_mut().for_each(|v| *v = *v * scale + offset);
    }
    w
}

/// candle's dequantization of `qt`, row-major.
fn dequantized(qt: &QTensor) -> Vec<f32> {
    qt.dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// A matrix quantized by candle, its dequantized weights, and our repacking.
fn candle_matrix(
    w: &[f32],
    n: usize,
    k: usize,
    dtype: GgmlDType,
) -> (QTensor, Vec<f32>, QuantMatrix) {
    let t = Tensor::from_slice(w, (n, k), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&t, dtype).unwrap();
    let deq = dequantized(&qt);
    let qm = QuantMatrix::from_qtensor(&qt)
        .unwrap()
        .expect("supported dtype");
    (qt, deq, qm)
}

/// Per output: `bound` is the worst case of activation rounding
/// (Σ_t |w_t| d_b / 2, as |x̃ - x| ≤ d/2 with d = amax/127), `var` its
/// expectation as uniform rounding noise (Σ_t w_t² d_b² / 12), `abs` the
/// scale Σ_t |x_t w_t| for float rounding slack.
struct Expected {
    exact: Vec<f64>,
    bound: Vec<f64>,
    var: Vec<f64>,
    abs: Vec<f64>,
}

/// `bs` is the activations' block: one 8-bit scale per `bs` inputs.
fn expected(x: &[f32], w: &[f32], m: usize, n: usize, k: usize, bs: usize) -> Expected {
    let mut e = Expected {
        exact: vec![0.0; m * n],
        bound: vec![0.0; m * n],
        var: vec![0.0; m * n],
        abs: vec![0.0; m * n],
    };
    for i in 0..m {
        let x = &x[i * k..(i + 1) * k];
        let d: Vec<f64> = x
            .chunks_exact(bs)
            .map(|b| b.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0)
            .collect();
        for j in 0..n {
            let w = &w[j * k..(j + 1) * k];
            let o = i * n + j;
            for t in 0..k {
                let (xv, wv, db) = (x[t] as f64, w[t] as f64, d[t / bs]);
                e.exact[o] += xv * wv;
                e.bound[o] += wv.abs() * db / 2.0;
                e.var[o] += wv * wv * db * db / 12.0;
                e.abs[o] += (xv * wv).abs();
            }
        }
    }
    e
}

/// Mean-square error of results against the exact product, with its
/// expectation under the uniform rounding model.
#[derive(Default)]
struct Noise {
    sq_err: f64,
    sq_expected: f64,
    count: usize,
}

impl Noise {
    /// Asserts the error is no larger than rounding noise. Pooled over many
    /// activation rows: one row's errors are correlated across outputs.
    fn check(&self, what: &str) {
        // The block maxima round exactly, so the real error sits a bit under
        // the model (observed 0.95..1.01); the rest is room for sampling noise.
        assert!(
            self.sq_err <= 1.25 * self.sq_expected,
            "{what}: mean square error {:e} vs expected {:e}",
            self.sq_err / self.count as f64,
            self.sq_expected / self.count as f64
        );
    }
}

/// Checks every element of a result against the exact product within the
/// activation rounding bound, adding its squared error to `noise`.
fn check_against_exact(got: &[f32], e: &Expected, noise: &mut Noise, what: &str) {
    for (o, &g) in got.iter().enumerate() {
        let err = (g as f64 - e.exact[o]).abs();
        let tol = e.bound[o] + 1e-5 * e.abs[o] + 1e-6;
        assert!(
            err <= tol,
            "{what}: out[{o}] = {g}, exact {}, err {err:e} > bound {tol:e}",
            e.exact[o]
        );
        noise.sq_err += err * err;
        noise.sq_expected += e.var[o];
        noise.count += 1;
    }
}

fn run(qm: &QuantMatrix, isa: Isa, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * qm.n()];
    qm.matmul_isa(isa, x, m, &mut out);
    out
}

fn check_format(dtype: GgmlDType, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // n values straddle the 16-row tile; 200 x 1536 with m ≥ 2 takes the
    // parallel path. K-quant blocks span 256 inputs, and so do their
    // activations' scales.
    let bs = dtype.block_size();
    let k_small = if bs == 256 { 512 } else { 576 };
    for (n, k) in [(75, k_small), (200, 1536), (16, k_small), (5, 1536)] {
        let w = weights(&mut rng, n, k);
        let (_, deq, qm) = candle_matrix(&w, n, k, dtype);
        assert_eq!((qm.n(), qm.k()), (n, k));
        let isas = isas();
        let mut noise: Vec<Noise> = isas.iter().map(|_| Noise::default()).collect();
        for (m, outliers) in [1, 2, 3, 5, 16, 33, 64, 1, 5, 64]
            .into_iter()
            .enumerate()
            .map(|(i, m)| (m, i >= 7))
        {
            let x = activations(&mut rng, m, k, outliers);
            let e = expected(&x, &deq, m, n, k, bs);
            let generic = run(&qm, Isa::Generic, &x, m);
            for (&isa, noise) in isas.iter().zip(&mut noise) {
                let got = run(&qm, isa, &x, m);
                let what = format!("{dtype:?} {n}x{k} m={m} outliers={outliers} {isa:?}");
                // A few outliers dominate their rows' error, too few samples
                // for the pooled mean-square check: the bound per output holds.
                let mut apart = Noise::default();
                let noise = if outliers { &mut apart } else { noise };
                check_against_exact(&got, &e, noise, &what);
                // Same integer sums, so only float rounding differs.
                assert_same_sums(&got, &generic, &e, &what);
            }
            let mut auto = vec![0.0; m * n];
            qm.matmul(&x, m, &mut auto);
            let mut generic_pub = vec![0.0; m * n];
            qm.matmul_with(Kernel::Generic, &x, m, &mut generic_pub);
            assert_eq!(auto, run(&qm, Isa::detect(), &x, m));
            assert_eq!(qm.matmul_to_vec(&x, m), auto);
            assert_eq!(generic_pub, generic);
            // Called from a pool thread, smaller calls split too; the split
            // must not change a bit.
            assert_eq!(rayon::scope(|_| run(&qm, Isa::detect(), &x, m)), auto);
        }
        for (isa, noise) in isas.iter().zip(&noise) {
            noise.check(&format!("{dtype:?} {n}x{k} {isa:?}"));
        }
    }
}

#[test]
fn q4_1_matches_dequantized_reference() {
    check_format(GgmlDType::Q4_1, 1);
}

#[test]
fn q4_0_matches_dequantized_reference() {
    check_format(GgmlDType::Q4_0, 6);
}

#[test]
fn q5_0_matches_dequantized_reference() {
    check_format(GgmlDType::Q5_0, 7);
}

#[test]
fn q5_1_matches_dequantized_reference() {
    check_format(GgmlDType::Q5_1, 8);
}

#[test]
fn q2_k_matches_dequantized_reference() {
    check_format(GgmlDType::Q2K, 9);
}

#[test]
fn q3_k_matches_dequantized_reference() {
    check_format(GgmlDType::Q3K, 10);
}

#[test]
fn q4_k_matches_dequantized_reference() {
    check_format(GgmlDType::Q4K, 11);
}

#[test]
fn q5_k_matches_dequantized_reference() {
    check_format(GgmlDType::Q5K, 12);
}

#[test]
fn q6_k_matches_dequantized_reference() {
    check_format(GgmlDType::Q6K, 13);
}

#[test]
fn q8_0_matches_dequantized_reference() {
    check_format(GgmlDType::Q8_0, 2);
}

/// A full M_BLOCK of rows, then a remainder (as a long prefill runs), in
/// every format: each row's sums of a tile kept in one buffer (AVX2), and
/// full 8-row passes (AVX-512), against the generic kernel's.
#[test]
fn more_rows_than_an_m_block() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let m = M_BLOCK + 3;
    for dtype in ALL {
        let (n, k) = (40, 2 * QK_K);
        let w = weights(&mut rng, n, k);
        let (_, deq, qm) = candle_matrix(&w, n, k, dtype);
        let x = activations(&mut rng, m, k, true);
        let e = expected(&x, &deq, m, n, k, dtype.block_size());
        let generic = run(&qm, Isa::Generic, &x, m);
        for isa in isas() {
            let mut noise = Noise::default();
            let what = format!("{dtype:?} m={m} {isa:?}");
            let got = run(&qm, isa, &x, m);
            check_against_exact(&got, &e, &mut noise, &what);
            noise.check(&what);
            assert_same_sums(&got, &generic, &e, &what);
        }
    }
}

/// A matrix on a named kernel runs it; one this CPU lacks is refused.
#[test]
fn kernels_are_chosen_per_matrix() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let (n, k, m) = (33, 512, 3);
    let w = weights(&mut rng, n, k);
    let x = gaussian(&mut rng, m * k);
    for kernel in [Kernel::Auto, Kernel::Generic, Kernel::Avx2, Kernel::Avx512] {
        let (_, _, qm) = candle_matrix(&w, n, k, GgmlDType::Q4K);
        let Ok(isa) = kernel.isa() else {
            assert!(qm.with_kernel(kernel).is_err(), "{kernel:?}");
            continue;
        };
        assert!(isas().contains(&isa), "{kernel:?} -> {isa:?}");
        let want = run(&qm, isa, &x, m);
        let qm = qm.with_kernel(kernel).unwrap();
        assert_eq!(qm.matmul_to_vec(&x, m), want, "{kernel:?}");
    }
    assert_eq!(Kernel::Generic.isa().unwrap(), Isa::Generic);
    assert_eq!(Kernel::Auto.isa().unwrap(), Isa::detect());
}

/// Every format's repacking keeps GGML's values to the bit: layouts and
/// bit planes are exercised by all 16 rows of a tile and every input.
#[test]
fn dequantize_row_is_bit_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (n, k) = (37, 512);
    let w = weights(&mut rng, n, k);
    for dtype in ALL {
        let (_, deq, qm) = candle_matrix(&w, n, k, dtype);
        let mut row = vec![0.0; k];
        for r in 0..n {
            qm.dequantize_row(r, &mut row);
            assert_eq!(row, deq[r * k..(r + 1) * k], "{dtype:?} row {r}");
        }
    }
}

#[test]
fn shared_pages_hold_the_same_weights() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let k = 1024;
    // One matrix per format below a huge page, and one Q8_0 matrix above it,
    // which keeps its own buffer.
    let mut mats: Vec<(GgmlDType, Vec<f32>, QuantMatrix)> = ALL
        .iter()
        .chain([&GgmlDType::Q8_0])
        .enumerate()
        .map(|(i, &dtype)| {
            let n = if i == ALL.len() { 2100 } else { 500 };
            let (_, deq, qm) = candle_matrix(&weights(&mut rng, n, k), n, k, dtype);
            (dtype, deq, qm)
        })
        .collect();
    let x = gaussian(&mut rng, 3 * k);
    let before: Vec<Vec<Vec<f32>>> = mats
        .iter()
        .map(|(_, _, qm)| isas().into_iter().map(|isa| run(qm, isa, &x, 3)).collect())
        .collect();
    let big_buffer = mats.last().unwrap().2.data.clone();

    share_pages(mats.iter_mut().map(|(_, _, qm)| qm));

    let (big, small) = mats.split_last().unwrap();
    assert!(
        Arc::ptr_eq(&big.2.data, &big_buffer),
        "the large matrix moved"
    );
    for ((dtype, deq, qm), before) in small.iter().zip(&before) {
        assert!(
            Arc::ptr_eq(&qm.data, &small[0].2.data),
            "{dtype:?} not shared"
        );
        assert_eq!(
            qm.bytes().as_ptr() as usize % LINE,
            0,
            "{dtype:?} alignment"
        );
        let mut row = vec![0.0; k];
        for r in 0..qm.n() {
            qm.dequantize_row(r, &mut row);
            assert_eq!(row, deq[r * k..(r + 1) * k], "{dtype:?} row {r}");
        }
        for (isa, before) in isas().into_iter().zip(before) {
            assert_eq!(&run(qm, isa, &x, 3), before, "{dtype:?} on {isa:?}");
        }
    }
}

#[test]
fn quantize_q8_0_matches_candle() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (n, k) = (21, 128);
    let w = weights(&mut rng, n, k);
    let (_, deq, _) = candle_matrix(&w, n, k, GgmlDType::Q8_0);
    let ours = QuantMatrix::quantize_q8_0(&w, n, k).unwrap();
    let mut row = vec![0.0; k];
    for r in 0..n {
        ours.dequantize_row(r, &mut row);
        assert_eq!(row, deq[r * k..(r + 1) * k], "row {r}");
    }
    assert!(QuantMatrix::quantize_q8_0(&w, n, k - 1).is_err());
}

const ALL: [GgmlDType; 10] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

#[test]
fn unsupported_dtype_is_none() {
    let t = Tensor::zeros((4, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
    for dtype in [GgmlDType::F16, GgmlDType::Q8K] {
        let qt = QTensor::quantize(&t, dtype).unwrap();
        assert!(
            QuantMatrix::from_qtensor(&qt).unwrap().is_none(),
            "{dtype:?}"
        );
    }
}

/// One tensor of the default model, fetched through the users' code path.
fn real_tensor(name: &str) -> QTensor {
    let path = crate::load::model_fetch::default_model_path().expect("default model");
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    content.tensor(&mut file, name, &Device::Cpu).unwrap()
}

#[test]
fn real_model_q4_1_matches_candle_qmatmul() {
    let qt = real_tensor("blk.0.ffn_gate.weight");
    assert_eq!(qt.dtype(), GgmlDType::Q4_1);
    let (n, k) = qt.shape().dims2().unwrap();
    let qm = QuantMatrix::from_qtensor(&qt).unwrap().unwrap();
    let deq = dequantized(&qt);
    let m = 5;
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let x = gaussian(&mut rng, m * k);
    let xt = Tensor::from_slice(&x, (m, k), &Device::Cpu).unwrap();
    let theirs: Vec<f32> = QMatMul::from_qtensor(qt)
        .unwrap()
        .forward(&xt)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let e = expected(&x, &deq, m, n, k, QK);
    let (mut sq_diff, mut sq_out) = (0.0, 0.0);
    for isa in isas() {
        let ours = run(&qm, isa, &x, m);
        let mut noise = Noise::default();
        check_against_exact(&ours, &e, &mut noise, &format!("real {isa:?}"));
        for (o, (&a, &c)) in ours.iter().zip(&theirs).enumerate() {
            // candle rounds activations to the same 8-bit values but stores
            // their scale and sum as f16 (2^-11 relative).
            let tol = 2f64.powi(-11) * e.abs[o];
            let diff = (a - c).abs() as f64;
            assert!(diff <= tol, "{isa:?} out[{o}]: ours {a}, candle {c}");
            sq_diff += diff * diff;
            sq_out += (c as f64) * (c as f64);
        }
    }
    assert!(
        sq_diff.sqrt() <= 1e-2 * sq_out.sqrt(),
        "relative rms diff {}",
        (sq_diff / sq_out).sqrt()
    );
}

#[test]
fn real_model_q8_0_embedding_rows() {
    let qt = real_tensor("token_embd.weight");
    assert_eq!(qt.dtype(), GgmlDType::Q8_0);
    let qm = QuantMatrix::from_qtensor(&qt).unwrap().unwrap();
    let deq = qt.dequantize(&Device::Cpu).unwrap();
    let mut row = vec![0.0; qm.k()];
    for r in [0, 1, 17, 12345, qm.n() - 1] {
        qm.dequantize_row(r, &mut row);
        let want: Vec<f32> = deq.get(r).unwrap().to_vec1().unwrap();
        assert_eq!(row, want, "row {r}");
    }
}

#[test]
fn activation_quantizers_agree() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut x = gaussian(&mut rng, 16 * QK);
    // Exact halves (ties), zeros, a zero block of each size and a huge value.
    x[3] = 0.5 * x[0].abs().max(1.0);
    x[QK..2 * QK].iter_mut().for_each(|v| *v = 0.0);
    x[2 * QK + 5] = 1e30;
    x[8 * QK..].iter_mut().for_each(|v| *v = 0.0);
    for blocks in [act::ActBlocks::B32, act::ActBlocks::B256] {
        let mut want = QuantActs::default();
        want.quantize(&x, 2, x.len() / 2, blocks, Isa::Generic, false);
        for isa in isas() {
            let mut got = QuantActs::default();
            got.quantize(&x, 2, x.len() / 2, blocks, isa, false);
            assert_eq!(got.qs(), want.qs(), "{isa:?} {blocks:?}");
            assert_eq!(got.scales(), want.scales(), "{isa:?} {blocks:?}");
            assert_eq!(got.supers(), want.supers(), "{isa:?} {blocks:?}");
        }
    }
    // Rows enough to quantize on the pool, with outlier channels.
    let (m, k) = (64, 1536);
    let x = activations(&mut rng, m, k, true);
    for blocks in [act::ActBlocks::B32, act::ActBlocks::B256] {
        let mut want = QuantActs::default();
        want.quantize(&x, m, k, blocks, Isa::Generic, false);
        for isa in isas() {
            let mut got = QuantActs::default();
            got.quantize(&x, m, k, blocks, isa, true);
            assert_eq!(got.qs(), want.qs(), "{isa:?} {blocks:?} on the pool");
            assert_eq!(got.scales(), want.scales(), "{isa:?} {blocks:?}");
            assert_eq!(got.supers(), want.supers(), "{isa:?} {blocks:?}");
        }
    }
}

/// The per-256 scales hold each block's `d` and the sums of its quants per
/// 16 and 32, as the K-quant kernels' minimum terms read them.
#[test]
fn super_activation_sums() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let x = gaussian(&mut rng, 3 * QK_K);
    let mut acts = QuantActs::default();
    acts.quantize(&x, 1, x.len(), act::ActBlocks::B256, Isa::Generic, false);
    for (b, s) in acts.row_supers(0).iter().enumerate() {
        let (x, q) = (&x[b * QK_K..][..QK_K], &acts.row(0)[b * QK_K..][..QK_K]);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(s.d, amax / 127.0);
        assert!(q.iter().any(|&q| q.abs() == 127));
        for (i, &t) in x.iter().enumerate() {
            assert!((q[i] as f32 * s.d - t).abs() <= s.d / 2.0 * 1.0001);
        }
        for h in 0..QK_K / 16 {
            let sum: i32 = q[16 * h..16 * (h + 1)].iter().map(|&q| q as i32).sum();
            assert_eq!(s.sums16[h] as i32, sum);
            assert_eq!(
                s.sums32[h / 2] as i32,
                if h % 2 == 0 {
                    sum + s.sums16[h + 1] as i32
                } else {
                    s.sums16[h - 1] as i32 + sum
                }
            );
        }
        let p = super_scales::SuperScales::pair(&s.sums16, 3);
        assert_eq!((p as i16, (p >> 16) as i16), (s.sums16[6], s.sums16[7]));
    }
}

/// A stack of experts repacked from one 3-D tensor, and grouped products
/// over them (several rows for one expert, one row, none), on every code
/// path here: each job equals that expert's own matmul to the bit, and the
/// exact product within the activations' rounding.
#[test]
fn grouped_expert_products_match_each_expert_alone() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for dtype in [
        GgmlDType::Q4K,
        GgmlDType::Q8_0,
        GgmlDType::Q4_1,
        GgmlDType::Q6K,
    ] {
        let (experts, n, k) = (5, 40, 512);
        let w = weights(&mut rng, experts * n, k);
        let (qt, deq, _) = candle_matrix(&w, experts * n, k, dtype);
        let data = qt.data().unwrap();
        let stacked = QTensor::new(
            QStorage::from_data(data.clone(), &Device::Cpu, dtype).unwrap(),
            (experts, n, k),
        )
        .unwrap();
        let stack = QuantMatrix::stack_from_qtensor(&stacked).unwrap().unwrap();
        let rows = [7, 0, 1, 3, 300];
        let xs: Vec<Vec<f32>> = rows
            .iter()
            .map(|&m| activations(&mut rng, m, k, false))
            .collect();
        for isa in isas() {
            let stack: Vec<QuantMatrix> = stack
                .iter()
                .map(|m| QuantMatrix {
                    isa,
                    data: m.data.clone(),
                    ..*m
                })
                .collect();
            let alone: Vec<Vec<f32>> = stack
                .iter()
                .zip(&xs)
                .zip(rows)
                .map(|((m, x), r)| run(m, isa, x, r))
                .collect();
            for in_pool in [false, true] {
                let mut outs: Vec<Vec<f32>> = rows.iter().map(|&m| vec![f32::NAN; m * n]).collect();
                let mut jobs: Vec<GroupedJob> = stack
                    .iter()
                    .zip(&xs)
                    .zip(outs.iter_mut())
                    .map(|((matrix, x), out)| GroupedJob { matrix, x, out })
                    .collect();
                match in_pool {
                    true => rayon::scope(|_| matmul_grouped(&mut jobs)),
                    false => matmul_grouped(&mut jobs),
                }
                assert_eq!(outs, alone, "{dtype:?} {isa:?} in_pool={in_pool}");
            }
            for (e, (x, &m)) in xs.iter().zip(&rows).enumerate() {
                let w = &deq[e * n * k..][..n * k];
                let exact = expected(x, w, m, n, k, dtype.block_size());
                let what = format!("{dtype:?} {isa:?} expert {e}");
                check_against_exact(&alone[e], &exact, &mut Noise::default(), &what);
            }
        }
    }
}

/// MXFP4 experts arrive as Q8_0 blocks of doubled E2M1 values under
/// power-of-two scales ([`mxfp4::gguf_to_q8_0`]): held as their 4-bit codes
/// and exponent bytes, on every code path they give the product of the
/// blocks' exact values, as candle reads them, within activation rounding;
/// dequantized, those values exactly. Some exponents are small enough that
/// the f16 scale is subnormal or 0.
#[test]
fn mxfp4_blocks_are_held_as_codes_and_multiply_exactly() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for (n, k) in [(75, 576), (200, 1536)] {
        let raw: Vec<u8> = (0..n * k / 32)
            .flat_map(|_| {
                let e = match rng.random_bool(0.1) {
                    true => rng.random_range(100..108u8),
                    false => rng.random_range(118..124u8),
                };
                let mut b = vec![e];
                b.extend((0..16).map(|_| rng.random::<u8>()));
                b
            })
            .collect();
        let qt = mxfp4::q8_0_tensor((n, k).into(), &Device::Cpu, |out| {
            mxfp4::gguf_to_q8_0(&raw, out)
        })
        .unwrap();
        // One scale off a power of two, and the matrix is Q8_0 again.
        let mut off = qt.data().unwrap().into_owned();
        off[34 * (n * k / 64)..][..2].copy_from_slice(&f16::from_f32(3.0 / 1024.0).to_le_bytes());
        assert_eq!(Format::Q8_0.narrowest(&off), Format::Q8_0);
        let qm = QuantMatrix::from_qtensor(&qt).unwrap().unwrap();
        assert_eq!(qm.format, Format::Mxfp4);
        let deq = dequantized(&qt);
        let mut row = vec![0f32; k];
        for r in [0, n / 2, n - 1] {
            qm.dequantize_row(r, &mut row);
            assert_eq!(row, deq[r * k..(r + 1) * k], "row {r}");
        }
        for m in [1, 3, 16, 33] {
            let x = activations(&mut rng, m, k, false);
            let e = expected(&x, &deq, m, n, k, QK);
            let generic = run(&qm, Isa::Generic, &x, m);
            for isa in isas() {
                let got = run(&qm, isa, &x, m);
                let what = format!("MXFP4 {n}x{k} m={m} {isa:?}");
                check_against_exact(&got, &e, &mut Noise::default(), &what);
                assert_same_sums(&got, &generic, &e, &what);
            }
        }
    }
    // A Q8_0 matrix of ordinary weights keeps its 8-bit layout.
    let w = weights(&mut rng, 16, 64);
    let (_, _, qm) = candle_matrix(&w, 16, 64, GgmlDType::Q8_0);
    assert_eq!(qm.format, Format::Q8_0);
}
