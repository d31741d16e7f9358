//! The Google Sheets adapter (DESIGN §2 `sheets`, P8): the users' own spreadsheet as the store.
//! The rules of what to read and write live in `pcmail_core::sheet`; here is the HTTP.

pub mod auth;
pub mod client;
pub mod render;
mod store;
pub mod wire;

pub use store::{SheetsStore, working_copy};

#[cfg(test)]
use auth as jwt;
#[cfg(test)]
#[path = "../../tests/standin/sheets.rs"]
pub(crate) mod standin;
