//! Images a request carries, from their bytes to the pixel values a
//! vision tower takes: reading those it names by URL where allowed
//! ([`fetch`]), decoding under limits ([`decode`]), Pillow's resampling
//! ([`resize`]) and a model's normalisation ([`preprocess`]).

pub mod decode;
pub mod fetch;
pub mod preprocess;
pub mod resize;
