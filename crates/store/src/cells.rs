//! A tab's rows as adapter-neutral values: what a copy between stores moves (O3).

/// One value of a row, whatever the adapter keeps it as (a boolean is 0/1 in SQLite).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
}

/// A value as a row's checksum reads it, borrowed where the adapter holds it (a flag is the
/// integer it is stored as): what `transfer::RowHash` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellRef<'a> {
    Null,
    Int(i64),
    Text(&'a str),
}

impl Cell {
    pub fn as_ref(&self) -> CellRef<'_> {
        match self {
            Cell::Null => CellRef::Null,
            Cell::Int(i) => CellRef::Int(*i),
            Cell::Bool(b) => CellRef::Int(i64::from(*b)),
            Cell::Text(t) => CellRef::Text(t),
        }
    }
}

/// Rows of one tab, each in [`crate::transfer::columns`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub tab: &'static str,
    pub rows: Vec<Vec<Cell>>,
}

/// E14/O3: what a restore or a copy hands the adapter: batches, then `End` once every row
/// came. A channel that closes without `End` is an export that stopped: a restore commits
/// nothing, a copy fails with [`COPY_INCOMPLETE`] and keeps its target marked unfinished.
#[derive(Debug)]
pub enum Incoming {
    Rows(Batch),
    End,
}

/// What a store taking a copy's rows says when they stop before `End`.
pub(crate) const COPY_INCOMPLETE: &str =
    "the rows to copy stopped before their end; the target stays marked unfinished";
