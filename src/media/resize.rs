//! Pillow's resampling (`Image.resize`), reproduced to the bit, because
//! the HF image processors a model was trained with resize through it and
//! a vision tower's output moves with every 8-bit level of its input.
//!
//! The method (Pillow's `Resample.c`): each axis is resampled on its own,
//! horizontally first, by a convolution whose filter widens by the scale
//! factor when shrinking (antialiasing). Each output pixel's weights are
//! normalised to sum to one, then fixed to 22 fractional bits; a pass sums
//! in `i32` from one half and rounds its result to 8 bits, so the
//! vertical pass reads the horizontal pass's rounded pixels.

use image::RgbImage;

/// Pillow's resampling filters (`Image.Resampling`), as the image
/// processors name them by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Bilinear,
    Bicubic,
    Lanczos,
}

impl Filter {
    /// A `resample` number of `preprocessor_config.json` (PIL's enum).
    pub fn from_pil(n: u64) -> Option<Filter> {
        match n {
            1 => Some(Filter::Lanczos),
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let sinc = |x: f64| match x {
            0.0 => 1.0,
            _ => (std::f64::consts::PI * x).sin() / (std::f64::consts::PI * x),
        };
        match self {
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
            Filter::Bicubic => {
                let (a, x) = (-0.5, x.abs());
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
            Filter::Lanczos if (-3.0..3.0).contains(&x) => sinc(x) * sinc(x / 3.0),
            Filter::Lanczos => 0.0,
        }
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// One output pixel's source span along an axis and its fixed-point
/// weights.
struct Taps {
    first: usize,
    weights: Vec<i32>,
}

/// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc` for resizing
/// `input` pixels to `output` along one axis.
fn taps(input: usize, output: usize, filter: Filter) -> Vec<Taps> {
    let scale = input as f64 / output as f64;
    let widen = scale.max(1.0);
    let support = filter.support() * widen;
    (0..output)
        .map(|i| {
            let center = (i as f64 + 0.5) * scale;
            // `as` truncates toward zero, as C's cast does.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let raw: Vec<f64> = (first..end)
                .map(|x| filter.weight((x as f64 - center + 0.5) / widen))
                .collect();
            let sum: f64 = raw.iter().sum();
            let one = f64::from(1u32 << PRECISION_BITS);
            let weights = raw
                .iter()
                .map(|&w| {
                    let w = if sum != 0.0 { w / sum } else { w };
                    match w < 0.0 {
                        true => (-0.5 + w * one) as i32,
                        false => (0.5 + w * one) as i32,
                    }
                })
                .collect();
            Taps { first, weights }
        })
        .collect()
}

/// A weighted sum of 8-bit samples, rounded back to 8 bits.
fn round8(samples: impl Iterator<Item = (u8, i32)>) -> u8 {
    let sum = samples.fold(1i32 << (PRECISION_BITS - 1), |acc, (v, w)| {
        acc.wrapping_add(i32::from(v).wrapping_mul(w))
    });
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `image` resized to `width` x `height` as Pillow's
/// `Image.resize((width, height), filter)` resizes it. Pillow 13 runs the
/// vertical pass first when the height shrinks by more than twice what
/// the width does (earlier releases always went across first; the two
/// orders round differently).
pub fn resize(image: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    let (in_w, in_h) = image.dimensions();
    let across = taps(in_w as usize, width as usize, filter);
    let down = taps(in_h as usize, height as usize, filter);
    let shrink = |from: u32, to: u32| i64::from(from) - i64::from(to);
    let vertical_first = shrink(in_h, height) > 0 && shrink(in_h, height) > shrink(in_w, width) * 2;
    let (need_across, need_down) = (in_w != width, in_h != height);
    if vertical_first {
        let rows = match need_down {
            true => vertical(image, &down, 0),
            false => image.clone(),
        };
        return match need_across {
            true => horizontal(&rows, &across, 0..rows.height() as usize),
            false => rows,
        };
    }
    if !need_across {
        return match need_down {
            true => vertical(image, &down, 0),
            false => image.clone(),
        };
    }
    // Only the source rows the vertical pass reads are resampled across.
    let top = down.first().map_or(0, |t| t.first);
    let bottom = down.last().map_or(0, |t| t.first + t.weights.len());
    let rows = horizontal(image, &across, top..bottom);
    match need_down {
        true => vertical(&rows, &down, top),
        false => rows,
    }
}

/// The `rows` of `image`, each resampled to `taps.len()` pixels.
fn horizontal(image: &RgbImage, taps: &[Taps], rows: std::ops::Range<usize>) -> RgbImage {
    let stride = image.width() as usize * 3;
    let (w, h) = (taps.len(), rows.len());
    let src = image.as_raw();
    let mut out = vec![0u8; w * 3 * h];
    for (row, y) in out.chunks_exact_mut(w * 3).zip(rows) {
        let line = &src[y * stride..][..stride];
        for (x, t) in taps.iter().enumerate() {
            for c in 0..3 {
                row[x * 3 + c] = round8(
                    t.weights
                        .iter()
                        .enumerate()
                        .map(|(i, &k)| (line[(t.first + i) * 3 + c], k)),
                );
            }
        }
    }
    RgbImage::from_raw(w as u32, h as u32, out).expect("the buffer is sized for its image")
}

/// `image` resampled to `taps.len()` rows; `shift` is the source row
/// `image`'s first row was (the taps count from the source's).
fn vertical(image: &RgbImage, taps: &[Taps], shift: usize) -> RgbImage {
    let stride = image.width() as usize * 3;
    let src = image.as_raw();
    let mut out = vec![0u8; stride * taps.len()];
    for (row, t) in out.chunks_exact_mut(stride).zip(taps) {
        for (i, value) in row.iter_mut().enumerate() {
            *value = round8(
                t.weights
                    .iter()
                    .enumerate()
                    .map(|(j, &k)| (src[(t.first - shift + j) * stride + i], k)),
            );
        }
    }
    RgbImage::from_raw(image.width(), taps.len() as u32, out)
        .expect("the buffer is sized for its image")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pillow's weights for halving 4 pixels to 2 with its bilinear
    /// filter: the triangle widened to cover two pixels each side.
    #[test]
    fn halving_weighs_as_pillow_does() {
        let t = taps(4, 2, Filter::Bilinear);
        assert_eq!((t[0].first, t[1].first), (0, 1));
        let one = 1i32 << PRECISION_BITS;
        // Centre 1.0, support 2: pixels 0..3 at distances .5, .5, 1.5
        // (scaled by 1/2: .25, .25, .75) weigh 3, 3, 1 (of 7).
        let fixed = |w: &[f64]| -> Vec<i32> {
            w.iter()
                .map(|w| (0.5 + w / 7.0 * f64::from(one)) as i32)
                .collect()
        };
        assert_eq!(t[0].weights, fixed(&[3.0, 3.0, 1.0]));
        // Centre 3.0: pixels 1..4, the image's edge cutting the span.
        assert_eq!(t[1].weights, fixed(&[1.0, 3.0, 3.0]));
    }

    /// An image resized to its own size is itself, and a flat colour stays
    /// flat whatever the filter's overshoot.
    #[test]
    fn identity_and_flat_colour() {
        let image = RgbImage::from_fn(7, 5, |x, y| image::Rgb([x as u8 * 30, y as u8 * 40, 9]));
        assert_eq!(resize(&image, 7, 5, Filter::Bicubic), image);
        let flat = RgbImage::from_pixel(13, 11, image::Rgb([200, 3, 77]));
        for filter in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
            for (w, h) in [(5, 4), (30, 20), (13, 3)] {
                let out = resize(&flat, w, h, filter);
                assert!(
                    out.pixels().all(|p| p.0 == [200, 3, 77]),
                    "{filter:?} {w}x{h}"
                );
            }
        }
    }
}
