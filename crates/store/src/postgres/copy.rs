//! P14: rows into PostgreSQL's binary `COPY` stream, sent in chunks of [`CHUNK`] bytes.
//! tokio-postgres's own writer sends every 4 KiB: a million mails were about 100,000 messages,
//! each a wake of the connection's task and a write to its socket.

use std::future::poll_fn;
use std::pin::Pin;

use bytes::{BufMut, Bytes, BytesMut};
use futures_sink::Sink;
use tokio_postgres::CopyInSink;
use tokio_postgres::types::{IsNull, ToSql, Type};

use super::conn::map_err;
use crate::cells::Cell;
use crate::{Result, StoreError};

/// How much of the stream goes to the connection at once.
pub(super) const CHUNK: usize = 256 * 1024;

/// The format's signature, then its flags and its header extension's length (both none).
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// The field count that ends the stream.
const TRAILER: i16 = -1;

/// One tab's `COPY … FROM STDIN (FORMAT binary)` under way. Dropped unfinished, it aborts
/// the `COPY`, and the transaction it is in fails.
pub struct CopyIn {
    tab: &'static str,
    types: Vec<Type>,
    sink: Pin<Box<CopyInSink<Bytes>>>,
    buf: BytesMut,
    rows: u64,
}

/// Room for the row that crosses [`CHUNK`] without growing the buffer.
const CAPACITY: usize = CHUNK + CHUNK / 4;

impl CopyIn {
    /// `types` are the columns' as the `COPY` names them (`transfer::columns` order).
    pub fn new(tab: &'static str, types: Vec<Type>, sink: CopyInSink<Bytes>) -> Self {
        let mut buf = BytesMut::with_capacity(CAPACITY);
        buf.put_slice(HEADER);
        CopyIn { tab, types, sink: Box::pin(sink), buf, rows: 0 }
    }

    /// One row, sent with those before it once they fill a chunk. A row that cannot be
    /// encoded leaves nothing of itself in the stream.
    pub async fn write(&mut self, row: &[Cell]) -> Result<()> {
        let start = self.buf.len();
        if let Err(e) = encode_row(&mut self.buf, self.tab, &self.types, row) {
            self.buf.truncate(start);
            return Err(e);
        }
        self.rows += 1;
        if self.buf.len() >= CHUNK {
            self.send().await?;
        }
        Ok(())
    }

    /// Ends the stream; fails unless PostgreSQL took every row written.
    pub async fn finish(mut self) -> Result<()> {
        self.buf.put_i16(TRAILER);
        self.send().await?;
        let took = self.sink.as_mut().finish().await.map_err(map_err)?;
        if took != self.rows {
            return Err(StoreError::Backend(format!("{}: PostgreSQL took {took} of {} rows", self.tab, self.rows)));
        }
        Ok(())
    }

    async fn send(&mut self) -> Result<()> {
        let sink = &mut self.sink;
        // Ready first: a send that fails or is cancelled here leaves the chunk in the buffer.
        poll_fn(|cx| sink.as_mut().poll_ready(cx)).await.map_err(map_err)?;
        let chunk = self.buf.split().freeze();
        // One allocation a chunk: the last one's is the connection's until it is written.
        self.buf.reserve(CAPACITY);
        sink.as_mut().start_send(chunk).map_err(map_err)?;
        poll_fn(|cx| sink.as_mut().poll_flush(cx)).await.map_err(map_err)
    }
}

/// One row of the binary format: its field count, then each field as its length in bytes
/// (-1 for NULL) and its value as a bound parameter of the column's type would be sent.
fn encode_row(buf: &mut BytesMut, tab: &str, types: &[Type], row: &[Cell]) -> Result<()> {
    let fields = i16::try_from(types.len()).ok().filter(|_| row.len() == types.len()).ok_or_else(|| {
        StoreError::Corrupt(format!("{tab}: a row of {} values for {} columns", row.len(), types.len()))
    })?;
    buf.put_i16(fields);
    for (i, (cell, ty)) in row.iter().zip(types).enumerate() {
        let column = || crate::transfer::columns(tab).get(i).map_or_else(|| i.to_string(), |c| c.to_string());
        let at = buf.len();
        buf.put_i32(0);
        let written =
            cell.to_sql_checked(ty, buf).map_err(|e| StoreError::Corrupt(format!("{tab}.{}: {e}", column())))?;
        let len = match written {
            IsNull::Yes => -1,
            IsNull::No => i32::try_from(buf.len() - at - 4)
                .map_err(|_| StoreError::Corrupt(format!("{tab}.{}: a value of 2 GiB or more", column())))?,
        };
        buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p14_a_row_is_its_field_count_then_each_field_length_first_and_null_as_minus_one() {
        let mut buf = BytesMut::new();
        let types = [Type::INT8, Type::TEXT, Type::BOOL, Type::TEXT];
        let row = [Cell::Int(7), Cell::Text("請求".into()), Cell::Int(1), Cell::Null];
        encode_row(&mut buf, "mail", &types, &row).expect("encoded");
        let mut want = vec![0, 4];
        want.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 7]);
        want.extend_from_slice(&[0, 0, 0, 6]);
        want.extend_from_slice("請求".as_bytes());
        // SQLite's 0/1 goes to a boolean column as one.
        want.extend_from_slice(&[0, 0, 0, 1, 1]);
        want.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&buf[..], &want[..]);
    }

    #[test]
    fn p14_a_row_that_fits_no_column_is_refused_naming_its_tab() {
        let mut buf = BytesMut::new();
        let short = encode_row(&mut buf, "jobs", &[Type::INT8, Type::TEXT], &[Cell::Int(1)]);
        assert!(matches!(short, Err(StoreError::Corrupt(m)) if m == "jobs: a row of 1 values for 2 columns"));
        let mistyped = encode_row(&mut buf, "jobs", &[Type::FLOAT8], &[Cell::Int(1)]);
        assert!(matches!(mistyped, Err(StoreError::Corrupt(m)) if m.starts_with("jobs.seq: ")));
        let unnamed = encode_row(&mut buf, "nothing", &[Type::FLOAT8], &[Cell::Int(1)]);
        assert!(matches!(unnamed, Err(StoreError::Corrupt(m)) if m.starts_with("nothing.0: ")));
        // Text where an integer or a flag belongs (SQLite keeps what it is given) is refused,
        // not written as the column's bytes: eight of them would read as a bigint.
        for ty in [Type::INT8, Type::BOOL] {
            let text = encode_row(&mut buf, "jobs", std::slice::from_ref(&ty), &[Cell::Text("abcdefgh".into())]);
            assert!(
                matches!(&text, Err(StoreError::Corrupt(m)) if m.contains("text cannot go into")),
                "{ty}: {text:?}"
            );
        }
        let int = encode_row(&mut buf, "jobs", &[Type::TEXT], &[Cell::Int(7)]);
        assert!(matches!(&int, Err(StoreError::Corrupt(m)) if m.contains("an integer cannot go into")), "{int:?}");
    }
}
