//! A small connection pool over tokio-postgres, with each connection's prepared statements
//! cached, and the codec's rows and values in PostgreSQL's terms.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use bytes::BytesMut;
use tokio::sync::{Semaphore, SemaphorePermit, mpsc};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{CancelToken, Client, NoTls, Row, Statement};

use super::copy::CopyIn;
use crate::cells::{Batch, Cell, Incoming};
use crate::codec::{Columns, Value};
use crate::{Result, StoreError};

pub type Param<'a> = &'a (dyn ToSql + Sync);

/// Connections opened at most at once; more callers wait for one to come back.
pub const POOL_SIZE: usize = 16;

pub fn map_err(e: tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        // E15: 53100 disk_full is a refusal for space, said as such.
        if code == "53100" {
            return StoreError::NoSpace(format!("postgres: {}", db.message()));
        }
        // 53: insufficient resources (disk full, out of memory, too many connections);
        // 57P: the server is shutting down; 08: the connection failed; 25006: read-only.
        if code.starts_with("53") || code.starts_with("57P") || code.starts_with("08") || code == "25006" {
            return StoreError::Unavailable(format!("postgres: {}", db.message()));
        }
        return StoreError::Backend(format!("postgres: {} ({code})", db.message()));
    }
    if e.is_closed() || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) {
        return StoreError::Unavailable(format!("postgres: {e}"));
    }
    StoreError::Backend(format!("postgres: {e}"))
}

pub struct Pool {
    config: tokio_postgres::Config,
    idle: Mutex<Vec<Conn>>,
    permits: Semaphore,
}

impl Pool {
    pub fn new(config: tokio_postgres::Config) -> Pool {
        Pool { config, idle: Mutex::new(Vec::new()), permits: Semaphore::new(POOL_SIZE) }
    }

    pub async fn get(&self) -> Result<Pooled<'_>> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("the connection pool is closed".into()))?;
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let conn = match idle {
            Some(c) if !c.client.is_closed() => c,
            _ => Conn::open(&self.config).await?,
        };
        Ok(Pooled { conn: Some(conn), pool: self, _permit: permit })
    }

    /// A connection outside the pool, closed when dropped: for a session lock that must not
    /// outlive its holder's work.
    pub async fn dedicated(&self) -> Result<Conn> {
        Conn::open(&self.config).await
    }
}

/// A connection borrowed from the pool; back into it on drop unless it may be mid-transaction.
pub struct Pooled<'a> {
    conn: Option<Conn>,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().unwrap_or_else(|| unreachable!("taken only on drop"))
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().unwrap_or_else(|| unreachable!("taken only on drop"))
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take().filter(|c| !c.in_transaction && !c.client.is_closed()) {
            self.pool.idle.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
        }
    }
}

pub struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    /// Set from BEGIN until COMMIT or ROLLBACK answered: a connection dropped in between (a
    /// cancelled request) is closed rather than handed to the next caller mid-transaction.
    in_transaction: bool,
}

impl Conn {
    pub async fn open(config: &tokio_postgres::Config) -> Result<Conn> {
        let (client, connection) = config.connect(NoTls).await.map_err(map_err)?;
        // A broken connection is reported by the next query on it, which has a caller to tell.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn { client, statements: HashMap::new(), in_transaction: false })
    }

    async fn prepare(&mut self, sql: &str) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let statement = self.client.prepare(sql).await.map_err(map_err)?;
        self.statements.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    pub async fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>> {
        let statement = self.prepare(sql).await?;
        self.client.query(&statement, params).await.map_err(map_err)
    }

    pub async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
        let statement = self.prepare(sql).await?;
        self.client.execute(&statement, params).await.map_err(map_err)
    }

    /// P14: `rows` of `tab` (each in `transfer::columns` order) by `COPY … FROM STDIN` in
    /// PostgreSQL's binary format; a cell goes to its column's type as a bound parameter would.
    pub async fn copy_in(&mut self, tab: &'static str, rows: &[Vec<Cell>]) -> Result<()> {
        let mut writer = self.copy_writer(tab).await?;
        for row in rows {
            writer.write(row).await?;
        }
        writer.finish().await
    }

    /// P14: `first` and the batches after it of the same tab as one `COPY`, each written as it
    /// comes, so that PostgreSQL takes rows while the next are read. Answers what came after
    /// them (another tab's batch, or the end); rows that stop before the end fail the `COPY`.
    pub async fn copy_in_run(&mut self, first: Batch, more: &mut mpsc::Receiver<Incoming>) -> Result<Incoming> {
        let tab = first.tab;
        let mut writer = self.copy_writer(tab).await?;
        let mut batch = first;
        let next = loop {
            for row in &batch.rows {
                writer.write(row).await?;
            }
            match more.recv().await {
                Some(Incoming::Rows(same)) if same.tab == tab => batch = same,
                Some(other) => break other,
                None => return Err(StoreError::Backend(crate::cells::COPY_INCOMPLETE.into())),
            }
        };
        writer.finish().await?;
        Ok(next)
    }

    async fn copy_writer(&mut self, tab: &'static str) -> Result<CopyIn> {
        let types = self.column_types(tab).await?;
        let sql = format!("COPY {tab} ({}) FROM STDIN (FORMAT binary)", crate::transfer::column_list(tab));
        let statement = self.prepare(&sql).await?;
        let sink = self.client.copy_in::<_, bytes::Bytes>(&statement).await.map_err(map_err)?;
        Ok(CopyIn::new(tab, types, sink))
    }

    /// The types of `tab`'s columns (in `transfer::columns` order), as this connection's prepared `SELECT` of them reads them.
    async fn column_types(&mut self, tab: &str) -> Result<Vec<Type>> {
        let statement =
            self.prepare(&format!("SELECT {} FROM {tab} LIMIT 0", crate::transfer::column_list(tab))).await?;
        Ok(statement.columns().iter().map(|c| c.type_().clone()).collect())
    }

    /// Rows decoded by one of the codec's decoders.
    pub async fn decode<T>(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
        decode: fn(&dyn Columns) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.query(sql, params).await?.iter().map(|r| decode(r)).collect()
    }

    /// Rows decoded as `decode` does, or None when the statement was cancelled (T14: its
    /// `statement_timeout` ran out, or a cancel request came).
    pub async fn decode_unless_cancelled<T>(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
        decode: fn(&dyn Columns) -> Result<T>,
    ) -> Result<Option<Vec<T>>> {
        let statement = self.prepare(sql).await?;
        match self.client.query(&statement, params).await {
            Ok(rows) => rows.iter().map(|r| decode(r)).collect::<Result<Vec<T>>>().map(Some),
            Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    /// A guard that cancels this connection's running statement if dropped before `disarm`.
    pub fn cancel_on_drop(&self) -> CancelOnDrop {
        CancelOnDrop { token: Some(self.client.cancel_token()) }
    }

    pub async fn batch(&mut self, sql: &str) -> Result<()> {
        self.client.batch_execute(sql).await.map_err(map_err)
    }

    pub async fn begin(&mut self) -> Result<()> {
        self.begin_as("BEGIN").await
    }

    /// A transaction started with its own options (`BEGIN ISOLATION LEVEL …`).
    pub async fn begin_as(&mut self, begin: &str) -> Result<()> {
        self.in_transaction = true;
        self.batch(begin).await
    }

    /// Commits when `outcome` is Ok, rolls back otherwise, and answers `outcome`.
    pub async fn finish<R>(&mut self, outcome: Result<R>) -> Result<R> {
        let end = if outcome.is_ok() { "COMMIT" } else { "ROLLBACK" };
        let ended = self.batch(end).await;
        if ended.is_ok() {
            self.in_transaction = false;
        }
        let out = outcome?;
        ended.map(|()| out)
    }
}

/// T14: a caller that went away (a client that hung up) stops PostgreSQL's work, not only its
/// own wait — the server would otherwise run the statement to its end.
pub struct CancelOnDrop {
    token: Option<CancelToken>,
}

impl CancelOnDrop {
    pub fn disarm(mut self) {
        self.token = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let token = self.token.take();
        if let (Some(token), Ok(runtime)) = (token, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                // Nothing is waiting for it: a statement that had already ended is no error.
                let _ = token.cancel_query(NoTls).await;
            });
        }
    }
}

/// Parameters as tokio-postgres takes them.
pub fn params<'a>(values: &'a [Value<'a>]) -> Vec<Param<'a>> {
    values.iter().map(|v| v as Param<'a>).collect()
}

impl Columns for Row {
    fn text(&self, i: usize) -> Result<String> {
        self.try_get(i).map_err(|e| column_error(i, e))
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>> {
        self.try_get(i).map_err(|e| column_error(i, e))
    }

    fn int(&self, i: usize) -> Result<i64> {
        self.try_get(i).map_err(|e| column_error(i, e))
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        self.try_get(i).map_err(|e| column_error(i, e))
    }

    fn flag(&self, i: usize) -> Result<bool> {
        self.try_get(i).map_err(|e| column_error(i, e))
    }
}

fn column_error(i: usize, e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("column {i}: {e}"))
}

impl ToSql for Value<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // `accepts` answers for the enum as a whole; each variant checks its own column type.
        match self {
            Value::Text(v) if <&str as ToSql>::accepts(ty) => v.to_sql(ty, out),
            Value::Int(v) if <i64 as ToSql>::accepts(ty) => v.to_sql(ty, out),
            Value::Bool(v) if <bool as ToSql>::accepts(ty) => v.to_sql(ty, out),
            other => Err(format!("{other:?} cannot be bound to a {ty} parameter").into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty) || <i64 as ToSql>::accepts(ty) || <bool as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// Cells go to the type the target column has: a 0/1 from SQLite into a boolean column. A
/// value of another kind is refused, not written as the column's bytes (SQLite's columns take
/// text where an integer belongs; `accepts` answers for the enum as a whole).
impl ToSql for Cell {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Cell::Null => Ok(IsNull::Yes),
            Cell::Text(v) if <&str as ToSql>::accepts(ty) => v.as_str().to_sql(ty, out),
            Cell::Int(v) if *ty == Type::BOOL => (*v != 0).to_sql(ty, out),
            Cell::Int(v) if *ty == Type::INT8 => v.to_sql(ty, out),
            Cell::Bool(v) if *ty == Type::INT8 => i64::from(*v).to_sql(ty, out),
            Cell::Bool(v) if *ty == Type::BOOL => v.to_sql(ty, out),
            Cell::Text(_) => Err(format!("text cannot go into a {ty} column").into()),
            Cell::Int(_) => Err(format!("an integer cannot go into a {ty} column").into()),
            Cell::Bool(_) => Err(format!("a flag cannot go into a {ty} column").into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <Value<'_> as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// One value of an exported row, by the column's type; pcmail keeps only these three.
pub fn cell(row: &Row, i: usize, tab: &str) -> Result<Cell> {
    let ty = row.columns().get(i).map(|c| c.type_().clone());
    let got = match ty {
        Some(Type::BOOL) => row.try_get::<_, Option<bool>>(i).map(|v| v.map(Cell::Bool)),
        Some(Type::INT8) => row.try_get::<_, Option<i64>>(i).map(|v| v.map(Cell::Int)),
        Some(Type::TEXT) => row.try_get::<_, Option<String>>(i).map(|v| v.map(Cell::Text)),
        other => {
            return Err(StoreError::Corrupt(format!("{tab} column {i} is a {other:?}, not text, bigint or boolean")));
        }
    };
    got.map(|v| v.unwrap_or(Cell::Null)).map_err(|e| StoreError::Corrupt(format!("{tab} column {i}: {e}")))
}

/// One column of many rows, bound as one array parameter: a write of N rows is one statement
/// (`INSERT … SELECT * FROM unnest(…)`) instead of N round trips.
#[derive(Debug)]
pub enum Column<'a> {
    Text(Vec<Option<&'a str>>),
    Int(Vec<Option<i64>>),
    Bool(Vec<bool>),
}

impl Column<'_> {
    fn sql_type(&self) -> &'static str {
        match self {
            Column::Text(_) => "text[]",
            Column::Int(_) => "bigint[]",
            Column::Bool(_) => "boolean[]",
        }
    }
}

/// Rows of parameters (each in the same column order and kinds) as columns.
pub fn transpose<'a>(rows: &[Vec<Value<'a>>]) -> Vec<Column<'a>> {
    let Some(first) = rows.first() else { return Vec::new() };
    let mut columns: Vec<Column<'a>> = first
        .iter()
        .map(|v| match v {
            Value::Text(_) => Column::Text(Vec::with_capacity(rows.len())),
            Value::Int(_) => Column::Int(Vec::with_capacity(rows.len())),
            Value::Bool(_) => Column::Bool(Vec::with_capacity(rows.len())),
        })
        .collect();
    for row in rows {
        for (column, value) in columns.iter_mut().zip(row) {
            match (column, *value) {
                (Column::Text(c), Value::Text(v)) => c.push(v),
                (Column::Int(c), Value::Int(v)) => c.push(v),
                (Column::Bool(c), Value::Bool(v)) => c.push(v),
                // The codec gives every row the same kinds; a mismatch is a bug in a caller.
                (column, value) => unreachable!("column {column:?} given {value:?}"),
            }
        }
    }
    columns
}

/// `unnest($1::text[], $2::bigint[], …)` for these columns.
pub fn unnest(columns: &[Column<'_>]) -> String {
    let args: Vec<String> = columns.iter().enumerate().map(|(i, c)| format!("${}::{}", i + 1, c.sql_type())).collect();
    format!("unnest({})", args.join(", "))
}

impl ToSql for Column<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Column::Text(v) => v.to_sql(ty, out),
            Column::Int(v) => v.to_sql(ty, out),
            Column::Bool(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <Vec<Option<&str>> as ToSql>::accepts(ty)
            || <Vec<Option<i64>> as ToSql>::accepts(ty)
            || <Vec<bool> as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// Parameters as tokio-postgres takes them, for columns.
pub fn column_params<'a>(columns: &'a [Column<'a>]) -> Vec<Param<'a>> {
    columns.iter().map(|c| c as Param<'a>).collect()
}
