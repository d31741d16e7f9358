//! The spreadsheet as a store (DESIGN §2 `sheets`, P8; seed 000's traps, seed 001 §6, §8, §10):
//! how cells compare, where a tab's columns are, and what one sync cycle reads and writes.
//! Pure: the adapter in pcmail-store does the HTTP.

pub mod cell;
pub mod layout;
pub mod plan;
