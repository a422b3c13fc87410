//! Image bytes to RGB pixels, refusing what would cost more than the
//! limits allow before decoding it: the header's size is checked first,
//! so a small file claiming billions of pixels (a decompression bomb)
//! never allocates them.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, RgbImage};

/// What one image may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Encoded bytes.
    pub max_bytes: usize,
    /// Width times height, as the header states it.
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    /// 8 MiB of file (the request body's own bound) and 16.7 megapixels
    /// (4096 x 4096: 48 MiB as RGB).
    fn default() -> Self {
        ImageLimits {
            max_bytes: 8 << 20,
            max_pixels: 4096 * 4096,
        }
    }
}

/// Why an image was refused; each reads as a client error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the image is {bytes} bytes, over the limit of {limit}")]
    TooManyBytes { bytes: usize, limit: usize },
    #[error("the image is {width} x {height} pixels, over the limit of {limit} pixels")]
    TooManyPixels { width: u32, height: u32, limit: u64 },
    #[error("the data is not an image in a supported format (PNG, JPEG, WebP or GIF)")]
    NotAnImage,
    #[error("the image cannot be decoded: {0}")]
    Corrupt(String),
}

/// Decodes PNG, JPEG, WebP or GIF (its first frame) to RGB, turned
/// upright by its EXIF orientation, as transformers' `load_image` does
/// (`exif_transpose`, then `convert("RGB")`: alpha is dropped, grey is
/// repeated in each channel).
pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage, ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            bytes: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Corrupt(e.to_string()))?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => {}
        _ => return Err(ImageError::NotAnImage),
    }
    let corrupt = |e: image::ImageError| ImageError::Corrupt(e.to_string());
    let mut decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            limit: limits.max_pixels,
        });
    }
    if width == 0 || height == 0 {
        return Err(ImageError::Corrupt(format!(
            "it is {width} x {height} pixels"
        )));
    }
    let orientation = decoder.orientation().map_err(corrupt)?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(corrupt)?;
    image.apply_orientation(orientation);
    Ok(image.into_rgb8())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Rgba};

    fn png(image: &DynamicImage) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        image.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn alpha_is_dropped_and_grey_repeated() {
        let rgba = ImageBuffer::from_fn(3, 2, |x, y| Rgba([x as u8, y as u8, 7, 0]));
        let rgb = decode(
            &png(&DynamicImage::ImageRgba8(rgba)),
            &ImageLimits::default(),
        )
        .unwrap();
        assert_eq!(rgb.dimensions(), (3, 2));
        assert_eq!(rgb.get_pixel(2, 1).0, [2, 1, 7]);
        let grey = image::GrayImage::from_fn(2, 2, |x, _| image::Luma([40 + x as u8]));
        let rgb = decode(
            &png(&DynamicImage::ImageLuma8(grey)),
            &ImageLimits::default(),
        )
        .unwrap();
        assert_eq!(rgb.get_pixel(1, 0).0, [41, 41, 41]);
    }

    #[test]
    fn limits_are_checked_before_decoding() {
        let bytes = png(&DynamicImage::new_rgb8(40, 30));
        let limits = ImageLimits {
            max_bytes: bytes.len() - 1,
            max_pixels: 1200,
        };
        assert_eq!(
            decode(&bytes, &limits),
            Err(ImageError::TooManyBytes {
                bytes: bytes.len(),
                limit: bytes.len() - 1
            })
        );
        let limits = ImageLimits {
            max_bytes: bytes.len(),
            max_pixels: 1199,
        };
        assert_eq!(
            decode(&bytes, &limits),
            Err(ImageError::TooManyPixels {
                width: 40,
                height: 30,
                limit: 1199
            })
        );
        assert!(decode(
            &bytes,
            &ImageLimits {
                max_pixels: 1200,
                ..limits
            }
        )
        .is_ok());
    }

    #[test]
    fn other_data_is_not_an_image() {
        for data in [&b"hello, world"[..], b"", b"%PDF-1.7\n"] {
            assert_eq!(
                decode(data, &ImageLimits::default()),
                Err(ImageError::NotAnImage)
            );
        }
        let bytes = png(&DynamicImage::new_rgb8(40, 30));
        assert!(matches!(
            decode(&bytes[..bytes.len() / 2], &ImageLimits::default()),
            Err(ImageError::Corrupt(_))
        ));
    }
}
