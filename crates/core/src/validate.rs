//! What makes a client's input valid on its own (T5's ranges, T6's names and texts), before
//! anything looks at the store. Request bodies in [`crate::api`] and the inputs of planners that
//! take them ([`crate::mail::SendRequest`], [`crate::ledger::Incoming`]) implement [`Validate`].

use crate::bounds::OutOfRange;
use crate::text::{self, TextError};

/// A request body that is wrong on its own, naming the field (`items[2].task`, `lease`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid { field: field.into(), message: message.into() }
    }
    fn text_error(field: &str, e: TextError) -> Invalid {
        Invalid::new(field, format!("{field} {e}"))
    }
    /// The same problem inside a list: `items[2].task`.
    pub fn within(self, list: &str, index: usize) -> Invalid {
        let field = format!("{list}[{index}].{}", self.field);
        let message = self.message.replacen(&self.field, &field, 1);
        Invalid { field, message }
    }
}

impl From<OutOfRange> for Invalid {
    fn from(e: OutOfRange) -> Invalid {
        Invalid { field: e.field.clone(), message: e.to_string() }
    }
}

/// What a request body must be on its own, before anything looks at the store.
pub trait Validate {
    fn validate(&self) -> Result<(), Invalid>;
}

/// A T6 name (queue, function, project, machine).
pub fn name(field: &str, value: &str) -> Result<(), Invalid> {
    text::check_name(value).map_err(|e| Invalid::text_error(field, e))
}

/// A one-line text of at most `max` characters.
pub fn line(field: &str, value: &str, max: usize) -> Result<(), Invalid> {
    text::check_line(value).map_err(|e| Invalid::text_error(field, e))?;
    let n = value.chars().count();
    if n > max {
        return Err(Invalid::new(field, format!("{field} is {n} characters long, more than the limit of {max}")));
    }
    Ok(())
}

/// A text of any lines (T6: no NUL, no bidirectional override).
pub fn text(field: &str, value: &str) -> Result<(), Invalid> {
    text::check_text(value).map_err(|e| Invalid::text_error(field, e))
}

pub fn opt<T>(value: &Option<T>, check: impl FnOnce(&T) -> Result<(), Invalid>) -> Result<(), Invalid> {
    value.as_ref().map_or(Ok(()), check)
}
