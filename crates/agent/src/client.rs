//! The PC's side of the HTTP API: where the server is, which token to send (DESIGN §10), and
//! the server's error bodies as typed errors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pcmail_core::api::{self, ErrorBody, ErrorCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";
const LOCAL_ADMIN_TOKEN: &str = "./pcmail-data/admin.token";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no token: pass --token, set PCMAIL_TOKEN, run `pcmail-ctl login`, or run beside a local `serve`")]
    NoToken,
    #[error("cannot reach the server at {base}: {message} (is `pcmail-ctl serve` running?)")]
    Unreachable { base: String, message: String },
    #[error(
        "the server at {base} presented a TLS certificate this PC does not trust ({message}); pass --ca FILE, set PCMAIL_CA, or run `pcmail-ctl login --ca FILE`"
    )]
    Untrusted { base: String, message: String },
    #[error("CA certificate {path}: {message}")]
    Ca { path: String, message: String },
    #[error("{message}")]
    Api { status: u16, code: Option<ErrorCode>, message: String, details: Vec<String> },
    #[error("unexpected answer from the server ({status}): {message}")]
    Decode { status: u16, message: String },
    #[error("client config {path}: {message}")]
    Config { path: PathBuf, message: String },
    /// V2: the server is older than this client serves; nothing was done with its answer.
    #[error("{message}")]
    Incompatible { message: String },
}

impl ClientError {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => *code,
            _ => None,
        }
    }

    /// E3: the server went away or is overloaded (unreachable, 408, 429, 5xx): worth repeating.
    /// Anything else is an answer about the request itself.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Api { status, .. } => pcmail_core::retry::retryable(*status),
            _ => false,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } | ClientError::Decode { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// V2: an answer from a server older than this client serves (its `Server: pcmail/VERSION`)
/// is not used; a server that does not name its release is served.
fn outside_window(headers: &reqwest::header::HeaderMap) -> Result<(), ClientError> {
    use pcmail_core::version::{Release, server_outside_window, server_release, serves};
    let server = headers.get(reqwest::header::SERVER).and_then(|v| server_release(v.to_str().ok()?));
    match server {
        Some(server) if !serves(Release::this(), server) => {
            Err(ClientError::Incompatible { message: server_outside_window(Release::this(), server) })
        }
        _ => Ok(()),
    }
}

/// V1: every request says which build sent it, so the server can tell which PCs run what.
pub fn user_agent() -> String {
    format!("pcmail-ctl/{} ({})", env!("CARGO_PKG_VERSION"), std::env::consts::OS)
}

/// What `login` writes under `$PCMAIL_HOME`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientConfig {
    pub server: String,
    pub token: String,
    /// O1: the CA certificate(s), as PEM, that the server's TLS certificate chains to (beside
    /// the system's roots): kept whole so the file `login --ca` read may move or go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

/// Reads a CA file (`--ca`, `PCMAIL_CA`) as PEM text, naming the file on failure.
pub fn read_ca(path: &Path) -> Result<String, ClientError> {
    let ca = |message: String| ClientError::Ca { path: path.display().to_string(), message };
    let pem = std::fs::read_to_string(path).map_err(|e| ca(e.to_string()))?;
    reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| ca(format!("not PEM certificates: {e}")))?;
    Ok(pem)
}

/// `$PCMAIL_HOME`, else `~/.pcmail`: the client config, the inbox cache and its queue.
pub fn home() -> PathBuf {
    match std::env::var_os("PCMAIL_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => std::env::var_os("HOME")
            .or_else(|| std::env::var_os("USERPROFILE"))
            .map_or_else(|| PathBuf::from(".pcmail"), |h| PathBuf::from(h).join(".pcmail")),
    }
}

pub fn config_path(home: &Path) -> PathBuf {
    home.join("config.json")
}

pub fn load_config(home: &Path) -> Result<Option<ClientConfig>, ClientError> {
    let path = config_path(home);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ClientError::Config { path, message: format!("not a valid client config: {e}") }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ClientError::Config { path, message: e.to_string() }),
    }
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    as_machine: Option<String>,
    ca: Option<String>,
}

impl Client {
    /// Resolves the server and token: explicit values, else the config `login` wrote, else a
    /// local `serve` (DESIGN §10).
    pub fn resolve(
        server: Option<String>,
        token: Option<String>,
        as_machine: Option<String>,
        ca: Option<&Path>,
        home: &Path,
    ) -> Result<Client, ClientError> {
        let config = load_config(home)?;
        let ca = match ca {
            Some(path) => Some(read_ca(path)?),
            None => config.as_ref().and_then(|c| c.ca.clone()),
        };
        let base =
            server.or_else(|| config.as_ref().map(|c| c.server.clone())).unwrap_or_else(|| DEFAULT_SERVER.into());
        let token = match (token, &config) {
            (Some(t), _) => t,
            (None, Some(c)) => c.token.clone(),
            (None, None) => std::fs::read_to_string(LOCAL_ADMIN_TOKEN)
                .map(|t| t.trim().to_string())
                .map_err(|_| ClientError::NoToken)?,
        };
        Client::new(&base, &token, as_machine, ca, Duration::from_secs(120))
    }

    /// The server's version; None from a server older than the version route (V3).
    pub async fn server_version(&self) -> Result<Option<pcmail_core::api::VersionInfo>, ClientError> {
        match self.exchange(self.http.get(format!("{}/api/v1/version", self.base))).await.map(|(v, _)| v) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `ca`: PEM certificates to trust beside the system's roots (O1).
    pub fn new(
        base: &str,
        token: &str,
        as_machine: Option<String>,
        ca: Option<String>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10).min(timeout))
            .user_agent(user_agent());
        if let Some(pem) = &ca {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| ClientError::Ca { path: "(saved by login)".into(), message: e.to_string() })?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http =
            builder.build().map_err(|e| ClientError::Unreachable { base: base.into(), message: e.to_string() })?;
        Ok(Client { http, base: base.trim_end_matches('/').to_string(), token: token.to_string(), as_machine, ca })
    }

    /// The CA this client trusts beside the system's roots, to save with a login.
    pub fn ca(&self) -> Option<&str> {
        self.ca.as_deref()
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The same server and identity with another request timeout.
    pub fn with_timeout(&self, timeout: Duration) -> Result<Client, ClientError> {
        Client::new(&self.base, &self.token, self.as_machine.clone(), self.ca.clone(), timeout)
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, ClientError> {
        Ok(self.send_reading(req).await?.0)
    }

    /// [`Client::send`], with the answer's headers. A route the server lacks is said as V3
    /// says (the status stays, so a queued call still backs off as for an unknown action, A4).
    async fn send_reading<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(T, reqwest::header::HeaderMap), ClientError> {
        match self.exchange(req).await {
            Err(ClientError::Api { status, code, message, details }) if api::route_missing(status, &message) => {
                let server = self.server_version().await.ok().flatten();
                let message = api::server_too_old(server.as_ref(), env!("CARGO_PKG_VERSION"));
                Err(ClientError::Api { status, code, message, details })
            }
            other => other,
        }
    }

    /// A request that got no HTTP answer: a certificate the PC does not trust is not an outage,
    /// so it is said as what to do about it.
    fn transport_error(&self, e: reqwest::Error) -> ClientError {
        let chain = format!("{e:?}");
        if chain.contains("InvalidCertificate") || chain.contains("UnknownIssuer") {
            let detail = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
            return ClientError::Untrusted { base: self.base.clone(), message: detail };
        }
        ClientError::Unreachable { base: self.base.clone(), message: e.to_string() }
    }

    /// X5: the server's clock, as the `Date` header of its version route says (no token
    /// needed); `None` when the answer has none. Any HTTP answer counts as reached.
    pub async fn server_date(&self) -> Result<Option<pcmail_core::Ts>, ClientError> {
        let req = self.http.get(format!("{}/api/v1/version", self.base));
        let resp = req.send().await.map_err(|e| {
            // The cause itself (connection refused, no such host), not only reqwest's summary.
            let mut cause = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                cause = s.to_string();
                source = s.source();
            }
            match self.transport_error(e) {
                ClientError::Unreachable { base, message } => {
                    ClientError::Unreachable { base, message: format!("{message}: {cause}") }
                }
                other => other,
            }
        })?;
        let date = resp.headers().get(reqwest::header::DATE).and_then(|v| v.to_str().ok());
        Ok(date.and_then(|d| chrono::DateTime::parse_from_rfc2822(d).ok()).map(|d| d.with_timezone(&chrono::Utc)))
    }

    async fn exchange<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(T, reqwest::header::HeaderMap), ClientError> {
        let mut req = req.bearer_auth(&self.token);
        if let Some(m) = &self.as_machine {
            req = req.header("x-pcmail-as", m);
        }
        let unreachable = |e: reqwest::Error| self.transport_error(e);
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let headers = resp.headers().clone();
        outside_window(&headers)?;
        let bytes = resp.bytes().await.map_err(unreachable)?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map(|body| (body, headers))
                .map_err(|e| ClientError::Decode { status: status.as_u16(), message: e.to_string() });
        }
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => ClientError::Api {
                status: status.as_u16(),
                code: Some(body.error.code),
                message: body.error.message,
                details: body.error.details,
            },
            Err(_) => ClientError::Api {
                status: status.as_u16(),
                code: None,
                message: format!("server answered {status}: {}", String::from_utf8_lossy(&bytes).trim()),
                details: vec![],
            },
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> Result<T, ClientError> {
        self.send(self.http.get(format!("{}{path}", self.base)).query(query)).await
    }

    /// U3: a page of a listing that answers a JSON array, and how many more match after it (the
    /// `x-pcmail-more` header; 0 from a server too old to send it).
    pub async fn get_page<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<(Vec<T>, u64), ClientError> {
        let (items, headers) = self.send_reading(self.http.get(format!("{}{path}", self.base)).query(query)).await?;
        let more = headers.get(pcmail_core::page::MORE_HEADER).and_then(|v| v.to_str().ok()?.parse().ok());
        Ok((items, more.unwrap_or(0)))
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, ClientError> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body)).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.http.delete(format!("{}{path}", self.base))).await
    }
}

/// Writes a private file (0600 on Unix) atomically: a crash leaves the old file or the new one.
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        pcmail_store::private::make_private(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(&tmp)?;
    f.write_all(contents.as_ref())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
