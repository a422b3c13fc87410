//! A chat request's images, from their parts to the prompt's media spans:
//! the URLs that are not `data:` URLs fetched before validation, where
//! the operator allows it (`handlers::plan`); then, on the blocking pool with
//! the rest of validation, each image decoded under the limits and made
//! into pixel values as the model's processor makes them, each image
//! marker the template wrote expanded into the model's placeholder
//! tokens, and each run of those tokens in the prompt's ids made a media
//! span keyed by the image's content.

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

use crate::engine::prompt::{MediaSpan, Pixels};
use crate::media::decode::{decode, ImageLimits};
use crate::media::fetch::Fetched;
use crate::models::vision::ImageSpec;
use crate::server::error::ApiError;
use crate::server::protocol::{ChatCompletionRequest, CompletionRequest, MessageContent};

/// An image part of a message: its URL, and the part it came from
/// (`messages[0].content[1]`), which its errors name.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRef {
    pub url: String,
    pub part: String,
}

impl ImageRef {
    /// The field that holds the image.
    pub fn field(&self) -> String {
        format!("{}.image_url", self.part)
    }
}

/// A request's image URLs, every one validation will read, in any order.
pub trait ImageSources {
    fn image_urls(&self) -> Vec<&str>;
}

impl ImageSources for ChatCompletionRequest {
    fn image_urls(&self) -> Vec<&str> {
        let parts = self.messages.iter().filter_map(|m| match &m.content {
            Some(MessageContent::Parts(parts)) => Some(parts),
            _ => None,
        });
        parts
            .flatten()
            .filter_map(|p| p.image_url.as_ref().map(|i| i.url.as_str()))
            .collect()
    }
}

impl ImageSources for CompletionRequest {
    fn image_urls(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// What a request's images may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageBudget {
    /// Images in one request.
    pub max_images: usize,
    /// Each image's bytes and pixels.
    pub each: ImageLimits,
}

impl Default for ImageBudget {
    /// Eight images, as the default of llama.cpp's and vLLM's servers is
    /// a handful; each within [`ImageLimits::default`].
    fn default() -> Self {
        ImageBudget {
            max_images: 8,
            each: ImageLimits::default(),
        }
    }
}

/// The request's images are no more than the budget allows.
pub fn check_count(images: &[ImageRef], budget: &ImageBudget) -> Result<(), ApiError> {
    match images.get(budget.max_images) {
        None => Ok(()),
        Some(extra) => Err(ApiError::bad_request(
            format!(
                "the request has {} images; this server takes at most {} a request",
                images.len(),
                budget.max_images
            ),
            Some(&extra.field()),
        )),
    }
}

/// Decodes and preprocesses each image ([`check_count`] first), from its
/// `data:` URL or what was fetched for it; the first one refused is the
/// request's error, naming its field.
pub fn load(
    images: &[ImageRef],
    spec: &ImageSpec,
    budget: &ImageBudget,
    fetched: &Fetched,
) -> Result<Vec<Pixels>, ApiError> {
    check_count(images, budget)?;
    images
        .iter()
        .map(|image| {
            let refused = |m: String| ApiError::bad_request(m, Some(&image.field()));
            let inline;
            let bytes = match image.url.strip_prefix("data:") {
                Some(rest) => {
                    inline = data_url(rest).map_err(refused)?;
                    &inline
                }
                None => match fetched.get(&image.url) {
                    Some(Ok(bytes)) => bytes,
                    Some(Err(why)) => return Err(refused(why.clone())),
                    None => return Err(refused("the image URL was not fetched".into())),
                },
            };
            let decoded = decode(bytes, &budget.each).map_err(|e| refused(e.to_string()))?;
            let p = &spec.processor;
            Ok(Pixels::new(
                p.pixels(&decoded),
                p.height as usize,
                p.width as usize,
            ))
        })
        .collect()
}

/// Standard base64, its padding optional (clients differ).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The bytes of a base64 `data:` URL of an image type (or of no type),
/// given what follows `data:`.
fn data_url(rest: &str) -> Result<Vec<u8>, String> {
    let Some((meta, data)) = rest.split_once(',') else {
        return Err("the data: URL has no comma before its data".into());
    };
    let mut meta = meta.split(';');
    let media_type = meta.next().unwrap_or_default().trim().to_ascii_lowercase();
    if !media_type.is_empty() && !media_type.starts_with("image/") {
        return Err(format!("the data: URL holds {media_type:?}, not an image"));
    }
    if !meta.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err("the data: URL must be base64 (data:image/png;base64,...)".into());
    }
    let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    BASE64
        .decode(data)
        .map_err(|e| format!("the data: URL's base64 is invalid: {e}"))
}

/// The rendered prompt with each image marker expanded, as the model's
/// processor does; the markers must be as many as the images (a template
/// that drops images, or text that writes a marker itself, is refused).
pub fn expand(
    rendered: &str,
    spec: &ImageSpec,
    images: usize,
    param: &str,
) -> Result<String, ApiError> {
    let markers = rendered.matches(spec.marker.as_str()).count();
    if markers != images {
        return Err(ApiError::bad_request(
            format!(
                "the prompt holds {markers} image markers ({:?}) for {images} images: the chat \
                 template must place every image, and text may not write the marker",
                spec.marker
            ),
            Some(param),
        ));
    }
    Ok(rendered.replace(spec.marker.as_str(), &spec.expansion))
}

/// Each image's run of placeholder tokens in `ids`, as a media span; the
/// runs must be the images' in number and length.
pub fn spans(
    ids: &[u32],
    spec: &ImageSpec,
    pixels: Vec<Pixels>,
    param: &str,
) -> Result<Vec<MediaSpan>, ApiError> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != spec.token {
            i += 1;
            continue;
        }
        let start = i;
        while i < ids.len() && ids[i] == spec.token {
            i += 1;
        }
        runs.push(start..i);
    }
    let whole = runs.iter().all(|r| r.len() == spec.tokens);
    if runs.len() != pixels.len() || !whole {
        return Err(ApiError::bad_request(
            format!(
                "the prompt's image tokens do not match its {} images: text may not hold the \
                 model's image token",
                pixels.len()
            ),
            Some(param),
        ));
    }
    Ok(runs
        .into_iter()
        .zip(pixels)
        .map(|(run, pixels)| MediaSpan {
            start: run.start,
            len: run.len(),
            hash: pixels.content_hash(),
            pixels,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG");
        assert_eq!(
            data_url(&format!("image/png;base64,{b64}")).unwrap(),
            b"\x89PNG"
        );
        // No type, spaces and line breaks in the data, missing padding.
        let wrapped = format!(";base64,{}\n{}", &b64[..4], b64[4..].trim_end_matches('='));
        assert_eq!(data_url(&wrapped).unwrap(), b"\x89PNG");
        for (url, says) in [
            ("text/plain;base64,aGk=", "not an image"),
            ("image/png,rawbytes", "must be base64"),
            ("image/png;base64", "no comma"),
            ("image/png;base64,@@@@", "base64 is invalid"),
        ] {
            let e = data_url(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
