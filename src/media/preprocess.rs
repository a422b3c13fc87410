//! A model's image processor: an image resized to the vision tower's
//! input, rescaled to [0, 1] and normalised per channel, as the HF image
//! processor in the checkpoint's `preprocessor_config.json` does it.

use anyhow::{bail, Context, Result};
use image::RgbImage;

use super::resize::{resize, Filter};

/// A fixed-size image processor (Gemma 3's, SigLIP's): every image is
/// resized to `width` x `height`, whatever its aspect.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    pub width: u32,
    pub height: u32,
    pub filter: Filter,
    pub rescale: f64,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl ImageProcessor {
    /// From `preprocessor_config.json`. Gemma 3's `do_pan_and_scan`
    /// (crops of wide images as extra images) is refused, not skipped.
    pub fn from_hf(config: &serde_json::Value) -> Result<ImageProcessor> {
        if config["do_pan_and_scan"].as_bool() == Some(true) {
            bail!("do_pan_and_scan is not supported");
        }
        for flag in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
            if config[flag].as_bool() == Some(false) {
                bail!("{flag} = false is not supported");
            }
        }
        let size = &config["size"];
        let side = |key: &str| -> Result<u32> {
            size[key]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .filter(|&v| v > 0)
                .with_context(|| format!("size.{key} must be a positive integer, not {size}"))
        };
        let triple = |key: &str, default: [f32; 3]| -> Result<[f32; 3]> {
            match &config[key] {
                serde_json::Value::Null => Ok(default),
                v => serde_json::from_value(v.clone())
                    .with_context(|| format!("{key} must hold three numbers, not {v}")),
            }
        };
        let resample = config["resample"].as_u64().unwrap_or(2);
        Ok(ImageProcessor {
            width: side("width")?,
            height: side("height")?,
            filter: Filter::from_pil(resample)
                .with_context(|| format!("resample {resample} is not supported"))?,
            rescale: config["rescale_factor"].as_f64().unwrap_or(1.0 / 255.0),
            mean: triple("image_mean", [0.5; 3])?,
            std: triple("image_std", [0.5; 3])?,
        })
    }

    /// The pixel values, channel-major (`[3, height, width]`). As the
    /// processors compute it: the rescale in f64, the normalisation in
    /// f32.
    pub fn pixels(&self, image: &RgbImage) -> Vec<f32> {
        let sized = match image.dimensions() == (self.width, self.height) {
            true => image.clone(),
            false => resize(image, self.width, self.height, self.filter),
        };
        let plane = (self.width * self.height) as usize;
        let mut out = vec![0f32; 3 * plane];
        for (i, p) in sized.pixels().enumerate() {
            for c in 0..3 {
                let v = (f64::from(p.0[c]) * self.rescale) as f32;
                out[c * plane + i] = (v - self.mean[c]) / self.std[c];
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// gemma-3-4b-it's `preprocessor_config.json`, as published.
    #[test]
    fn gemma3s_config() {
        let p = ImageProcessor::from_hf(&json!({
            "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
            "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5],
            "pan_and_scan_max_num_crops": null, "pan_and_scan_min_crop_size": null,
            "pan_and_scan_min_ratio_to_activate": null, "processor_class": "Gemma3Processor",
            "resample": 2, "rescale_factor": 0.00392156862745098,
            "size": {"height": 896, "width": 896}
        }))
        .unwrap();
        assert_eq!((p.width, p.height, p.filter), (896, 896, Filter::Bilinear));
        let white = RgbImage::from_pixel(4, 4, image::Rgb([255, 0, 128]));
        let px = p.pixels(&white);
        assert_eq!(px.len(), 3 * 896 * 896);
        let plane = 896 * 896;
        assert_eq!(
            (px[0], px[plane], px[2 * plane]),
            (1.0, -1.0, 128.0 / 255.0 * 2.0 - 1.0)
        );
    }

    #[test]
    fn unsupported_settings_are_refused() {
        let base = json!({"size": {"height": 8, "width": 8}});
        assert!(ImageProcessor::from_hf(&base).is_ok());
        for (key, value) in [
            ("do_pan_and_scan", json!(true)),
            ("do_normalize", json!(false)),
            ("resample", json!(0)),
            ("size", json!({"shortest_edge": 8})),
            ("image_mean", json!([0.5])),
        ] {
            let mut c = base.clone();
            c[key] = value;
            let e = ImageProcessor::from_hf(&c).unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
        }
    }
}
