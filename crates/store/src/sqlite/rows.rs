//! How SQLite reads and binds the shared codec's rows and values.

use rusqlite::types::{ToSqlOutput, ValueRef};

use crate::cells::{Cell, CellRef};
use crate::codec::{Columns, Value};
use crate::{Result, StoreError};

impl Columns for rusqlite::Row<'_> {
    fn text(&self, i: usize) -> Result<String> {
        self.get(i).map_err(|e| column_error(i, e))
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>> {
        self.get(i).map_err(|e| column_error(i, e))
    }

    fn int(&self, i: usize) -> Result<i64> {
        self.get(i).map_err(|e| column_error(i, e))
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        self.get(i).map_err(|e| column_error(i, e))
    }

    fn flag(&self, i: usize) -> Result<bool> {
        self.get(i).map_err(|e| column_error(i, e))
    }
}

fn column_error(i: usize, e: rusqlite::Error) -> StoreError {
    StoreError::Corrupt(format!("column {i}: {e}"))
}

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match *self {
            Value::Text(Some(s)) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            Value::Int(Some(i)) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(i)),
            Value::Bool(b) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(i64::from(b))),
            Value::Text(None) | Value::Int(None) => ToSqlOutput::Owned(rusqlite::types::Value::Null),
        })
    }
}

impl rusqlite::ToSql for Cell {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Cell::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Cell::Int(i) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*i)),
            Cell::Bool(b) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(i64::from(*b))),
            Cell::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

/// One value of an exported row.
pub fn cell(value: ValueRef<'_>, tab: &str, column: &str) -> Result<Cell> {
    Ok(match cell_ref(value, tab, column)? {
        CellRef::Null => Cell::Null,
        CellRef::Int(i) => Cell::Int(i),
        CellRef::Text(t) => Cell::Text(t.to_string()),
    })
}

/// One value of a row where SQLite holds it; pcmail never stores reals or blobs.
pub fn cell_ref<'a>(value: ValueRef<'a>, tab: &str, column: &str) -> Result<CellRef<'a>> {
    match value {
        ValueRef::Null => Ok(CellRef::Null),
        ValueRef::Integer(i) => Ok(CellRef::Int(i)),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(CellRef::Text)
            .map_err(|_| StoreError::Corrupt(format!("{tab}.{column} holds text that is not UTF-8"))),
        ValueRef::Real(_) | ValueRef::Blob(_) => {
            Err(StoreError::Corrupt(format!("{tab}.{column} holds a {:?}, not text or an integer", value.data_type())))
        }
    }
}

/// Decodes every row of `stmt` with one of the codec's decoders.
pub fn collect<T>(
    stmt: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
    decode: fn(&dyn Columns) -> Result<T>,
) -> Result<Vec<T>> {
    let mut rows = stmt.query(params).map_err(super::map_err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(super::map_err)? {
        out.push(decode(row)?);
    }
    Ok(out)
}
