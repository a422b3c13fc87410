//! Images a request carries, from their bytes to the pixel values a
//! vision tower takes: decoding under limits ([`decode`]), Pillow's
//! resampling ([`resize`]) and a model's normalisation ([`preprocess`]).

pub mod decode;
pub mod preprocess;
pub mod resize;
