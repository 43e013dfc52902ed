//! TLS, bearer-token and shared-tier settings: the edge's flags, the cloud's `[server]` table.
//! Secrets come from a file or an environment variable, never from the command line, and are
//! never printed.

use std::path::PathBuf;

use anyhow::Context;
use edgeprompt_edge::ClientSecurity;

/// Environment variable holding the bearer token when no file is given.
pub const TOKEN_ENV: &str = "EDGEPROMPT_CLOUD_TOKEN";

#[derive(clap::Args, Clone, Default)]
pub struct ClientArgs {
    /// PEM of the CA that signed the cloud's certificate (turns on TLS; use an https:// URL).
    #[arg(long)]
    cloud_ca: Option<PathBuf>,
    /// Name the cloud's certificate must carry, if not the URL's host.
    #[arg(long)]
    cloud_domain: Option<String>,
    /// File holding the bearer token (default: $EDGEPROMPT_CLOUD_TOKEN, if set).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl ClientArgs {
    pub fn load(&self) -> anyhow::Result<ClientSecurity> {
        let ca_pem = match &self.cloud_ca {
            Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
            None => None,
        };
        Ok(ClientSecurity {
            ca_pem,
            domain: self.cloud_domain.clone(),
            token: token(self.token_file.as_ref(), None)?,
        })
    }
}

/// The cloud's `[server]` table in its prompts file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    /// Name of the environment variable with the token (default EDGEPROMPT_CLOUD_TOKEN).
    pub token_env: Option<String>,
    pub max_streams: Option<usize>,
    pub per_client_rate: Option<f64>,
    /// Redis shared by several cloud nodes, e.g. "redis://127.0.0.1:6379/".
    pub redis_url: Option<String>,
    /// Key prefix in that Redis (default "edgeprompt").
    pub redis_namespace: Option<String>,
}

/// A token from `file`, else from the environment; trimmed; empty means none.
pub fn token(file: Option<&PathBuf>, env: Option<&str>) -> anyhow::Result<Option<String>> {
    let raw = match file {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => std::env::var(env.unwrap_or(TOKEN_ENV)).ok(),
    };
    Ok(raw.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
}
