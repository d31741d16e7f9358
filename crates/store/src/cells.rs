//! A tab's rows as adapter-neutral values: what a copy between stores moves (O3).

/// One value of a row, whatever the adapter keeps it as (a boolean is 0/1 in SQLite).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
}

/// Rows of one tab, each in [`crate::transfer::columns`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub tab: &'static str,
    pub rows: Vec<Vec<Cell>>,
}

/// E14: what a restore that replaces a store's rows hands the adapter: batches, then `End` once
/// every row came. A channel that closes without `End` is an export that stopped: nothing is
/// committed.
#[derive(Debug)]
pub enum Incoming {
    Rows(Batch),
    End,
}
