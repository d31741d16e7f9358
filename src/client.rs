//! The CLI's side of the HTTP API: where the server is, which token to send (DESIGN §10),
//! and turning error bodies into exit codes.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use pcmail_core::api::ErrorBody;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::args::Connection;
use crate::exit::{CliError, Exit};

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";
const LOCAL_ADMIN_TOKEN: &str = "./pcmail-data/admin.token";

/// What `login` writes under `$PCMAIL_HOME`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientConfig {
    pub server: String,
    pub token: String,
}

pub fn home() -> PathBuf {
    match std::env::var_os("PCMAIL_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => std::env::var_os("HOME").map_or_else(|| PathBuf::from(".pcmail"), |h| PathBuf::from(h).join(".pcmail")),
    }
}

pub fn config_path() -> PathBuf {
    home().join("config.json")
}

fn load_config() -> anyhow::Result<Option<ClientConfig>> {
    let path = config_path();
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("{} is not a valid client config", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    as_machine: Option<String>,
}

impl Client {
    pub fn new(conn: &Connection) -> anyhow::Result<Client> {
        let config = load_config()?;
        let base = conn
            .server
            .clone()
            .or_else(|| config.as_ref().map(|c| c.server.clone()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string());
        let token = match (&conn.token, &config) {
            (Some(t), _) => t.clone(),
            (None, Some(c)) => c.token.clone(),
            (None, None) => std::fs::read_to_string(LOCAL_ADMIN_TOKEN).map(|t| t.trim().to_string()).map_err(|_| {
                CliError::new(
                    Exit::Unauthorized,
                    "no token: pass --token, set PCMAIL_TOKEN, run `pcmail-ctl login`, or run beside a local `serve`",
                )
            })?,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client { http, base: base.trim_end_matches('/').to_string(), token, as_machine: conn.as_machine.clone() })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let mut req = req.bearer_auth(&self.token);
        if let Some(m) = &self.as_machine {
            req = req.header("x-pcmail-as", m);
        }
        let resp = req.send().await.map_err(|e| {
            CliError::new(
                Exit::Error,
                format!("cannot reach the server at {}: {e} (is `pcmail-ctl serve` running?)", self.base),
            )
        })?;
        let status = resp.status();
        let bytes = resp.bytes().await.context("reading the server's answer")?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .with_context(|| format!("unexpected answer from the server ({status})"));
        }
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => CliError {
                exit: Exit::for_code(body.error.code),
                code: Some(body.error.code),
                message: body.error.message,
                details: body.error.details,
            },
            Err(_) => CliError::new(
                if status.as_u16() == 401 || status.as_u16() == 403 { Exit::Unauthorized } else { Exit::Error },
                format!("server answered {status}: {}", String::from_utf8_lossy(&bytes).trim()),
            ),
        }
        .into())
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        self.send(self.http.get(format!("{}{path}", self.base)).query(query)).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.http.delete(format!("{}{path}", self.base))).await
    }
}

/// Writes a private file (0600 on Unix) atomically: a crash leaves the old file or the new one.
pub fn write_private(path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = path.parent().context("path has no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
