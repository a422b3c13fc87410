//! `strftime_now(format)`: transformers' global that templates call for
//! today's date (Llama 3.2, Mistral Small 3.2). The clock is injectable so
//! tests render a fixed day.

use std::fmt::Write;
use std::sync::Arc;

use chrono::format::{Fixed, Item, StrftimeItems};
use chrono::NaiveDateTime;
use minijinja::{Error, ErrorKind};

/// The current time, naive as Python's `datetime.now()`.
pub type Clock = Arc<dyn Fn() -> NaiveDateTime + Send + Sync>;

/// Local wall-clock time, what `datetime.now()` gives transformers.
pub fn local_clock() -> Clock {
    Arc::new(|| chrono::Local::now().naive_local())
}

/// The template function: the clock's time in C-locale `strftime` format.
pub fn strftime_now(clock: Clock) -> impl Fn(&str) -> Result<String, Error> + Send + Sync {
    move |format: &str| {
        let items: Vec<Item> = StrftimeItems::new(format)
            .parse()
            .map_err(|e| unsupported(format, e))?
            .into_iter()
            .map(without_zone)
            .collect();
        let mut out = String::new();
        write!(out, "{}", clock().format_with_items(items.iter()))
            .map_err(|e| unsupported(format, e))?;
        Ok(out)
    }
}

/// A naive time has no zone: Python writes `%z` and `%Z` as nothing, where
/// chrono would fail.
fn without_zone(item: Item<'_>) -> Item<'_> {
    match item {
        Item::Fixed(
            Fixed::TimezoneName
            | Fixed::TimezoneOffset
            | Fixed::TimezoneOffsetColon
            | Fixed::TimezoneOffsetDoubleColon
            | Fixed::TimezoneOffsetTripleColon
            | Fixed::TimezoneOffsetColonZ
            | Fixed::TimezoneOffsetZ,
        ) => Item::Literal(""),
        item => item,
    }
}

fn unsupported(format: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("strftime_now: cannot format {format:?}: {e}"),
    )
}
